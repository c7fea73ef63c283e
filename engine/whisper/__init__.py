"""Whisper transcription: audio in, timestamped text out (Engine mode "transcribe").

    audio.py       decode (PyAV) + resample to 16 kHz mono, silence kept as nothing
    vad.py         energy VAD → chunks of <= 30 s (chunk.py: pieces of a file, times mapped back)
    mel.py         batched log-Mel features in torch
    loader.py      CTranslate2 / Hugging Face / openai-whisper .pt → one state dict (ct2.py: model.bin)
    model.py       encoder + slot-stepped decoder (kv_cache.py: per-request self/cross K/V)
    tokenizer.py   special ids, text from ids
    logit_rules.py openai-whisper's suppression and timestamp rules
    scheduler.py   continuous batching: who runs in which slot
    decoding.py    ChunkDecoder.step(): admit → encode → decode one token each → sample → release
    decoder_step.py the decoder step: eager on CPU; static buckets replayed as CUDA graphs on CUDA
    segments.py    timestamp tokens → segments
    transcriber.py long-form: files → chunks → decoder → quality fallback → stitched transcripts
    build.py       load_transcriber (the FP8 hook is here)
"""
