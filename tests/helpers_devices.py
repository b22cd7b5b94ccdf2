"""What a test needs of the machine's devices, as pytest marks; ``tests/conftest.py`` decides, in one place,
whether this machine has it (``pytest_runtest_setup``), and skips the test saying what is missing.

* ``cuda_devices(n)``: the test needs ``n`` CUDA devices.  In-process ranks (``flow.distributed.run``) that
  make a *local* tensor on ``"cuda"`` (``flow.tensor(..., device="cuda")``, ``.to("cuda")``) put it on
  ``cuda:<local rank>`` (``pyflow/device/device.py``, ``_default_index``), as OneFlow does; on a machine with
  fewer GPUs than ranks that device does not exist, and pyflow says so (``DeviceError``), as OneFlow would.
  A *placement* on ``"cuda"`` needs no more than one: ``placement.device`` shares the GPUs among the ranks
  (``cuda:<local rank % GPUs>``), so tests that only place global tensors run on a one-GPU machine too.
  The simulator offers ``PYFLOW_SIM_DEVICES`` devices (default 8): these tests run there everywhere.
* ``EMULATED_STREAMS``: the test needs CUDA streams whose tasks ``pyflow.device.ep.emulation`` delays at
  random, to see a wrong answer when a wait is missing.  Only the simulator's CUDA streams are emulated
  (``ep/emulated.py``); on a GPU they are real streams (``ep/cuda.py``), which take no delays, so a
  mutation check ("drop the waits and the answer goes wrong") has nothing to see there.  Its property,
  that the waits are needed, is proven in the simulator.
"""

from __future__ import annotations

import pytest

__all__ = ["EMULATED_STREAMS", "EMULATED_STREAMS_REASON", "cuda_devices", "cuda_devices_if", "cuda_devices_reason"]

EMULATED_STREAMS_REASON = (
    "needs emulated CUDA streams (the simulator's): on a GPU the streams are real (pyflow/device/ep/cuda.py) "
    "and ep.emulation's random delays do not reach them, so a missing wait shows no wrong answer; "
    "the simulator run proves the waits")
EMULATED_STREAMS = pytest.mark.emulated_streams


def cuda_devices(n: int) -> pytest.MarkDecorator:
    """The mark of a test that needs ``n`` CUDA devices (``@cuda_devices(4)``)."""
    return pytest.mark.cuda_devices(n)


def cuda_devices_if(n: int, *devices: str) -> list:
    """The marks of a parametrized case that needs ``n`` CUDA devices if one of ``devices`` (the device types
    its ranks make local tensors on) is ``"cuda"``; none for a case on cpu alone, which runs everywhere.

    ``pytest.param(..., marks=cuda_devices_if(4, in_device))``, or ``marks=[pytest.mark.slow, *...]``.
    """
    return [cuda_devices(n)] if "cuda" in devices else []


def cuda_devices_reason(needed: int, have: int) -> str | None:
    """Why a test that needs ``needed`` CUDA devices cannot run on a machine with ``have``; None if it can."""
    if have >= needed:
        return None
    return f"needs {needed} CUDA devices; this machine has {have}"
