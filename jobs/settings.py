"""Where Barge keeps its state: one frozen value read from the environment once.

With nothing set, everything lives under the data directory (`BARGE_DATA_DIR`, else
`$XDG_DATA_HOME/barge`, else `~/.local/share/barge`): SQLite for state and a kombu
filesystem transport for the queue, so one machine needs no server at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.lora.options import MAX_SUPPORTED_RANK, LoraOptions   # torch-free


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str     # SQLAlchemy URL: sqlite:///... or postgresql+psycopg://...
    broker_url: str       # "filesystem://" (embedded), amqp://..., redis://...
    namespace: str = "barge"   # prefix of every queue name on the broker
    visibility_timeout_s: float = 3600.0   # Redis: an unacknowledged message is redelivered after this
    price_per_hour: float | None = None    # cost of one worker-hour (GPU-hour) for job reports; None: no cost
    cache_url: str = ""        # incremental jobs' results cache (path or fsspec URL); "": data_dir/cache
    worker_retention_s: float = 7 * 86_400.0   # a worker's heartbeat row outlives its last beat this long
                                               # (jobs.worker_beats.WorkerBeats.prune, by the housekeeper)
    max_lora_rank: int = LoraOptions.max_lora_rank   # BARGE_MAX_LORA_RANK: the largest LoRA adapter rank a submit
                                                     # takes and a worker's engine serves (its slots are padded to it)

    def __post_init__(self) -> None:
        if not self.cache_url:
            object.__setattr__(self, "cache_url", str(self.data_dir / "cache"))

    @property
    def is_embedded_broker(self) -> bool:
        return self.broker_url.startswith("filesystem://")

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        data_home = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
        data_dir = Path(env.get("BARGE_DATA_DIR") or os.path.join(data_home, "barge")).expanduser()
        database_url = env.get("BARGE_DATABASE_URL") or f"sqlite:///{data_dir / 'barge.db'}"
        if database_url.startswith("postgresql://"):
            database_url = "postgresql+psycopg://" + database_url.removeprefix("postgresql://")
        broker_url = env.get("BARGE_BROKER_URL") or "filesystem://"
        namespace = env.get("BARGE_NAMESPACE") or "barge"
        visibility_timeout_s = float(env.get("BARGE_VISIBILITY_TIMEOUT_S") or 3600.0)
        return cls(data_dir=data_dir, database_url=database_url, broker_url=broker_url, namespace=namespace,
                   visibility_timeout_s=visibility_timeout_s, price_per_hour=_price(env.get("BARGE_PRICE_PER_HOUR")),
                   cache_url=env.get("BARGE_CACHE_URL") or "",
                   worker_retention_s=_retention(env.get("BARGE_WORKER_RETENTION_S"), cls.worker_retention_s),
                   max_lora_rank=_lora_rank(env.get("BARGE_MAX_LORA_RANK"), cls.max_lora_rank))


def _retention(value: str | None, default: float) -> float:
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:   # 0 would prune live workers' rows
        raise ValueError(f"BARGE_WORKER_RETENTION_S: {value!r} is not a positive number of seconds")
    return seconds


def _price(value: str | None) -> float | None:
    if not value:
        return None
    try:
        price = float(value)
    except ValueError:
        raise ValueError(f"BARGE_PRICE_PER_HOUR: {value!r} is not a number") from None
    if price < 0:
        raise ValueError(f"BARGE_PRICE_PER_HOUR: {value!r} is negative")
    return price


def _lora_rank(value: str | None, default: int) -> int:
    if not value:
        return default
    if not value.strip().isdigit() or not 1 <= int(value) <= MAX_SUPPORTED_RANK:
        raise ValueError(f"BARGE_MAX_LORA_RANK: {value!r} is not a rank from 1 to {MAX_SUPPORTED_RANK}")
    return int(value)
