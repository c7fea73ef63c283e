"""queueing.devices: which engine processes `--devices` asks for, and when a fallen one
comes back (pure decisions)."""

import pytest

from queueing.devices import (BACKOFF_MAX_S, FAULT_WINDOW_S, DeviceSlot, max_faults_from_env, parse_devices,
                              restart_delay)


@pytest.mark.parametrize("text, num_gpus, labels", [
    (None, 0, ["cpu:0"]),
    ("", 2, ["cuda:0", "cuda:1"]),
    ("all", 3, ["cuda:0", "cuda:1", "cuda:2"]),
    ("0,1,3", 4, ["cuda:0", "cuda:1", "cuda:3"]),
    ("0,0", 1, ["cuda:0", "cuda:0"]),
    (" 2 ", 4, ["cuda:2"]),
    ("cpu", 8, ["cpu:0"]),
    ("cpu:2", 0, ["cpu:0", "cpu:1"]),
    ("CPU:3", 1, ["cpu:0", "cpu:1", "cpu:2"]),
])
def test_devices_name_one_engine_process_each(text, num_gpus, labels):
    assert [slot.label for slot in parse_devices(text, num_gpus)] == labels


@pytest.mark.parametrize("text, num_gpus, message", [
    ("all", 0, "no GPU is visible"),
    ("4", 4, "GPU 4 is not visible"),
    ("0,x", 2, "'x' is not a GPU index"),
    ("cpu:0", 0, "cpu:N with N >= 1"),
    ("cpu:two", 0, "cpu:N with N >= 1"),
    ("gpu", 1, "'gpu' is not a GPU index"),
])
def test_a_bad_devices_value_is_refused_naming_it(text, num_gpus, message):
    with pytest.raises(ValueError, match=message):
        parse_devices(text, num_gpus)


def test_a_gpu_process_sees_only_its_gpu_and_a_cpu_process_none():
    assert DeviceSlot("cuda", 3).child_env() == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                 "BARGE_DEVICE_SLOT": "cuda:3"}
    assert DeviceSlot("cpu", 1).child_env() == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                                "BARGE_DEVICE_SLOT": "cpu:1"}
    assert DeviceSlot("cuda", 3).torch_device == "cuda:0"   # pinned: its one visible GPU
    assert DeviceSlot("cpu", 1).torch_device == "cpu"


@pytest.mark.parametrize("label", ["cuda:3", "cpu:0", "cpu:12"])
def test_a_slot_label_round_trips(label):
    assert DeviceSlot.from_label(label).label == label


@pytest.mark.parametrize("label", ["gpu:1", "cuda", "cpu:-1", "cuda:x"])
def test_a_bad_slot_label_is_refused(label):
    with pytest.raises(ValueError, match="BARGE_DEVICE_SLOT"):
        DeviceSlot.from_label(label)


@pytest.mark.parametrize("fault_ages, max_faults, delay", [
    ([0], 5, 1.0),                         # first fault: one second
    ([30, 0], 5, 2.0),                     # doubled per fault within the hour
    ([300, 200, 100, 0], 5, 8.0),
    ([400, 300, 200, 100, 0], 5, None),    # the fifth within the hour: left unhealthy
    ([FAULT_WINDOW_S + 1, FAULT_WINDOW_S + 2, 0], 3, 1.0),   # older faults are forgotten
    ([2, 1, 0], 3, None),
    (list(range(20, 0, -1)) + [0], 100, BACKOFF_MAX_S),      # capped
])
def test_a_fallen_engine_restarts_with_backoff_until_too_many_faults(fault_ages, max_faults, delay):
    now = 10_000.0
    assert restart_delay([now - age for age in fault_ages], now, max_faults) == delay


def test_max_faults_comes_from_the_environment():
    assert max_faults_from_env({}) == 5
    assert max_faults_from_env({"BARGE_DEVICE_MAX_FAULTS": "2"}) == 2
    with pytest.raises(ValueError, match="BARGE_DEVICE_MAX_FAULTS"):
        max_faults_from_env({"BARGE_DEVICE_MAX_FAULTS": "0"})


def test_a_cuda_fault_is_told_apart_from_out_of_memory_and_other_errors():
    import torch

    from queueing.devices import is_device_fault
    assert is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_device_fault(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_device_fault(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_device_fault(ValueError("prompt is empty"))
    assert not is_device_fault(OSError("connection refused"))
