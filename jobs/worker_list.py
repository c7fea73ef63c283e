"""`barge workers`: the workers that beat recently (jobs.worker_beats), one line per
engine with its device slot and what the device is doing (queueing.device_telemetry's
figures, as the worker last reported them)."""

from __future__ import annotations

import time

from jobs.worker_beats import WorkerBeat

GIB = 1024 ** 3


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
