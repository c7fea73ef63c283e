"""What an engine process's device is doing: utilization, memory, power, temperature.

On a GPU the figures come from NVML (nvidia-ml-py, an optional dependency: `pip install
nvidia-ml-py`), read for the process's own GPU by its physical index (NVML ignores
CUDA_VISIBLE_DEVICES; the supervisor sets CUDA_DEVICE_ORDER=PCI_BUS_ID so that both
number GPUs as nvidia-smi does). Without NVML, or on the CPU, they are the CPU's: the
machine's CPU utilization and this process's resident memory over the machine's, with
no power or temperature. Reading never raises: a figure that cannot be read is None.

Served as Prometheus gauges {device, name} (queueing.metrics) and in the worker's
heartbeat (`barge workers`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

from queueing.devices import DeviceSlot

log = logging.getLogger("barge.metrics")


@dataclass(frozen=True)
class DeviceFigures:
    device: str                          # the slot: "cuda:3", "cpu:0"
    name: str                            # "NVIDIA H200", or "cpu"
    source: str                          # "nvml" | "cpu"
    utilization: float | None = None     # 0..1: GPU busy share over NVML's last sample; CPU: the machine's
    memory_used_bytes: int | None = None   # GPU: used on the device (every process); CPU: this process's RSS
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class DeviceTelemetry:
    """Reads one slot's figures; NVML is initialised on the first read, once."""

    def __init__(self, slot: DeviceSlot):
        self.slot = slot
        self._nvml = None        # the pynvml module, once initialised
        self._handle = None
        self._nvml_tried = False

    def read(self) -> DeviceFigures:
        if self.slot.kind == "cuda" and self._nvml_handle() is not None:
            return self._gpu_figures()
        return cpu_figures(self.slot.label)

    def _nvml_handle(self):
        if not self._nvml_tried:
            self._nvml_tried = True
            try:
                import pynvml
                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.slot.index)
                self._nvml = pynvml
            except Exception as exc:   # ImportError, or NVML without a driver: CPU figures
                log.info("no NVML figures for %s (%s); reporting the CPU's", self.slot.label, exc)
        return self._handle

    def _gpu_figures(self) -> DeviceFigures:
        nvml, handle = self._nvml, self._handle
        memory = _quietly(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        utilization = _quietly(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        power = _quietly(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        temperature = _quietly(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
        name = _quietly(lambda: nvml.nvmlDeviceGetName(handle)) or "gpu"
        return DeviceFigures(self.slot.label, name if isinstance(name, str) else name.decode(), "nvml", utilization,
                             None if memory is None else int(memory.used),
                             None if memory is None else int(memory.total), power, temperature)


def cpu_figures(label: str) -> DeviceFigures:
    """The CPU's figures, from psutil where it is installed, else /proc."""
    try:
        import psutil
    except ImportError:
        return DeviceFigures(label, "cpu", "cpu", _load_share(), _rss_bytes(), _mem_total_bytes())
    return DeviceFigures(label, "cpu", "cpu", psutil.cpu_percent(interval=None) / 100.0,
                         psutil.Process().memory_info().rss, psutil.virtual_memory().total)


def _quietly(read):
    try:
        return read()
    except Exception:   # a figure this GPU or driver does not report (NVML_ERROR_NOT_SUPPORTED, ...)
        return None


def _load_share() -> float | None:
    try:
        return min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return None


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _mem_total_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None
