"""Tracing the eager VM (seed 002): per stream, when each instruction waited and ran.

* ``tracer`` - ``InstructionRecord``, ``Tracer`` (the VM's ``on_release`` hook),
               and ``trace()``, the context manager (``flow.trace.trace()``; this
               package is callable too, as ``flow.device`` is: ``flow.trace()``)
* ``chrome`` - the records as a Chrome trace (JSON for ui.perfetto.dev)
* ``plot``   - the same timeline as a PNG (needs matplotlib: ``pip install matplotlib``)

>>> import pyflow as flow
>>> with flow.trace() as tracer:
...     y = flow.relu(flow.tensor([[1.0, -2.0]], device="cuda"))
>>> sorted({r.name for r in tracer.records} & {"relu", "tensor"})
['relu', 'tensor']
>>> tracer.save("relu_trace.json")      # doctest: +SKIP
"""

import sys
import types

from pyflow.trace.tracer import DeviceWorkRecord, InstructionRecord, Tracer, trace

__all__ = ["InstructionRecord", "DeviceWorkRecord", "Tracer", "trace"]


class _CallableModule(types.ModuleType):
    """This package, callable: ``flow.trace()`` is ``flow.trace.trace()``."""

    def __call__(self, *args, **kwargs):
        return trace(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
