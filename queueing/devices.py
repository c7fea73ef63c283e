"""Which devices a worker serves, and when a fallen engine process comes back: pure
decisions, table-tested in tests/unit/queueing/test_devices.py.

`barge worker --devices all|0,1,3|0,0|cpu|cpu:N` (or BARGE_DEVICES) names one engine
process per entry. A GPU entry pins its process to that GPU with CUDA_VISIBLE_DEVICES
(the process then sees it as cuda:0); "0,0" puts two processes on one GPU, each with
its share of the memory (BARGE_GPU_MEMORY_FRACTION). "cpu:N" runs N CPU processes.
Default: every visible GPU, else the CPU in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

FAULT_WINDOW_S = 3600.0     # faults older than this are forgotten
DEFAULT_MAX_FAULTS = 5      # BARGE_DEVICE_MAX_FAULTS: faults within the window before a device is left unhealthy
BACKOFF_BASE_S = 1.0        # first restart after this; doubled per fault still in the window
BACKOFF_MAX_S = 60.0
SLOT_VARIABLE = "BARGE_DEVICE_SLOT"   # set by the supervisor in each engine process it starts


@dataclass(frozen=True)
class DeviceSlot:
    """One engine process's device."""

    kind: str           # "cpu" | "cuda"
    index: int          # cuda: the physical GPU index (as nvidia-smi numbers it); cpu: the process's number

    @property
    def label(self) -> str:
        """"cuda:3", "cpu:1": in logs, the worker's hostname, Engine.settings["device_id"]."""
        return f"{self.kind}:{self.index}"

    def child_env(self) -> dict[str, str]:
        """What the engine process serving this slot is started with: its GPU alone is
        visible (a CPU process sees none, so nothing in it can reach for a GPU), and
        BARGE_DEVICE_SLOT tells it that it is that slot's process."""
        visible = str(self.index) if self.kind == "cuda" else ""
        # PCI order: CUDA numbers GPUs as nvidia-smi and NVML do (its default is fastest first).
        return {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", SLOT_VARIABLE: self.label}

    @property
    def torch_device(self) -> str:
        """The device its engines load on, inside its own (pinned) process."""
        return "cuda:0" if self.kind == "cuda" else "cpu"

    @classmethod
    def from_label(cls, label: str) -> "DeviceSlot":
        kind, _, index = label.partition(":")
        if kind not in ("cpu", "cuda") or not index.isdigit():
            raise ValueError(f"{SLOT_VARIABLE}: {label!r} is not a slot like cuda:3 or cpu:1")
        return cls(kind, int(index))


def parse_devices(text: str | None, num_gpus: int) -> list[DeviceSlot]:
    """The slots `--devices TEXT` names on a machine with `num_gpus` visible GPUs;
    ValueError naming a bad entry. None or "" gives the default."""
    text = (text or "").strip().lower()
    if text in ("", "all"):
        if num_gpus == 0 and text == "all":
            raise ValueError("--devices all: no GPU is visible on this machine (use cpu or cpu:N)")
        return [DeviceSlot("cuda", i) for i in range(num_gpus)] or [DeviceSlot("cpu", 0)]
    if text == "cpu" or text.startswith("cpu:"):
        count = _count(text.removeprefix("cpu").removeprefix(":") or "1", text)
        return [DeviceSlot("cpu", i) for i in range(count)]
    return [DeviceSlot("cuda", _gpu_index(entry.strip(), num_gpus)) for entry in text.split(",")]


def _count(value: str, text: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"--devices {text!r}: expected cpu or cpu:N with N >= 1")
    return int(value)


def _gpu_index(entry: str, num_gpus: int) -> int:
    if not entry.isdigit():
        raise ValueError(f"--devices: {entry!r} is not a GPU index (expected all, 0,1,3, cpu or cpu:N)")
    index = int(entry)
    if index >= num_gpus:
        raise ValueError(f"--devices: GPU {index} is not visible on this machine ({num_gpus} GPUs visible)")
    return index


def restart_delay(fault_times: list[float], now: float, max_faults: int) -> float | None:
    """Seconds to wait before restarting a slot's engine process that has just fallen,
    given the times of its faults (this one included); None: the device has fallen
    `max_faults` times within the hour and is left unhealthy."""
    recent = [t for t in fault_times if now - t < FAULT_WINDOW_S]
    if len(recent) >= max_faults:
        return None
    return min(BACKOFF_BASE_S * 2 ** (len(recent) - 1), BACKOFF_MAX_S)


def max_faults_from_env(env: dict[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    value = env.get("BARGE_DEVICE_MAX_FAULTS", "")
    if not value:
        return DEFAULT_MAX_FAULTS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"BARGE_DEVICE_MAX_FAULTS: {value!r} is not an int >= 1")
    return int(value)


def count_visible_gpus() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied); 0 without CUDA. It
    initialises nothing that a child process would inherit: children are exec'd."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


EXIT_DEVICE_FAULT = 75   # the engine process ends itself after a GPU fault; the supervisor restarts it

# Messages of CUDA errors after which the process's CUDA context is unusable.
_FAULT_MESSAGES = ("illegal memory access", "device-side assert", "unspecified launch failure", "uncorrectable ecc",
                   "device has fallen off the bus", "cuda error: unknown error", "gpu is lost", "misaligned address",
                   "illegal instruction", "cudaerrorlaunchfailure")


def is_device_fault(exc: BaseException) -> bool:
    """True for a CUDA error that poisons the context (an illegal memory access, a lost
    device, an Xid): only a new process can use the GPU again. Out of memory is not one
    (engine.oom recovers from it in the step)."""
    import torch
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    message = str(exc).lower()
    accelerator_error = getattr(torch, "AcceleratorError", ())
    return (bool(accelerator_error) and isinstance(exc, accelerator_error)) or any(
        text in message for text in _FAULT_MESSAGES)
