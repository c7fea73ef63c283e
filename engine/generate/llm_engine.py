"""LLMEngine: the generate mode — prompts in, one GenerationOutput per prompt out.

Two ways in: generate(prompts) runs them to the end and returns their outputs in order;
the streaming API keeps one batch full across a caller's own batches (queueing.generate_feed):
add_request(s) queues prompts and returns their request ids, step() returns the requests
it finished with their outputs, abort(request_id) ends one early.

    step():  schedule -> (step observers) -> run the model -> sample -> advance requests -> collect finished
             -> jump forward (structured output: append the tokens the grammar forces)

Prompts are validated one by one: a bad row becomes an output with .error and the
rest run; only a bad SamplingParams value raises (ValueError naming it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.generate.attention import attention_backend
from engine.generate.block_manager import BlockManager
from engine.generate.cuda_graph import CudaGraphRunner
from engine.generate.grammar import GrammarCache
from engine.generate.kv_cache import FP8_KV_DTYPE, allocate_kv_cache, bytes_per_block, cache_dtype
from engine.generate.model_config import DecoderConfig
from engine.generate.model_loader import load_decoder
from engine.generate.options import GenerateOptions
from engine.generate.outputs import FinishedRequest, GenerationOutput, error_output
from engine.generate.request import Request, RequestStatus
from engine.generate.runner import ModelRunner, ModelRunnerOutput
from engine.generate.sampling_params import SamplingParams
from engine.generate.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine.generate.token_logprobs import TokenPieces, token_logprobs
from engine.generate.tokenizer import TextTokenizer
from engine.gpu_memory import kv_cache_blocks
from engine.layers.packed_linear import pack_linears
from engine.lora.adapter import LoraAdapter
from engine.lora.adapter_config import AdapterError
from engine.lora.manager import AdapterSource, LoraManager, adapters_per_row
from engine.lora.options import LoraOptions
from engine.models.llama import LlamaForCausalLM
from engine.oom import OomGuard, recover_generate_step
from engine.settings import model_settings
from engine.step_stats import StepObserver, StepStats, notify

log = logging.getLogger("barge.engine")

Prompt = str | list[int] | list[dict]     # text, token ids, or chat messages [{"role", "content"}]


@dataclass
class RunStats:
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0              # prompt tokens served by the prefix cache
    num_generated_tokens: int = 0
    num_steps: int = 0
    num_preemptions: int = 0
    seconds: float = 0.0
    num_forced_tokens: int = 0              # of the generated tokens, appended by jump-forward without a step
    num_prefill_tokens: int = 0             # prompt tokens computed (num_prompt_tokens less the cache's hits,
                                            # plus any recomputed after a preemption)
    num_prefill_lower_bound: int = 0        # distinct prefixes of the prompts' tokens (prefix_order.py): the
                                            # fewest prompt tokens any order computes from an empty cache

    @property
    def generated_tokens_per_second(self) -> float:
        return self.num_generated_tokens / self.seconds if self.seconds else 0.0

    @property
    def forward_steps_per_output_token(self) -> float:
        """Each sampled token took a request one forward step; forced tokens took none."""
        if not self.num_generated_tokens:
            return 0.0
        return (self.num_generated_tokens - self.num_forced_tokens) / self.num_generated_tokens


class LLMEngine:
    def __init__(self, model: LlamaForCausalLM, config: DecoderConfig, tokenizer: TextTokenizer,
                 options: GenerateOptions, dtype: torch.dtype, device: torch.device, lora: LoraOptions | None = None):
        """lora: serve LoRA adapters per request (engine/lora/): the model's linears are wrapped
        and the scheduler admits at most lora.max_loras adapters into the running batch."""
        self.config, self.tokenizer, self.options = config, tokenizer, options
        max_model_len = min(options.max_model_len or config.max_model_len, config.max_model_len)
        num_blocks = options.num_blocks or kv_cache_blocks(model, config, options, dtype, device, max_model_len)
        # A request must always fit alone, or preempting everything else would not save it.
        self.max_model_len = min(max_model_len, num_blocks * options.block_size)
        self.block_manager = BlockManager(num_blocks, options.block_size, options.enable_prefix_caching)
        self.scheduler = Scheduler(SchedulerConfig(options.max_num_seqs, options.max_num_batched_tokens,
                                                   self.max_model_len,
                                                   prefix_aware_admission=options.prefix_aware_admission),
                                   self.block_manager)
        # The Triton path gets one dummy block past the real ones: padding rows of a CUDA graph write there.
        use_triton = attention_backend(device) == "triton"
        self.kv_cache_dtype = cache_dtype(options.kv_cache_dtype, dtype)
        check_kv_cache_dtype(self.kv_cache_dtype, use_triton, device)
        kv_cache = allocate_kv_cache(config, num_blocks + int(use_triton), options.block_size, self.kv_cache_dtype,
                                     device)
        log.info("generate engine: KV cache %s, %d blocks of %d tokens (%d tokens, %.1f MiB)",
                 _dtype_name(self.kv_cache_dtype), num_blocks, options.block_size, num_blocks * options.block_size,
                 num_blocks * bytes_per_block(config, options.block_size, self.kv_cache_dtype) / 2**20)
        self.runner = ModelRunner(model, kv_cache, options.block_size, device)
        self.lora = self._serve_adapters(lora, model, dtype, device)
        if use_triton and device.type == "cuda" and not options.enforce_eager:
            self.runner.graphs = CudaGraphRunner(model, kv_cache, options.max_num_seqs,
                                                 -(-self.max_model_len // options.block_size),
                                                 num_blocks * options.block_size, device, capture=True)
            self.runner.graphs.capture_all()
        if options.seed is not None:
            self.runner.sampler.seed = options.seed
        self.eos_token_ids = frozenset(config.eos_token_ids) | _token_set(tokenizer.token_id(tokenizer.eos_token))
        self.token_pieces = TokenPieces(tokenizer, config.vocab_size, self.eos_token_ids)   # built when first asked
        self.last_run = RunStats()
        self.step_observers: list[StepObserver] = []     # called with each step's StepStats
        self._next_request_id = 0
        self._unfinished: dict[int, Request] = {}       # request id -> request, from its queueing to its end
        self._grammars: GrammarCache | None = None      # built with the first structured request
        self._num_forced_since_step = 0                 # jump-forward tokens the next step computes
        self.oom_guard = OomGuard.from_env()            # out-of-memory errors survived (engine.oom)

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype, device: torch.device,
             options: GenerateOptions | None = None, quantization: str | None = None,
             lora: LoraOptions | None = None) -> "LLMEngine":
        model, config, tokenizer = load_decoder(path, dtype, device, quantization)
        options = options or GenerateOptions()
        pack_linears(model, options.max_num_seqs)    # CPU fp32: weights reordered once for oneDNN
        return cls(model, config, tokenizer, options, dtype, device, lora)

    def _serve_adapters(self, lora: LoraOptions | None, model: LlamaForCausalLM, dtype: torch.dtype,
                        device: torch.device) -> LoraManager | None:
        """On CUDA the grouped shrink/expand are Triton kernels; decode steps with LoRA tokens run
        eagerly (the graphs hold base-only steps)."""
        if lora is None:
            return None
        manager = LoraManager(lora, self.config, dtype, device, use_kernels=device.type == "cuda")
        manager.wrap(model)
        self.runner.lora = manager
        self.scheduler.max_loras = lora.max_loras
        return manager

    @property
    def settings(self) -> dict:
        """dtype, device, quantization, and the limits this engine was sized to (the
        effective ones: max_model_len and num_kv_blocks as computed at load), and the
        KV cache's dtype ("float8_e4m3fn" where kv_cache_dtype="fp8")."""
        scheduler, blocks = self.scheduler.config, self.block_manager
        return {**model_settings(self.runner.model), "max_num_seqs": scheduler.max_num_seqs,
                "max_num_batched_tokens": scheduler.max_num_batched_tokens, "max_model_len": self.max_model_len,
                "block_size": blocks.block_size, "num_kv_blocks": blocks.num_blocks,
                "kv_cache_dtype": _dtype_name(self.kv_cache_dtype),
                "enable_prefix_caching": blocks.enable_prefix_caching, **self._graph_settings(),
                **({"num_oom_retries": self.oom_guard.num_ooms} if self.oom_guard.num_ooms else {})}

    def _graph_settings(self) -> dict:
        """On CUDA: the decode batch sizes captured as graphs and the memory they hold."""
        graphs = self.runner.graphs
        if graphs is None or not graphs.is_capturing:
            return {"cuda_graphs": False} if self.runner.device.type == "cuda" else {}
        return {"cuda_graphs": True, "cuda_graph_batch_sizes": graphs.batch_sizes,
                "cuda_graph_memory_bytes": graphs.memory_bytes}

    def generate(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
                 adapter: AdapterSource | list[AdapterSource] | None = None) -> list[GenerationOutput]:
        """adapter: a LoRA adapter (a PEFT folder or fsspec URL) for every prompt, or one per
        prompt (None: the base model); the engine must be built with LoraOptions."""
        started, outputs, requests = time.perf_counter(), [None] * len(prompts), {}
        for row, request_or_error in enumerate(self._queue_all(prompts, params, adapter)):
            if isinstance(request_or_error, str):
                outputs[row] = error_output(request_or_error)
            else:
                requests[row] = request_or_error
        num_steps, num_preemptions = 0, self.scheduler.num_preemptions
        num_prefill_tokens, plan = self.scheduler.num_prefill_tokens, self.scheduler.plan_waiting_by_prefix()
        if self.options.order_by_prefix:
            self.scheduler.order_waiting(plan)
        while self.has_unfinished_requests:
            self._step()
            num_steps += 1
        for row, request in requests.items():
            outputs[row] = self._to_output(request)
        self.last_run = RunStats(len(requests), sum(r.num_prompt_tokens for r in requests.values()),
                                 sum(r.num_cached_tokens for r in requests.values()),
                                 sum(r.num_output_tokens for r in requests.values()), num_steps,
                                 self.scheduler.num_preemptions - num_preemptions, time.perf_counter() - started,
                                 sum(r.num_forced_tokens for r in requests.values()),
                                 self.scheduler.num_prefill_tokens - num_prefill_tokens, plan.num_distinct_tokens)
        return outputs

    def add_requests(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
                     adapter: AdapterSource | list[AdapterSource] | None = None) -> list[int | str]:
        """Queue prompts to be run by step(), checking every SamplingParams first (a bad
        value raises ValueError naming it, before any is queued); per prompt its request
        id, or a string saying why it cannot run (an adapter that does not fit among them).
        adapter: as generate's."""
        return [request if isinstance(request, str) else request.request_id
                for request in self._queue_all(prompts, params, adapter)]

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None,
                    adapter: AdapterSource | None = None) -> int | str:
        """Queue one prompt, as add_requests: its request id, or why it cannot run."""
        return self.add_requests([prompt], params, adapter)[0]

    def step(self) -> list[FinishedRequest]:
        """One step of every unfinished request; the requests it finished (an error row
        among them, its output's .error set), each with its output."""
        return [FinishedRequest(request.request_id, self._to_output(request)) for request in self._step()]

    def abort(self, request_id: int) -> None:
        """End a request before it finishes, freeing its KV blocks; step() never returns
        it. An id that has finished (or was never queued) is ignored."""
        request = self._unfinished.pop(request_id, None)
        if request is not None and not request.is_finished:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)

    @property
    def max_loras(self) -> int | None:
        """Adapters one step can mix (LoraOptions.max_loras); None on an engine without LoRA."""
        return self.lora.options.max_loras if self.lora is not None else None

    def prefetch_adapters(self, sources: list[AdapterSource]) -> None:
        """Read these adapters into the host cache on a background thread, so that the
        requests naming them, queued later, find them read (engine/lora/manager.py). A
        failed read is dropped here and is its requests' error when they are queued."""
        if self.lora is not None:
            self.lora.prefetch(source for source in sources if source is not None)

    @property
    def has_unfinished_requests(self) -> bool:
        """Some request is waiting or running: step() has work."""
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._unfinished)

    def _queue_all(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams] | None,
                   adapter: AdapterSource | list[AdapterSource] | None) -> list[Request | str]:
        rows = zip(prompts, self._params_per_row(prompts, params), adapters_per_row(adapter, len(prompts), self.lora))
        return [self._queue(prompt, row_params, source) for prompt, row_params, source in rows]

    def _queue(self, prompt: Prompt, params: SamplingParams, adapter_source: AdapterSource) -> Request | str:
        """Queue one prompt whose params are checked; a string says why it cannot run."""
        token_ids = self.prompt_token_ids(prompt)
        if isinstance(token_ids, str):
            return token_ids
        if len(token_ids) >= self.max_model_len:
            return (f"prompt has {len(token_ids)} tokens; the context holds {self.max_model_len} "
                    f"and at least one must be left for output")
        adapter = self._adapter(adapter_source)
        if isinstance(adapter, str):
            return adapter
        request = Request(self._next_request_id, token_ids, params, self.eos_token_ids, adapter=adapter)
        if params.structured is not None:
            request.grammar = self.grammars.grammar_for(params.structured)
        if params.prompt_logprobs is not None:
            request.prompt_logprobs.append(None)     # the first prompt token has nothing before it
        self._next_request_id += 1
        self.scheduler.add_request(request)
        self._unfinished[request.request_id] = request
        return request

    def _adapter(self, source: AdapterSource) -> LoraAdapter | str | None:
        """The row's adapter, loaded (or kept from an earlier row), or why it cannot serve."""
        if source is None:
            return None
        try:
            return self.lora.adapter(source)
        except AdapterError as error:
            return str(error)

    def _step(self) -> list[Request]:
        """One step; the requests it finished, no longer unfinished."""
        finished = self._run_step()
        for request in finished:
            self._unfinished.pop(request.request_id, None)
        return finished

    def _run_step(self) -> list[Request]:
        failed = self._end_failed_grammars()
        scheduler_output = self.scheduler.schedule()
        if not scheduler_output.requests:      # only requests whose grammar is compiling are left
            self._wait_for_a_grammar()
            return failed
        if self.step_observers:
            notify(self.step_observers, self._step_stats(scheduler_output))
        try:
            self.oom_guard.check(scheduler_output.total_num_scheduled_tokens)
            runner_output = self.runner.execute(scheduler_output)
        except torch.OutOfMemoryError as error:   # run again under lower budgets (engine.oom)
            return failed + recover_generate_step(self, scheduler_output, error)
        self._record_logprobs(scheduler_output, runner_output)
        finished = self.scheduler.update_from_output(scheduler_output, runner_output.sampled_token_ids)
        finished += self._apply_stop_strings(scheduler_output, runner_output)
        self._jump_forward(scheduler_output, runner_output)
        return failed + finished

    @property
    def grammars(self) -> GrammarCache:
        if self._grammars is None:
            self._grammars = GrammarCache(self.tokenizer, self.config.vocab_size, self.eos_token_ids)
        return self._grammars

    def _end_failed_grammars(self) -> list[Request]:
        """Requests whose constraint did not compile against this vocabulary end with that error."""
        failed = [r for r in self.scheduler.waiting if r.grammar is not None and r.grammar.is_ready and r.grammar.error]
        for request in failed:
            request.error = request.grammar.error
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        return failed

    def _wait_for_a_grammar(self) -> None:
        compiling = next((r.grammar for r in self.scheduler.waiting if not r.is_ready), None)
        if compiling is not None:
            compiling.wait()

    def _jump_forward(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        """Append what each constrained request's grammar forces next (the keys and punctuation
        of a schema): the next step computes those tokens with the one after them, in one pass.
        Only requests that ask for it (SamplingParams.jump_forward, else the engine's option);
        requests asking for logprobs are left out: forced tokens have no distribution to report.
        One sampled token is always left before max_tokens or the context limit, so that where
        a request stops stays the scheduler's decision."""
        self._num_forced_since_step = 0
        for request in scheduler_output.requests:
            if (not self._jumps_forward(request) or request.is_finished or request.params.logprobs is not None
                    or request.request_id not in runner_output.sampled_token_ids):
                continue
            room = min(request.params.max_tokens - request.num_output_tokens,
                       self.max_model_len - request.num_tokens) - 1
            forced = request.grammar.forced_tokens()[:max(room, 0)]
            request.append_forced(forced)
            self._num_forced_since_step += len(forced)

    def _jumps_forward(self, request: Request) -> bool:
        asked = request.params.jump_forward
        return request.grammar is not None and (self.options.enable_jump_forward if asked is None else asked)

    def _step_stats(self, output: SchedulerOutput) -> StepStats:
        """The batch as scheduled: blocks are counted once this step's are allocated."""
        limits, blocks = self.scheduler.config, self.block_manager
        return StepStats(num_seqs=len(output.requests), num_tokens=output.total_num_scheduled_tokens,
                         max_num_seqs=limits.max_num_seqs, max_num_tokens=limits.max_num_batched_tokens,
                         num_kv_blocks_used=blocks.num_blocks - blocks.num_free_blocks, num_kv_blocks=blocks.num_blocks,
                         num_preemptions=len(output.preempted), num_prefix_cache_hit_tokens=output.num_cached_tokens,
                         num_forced_tokens=self._num_forced_since_step, num_prefill_tokens=output.num_prefill_tokens)

    def _record_logprobs(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        for request in scheduler_output.requests:
            request.prompt_logprobs.extend(runner_output.prompt_logprobs.get(request.request_id, ()))
            if request.request_id in runner_output.logprobs:
                request.logprobs.append(runner_output.logprobs[request.request_id])

    def _apply_stop_strings(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[Request]:
        """Stop strings need text, so they are checked here rather than in the scheduler."""
        finished = []
        for request in scheduler_output.requests:
            if not request.params.stop or request.request_id not in runner_output.sampled_token_ids:
                continue
            text = self.tokenizer.decode(request.output_token_ids)
            cuts = [index for index in (text.find(stop) for stop in request.params.stop) if index >= 0]
            if not cuts:
                continue
            request.stop_text_len = min(cuts)
            if request.is_finished:         # max_tokens was reached by the very token that completed the stop
                request.status = RequestStatus.FINISHED_STOPPED
            else:
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
                finished.append(request)
        return finished

    def prompt_token_ids(self, prompt: Prompt) -> list[int] | str:
        """The prompt's token ids, or why there are none."""
        if prompt is None:
            return "prompt is null"
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else "prompt is empty"
        if not isinstance(prompt, (list, tuple)):
            return f"prompt is not text, token ids or messages (got {type(prompt).__name__})"
        if not prompt:
            return "prompt is empty"
        if any(isinstance(item, dict) for item in prompt):
            return self._chat_token_ids(list(prompt))
        if all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.config.vocab_size for t in prompt):
            return list(prompt)
        return f"prompt token ids must be ints in 0..{self.config.vocab_size - 1}"

    def _chat_token_ids(self, messages: list) -> list[int] | str:
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in messages):
            return "chat messages must each be {'role': str, 'content': str}"
        try:
            text = self.tokenizer.apply_chat_template(messages)
        except ValueError as error:
            return str(error)
        # The template already wrote the special tokens (BOS and all) it wants.
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _params_per_row(self, prompts: list, params) -> list[SamplingParams]:
        if params is None:
            params = SamplingParams()
        rows = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(rows) != len(prompts):
            raise ValueError(f"params has {len(rows)} entries for {len(prompts)} prompts")
        for row in rows:
            if not isinstance(row, SamplingParams):
                raise ValueError(f"params must be SamplingParams, got {type(row).__name__}")
            self._check_params(row)
        return list(rows)

    def _check_params(self, params: SamplingParams) -> None:
        vocab = self.config.vocab_size
        if any(token_id >= vocab for token_id in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be below the vocabulary size {vocab}, got {params.stop_token_ids}")
        for name in ("logprobs", "prompt_logprobs", "top_k"):
            if (getattr(params, name) or 0) > vocab:
                raise ValueError(f"{name} must be at most the vocabulary size {vocab}, got {getattr(params, name)}")

    def _to_output(self, request: Request) -> GenerationOutput:
        """A finished (or aborted) request as the GenerationOutput generate would return."""
        if request.error is not None:
            return error_output(request.error, request.num_prompt_tokens)
        text = self.tokenizer.decode(request.output_token_ids)
        if request.stop_text_len is not None:
            text = text[:request.stop_text_len]
        params = request.params
        return GenerationOutput(
            token_ids=request.output_token_ids, text=text, finish_reason=request.status.finish_reason,
            num_prompt_tokens=request.num_prompt_tokens, num_cached_tokens=request.num_cached_tokens,
            logprobs=request.logprobs if params.logprobs is not None else None,
            prompt_logprobs=request.prompt_logprobs if params.prompt_logprobs is not None else None,
            token_logprobs=self._token_logprobs(request))

    def _token_logprobs(self, request: Request) -> list | None:
        params = request.params
        if params.logprobs is None:
            return None
        ending = (self.eos_token_ids | frozenset(params.stop_token_ids)
                  if request.status.finish_reason == "stop" and not params.ignore_eos else frozenset())
        return token_logprobs(request.logprobs, request.output_token_ids, params.logprobs, self.token_pieces, ending)


def check_kv_cache_dtype(kv_dtype: torch.dtype, use_triton: bool, device: torch.device) -> None:
    """An fp8 cache where the paged kernel cannot read it is refused at construction:
    Triton widens E4M3 on compute capability 8.9 (Ada, Hopper) and later only."""
    if kv_dtype != FP8_KV_DTYPE or not use_triton or device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        raise ValueError(f"kv_cache_dtype='fp8' needs a GPU of compute capability 8.9 or later for the paged "
                         f"attention kernel; {torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _token_set(token_id: int | None) -> frozenset[int]:
    return frozenset() if token_id is None else frozenset((token_id,))
