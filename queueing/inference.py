"""One engine call for a chunk of a shard's rows, per mode, with the job's params built
as that mode's param object (EmbedParams, SamplingParams, TranscribeParams,
ClassifyParams, ScoreParams: torch-free, each checking its values and raising ValueError
naming a bad one).

Sampling in a generate job is reproducible row by row: with a job `seed`, each row's
seed derives from it and the row's id, so a re-run of a shard (after a crash, or a
retry) writes the same text, whatever batch the row lands in."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.embed.outputs import EmbeddingOutput
from engine.embed.params import EmbedParams
from engine.generate.sampling_params import SamplingParams
from engine.whisper.params import TranscribeParams
from jobs.records import JobRecord
from jobs.row_params import row_adapters, shared_params
from jobs.scoring import classify_params, score_params
from jobs.validate import sampling_kwargs

if TYPE_CHECKING:
    from engine.engine import Engine


def infer(engine: Engine, job: JobRecord, ids: pa.Array, inputs: list, row_params: list[dict] | None = None) -> list:
    """Outputs in input order, each with .error set for a bad row instead of raising.
    `row_params`: each row's params over the job's (jobs.row_params), or None."""
    spec = job.spec
    if spec.mode == "embed":
        return encode_rows(engine, embed_params(spec.params), inputs, row_params)
    if spec.mode == "generate":
        return engine.generate(inputs, row_sampling_params(spec.params, ids, row_params),
                               adapter=row_adapters(spec.adapter, row_params, len(inputs)))
    if spec.mode == "transcribe":     # audio bytes or paths/URLs; bad audio is a row's error
        return engine.transcribe(inputs, TranscribeParams(**spec.params))
    if spec.mode == "classify":       # texts, pairs or chats; a null row is a row's error
        return engine.classify(inputs, classify_params(spec.params))
    if spec.mode == "score":
        return score_rows(engine, spec.params, inputs)
    raise ValueError(f"mode {spec.mode!r} has no engine in this worker")


def score_rows(engine: Engine, params: dict, inputs: list) -> list:
    """ScoreOutputs in input order: conversations through a reward model (params.chat), else
    (query, document) pairs; an error row's None input is a pair of nulls."""
    if params.get("chat"):
        return engine.score_chats(inputs, score_params(params))
    pairs = [pair or (None, None) for pair in inputs]
    return engine.score([query for query, _ in pairs], [document for _, document in pairs], score_params(params))


def embed_params(params: dict) -> EmbedParams:
    """An embed job's params (its per-row column left out) as the engine's EmbedParams."""
    return EmbedParams(**shared_params(params))


def encode_rows(engine: Engine, params: EmbedParams, inputs: list, row_params: list[dict] | None = None,
                ) -> list[EmbeddingOutput]:
    """Embed outputs in input order. Rows that ask their own `dimensions` run in one engine
    call per width, each exactly as a job with that `dimensions` would (truncated, then
    normalised: engine.layers.pooling.finish); a width the model has not is the row's error.

    NOTE: one call per width, not one forward for all with the widths cut after it, so
    that a row's vector is the very one a job-level `dimensions` writes. A chunk mixing k
    widths runs k smaller batches of the same tokens: 256 MiniLM rows of three widths
    interleaved took 1.01x the time of one width on CPU (best of 6, 2 cores)."""
    if not row_params or not any(row_params):
        return engine.encode(inputs, params)
    widths = [override.get("dimensions", params.dimensions) for override in row_params]
    outputs: list = [None] * len(inputs)
    for width in dict.fromkeys(widths):   # the distinct widths, in order of first row
        rows = [row for row, row_width in enumerate(widths) if row_width == width]
        try:
            width_params = replace(params, dimensions=width)
            width_params.check(engine.embedding_dim)
        except ValueError as error:   # the engine's own refusal of this width, as the rows' error
            results = [EmbeddingOutput(None, 0, str(error))] * len(rows)
        else:
            results = engine.encode([inputs[row] for row in rows], width_params)
        for row, result in zip(rows, results):
            outputs[row] = result
    return outputs


def row_seed(job_seed: int, row_id: object) -> int:
    digest = hashlib.sha256(f"{job_seed}:{row_id!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1   # a non-negative 63-bit integer


def row_sampling_params(params: dict, ids: pa.Array, row_params: list[dict] | None = None) -> list[SamplingParams]:
    """A job's sampling params for each of these rows (each with its own seed, if the job or
    the row has one), a row's own params (jobs.row_params) over the job's; ValueError
    naming the parameter the engine refuses."""
    overrides = row_params or [{}] * len(ids)
    shared = None     # the job's own params, built once for the rows that add nothing to them
    sampling = []
    for row_id, override in zip(ids.to_pylist(), overrides):
        kwargs = sampling_kwargs({**params, **override})
        seed = kwargs.pop("seed", None)
        if seed is not None:
            sampling.append(SamplingParams(**kwargs, seed=row_seed(seed, row_id)))
        elif override:
            sampling.append(SamplingParams(**kwargs))
        else:
            shared = shared or SamplingParams(**kwargs)
            sampling.append(shared)
    return sampling
