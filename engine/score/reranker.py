"""YesNoReranker: a causal LM scores (query, document) pairs, Qwen3-Reranker style, through
Barge's generate engine: the pair's prompt (engine/score/rerank_prompt.py) is prefilled,
and the score is P(yes) = softmax([logit(no), logit(yes)])[1] at its last position.

    pairs -> prompts -> rounds grouped by query -> LLMEngine steps (prefill only) -> P(yes) per pair

The generate engine brings its paged KV cache, chunked prefill, continuous batching and
prefix cache; YesNoRunner replaces its sampling with the two-token softmax, and each
request ends after that one position (max_tokens=1, no decode step ever runs). Run in
rounds (engine/score/query_groups.py), a query's pairs find its instruction + query
prompt in the prefix cache and compute only their document's tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.generate.llm_engine import LLMEngine
from engine.generate.options import GenerateOptions
from engine.generate.outputs import FinishedRequest
from engine.generate.runner import ModelRunner, ModelRunnerOutput
from engine.generate.sampling_params import SamplingParams
from engine.generate.scheduler import SchedulerOutput
from engine.score.outputs import ScoreOutput
from engine.score.params import ScoreParams
from engine.score.query_groups import plan_rounds
from engine.score.rerank_prompt import RerankPrompt
from engine.score.rows import pair_error
from engine.step_stats import StepStats

SCORE_ONLY = SamplingParams(max_tokens=1, temperature=0.0)   # one position scored, then the request ends


@dataclass
class RerankStats:
    """One score_pairs call."""

    num_pairs: int = 0                  # pairs that reached the engine
    num_prompt_tokens: int = 0          # their prompts' tokens, all of them
    num_computed_tokens: int = 0        # tokens the forward passes computed (prefill); the rest came from the
                                        # prefix cache (more than num_prompt_tokens only after preemptions)
    num_steps: int = 0
    seconds: float = 0.0

    @property
    def num_cached_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_computed_tokens


class YesNoRunner(ModelRunner):
    """The generate engine's ModelRunner, scoring instead of sampling: at each request's
    last prompt position, P(yes) under a softmax over the logits of (no, yes)."""

    def __init__(self, runner: ModelRunner):
        super().__init__(runner.model, runner.kv_cache, runner.block_size, runner.device)
        self.candidate_ids = (0, 0)                 # (no, yes) token ids of the call in progress
        self.scores: dict[int, float] = {}          # request_id -> P(yes), until the caller takes it

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        batch = self.prepare(output)
        hidden = self.model(batch.input_ids, batch.positions, batch.meta, self.kv_cache)
        logits = self.model.compute_logits(hidden[batch.logit_rows[:len(batch.sample_rows)]])
        probabilities = torch.softmax(logits[:, list(self.candidate_ids)], dim=-1)[:, 1]
        request_ids = [request.request_id for request in batch.sample_requests]
        self.scores.update(zip(request_ids, probabilities.tolist()))
        # The request takes "yes" as its one output token and ends (max_tokens=1).
        return ModelRunnerOutput({request_id: self.candidate_ids[1] for request_id in request_ids}, {}, {})


class YesNoReranker:
    def __init__(self, llm: LLMEngine):
        self.llm = llm
        self.runner = YesNoRunner(llm.runner)
        llm.runner = self.runner
        # The prompt writes its own special tokens; one position is left for the scored token.
        self.prompt = RerankPrompt(lambda text: llm.tokenizer.encode(text, add_special_tokens=False),
                                   llm.max_model_len - 1)
        self.last_run = RerankStats()
        llm.step_observers.append(self._count_step)

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype, device: torch.device, options: GenerateOptions | None = None,
             quantization: str | None = None) -> "YesNoReranker":
        """A model folder or .gguf file of a causal LM (engine/generate/model_loader.py).
        No CUDA graphs: they replay decode steps, and a scored request never decodes."""
        options = replace(options or GenerateOptions(), enforce_eager=True)
        return cls(LLMEngine.load(path, dtype, device, options, quantization))

    @property
    def settings(self) -> dict:
        return self.llm.settings

    @property
    def step_observers(self) -> list:
        return self.llm.step_observers

    @property
    def max_wave_tokens(self) -> int:
        """Half the KV cache: what a wave of queries may hold (engine/score/query_groups.py)."""
        blocks = self.llm.block_manager
        return max(1, blocks.num_blocks * blocks.block_size // 2)

    def score_pairs(self, queries: Sequence, documents: Sequence, params: ScoreParams) -> list[ScoreOutput]:
        """P(yes) per pair, in input order; a bad pair gets .error. With
        params.group_by_query the pairs of one (instruction, query) run together, after
        one of them has put its prompt in the prefix cache; else in input order."""
        if len(queries) != len(documents):
            raise ValueError(f"{len(queries)} queries for {len(documents)} documents")
        self.runner.candidate_ids = (self._token_id("no_token", params.no_token),
                                     self._token_id("yes_token", params.yes_token))
        started, self.last_run = time.perf_counter(), RerankStats()
        outputs: list[ScoreOutput | None] = [None] * len(queries)
        prompts: dict[int, list[int]] = {}
        for row, (query, document) in enumerate(zip(queries, documents)):
            prompt = pair_error(query, document) or self.prompt.token_ids(params.instruction, query, document,
                                                                         params.truncate)
            if isinstance(prompt, str):
                outputs[row] = ScoreOutput(None, 0, prompt)
            else:
                prompts[row] = prompt
        rows = list(prompts)
        if params.group_by_query:
            rounds = plan_rounds([queries[row] for row in rows], [len(prompts[row]) for row in rows],
                                 self.max_wave_tokens, self.llm.scheduler.config.max_num_seqs)
            rounds = [[rows[index] for index in round_rows] for round_rows in rounds]
        else:
            rounds = [rows]
        for round_rows in rounds:
            self._run_round(round_rows, prompts, outputs)
        self.last_run.seconds = time.perf_counter() - started
        return outputs

    def _run_round(self, rows: list[int], prompts: dict[int, list[int]], outputs: list[ScoreOutput | None]) -> None:
        """Queue the rows' prompts and step the engine until every one is scored."""
        row_of: dict[int, int] = {}
        for row in rows:
            request_id = self.llm.add_request(prompts[row], SCORE_ONLY)
            if isinstance(request_id, str):
                outputs[row] = ScoreOutput(None, len(prompts[row]), request_id)
            else:
                row_of[request_id] = row
        while self.llm.has_unfinished_requests:
            for finished in self.llm.step():
                outputs[row_of[finished.request_id]] = self._output(finished)

    def _output(self, finished: FinishedRequest) -> ScoreOutput:
        num_prompt_tokens = finished.output.num_prompt_tokens
        self.last_run.num_pairs += 1
        self.last_run.num_prompt_tokens += num_prompt_tokens
        score = self.runner.scores.pop(finished.request_id, None)
        if finished.output.error is not None or score is None:
            return ScoreOutput(None, num_prompt_tokens, finished.output.error or "the engine ended the pair unscored")
        return ScoreOutput(score, num_prompt_tokens)

    def _token_id(self, name: str, token: str) -> int:
        token_id = self.llm.tokenizer.token_id(token)
        if token_id is None:
            raise ValueError(f"{name} {token!r} is not a token of this model's vocabulary")
        return token_id

    def _count_step(self, stats: StepStats) -> None:
        self.last_run.num_computed_tokens += stats.num_tokens
        self.last_run.num_steps += 1
