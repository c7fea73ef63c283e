"""`barge worker` and `barge workers`.

    barge worker --model minilm [--devices 0,1] [--metrics-port PORT]
    barge workers [--since SECONDS]

`barge worker` serves its models (queueing.supervisor: one engine process per device slot,
each of them `barge worker` run again). `barge workers` lists the workers that beat
recently (jobs.worker_beats), one line per engine with its device slot and what the device
is doing (queueing.device_telemetry's figures, as the worker last reported them).
"""

from __future__ import annotations

import argparse
import sys
import time

from jobs.client import Client
from jobs.worker_beats import WorkerBeat, WorkerBeats

GIB = 1024 ** 3
# How an engine process runs `barge worker` again, with its own options after it.
WORKER_COMMAND = (sys.executable, "-m", "cli", "worker")


def add_commands(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser("worker", help="run a worker serving one or more models")
    worker.add_argument("--model", required=True, action="append",
                        help="registered name, folder or Hub id (repeatable)")
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port (default BARGE_METRICS_PORT; 0: off); "
                             "with several devices, engine process i serves PORT + i")
    worker.add_argument("--devices", metavar="DEVICES",
                        help="one engine process per entry: all, GPU indices (0,1,3; 0,0 shares one GPU), cpu or "
                             "cpu:N (default BARGE_DEVICES, else every visible GPU, else the CPU)")
    worker.set_defaults(func=_worker)

    workers = commands.add_parser("workers", help="workers that beat recently: each engine's device and its figures")
    workers.add_argument("--since", type=float, default=300.0, metavar="SECONDS",
                         help="workers whose last beat is this recent (default 300)")
    workers.set_defaults(func=_workers)


def _worker(args) -> int:
    from queueing.supervisor import run_worker
    return run_worker(args.model, worker_command=WORKER_COMMAND, devices=args.devices, loglevel=args.loglevel,
                      metrics_port=args.metrics_port)


def _workers(args) -> int:
    beats = WorkerBeats(Client().store.engine).list(since=time.time() - args.since)
    print("\n".join(worker_lines(beats)))
    return 0


def worker_lines(beats: list[WorkerBeat], now: float | None = None) -> list[str]:
    """The table `barge workers` prints (pure: tested without a database)."""
    now = time.time() if now is None else now
    lines = [f"{'WORKER':34}  {'SLOT':7}  {'MODEL':24}  {'MODE':10}  {'UTIL':>5}  {'MEMORY':>15}  {'POWER':>6}  "
             f"{'TEMP':>5}  {'BEAT':>5}"]
    for beat in beats:
        state = "stopped" if beat.stopped_at else f"{now - beat.heartbeat_at:.0f}s"
        for engine in beat.engines or [None]:
            settings = engine.settings if engine else {}
            device = (engine.device if engine else None) or {}
            lines.append(f"{beat.id[:34]:34}  {settings.get('device_id', settings.get('device', '-')):7}  "
                         f"{str(settings.get('model', ','.join(beat.models)))[:24]:24}  {settings.get('mode', '-'):10}  "
                         f"{_share(device.get('utilization')):>5}  {_memory(device):>15}  "
                         f"{_unit(device.get('power_watts'), 'W'):>6}  {_unit(device.get('temperature_celsius'), 'C'):>5}  "
                         f"{state:>5}")
    return lines


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _memory(device: dict) -> str:
    used, total = device.get("memory_used_bytes"), device.get("memory_total_bytes")
    if used is None or total is None:
        return "-"
    return f"{used / GIB:.1f}/{total / GIB:.1f} GiB"


def _unit(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f}{unit}"
