"""`barge workers` lines (cli.worker): each engine's slot and device figures."""

from jobs.worker_beats import EngineBeat, WorkerBeat
from cli.worker import worker_lines

GIB = 1024 ** 3


def test_each_engine_shows_its_slot_and_device_figures():
    gpu = {"utilization": 0.87, "memory_used_bytes": 60 * GIB, "memory_total_bytes": 140 * GIB,
           "power_watts": 512.4, "temperature_celsius": 61.0}
    cpu = {"utilization": 0.5, "memory_used_bytes": GIB, "memory_total_bytes": 24 * GIB,
           "power_watts": None, "temperature_celsius": None}
    beats = [WorkerBeat("node:11", ["llama"], [EngineBeat({"model": "llama", "mode": "generate",
                                                           "device_id": "cuda:3"}, device=gpu)],
                        heartbeat_at=95.0),
             WorkerBeat("node:12", ["minilm"], [EngineBeat({"model": "minilm", "mode": "embed", "device": "cpu"},
                                                           device=cpu)], heartbeat_at=90.0, stopped_at=91.0),
             WorkerBeat("node:13", ["minilm"], [], heartbeat_at=99.0)]
    header, gpu_line, cpu_line, idle_line = worker_lines(beats, now=100.0)
    assert header.split()[:3] == ["WORKER", "SLOT", "MODEL"]
    assert gpu_line.split() == ["node:11", "cuda:3", "llama", "generate", "87%", "60.0/140.0", "GiB", "512W", "61C",
                                "5s"]
    assert cpu_line.split() == ["node:12", "cpu", "minilm", "embed", "50%", "1.0/24.0", "GiB", "-", "-", "stopped"]
    assert idle_line.split() == ["node:13", "-", "minilm", "-", "-", "-", "-", "-", "1s"]


def test_an_old_heartbeat_row_without_figures_still_reads():
    assert EngineBeat(**{"settings": {}, "num_steps": 3}).device is None
