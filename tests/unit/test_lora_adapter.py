"""Loading PEFT adapters (engine/lora/adapter.py): what a good one becomes, and each refusal
naming its problem — the checks a job's adapter meets at submit and a row's adapter at queueing."""

import json
import shutil

import fsspec
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.generate.model_config import load_decoder_config
from engine.lora.adapter import load_adapter
from engine.lora.adapter_config import AdapterError
from tests.support.lora_adapters import ATTENTION, MLP, save_random_adapter
from tests.support.random_decoders import save_random_decoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

PREFIX = "base_model.model.model.layers"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_random_decoder(tmp_path_factory.mktemp("base"), "llama")


@pytest.fixture(scope="module")
def good(base, tmp_path_factory):
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return save_random_adapter(model, tmp_path_factory.mktemp("adapters") / "good", 8, ATTENTION + MLP, 1, 0.1)


@pytest.fixture
def config(base):
    return load_decoder_config(base)


def edited(good, tmp_path, config_changes=None, tensors=None):
    """A copy of the good adapter with its config fields changed and/or its tensors replaced."""
    folder = tmp_path / "edited"
    shutil.copytree(good, folder)
    if config_changes:
        raw = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**raw, **config_changes}))
    if tensors is not None:
        save_file(tensors(load_file(folder / "adapter_model.safetensors")), folder / "adapter_model.safetensors")
    return folder


def test_a_peft_adapter_loads_per_layer_and_projection(good, config):
    adapter = load_adapter(good, config, max_rank=64, dtype=torch.float32)
    assert adapter.rank == 8 and adapter.config.scaling == 2.0
    assert adapter.projections == frozenset(ATTENTION + MLP)
    assert len(adapter.weights) == config.num_layers * 7
    a, b = adapter.weights[(1, "k_proj")]
    assert a.shape == (8, config.hidden_size) and b.shape == (config.num_kv_heads * config.head_dim, 8)
    raw = load_file(good / "adapter_model.safetensors")
    assert torch.equal(b, raw[f"{PREFIX}.1.self_attn.k_proj.lora_B.weight"])


def test_identity_is_the_files_content(good, config, tmp_path):
    """Two folders with the same bytes are one adapter (they share prefix-cache blocks);
    a retrained adapter under the same name is another."""
    copy = shutil.copytree(good, tmp_path / "same")
    changed = edited(good, tmp_path, tensors=lambda t: {k: v * 2 if "lora_B" in k else v for k, v in t.items()})
    ids = [load_adapter(folder, config, 64, torch.float32).adapter_id for folder in (good, copy, changed)]
    assert ids[0] == ids[1] != ids[2]


def test_an_fsspec_url_loads_as_the_folder_does(good, config):
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with fsspec.open(f"memory://lora/good/{name}", "wb") as target:
            target.write((good / name).read_bytes())
    from_url = load_adapter("memory://lora/good", config, 64, torch.float32)
    assert from_url.adapter_id == load_adapter(good, config, 64, torch.float32).adapter_id
    with pytest.raises(AdapterError, match="memory://lora/missing: cannot be read"):
        load_adapter("memory://lora/missing", config, 64, torch.float32)


def drop(name_part):
    return lambda tensors: {k: v for k, v in tensors.items() if name_part not in k}


def with_tensor(name, shape):
    """The tensors with `name` added, or replaced, as zeros of `shape`."""
    return lambda tensors: {**tensors, name: torch.zeros(shape)}


@pytest.mark.parametrize("config_changes, tensors, message", [
    ({"r": 128}, None, "r=128 exceeds this engine's max_lora_rank=64"),
    ({"r": 0}, None, "r must be an int >= 1, got 0"),
    ({"peft_type": "LOHA"}, None, "peft_type 'LOHA' is not supported"),
    ({"use_dora": True}, None, "use_dora is not supported"),
    ({"bias": "lora_only"}, None, "bias='lora_only' is not supported"),
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save is not supported"),
    ({"rank_pattern": {"q_proj": 4}}, None, "rank_pattern is not supported"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, None, r"target_modules \['embed_tokens'\] are not supported"),
    ({"lora_alpha": "big"}, None, "lora_alpha must be a number"),
    (None, with_tensor(f"{PREFIX}.0.self_attn.q_proj.lora_A.weight", (8, 32)),
     r"layers.0.q_proj.lora_A has shape \[8, 32\]; r=8 on this base model needs \[8, 64\]"),
    (None, with_tensor(f"{PREFIX}.1.mlp.down_proj.lora_B.weight", (64, 4)),
     r"layers.1.down_proj.lora_B has shape \[64, 4\]; r=8 on this base model needs \[64, 8\]"),
    (None, with_tensor("base_model.model.lm_head.lora_A.weight", (8, 64)),
     "tensor base_model.model.lm_head.lora_A.weight is not a LoRA weight of q_proj"),
    (None, with_tensor(f"{PREFIX}.7.self_attn.q_proj.lora_A.weight", (8, 64)),
     "is for layer 7; the base model has 2 layers"),
    (None, with_tensor(f"{PREFIX}.0.mlp.q_proj.lora_A.weight", (8, 64)), "is not a LoRA weight"),
    (None, drop("layers.1.self_attn.v_proj.lora_B"), "layers.1.v_proj has no lora_B"),
    (None, lambda tensors: {}, "holds no LoRA weights"),
])
def test_refusals_name_the_problem(good, config, tmp_path, config_changes, tensors, message):
    folder = edited(good, tmp_path, config_changes, tensors)
    with pytest.raises(AdapterError, match=message) as refusal:
        load_adapter(folder, config, max_rank=64, dtype=torch.float32)
    assert str(folder) in str(refusal.value)


def test_missing_and_unreadable_files_are_refused(good, config, tmp_path):
    with pytest.raises(AdapterError, match="no adapter_config.json"):
        load_adapter(tmp_path, config, 64, torch.float32)
    folder = edited(good, tmp_path)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="adapter_config.json is not JSON"):
        load_adapter(folder, config, 64, torch.float32)
    (folder / "adapter_config.json").write_text((good / "adapter_config.json").read_text())
    (folder / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterError, match="adapter_model.safetensors is not a safetensors file"):
        load_adapter(folder, config, 64, torch.float32)


def test_an_adapter_made_for_another_base_is_refused(good, tmp_path):
    """The same adapter against a wider base: the first mismatching tensor is named."""
    wider = load_decoder_config(save_random_decoder(tmp_path / "wider", "llama", hidden_size=96))
    with pytest.raises(AdapterError, match=r"layers.0.down_proj.lora_B has shape \[64, 8\]; r=8 on this base model "
                                           r"needs \[96, 8\]"):
        load_adapter(good, wider, 64, torch.float32)
