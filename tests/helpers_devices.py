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
  that the waits are needed, is proven in the simulator.  (Even without the random delays an emulated
  stream lags far behind the host: a worker thread running simulated kernels.  A GPU runs tiny kernels
  in microseconds, before the VM issues the next instruction: a missing order shows by chance, if at all.)
* ``SIMULATED_BLOCK_ORDER``: the test needs the simulator's control of when each block of a grid starts
  (``kernels/sim/settings.py``, ``start_order``: forward, reverse, seeded shuffles) to see a wrong answer
  when a barrier between blocks is missing.  A GPU schedules blocks itself: the same race may or may not
  show, run after run, so a mutation check ("drop the barriers and the answer goes wrong") proves nothing
  there.  Its property, that the barriers are needed, is proven in the simulator.
"""

from __future__ import annotations

import pytest

__all__ = ["EMULATED_STREAMS", "EMULATED_STREAMS_REASON", "SIMULATED_BLOCK_ORDER", "SIMULATED_BLOCK_ORDER_REASON",
           "cuda_devices", "cuda_devices_if", "cuda_devices_reason"]

EMULATED_STREAMS_REASON = (
    "needs emulated CUDA streams (the simulator's): on a GPU the streams are real (pyflow/device/ep/cuda.py), "
    "ep.emulation's random delays do not reach them and tiny kernels finish before the host issues the next, "
    "so a missing wait shows no wrong answer; the simulator run proves the waits")
EMULATED_STREAMS = pytest.mark.emulated_streams

SIMULATED_BLOCK_ORDER_REASON = (
    "needs the simulator's block start order (kernels/sim/settings.py start_order): on a GPU the hardware "
    "schedules the blocks, so a missing barrier's race shows by chance, if at all; the simulator run proves "
    "the barriers")
SIMULATED_BLOCK_ORDER = pytest.mark.simulated_block_order


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
