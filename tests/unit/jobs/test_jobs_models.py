"""Model names: a job and a worker that name one model the same way meet on one key."""

from __future__ import annotations

import json
import os

import pytest

from jobs.models import ModelRef, model_mode, registered_models, resolve_model

BUILTIN_KEY = "all-MiniLM-L6-v2"   # the first, in sorted order, of the built-in aliases


def model_folder(parent, name: str = "my-model", hidden_size: int = 8) -> str:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": hidden_size}))
    return str(folder)


def test_builtin_names_resolve_to_one_key_and_folder():
    by_short_name = resolve_model("minilm", env={})
    by_full_name = resolve_model("all-MiniLM-L6-v2", env={})
    assert by_short_name == by_full_name
    assert by_short_name.key == BUILTIN_KEY
    assert os.path.isfile(os.path.join(by_short_name.path, "config.json"))


def test_the_builtin_folder_path_gets_the_builtin_key():
    folder = resolve_model("minilm", env={}).path
    assert resolve_model(folder, env={}) == ModelRef(key=BUILTIN_KEY, path=folder)
    assert resolve_model(folder + "/", env={}).key == BUILTIN_KEY


def test_an_unregistered_folder_gets_a_stable_key_from_its_path(tmp_path):
    folder = model_folder(tmp_path, "My Model")
    ref = resolve_model(folder, env={})
    assert ref.path == folder
    assert ref.key.startswith("My_Model-") and len(ref.key) == len("My_Model-") + 8
    assert resolve_model(folder, env={}) == ref
    other = model_folder(tmp_path / "elsewhere", "My Model")
    assert resolve_model(other, env={}).key != ref.key


def test_a_relative_folder_path_is_made_absolute(tmp_path, monkeypatch):
    folder = model_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model", env={}) == resolve_model(folder, env={})


def test_barge_models_entries_register_names(tmp_path):
    first, second = model_folder(tmp_path, "a"), model_folder(tmp_path, "b")
    env = {"BARGE_MODELS": f" alpha = {first} ,, beta={second},"}
    assert registered_models(env)["alpha"] == first
    assert resolve_model("alpha", env) == ModelRef(key="alpha", path=first)
    assert resolve_model("beta", env) == ModelRef(key="beta", path=second)
    # The folder path meets the name on one key.
    assert resolve_model(second, env).key == "beta"


def test_several_names_for_one_folder_share_the_first_sorted_name(tmp_path):
    folder = model_folder(tmp_path)
    env = {"BARGE_MODELS": f"zeta={folder},eta={folder}"}
    assert {resolve_model(name, env).key for name in ("zeta", "eta", folder)} == {"eta"}


def test_barge_models_file_takes_paths_and_objects(tmp_path):
    first, second = model_folder(tmp_path, "a"), model_folder(tmp_path, "b")
    models_file = tmp_path / "models.json"
    models_file.write_text(json.dumps({"plain": first, "nested": {"path": second}}))
    env = {"BARGE_MODELS_FILE": str(models_file)}
    assert resolve_model("plain", env) == ModelRef(key="plain", path=first)
    assert resolve_model("nested", env) == ModelRef(key="nested", path=second)
    assert "minilm" in registered_models(env)   # the built-ins stay


def test_barge_models_overrides_the_file_and_the_builtins(tmp_path):
    first, second = model_folder(tmp_path, "a"), model_folder(tmp_path, "b")
    models_file = tmp_path / "models.json"
    models_file.write_text(json.dumps({"m": first}))
    env = {"BARGE_MODELS_FILE": str(models_file), "BARGE_MODELS": f"m={second},minilm={second}"}
    assert resolve_model("m", env).path == second
    assert resolve_model("minilm", env).path == second


def test_a_registered_name_expands_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = model_folder(tmp_path)
    assert resolve_model("mine", {"BARGE_MODELS": "mine=~/my-model"}).path == folder


def test_the_process_environment_is_the_default(tmp_path, monkeypatch):
    folder = model_folder(tmp_path)
    monkeypatch.setenv("BARGE_MODELS", f"from-env={folder}")
    monkeypatch.delenv("BARGE_MODELS_FILE", raising=False)
    assert resolve_model("from-env") == ModelRef(key="from-env", path=folder)


def test_a_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^model: folder .*empty has no config.json"):
        resolve_model(str(tmp_path / "empty"), env={})


def test_a_registered_name_without_config_json_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^model: registered model 'broken' points to .* neither a folder with config.json nor a .gguf file"):
        resolve_model("broken", {"BARGE_MODELS": f"broken={tmp_path / 'empty'}"})


def test_an_unknown_name_is_refused_listing_the_known_names(tmp_path):
    folder = model_folder(tmp_path)
    with pytest.raises(ValueError) as caught:
        resolve_model("no-such-model", {"BARGE_MODELS": f"mine={folder}"})
    message = str(caught.value)
    assert message.startswith("model: 'no-such-model' is neither a registered model")
    assert "known: SmolLM2-135M-Instruct, all-MiniLM-L6-v2, mine, minilm, smollm2" in message


def test_a_file_is_not_a_model_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="neither a registered model"):
        resolve_model(str(tmp_path / "config.json"), env={})


@pytest.mark.parametrize("entry", ["justaname", "=/some/path", "name=", " = "])
def test_a_malformed_barge_models_entry_is_refused(entry):
    with pytest.raises(ValueError, match=r"^BARGE_MODELS: entry .* is not name=path"):
        registered_models({"BARGE_MODELS": f"ok=/x,{entry}"})


@pytest.mark.parametrize("config, files, mode", [
    ({"model_type": "bert", "architectures": ["BertModel"]}, (), "embed"),
    ({"model_type": "modernbert", "architectures": ["ModernBertModel"]}, (), "embed"),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, (), "generate"),
    # Qwen3-Embedding names Qwen3ForCausalLM; its sentence-transformers files say it embeds
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, ("modules.json",), "embed"),
])
def test_model_mode_from_the_folder(tmp_path, config, files, mode):
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name in files:
        (tmp_path / name).write_text("[]")
    assert model_mode(str(tmp_path)) == mode
