"""How much engine work a row group holds, estimated from its footer alone.

The planner sizes shards by work, not rows: a shard of 2048 tweets and a shard of
2048 books are not the same job. The only cost it may pay is the footer, so the
estimate comes from the input column chunk's uncompressed byte size, which every
Parquet writer records per row group.

    text  (string column)  -> tokens        ~ uncompressed bytes / BYTES_PER_TOKEN
    audio (binary column)  -> audio seconds ~ uncompressed bytes / AUDIO_BYTES_PER_SECOND

NOTE: these are estimates, good to a small factor, which is all shard sizing needs.
The uncompressed size of a string chunk counts each value's bytes plus a 4-byte
length (about one token a row, close to the special tokens the engine adds). A
dictionary-encoded chunk of many repeated values is smaller than the text it stands
for, so the estimate is low there; the row limit still bounds such a shard.
"""

from __future__ import annotations

import pyarrow as pa

# UTF-8 English averages about 4 bytes per BPE token (GPT-2/Llama/BERT vocabularies).
BYTES_PER_TOKEN = 4
# A hook, not a measurement: compressed speech (MP3/Opus/FLAC mixes) runs at about
# 16 kB/s; 16 kHz 16-bit WAV is 32 kB/s. Decoding headers would be exact but costs
# reading the data, which planning must not do.
AUDIO_BYTES_PER_SECOND = 16_000

TOKENS = "tokens"
AUDIO_SECONDS = "audio_seconds"


def work_unit(column_type: pa.DataType) -> str:
    """The unit of work for an input column of this type: tokens for text, else audio seconds."""
    if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
        return TOKENS
    return AUDIO_SECONDS


def estimate_work(unit: str, uncompressed_bytes: int) -> int:
    """Work in `unit` for a column chunk of `uncompressed_bytes`; at least 1 for a non-empty chunk."""
    if unit == TOKENS:
        per_unit = BYTES_PER_TOKEN
    elif unit == AUDIO_SECONDS:
        per_unit = AUDIO_BYTES_PER_SECOND
    else:
        raise ValueError(f"work unit {unit!r} is not {TOKENS!r} or {AUDIO_SECONDS!r}")
    if uncompressed_bytes <= 0:
        return 0
    return max(1, -(-uncompressed_bytes // per_unit))
