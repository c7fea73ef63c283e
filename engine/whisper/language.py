"""Language detection per file, as openai-whisper's transcribe does it: before decoding,
the file's first 30 s (its log-Mel over the padded audio, not the zeros a decoding window
gets past its end) through the encoder, one decoder step on <|startoftranscript|>, and
a softmax over the language tokens alone.

A file's every chunk then decodes in the detected language, and the file reports the
probability of it (TranscriptionOutput.language_probability). Files are detected in
batches of the decoder's encoder batch size.
"""

from __future__ import annotations

import torch

from engine.whisper.alignment import decoder_pass
from engine.whisper.audio import Audio
from engine.whisper.config import N_SAMPLES_PER_CHUNK


@torch.inference_mode()
def detect_languages(decoder, audios: list[Audio], batch_size: int) -> list[dict[str, float]]:
    """{language code: probability} of each file, from its first 30 s."""
    tokenizer = decoder.tokenizer
    codes, ids = list(tokenizer.language_ids), list(tokenizer.language_ids.values())
    results = []
    for first in range(0, len(audios), batch_size):
        batch = [audio.samples(0, N_SAMPLES_PER_CHUNK) for audio in audios[first:first + batch_size]]
        features = decoder.encode(batch, zeros_past_end=False)
        logits, _ = decoder_pass(decoder.model, [[tokenizer.sot]] * len(batch), features, heads=[])
        probs = logits[:, 0, ids].float().softmax(dim=-1).tolist()
        results += [dict(zip(codes, row)) for row in probs]
    return results
