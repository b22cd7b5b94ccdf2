"""Seed 000's device layer: what a device is, what a stream is, and how memory is cached.

* ``device``    - ``DeviceType``, the interned ``Device("cuda:1")`` symbol
* ``stream``    - ``StreamType`` and its traits, the ``Stream`` symbol, ``StreamMgr``
* ``ep``        - execution providers (OneFlow's ep::Device (``EpDevice``) / ep::Stream (``EpStream``) / ep::Event):
                  cpu, cuda on a GPU, and emulated asynchronous cuda for the simulator
* ``allocator`` - the caching allocator (OneFlow's BinAllocator) over an ep device

Imports only ``pyflow.kernels`` and ``pyflow.errors`` below it.

``pyflow.device`` is this package *and*, as in OneFlow and PyTorch, the way to
name a device: ``flow.device("cuda:1")`` calls the package, which returns a
``Device``.  (A module cannot be called normally; the class swap at the end of
this file makes it callable, so ``import pyflow.device.ep`` and
``flow.device("cuda")`` both work.)
"""

import sys
import types

from pyflow.device import ep
from pyflow.device.allocator import Allocation, AllocatorStats, CachingAllocator
from pyflow.device.device import Device, DeviceType
from pyflow.device.stream import (
    Stream,
    StreamMgr,
    StreamType,
    allocator_stream_type,
    default_stream,
    need_soft_sync,
    on_independent_thread,
    supports_stream_wait,
)

__all__ = [
    "Device", "DeviceType", "Stream", "StreamType", "StreamMgr", "default_stream",
    "need_soft_sync", "supports_stream_wait", "on_independent_thread", "allocator_stream_type",
    "CachingAllocator", "Allocation", "AllocatorStats", "ep",
]


class _CallableModule(types.ModuleType):
    """This package, callable: ``pyflow.device("cuda:1")`` is ``Device("cuda:1")``."""

    def __call__(self, spec, index=None):
        return Device(spec, index)


sys.modules[__name__].__class__ = _CallableModule
