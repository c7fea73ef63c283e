"""LoRA adapters named by OpenAI batch lines: a generate line's `model` is `BASE`,
`BASE:ADAPTER`, or an adapter's name alone, as vLLM's requests name a LoRA module.

    "smollm2"            the base model
    "smollm2:support"    the base model with the adapter registered as `support`
    "support"            the same, its base the one its registration names, else the one
                         generate model this server serves

As vLLM serves `--lora-modules NAME=PATH` and a request names the adapter by NAME, the
adapters a line may name are the deployment's, registered by name in BARGE_LORA_MODULES
("name=location,name=location"; a location is a PEFT adapter folder or fsspec URL, as
JobSpec.adapter takes; "BASE:name=location" also names the base a line naming the adapter
alone runs on, as vLLM's `base_model_name`) on the host that checks the batch (`barge
serve`, or `barge submit` of a local .jsonl). A line names an adapter, never a location: a
client of `barge serve` cannot make the server or its workers read a path of its choosing,
as it cannot name a model path. A served model's name wins over an adapter's.

A batch runs on one base model; its lines' adapters become the job's adapter column
(jobs.row_params: each row's location, null for the base), so lines of many adapters and of
the base run in one job. Each adapter is checked once per batch against the base, as a
job's adapter is at submit (jobs.adapters.check_adapter): one that cannot serve refuses
every line naming it. Its messages name the adapter, never where the server keeps it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from api.json_lines import shown
from jobs.adapters import check_adapter
from jobs.hosts import unshared
from jobs.models import resolve_model
from jobs.settings import Settings
from jobs.spec import JobSpecError

ADAPTER_COLUMN = "adapter"       # a batch's input column of each row's adapter location (null: the base)
SEPARATOR = ":"                  # BASE:ADAPTER; an adapter name holds none, so the last one splits
ENV_NAME = "BARGE_LORA_MODULES"

# (base model name, adapter name, location) -> why the adapter cannot serve on that base, or None
AdapterCheck = Callable[[str, str, str], str | None]


@dataclass(frozen=True)
class LineModel:
    """What a line's `model` names."""

    base: str                    # the model the line runs on (the batch's job's model)
    adapter: str | None = None   # a registered adapter's name; None: the base model alone


class AdapterRefused(ValueError):
    """A line's adapter refused, with the code its LineError carries (param: body.model)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def lora_modules(env: dict[str, str] | None = None) -> dict[str, str]:
    """BARGE_LORA_MODULES: adapter name -> location. ValueError naming a malformed entry."""
    return {name: location for _, name, location in _lora_entries(env)}


def lora_module_bases(env: dict[str, str] | None = None) -> dict[str, str]:
    """Adapter name -> the base model its BARGE_LORA_MODULES entry names (BASE:name=location)."""
    return {name: base for base, name, _ in _lora_entries(env) if base is not None}


def _lora_entries(env: dict[str, str] | None) -> list[tuple[str | None, str, str]]:
    """(base or None, name, location) per BARGE_LORA_MODULES entry."""
    env = os.environ if env is None else env
    entries = []
    for item in filter(None, (part.strip() for part in env.get(ENV_NAME, "").split(","))):
        named, sep, location = (part.strip() for part in item.partition("="))
        base, colon, name = named.rpartition(SEPARATOR)
        if not sep or not name or not location or (colon and not base):
            raise ValueError(f"{ENV_NAME}: entry {item!r} is not name=location or BASE{SEPARATOR}name=location")
        # a path travels to the workers in each row: absolute, as this host reads it
        location = location if "://" in location else os.path.abspath(os.path.expanduser(location))
        entries.append((base or None, name, location))
    return entries


def split_model(model: str, known_models: dict) -> LineModel:
    """A served model's name is the base alone (even with a colon in it); else BASE:ADAPTER
    when BASE is served. Anything else is returned whole, for the caller to refuse as unknown."""
    if model in known_models:
        return LineModel(model)
    base, sep, adapter = model.rpartition(SEPARATOR)
    if sep and adapter and base in known_models:
        return LineModel(base, adapter)
    return LineModel(model)


class BatchAdapters:
    """The adapters one batch's lines may name, each checked against a base once, the first
    time a line names the pair (later lines naming it get the same answer)."""

    def __init__(self, locations: dict[str, str], check: AdapterCheck, bases: dict[str, str] | None = None):
        self.locations = locations   # adapter name -> folder or URL (BARGE_LORA_MODULES)
        self.check = check
        self.bases = bases or {}     # adapter name -> the base its entry names (BASE:name=location)
        self.problems: dict[tuple[str, str], str | None] = {}   # (base, adapter name) -> check's answer

    @classmethod
    def none(cls) -> BatchAdapters:
        return cls({}, lambda base, name, location: None)

    def base_of(self, name: str, known_models: dict) -> str:
        """The base model a line naming the registered adapter `name` alone runs on: the one
        its entry names, else the one generate model served; AdapterRefused when neither does."""
        base = self.bases.get(name)
        if base is not None:
            if base not in known_models:
                raise AdapterRefused("model_not_found", f"the adapter {shown(name)} is registered on model {base!r}, "
                                                        f"which this server does not serve")
            return base
        generate = sorted(model for model, modes in known_models.items()
                          if "generate" in ((modes,) if isinstance(modes, str) else modes))
        if len(generate) == 1:
            return generate[0]
        raise AdapterRefused("model_not_found", f"the adapter {shown(name)} alone names no base model: this server "
                                                f"serves {len(generate)} generate models ({', '.join(generate)}); "
                                                f"name it as BASE:{name}, or register it as BASE:{name}=LOCATION "
                                                f"in {ENV_NAME}")

    def location(self, line_model: LineModel) -> str:
        """Where the line's adapter is; AdapterRefused when none is registered by that name or
        it cannot serve on the line's base."""
        name = line_model.adapter
        location = self.locations.get(name)
        if location is None:
            served = ", ".join(sorted(self.locations)) or f"none ({ENV_NAME} lists none)"
            raise AdapterRefused("model_not_found", f"the adapter {shown(name)} of model {line_model.base!r} does "
                                                    f"not exist; this server's adapters: {served}")
        key = (line_model.base, name)
        if key not in self.problems:
            self.problems[key] = self.check(line_model.base, name, location)
        if self.problems[key] is not None:
            raise AdapterRefused("invalid_value", self.problems[key])
        return location


def served_adapters(settings: Settings, env: dict[str, str] | None = None, locations: dict[str, str] | None = None,
                    bases: dict[str, str] | None = None) -> BatchAdapters:
    """The adapters registered on this host (`locations` and `bases`, by default read from
    BARGE_LORA_MODULES), for one batch: each checked as a job's adapter is at submit, under
    `settings`."""
    def check(base: str, name: str, location: str) -> str | None:
        return adapter_problem(base, name, location, settings, env)
    return BatchAdapters(lora_modules(env) if locations is None else locations, check,
                         lora_module_bases(env) if bases is None else bases)


def adapter_problem(base: str, name: str, location: str, settings: Settings,
                    env: dict[str, str] | None = None) -> str | None:
    """Why the adapter registered as `name` cannot serve on the served model `base`, or None."""
    if unshared(location, settings, env) is not None:
        return (f"the adapter {name!r} is on the disk of the host that checks batches, which the workers of this "
                f"deployment of many hosts cannot reach ({ENV_NAME} must name shared locations)")
    try:
        check_adapter(location, resolve_model(base, env, weights=False), settings.max_lora_rank, shown_as=name)
    except JobSpecError as error:
        return error.problem
    except ValueError as error:   # the base does not resolve here
        return f"the adapter {name!r} cannot be checked against model {base!r}: {error}"
    return None
