"""What a generate shard records beyond its tokens, and a job's sum of it (issues 47 and 44):

    prefill    prompt tokens of the rows the engine ran, those of them served from the
               prefix cache, and the lower bound: the distinct prefix tokens of the prompts
               (engine/generate/prefix_order.py), the fewest any order computes from an
               empty cache
    adapters   a job with LoRA adapters (JobSpec.adapter, params.adapter_column): per
               adapter location (None: the base model) the rows the engine ran and their
               prompt and generated tokens

A committed shard stores its GenerateUsage as JSON (barge_shards.generate_usage, migration
0020; queueing.usage builds it); the job report (jobs.report), `barge report` and the
manifest's stats show the sum over the job's shards. A shard committed before 0020 stored
none and is left out of the sum.

NOTE: the lower bound is each shard's (on the worker's synchronous path, each engine
call's), summed. The engine's prefix cache outlives a shard, so a template computed for one
shard serves the next one's rows: a job of many shards, or a job after another with the
same template, can compute fewer prompt tokens than the summed bound. Against one shard on
an empty cache the bound holds, and the engine comes within a KV block per row of it. Rows
the engine refused (an adapter that cannot be read) count in neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from storage.redaction import redact_url


@dataclass(frozen=True)
class Prefill:
    num_prompt_tokens: int = 0           # prompt tokens of the rows the engine ran
    num_cached_tokens: int = 0           # of them, served from the prefix cache when the row was first admitted
    num_lower_bound: int | None = None   # distinct prefix tokens of the prompts; None: not measured for
                                         # every shard (the worker's feed measures it with order_by_prefix on)

    @property
    def num_computed_tokens(self) -> int:
        """Prompt tokens the engine computed. NOTE: a preempted row's prompt computed again
        when it is readmitted is not counted here (a row reports the cache hits of its first
        admission only); the worker's metric barge_prefill_tokens_total counts it."""
        return self.num_prompt_tokens - self.num_cached_tokens

    def __add__(self, other: "Prefill") -> "Prefill":
        bounds = (self.num_lower_bound, other.num_lower_bound)
        return Prefill(self.num_prompt_tokens + other.num_prompt_tokens,
                       self.num_cached_tokens + other.num_cached_tokens, None if None in bounds else sum(bounds))


@dataclass(frozen=True)
class AdapterUsage:
    adapter: str | None                  # its location as the job or the row named it; None: the base model
    num_rows: int = 0                    # rows the engine ran with it, failed ones included
    num_tokens: int = 0                  # their prompt and generated tokens


@dataclass(frozen=True)
class GenerateUsage:
    prefill: Prefill = Prefill()
    adapters: tuple[AdapterUsage, ...] = field(default_factory=tuple)   # a job with adapters: the base's first,
                                                                        # then by location; () for any other job

    def __add__(self, other: "GenerateUsage") -> "GenerateUsage":
        by_adapter = {usage.adapter: usage for usage in self.adapters}
        for usage in other.adapters:
            mine = by_adapter.get(usage.adapter, AdapterUsage(usage.adapter))
            by_adapter[usage.adapter] = AdapterUsage(usage.adapter, mine.num_rows + usage.num_rows,
                                                     mine.num_tokens + usage.num_tokens)
        return GenerateUsage(self.prefill + other.prefill, in_order(by_adapter.values()))

    def to_dict(self) -> dict:
        """As a shard stores it: adapter locations as named (the job's spec holds them too)."""
        prefill = self.prefill
        return {"prefill": {"num_prompt_tokens": prefill.num_prompt_tokens,
                            "num_cached_tokens": prefill.num_cached_tokens,
                            "num_lower_bound": prefill.num_lower_bound},
                "adapters": [{"adapter": usage.adapter, "num_rows": usage.num_rows, "num_tokens": usage.num_tokens}
                             for usage in self.adapters]}

    @classmethod
    def from_dict(cls, stored: dict) -> "GenerateUsage":
        return cls(Prefill(**stored["prefill"]), tuple(AdapterUsage(**usage) for usage in stored["adapters"]))

    def to_report(self) -> dict:
        """As the job report shows it: the computed tokens added, adapter locations redacted."""
        stored = self.to_dict()
        return {"prefill": {**stored["prefill"], "num_computed_tokens": self.prefill.num_computed_tokens},
                **({"adapters": [{**usage, "adapter": shown_adapter(usage["adapter"])} for usage in stored["adapters"]]}
                   if self.adapters else {})}

    def format_lines(self) -> list[str]:
        """`barge report`'s lines: prefill, then rows and tokens per adapter."""
        prefill = self.prefill
        bound = prefill.num_lower_bound
        ratio = f" ({prefill.num_computed_tokens / bound:.2f}x)" if bound else ""
        lines = [f"  prefill: {prefill.num_computed_tokens:,} prompt tokens computed, "
                 f"{prefill.num_cached_tokens:,} from the prefix cache, "
                 + ("lower bound not measured" if bound is None else f"lower bound {bound:,}{ratio}")]
        if self.adapters:
            lines.append("  adapters: " + "; ".join(f"{shown_adapter(usage.adapter) or 'base'} {usage.num_rows:,} rows "
                                                    f"{usage.num_tokens:,} tokens" for usage in self.adapters))
        return lines


def sum_usage(usages: Iterable[GenerateUsage]) -> GenerateUsage | None:
    """The job's usage over its shards'; None when none recorded any."""
    total = None
    for usage in usages:
        total = usage if total is None else total + usage
    return total


def in_order(usages: Iterable[AdapterUsage]) -> tuple[AdapterUsage, ...]:
    """The base model's first, then by location."""
    return tuple(sorted(usages, key=lambda usage: (usage.adapter is not None, usage.adapter or "")))


def shown_adapter(adapter: str | None) -> str | None:
    """An adapter's location as it may be shown (storage.redaction): no credential, no query."""
    return None if adapter is None else redact_url(adapter)
