"""LogitRules against openai-whisper's own filters (SuppressBlank, SuppressTokens,
ApplyTimestampRules) on batches of rows in every timestamp state: the same logits masked.
The rules decide the timestamps' last rule for all rows at once (one read of the device per
step); the reference loops over rows."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.whisper.config import WhisperConfig
from engine.whisper.logit_rules import LogitRules
from engine.whisper.tokenizer import WhisperTokenizer

decoding = pytest.importorskip("whisper.decoding")

CONFIG = WhisperConfig(n_mels=80, n_audio_ctx=4, n_audio_state=8, n_audio_head=2, n_audio_layer=1, n_vocab=51865,
                       n_text_ctx=6, n_text_state=8, n_text_head=2, n_text_layer=1)
SUPPRESS = (1, 2, 7, 50358, 50359)


def sampled_rows(tokenizer, num_rows: int, length: int, rng) -> list[list[int]]:
    """Each row a mix of text and rising timestamps, ending in either."""
    begin, rows = tokenizer.timestamp_begin, []
    for _ in range(num_rows):
        row, stamp = [], 0
        for _ in range(length):
            if rng.random() < 0.5:
                stamp += int(rng.integers(0, 40))
                row.append(begin + stamp)
            else:
                row.append(int(rng.integers(300, 5000)))
        rows.append(row)
    return rows


@pytest.mark.parametrize("length", [0, 1, 2, 5, 9])
def test_rules_mask_as_openai_whispers_filters(tmp_path, length):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    tokenizer = WhisperTokenizer(CONFIG, tmp_path)
    rules = LogitRules(tokenizer, SUPPRESS, (220, tokenizer.eot))
    rng = np.random.default_rng(length)
    outputs = sampled_rows(tokenizer, 12, length, rng)
    logits = torch.from_numpy(rng.standard_normal((12, CONFIG.n_vocab)).astype(np.float32))
    # Lift the timestamps by a per-row amount so that they outweigh the text in some rows only.
    logits[:, tokenizer.timestamp_begin:] += torch.from_numpy(rng.uniform(-2, 6, (12, 1)).astype(np.float32))
    theirs = logits.clone()
    sot = tokenizer.sot_sequence("en", "transcribe", with_timestamps=True)
    tokens = torch.tensor([sot + row for row in outputs], dtype=torch.long).reshape(12, len(sot) + length)
    reference = SimpleNamespace(no_timestamps=tokenizer.no_timestamps, timestamp_begin=tokenizer.timestamp_begin,
                                eot=tokenizer.eot, encode=lambda text: [220])
    for rule in (decoding.SuppressBlank(reference, len(sot)), decoding.SuppressTokens(SUPPRESS),
                 decoding.ApplyTimestampRules(reference, len(sot), 50)):
        rule.apply(theirs, tokens)
    ours = logits.clone()
    rules.apply(ours, outputs, [True] * 12, [50] * 12)
    assert torch.equal(ours, theirs)
    text_masked = torch.isinf(ours[:, :tokenizer.timestamp_begin]).all(dim=1)
    if length:
        assert 0 < int(text_masked.sum()) < 12          # both outcomes of the last rule were met
