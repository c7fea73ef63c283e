"""Device figures without NVML (queueing.device_telemetry): the absent path, run for real
here (no GPU, no nvidia-ml-py). The NVML path runs only on a GPU: bench/gpu_check.py."""

import sys

from prometheus_client import generate_latest

from queueing.device_telemetry import DeviceTelemetry
from queueing.devices import DeviceSlot
from queueing.metrics import WorkerMetrics


def test_a_gpu_slot_without_nvml_reports_the_cpu_and_does_not_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)     # import fails, as where nvidia-ml-py is absent
    figures = DeviceTelemetry(DeviceSlot("cuda", 0)).read()
    assert (figures.device, figures.source, figures.name) == ("cuda:0", "cpu", "cpu")
    assert 0 < figures.memory_used_bytes < figures.memory_total_bytes
    assert 0.0 <= figures.utilization <= 1.0
    assert figures.power_watts is None and figures.temperature_celsius is None


def test_a_cpu_slot_reports_cpu_figures_under_its_label():
    figures = DeviceTelemetry(DeviceSlot("cpu", 1)).read()
    assert (figures.device, figures.source) == ("cpu:1", "cpu")
    assert figures.to_dict()["memory_total_bytes"] == figures.memory_total_bytes


def test_the_metrics_serve_the_figures_it_has_and_leave_out_the_rest(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    metrics = WorkerMetrics()
    metrics.watch_device(DeviceTelemetry(DeviceSlot("cuda", 0)))
    text = generate_latest(metrics.registry).decode()
    assert 'barge_device_memory_total_bytes{device="cuda:0",name="cpu"}' in text
    assert 'barge_device_utilization_ratio{device="cuda:0",name="cpu"}' in text
    assert "barge_device_power_watts" not in text and "barge_device_temperature_celsius" not in text


class _Engine:
    def __init__(self, settings):
        self.settings = settings

    def add_step_observer(self, observer):
        pass


def test_the_oom_counter_reads_each_engines_retries():
    metrics = WorkerMetrics()
    metrics.observe_engine(_Engine({"num_oom_retries": 3}), "minilm", "embed")
    metrics.observe_engine(_Engine({}), "llama", "generate")
    text = generate_latest(metrics.registry).decode()
    assert 'barge_engine_oom_retries_total{mode="embed",model="minilm"} 3.0' in text
    assert 'barge_engine_oom_retries_total{mode="generate",model="llama"} 0.0' in text
