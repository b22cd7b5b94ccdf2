"""Seed 000: ``DeviceManagerRegistry`` -- the registry that maps a device to its ep
("execution provider") device: ``Singleton<ep::DeviceManagerRegistry>::Get()->GetDevice(type, index)``.

One cached ``EpDevice`` per (type, index), created on first use. Providers:

==========  ==========================================================================
cpu         ``cpu.CpuDevice`` (exactly one device, cpu:0)
cuda        ``cuda.CudaDevice`` when ``is_gpu()``, else ``emulated.EmulatedDevice``
            with ``FakeCUDAArray`` arrays; ``PYFLOW_SIM_DEVICES`` (default 8, a simulated
            8-GPU node, so in-process ranks each get their own) devices
mock        ``emulated.EmulatedDevice`` with numpy arrays; ``PYFLOW_MOCK_DEVICES``
            (default 2) devices
==========  ==========================================================================

``shutdown()`` (also run at exit) destroys every stream and joins every worker thread.

>>> from pyflow.device.ep import get_device
>>> get_device("cpu").device
device(type='cpu', index=0)
"""

from __future__ import annotations

import atexit
import os
import threading

from pyflow.device.device import Device as DeviceSymbol
from pyflow.device.device import DeviceLike, DeviceType
from pyflow.device.ep.base import EpDevice, EpStream, Event, RawBuffer
from pyflow.device.ep.cpu import CpuDevice
from pyflow.device.ep.emulated import EmulatedDevice, emulation, emulation_settings, shutdown_all_streams
from pyflow.errors import BackendError, DeviceError
from pyflow.kernels.backend import is_gpu

__all__ = [
    "EpDevice",
    "EpStream",
    "Event",
    "RawBuffer",
    "get_device",
    "device_count",
    "shutdown",
    "emulation",
    "emulation_settings",
]

_cache: dict[DeviceSymbol, EpDevice] = {}
_lock = threading.Lock()


def _env_count(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit():
        raise DeviceError(f"{name}={text!r} must be a non-negative integer")
    return int(text)


def _cuda_gpu_count() -> int:
    """GPUs numba sees in GPU mode; ``BackendError`` when the driver has none to offer."""
    from pyflow.device.ep.cuda import gpu_count

    try:
        count = gpu_count()
    except Exception as error:  # numba's CudaSupportError and friends
        raise BackendError(f"the GPU backend is selected but CUDA is unusable: {error}") from error
    if count < 1:
        raise BackendError("the GPU backend is selected but the CUDA driver reports no GPU")
    return count


def device_count(device_type: "DeviceType | str") -> int:
    """How many devices of this type exist (cpu: 1; cuda: GPUs or simulated; mock: env)."""
    device_type = DeviceType.parse(device_type)
    if device_type is DeviceType.cpu:
        return 1
    if device_type is DeviceType.mock:
        return _env_count("PYFLOW_MOCK_DEVICES", 2)
    if is_gpu():
        return _cuda_gpu_count()
    return _env_count("PYFLOW_SIM_DEVICES", 8)


def _describe_count(device_type: DeviceType, count: int) -> str:
    plural = "device" if count == 1 else "devices"
    how = {DeviceType.cpu: "", DeviceType.mock: " (mock; set PYFLOW_MOCK_DEVICES)"}.get(
        device_type, " (GPU)" if is_gpu() else " (simulated; set PYFLOW_SIM_DEVICES)"
    )
    return f"{count} {device_type.name} {plural}{how}"


def _create(device: DeviceSymbol) -> EpDevice:
    count = device_count(device.device_type)
    if device.index >= count:
        raise DeviceError(f"{device} does not exist: {_describe_count(device.device_type, count)}")
    if device.device_type is DeviceType.cpu:
        return CpuDevice(device)
    if device.device_type is DeviceType.cuda and is_gpu():
        from pyflow.device.ep.cuda import CudaDevice

        return CudaDevice(device)
    return EmulatedDevice(device, fake_cuda_arrays=device.device_type is DeviceType.cuda)


def get_device(device: DeviceLike) -> EpDevice:
    """The ep device for ``device`` (a ``Device`` or a string like ``"cuda:1"``), cached.

    ``DeviceError`` if the index does not exist; ``BackendError`` for cuda when the
    GPU backend is selected but no GPU is usable.
    """
    found = _cache.get(device)   # a Device symbol is interned: found at once
    if found is not None:
        return found
    device = DeviceSymbol(device)
    with _lock:
        found = _cache.get(device)
        if found is None:
            found = _cache[device] = _create(device)
        return found


def shutdown(timeout: float | None = 10.0) -> None:
    """Destroy every stream of every ep device and join every worker thread.

    The cache is emptied: a later ``get_device`` builds fresh ep devices. Raises the
    first pending stream error (after everything is closed), so none is lost.
    """
    with _lock:
        devices = list(_cache.values())
        _cache.clear()
    first: BaseException | None = None
    try:
        shutdown_all_streams(timeout)  # every emulated stream, even of unregistered devices
    except Exception as error:
        first = error
    for ep_device in devices:  # what is left: cpu and GPU streams
        try:
            ep_device.close()
        except Exception as error:
            first = first or error
    if first is not None:
        raise first


atexit.register(shutdown)
