"""The pure decisions behind Hub ids (jobs.hub_models): how an id is spelled, which files
of a repo a model needs, which queue and cache namespace a commit gets. Fetching
itself runs against a real Hub cache and a local Hub server in tests/e2e/test_hub_*."""

from __future__ import annotations

import pytest

from jobs.cache_keys import model_identity
from jobs.hub_models import HubId, HubSnapshot, is_hub_key, parse_hub_id, queue_key, select_files
from jobs.models import ModelRef, resolve_model
from jobs.messaging import model_queue

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("name, expected", [
    ("BAAI/bge-small-en-v1.5", HubId("BAAI/bge-small-en-v1.5")),
    ("hf://BAAI/bge-small-en-v1.5", HubId("BAAI/bge-small-en-v1.5")),
    ("Qwen/Qwen3-Embedding-0.6B@main", HubId("Qwen/Qwen3-Embedding-0.6B", "main")),
    (f"org/name@{COMMIT}", HubId("org/name", COMMIT)),
    ("org/name@refs/pr/4", HubId("org/name", "refs/pr/4")),
    ("org/name-GGUF:Q4_K_M", HubId("org/name-GGUF", None, "Q4_K_M")),
    ("org/name-GGUF@v1.0:Q4_1", HubId("org/name-GGUF", "v1.0", "Q4_1")),
    ("org/name-GGUF:Q4_1@v1.0", HubId("org/name-GGUF", "v1.0", "Q4_1")),
    ("minilm", None), ("/models/minilm", None), ("./org/name", None), ("org/name/extra", None),
    ("org/name:Q4:Q8", None), ("s3://bucket/model", None),
])
def test_parse_hub_id(name, expected):
    assert parse_hub_id(name) == expected


def test_a_malformed_hf_url_is_refused_not_taken_for_a_folder():
    with pytest.raises(ValueError, match="hf://org only"):
        parse_hub_id("hf://org only")


MINILM_REPO = ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt", "README.md",
               "modules.json", "1_Pooling/config.json", "onnx/model.onnx", "openvino/openvino_model.bin",
               "data_config.json", "sentence_bert_config.json", "tf_model.h5", "2_Dense/model.safetensors",
               "2_Dense/config.json"]
GGUF_REPO = ["README.md", "model.Q4_1.gguf", "model.Q8_0.gguf", "model-q4_k_m.gguf"]


@pytest.mark.parametrize("files, hub_id, wanted, gguf", [
    (MINILM_REPO, HubId("o/minilm"), ["config.json", "tokenizer.json", "vocab.txt", "modules.json",
                                      "1_Pooling/config.json", "sentence_bert_config.json", "2_Dense/model.safetensors",
                                      "2_Dense/config.json", "model.safetensors"], None),
    (["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "model.safetensors.index.json", "generation_config.json", "pytorch_model-00001-of-00002.bin"], HubId("o/llm"),
     ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
      "model-00002-of-00002.safetensors", "model.safetensors.index.json"], None),
    (["config.json", "model.bin", "tokenizer.json", "vocabulary.txt", "README.md"], HubId("o/faster-whisper-tiny"),
     ["config.json", "tokenizer.json", "vocabulary.txt", "model.bin"], None),
    (GGUF_REPO, HubId("o/gguf", None, "Q8_0"), ["model.Q8_0.gguf"], "model.Q8_0.gguf"),
    (GGUF_REPO, HubId("o/gguf", None, "Q4_K_M"), ["model-q4_k_m.gguf"], "model-q4_k_m.gguf"),
    (["model.Q4_1.gguf", "README.md"], HubId("o/gguf"), ["model.Q4_1.gguf"], "model.Q4_1.gguf"),
])
def test_select_files_takes_only_what_the_model_needs(files, hub_id, wanted, gguf):
    chosen, gguf_file = select_files(files, hub_id)
    assert sorted(chosen) == sorted(wanted) and gguf_file == gguf


@pytest.mark.parametrize("files, hub_id, problem", [
    (GGUF_REPO, HubId("o/gguf"), "several GGUF quantizations; name one as o/gguf:QUANT (it has: q4_k_m, Q4_1, Q8_0)"),
    (GGUF_REPO, HubId("o/gguf", "main", "Q2_K"), "'o/gguf@main' has no GGUF file of quantization 'Q2_K'"),
    (["config.json", "pytorch_model.bin"], HubId("o/old"), "'o/old' has no weights Barge loads"),
    ([], HubId("o/empty"), "its files: none"),
])
def test_select_files_refuses_naming_the_model(files, hub_id, problem):
    with pytest.raises(ValueError, match="^model: ") as refused:
        select_files(files, hub_id)
    assert problem in str(refused.value)


def test_one_queue_per_repo_one_key_per_commit(tmp_path):
    main = HubSnapshot(HubId("org/name"), COMMIT, tmp_path)
    other = HubSnapshot(HubId("org/name", "v2"), "f" * 40, tmp_path)
    gguf = HubSnapshot(HubId("org/name", None, "Q4_1"), COMMIT, tmp_path, "name.Q4_1.gguf")
    assert main.key == f"hf.org--name@{COMMIT}" and is_hub_key(main.key)
    assert model_queue(main.key) == model_queue(other.key) == "model.hf.org--name"
    assert model_queue(gguf.key) == "model.hf.org--name.name.Q4_1" and gguf.path == str(tmp_path / "name.Q4_1.gguf")
    assert queue_key("minilm") == "minilm" and not is_hub_key("minilm")
    assert HubId("org/name", "main", "Q4_1").pinned(COMMIT) == f"org/name@{COMMIT}:Q4_1"


def test_two_commits_never_share_a_cache_namespace_even_with_equal_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    first = ModelRef(key=f"hf.org--name@{COMMIT}", path=str(tmp_path), pinned=f"org/name@{COMMIT}")
    second = ModelRef(key="hf.org--name@" + "f" * 40, path=str(tmp_path), pinned="org/name@" + "f" * 40)
    local = ModelRef(key="name-1234", path=str(tmp_path))
    assert len({model_identity(first), model_identity(second), model_identity(local)}) == 3
    assert model_identity(first) == model_identity(first)


def test_a_local_folder_named_like_a_hub_id_wins_and_hf_prefix_never_looks_for_one(tmp_path, monkeypatch):
    folder = tmp_path / "org" / "name"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/name", env={}).path == str(folder)
    assert resolve_model("org/name", env={}).pinned is None
    monkeypatch.setattr("jobs.models.fetch_snapshot",
                        lambda hub_id, **options: (_ for _ in ()).throw(ValueError(f"model: {hub_id}")))
    with pytest.raises(ValueError, match="org/name"):
        resolve_model("hf://org/name", env={})
