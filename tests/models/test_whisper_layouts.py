"""The same real Whisper tiny.en weights in the three layouts Barge loads: the packaged
CTranslate2 folder, a Hugging Face folder written by transformers, and an
openai-whisper `.pt` checkpoint. transformers' WhisperForConditionalGeneration is the
reference for the decoder's logits; every layout must transcribe identically."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
import transformers

from engine import Engine
from engine.whisper.loader import load_checkpoint
from engine.whisper.request import DecodeOptions, DecodeRequest
from tests.support.speech import SENTENCES, espeak
from tests.support.whisper_models import one_thread, tiny_en_path


# openai-whisper names -> Hugging Face names, written out here rather than inverted from
# the loader, so the HF folder does not depend on the code under test.
OPENAI_TO_HF = (
    (r"^encoder\.positional_embedding$", "model.encoder.embed_positions.weight"),
    (r"^decoder\.positional_embedding$", "model.decoder.embed_positions.weight"),
    (r"^decoder\.token_embedding\.", "model.decoder.embed_tokens."),
    (r"^encoder\.ln_post\.", "model.encoder.layer_norm."), (r"^decoder\.ln\.", "model.decoder.layer_norm."),
    (r"^encoder\.conv", "model.encoder.conv"), (r"^(encoder|decoder)\.blocks\.", r"model.\1.layers."),
    (r"\.cross_attn_ln\.", ".encoder_attn_layer_norm."), (r"\.attn_ln\.", ".self_attn_layer_norm."),
    (r"\.cross_attn\.", ".encoder_attn."), (r"\.attn\.", ".self_attn."),
    (r"\.query\.", ".q_proj."), (r"\.key\.", ".k_proj."), (r"\.value\.", ".v_proj."), (r"\.out\.", ".out_proj."),
    (r"\.mlp\.0\.", ".fc1."), (r"\.mlp\.2\.", ".fc2."), (r"\.mlp_ln\.", ".final_layer_norm."),
)


def _hf_name(name: str) -> str:
    for pattern, replacement in OPENAI_TO_HF:
        name = re.sub(pattern, replacement, name)
    return name


@pytest.fixture(scope="module")
def checkpoint():
    return load_checkpoint(tiny_en_path())


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    c = checkpoint.config
    config = transformers.WhisperConfig(
        vocab_size=c.n_vocab, num_mel_bins=c.n_mels, d_model=c.n_audio_state, encoder_layers=c.n_audio_layer,
        encoder_attention_heads=c.n_audio_head, decoder_layers=c.n_text_layer, decoder_attention_heads=c.n_text_head,
        encoder_ffn_dim=4 * c.n_audio_state, decoder_ffn_dim=4 * c.n_text_state, max_source_positions=c.n_audio_ctx,
        max_target_positions=c.n_text_ctx, decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256)
    model = transformers.WhisperForConditionalGeneration(config)
    state = {_hf_name(name): tensor.float() for name, tensor in checkpoint.state_dict.items()}
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def clip():
    return espeak(SENTENCES[4])


def test_decoder_logits_match_transformers(checkpoint, hf_model, clip):
    with one_thread():
        asr = Engine.from_pretrained(tiny_en_path(), mode="transcribe")
        decoder = asr.transcriber.decoder
        request = DecodeRequest(0, lambda: clip, DecodeOptions(with_timestamps=False), "en")
        decoder.add(request)
        while decoder.has_work:
            decoder.step()
        tokens = request.fed + [asr.transcriber.tokenizer.eot]
        features = decoder.encode([clip])
        ours = []
        cache = decoder.cache
        decoder.model.decoder.write_cross(cache, [0], features)
        with torch.inference_mode():
            for position, token in enumerate(tokens[:-1]):
                ours.append(decoder.model.decoder.step(torch.tensor([token]), torch.tensor([position]), cache)[0])
            mel = torch.zeros(1, 480_000)
            mel[0, :len(clip)] = torch.from_numpy(clip)
            from engine.whisper.mel import log_mel
            features_in = log_mel(mel, 80)
            features_in[:, :, len(clip) // 160:] = 0     # the window as Barge (and openai's transcribe) pads it
            theirs = hf_model(input_features=features_in, decoder_input_ids=torch.tensor([tokens[:-1]])).logits[0]
    assert asr.transcriber.tokenizer.decode(request.output).strip().lower().startswith("please close")
    assert torch.allclose(torch.stack(ours), theirs, atol=2e-3), float((torch.stack(ours) - theirs).abs().max())
    assert torch.equal(torch.stack(ours).argmax(-1), theirs.argmax(-1))


def test_hf_folder_and_openai_pt_transcribe_like_the_ctranslate2_folder(checkpoint, hf_model, clip, tmp_path):
    hf_folder = tmp_path / "whisper-tiny.en-hf"
    hf_model.save_pretrained(hf_folder)
    (hf_folder / "tokenizer.json").write_bytes((checkpoint.folder / "tokenizer.json").read_bytes())
    ct2_config = json.loads((checkpoint.folder / "config.json").read_text())
    (hf_folder / "generation_config.json").write_text(json.dumps(
        {"suppress_tokens": ct2_config["suppress_ids"], "begin_suppress_tokens": ct2_config["suppress_ids_begin"]}))
    pt_path = tmp_path / "tiny.en.pt"
    dims = {field.name: getattr(checkpoint.config, field.name) for field in dataclasses.fields(checkpoint.config)
            if field.name.startswith("n_")}
    torch.save({"dims": dims, "model_state_dict": checkpoint.state_dict}, pt_path)
    with one_thread():
        results = [Engine.from_pretrained(path, mode="transcribe").transcribe([clip])[0]
                   for path in (tiny_en_path(), hf_folder, pt_path)]
    assert results[0].text and results[0].text == results[1].text == results[2].text
    assert results[0].segments == results[1].segments == results[2].segments
