"""One host or many: which locations every process of a deployment can reach.

Barge scales out on a shared store, a network broker and object storage: the client on a
laptop, `barge serve` on one host, workers on GPU nodes, sharing nothing else. Then a
path on one host's disk — a job's input or output, the results cache, the API's files, a
model folder — is a path the others do not have, and what failed was silent (parts landing
on whichever worker ran each shard, a batch failed with `errors: null`, a job sitting
`running` for a model queue nobody consumes).

    one host    the embedded default (SQLite and the filesystem broker), or
                BARGE_SINGLE_HOST=1 (one machine running PostgreSQL and RabbitMQ)
    many hosts  anything else: every location must be a URL every host reaches (s3://,
                gs://, az://, http(s)://, any fsspec URL but memory://), or a path under a
                mount listed in BARGE_SHARED_PATHS (e.g. /mnt/corpus:/mnt/models)

On many hosts a host-local location is refused before any work — at submit for a job's
fields (jobs.client), at the start of `barge worker`, `barge serve` and `barge beat` for
their settings — with a message naming the field or setting and what to use instead.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from jobs.settings import Settings
from jobs.spec import JobSpec, JobSpecError

LOCAL_SCHEMES = ("", "file", "local")   # fsspec's names for this host's disk
PER_PROCESS_SCHEMES = ("memory",)        # not even shared between two processes


def is_single_host(settings: Settings, env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("BARGE_SINGLE_HOST", "").strip() in ("1", "true", "yes"):
        return True
    return settings.database_url.startswith("sqlite") and settings.is_embedded_broker


def shared_paths(env: dict[str, str] | None = None) -> list[str]:
    """BARGE_SHARED_PATHS: folders mounted at the same path on every host (os.pathsep or comma)."""
    env = os.environ if env is None else env
    raw = env.get("BARGE_SHARED_PATHS", "").replace(",", os.pathsep)
    return [os.path.abspath(os.path.expanduser(part)) for part in raw.split(os.pathsep) if part.strip()]


def unshared(location: str, settings: Settings, env: dict[str, str] | None = None) -> str | None:
    """Why `location` cannot serve a deployment of many hosts, or None when it can (or when
    the deployment is one host)."""
    if is_single_host(settings, env):
        return None
    scheme, sep, rest = location.partition("://")
    if not sep:
        scheme, rest = "", location
    scheme = scheme.lower()
    if scheme in PER_PROCESS_SCHEMES:
        return f"{location!r} lives in one process's memory; use a URL every host reaches (s3://...)"
    if scheme not in LOCAL_SCHEMES:
        return None
    path = os.path.abspath(os.path.expanduser(rest))
    if any(PurePosixPath(path).is_relative_to(root) for root in shared_paths(env)):
        return None
    return (f"{location!r} is a path on this host's disk, and this deployment is many hosts (a shared store "
            f"or a network broker): the other hosts cannot reach it. Use a URL every host reaches "
            f"(s3://bucket/...), or a path under a mount every host shares, listed in BARGE_SHARED_PATHS; "
            f"or set BARGE_SINGLE_HOST=1 if every Barge process runs on this machine")


def check_job_locations(spec: JobSpec, settings: Settings, env: dict[str, str] | None = None) -> None:
    """A job's input, output, model folder and LoRA adapter, each reachable from every host;
    JobSpecError naming the field otherwise (before anything is read or queued). Adapters
    named per row (params.adapter_column) are data: a row whose adapter a worker cannot
    read gets that as its error."""
    for location in [spec.input] if isinstance(spec.input, str) else list(spec.input):
        if (problem := unshared(location, settings, env)) is not None:
            raise JobSpecError("input", problem)
    if (problem := unshared(spec.output, settings, env)) is not None:
        raise JobSpecError("output", problem)
    if _is_model_path(spec.model, env) and (problem := unshared(spec.model, settings, env)) is not None:
        raise JobSpecError("model", f"{problem}. A model is best named so that each worker resolves it: a name "
                                    "registered on the workers (BARGE_MODELS), or a Hub id")
    if spec.adapter is not None and (problem := unshared(spec.adapter, settings, env)) is not None:
        raise JobSpecError("adapter", problem)


def template_problem(template: dict, settings: Settings, env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(field, why) of a schedule template's first location the other hosts cannot reach,
    or None. Placeholders ({date:...}) do not change whether a location is shared."""
    inputs = template.get("input")
    for location in [inputs] if isinstance(inputs, str) else list(inputs or []):
        if (problem := unshared(location, settings, env)) is not None:
            return "template.input", problem
    if isinstance(template.get("output"), str) and (problem := unshared(template["output"], settings, env)):
        return "template.output", problem
    model = template.get("model")
    if isinstance(model, str) and _is_model_path(model, env) and (problem := unshared(model, settings, env)):
        return "template.model", problem
    if isinstance(template.get("adapter"), str) and (problem := unshared(template["adapter"], settings, env)):
        return "template.adapter", problem
    return None


def check_setting(name: str, location: str, settings: Settings, env: dict[str, str] | None = None) -> None:
    """A process's own location setting (BARGE_CACHE_URL, BARGE_API_FILES_URL): ValueError
    naming it when the other hosts cannot reach it."""
    if (problem := unshared(location, settings, env)) is not None:
        raise ValueError(f"{name}: {problem}")


def _is_model_path(model: str, env: dict[str, str] | None) -> bool:
    """A folder or file path rather than a registered name or a Hub id (which each worker
    resolves for itself)."""
    from jobs.models import HUB_PREFIX, registered_models
    if model in registered_models(env) or model.startswith(HUB_PREFIX):
        return False
    return os.path.exists(os.path.expanduser(model))
