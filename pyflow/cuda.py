"""``flow.cuda``: the few questions a training script asks about the CUDA device, as ``torch.cuda``.

``is_available()`` answers **"can pyflow run tensors on ``"cuda"``?"**, which in pyflow is
true on a real GPU *and* in the CUDA simulator (``flow.backend_description()`` says which).
PyTorch's answer is "is there a GPU"; pyflow's cuda device exists without one, so
the course's line::

    device = "cuda" if flow.cuda.is_available() else "cpu"

picks ``"cuda"`` here too and the script runs its cuda path (slowly, simulated) unchanged.
That is the point of a teaching runtime: the same code exercises the device code on a
laptop.  ``flow.is_gpu()`` tells a real GPU apart; ``PYFLOW_SIM_DEVICES=0`` hides the
simulated devices (then ``is_available()`` is False and such a script picks ``"cpu"``).

>>> import pyflow as flow
>>> flow.cuda.is_available() == (flow.cuda.device_count() > 0)
True
>>> flow.cuda.synchronize()          # waits for every op issued so far
"""

from __future__ import annotations

from pyflow import env
from pyflow.device import Device
from pyflow.device.ep import device_count as _ep_device_count
from pyflow.errors import ArgumentTypeError, BackendError, DeviceError
from pyflow.framework.creation import manual_seed as _manual_seed
from pyflow.vm import sync

__all__ = ["is_available", "device_count", "current_device", "synchronize", "manual_seed", "manual_seed_all"]


def device_count() -> int:
    """How many cuda devices pyflow has: the GPUs numba sees, else the simulated ones
    (``PYFLOW_SIM_DEVICES``, default 8); 0 when a GPU backend was forced but CUDA is unusable."""
    try:
        return _ep_device_count("cuda")
    except BackendError:
        return 0


def is_available() -> bool:
    """True when tensors can live on ``"cuda"``: a GPU, or pyflow's CUDA simulator (see the module doc)."""
    return device_count() > 0


def current_device() -> int:
    """The index of this rank's cuda device: its local rank modulo the devices (0 for one process),
    the device a global tensor's placement gives this rank.  pyflow has no ``set_device``."""
    count = device_count()
    if count == 0:
        raise DeviceError("flow.cuda.current_device(): pyflow has no cuda device (flow.cuda.is_available() "
                          "is False)")
    return env.get_local_rank() % count


def synchronize(device=None) -> None:
    """Wait until every op issued so far has finished, on every device (``flow.sync()``: pyflow's VM
    orders all streams, so there is nothing narrower to wait for); ``device`` is checked only."""
    if device is not None:
        if isinstance(device, int) and not isinstance(device, bool):
            device = Device("cuda", device)
        elif isinstance(device, str):
            device = Device(device)
        elif not isinstance(device, Device):
            raise ArgumentTypeError(f"flow.cuda.synchronize: device must be an int, a string or a flow.device, "
                                    f"got {type(device).__name__}")
        if device.type != "cuda" or device.index >= device_count():
            raise DeviceError(f"flow.cuda.synchronize: {device} is not one of the {device_count()} cuda devices")
    sync()


def manual_seed(seed: int) -> None:
    """Seed the random numbers (``flow.manual_seed``: pyflow draws them on the host for every device)."""
    _manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """As ``manual_seed``: one generator serves every device."""
    _manual_seed(seed)
