"""Tracing the eager VM (seed 002): per stream, when each instruction waited and ran.

* ``tracer`` - ``InstructionRecord``, ``Tracer`` (the VM's ``on_release`` hook),
               and ``trace()``, the context manager (``flow.trace()``)
* ``chrome`` - the records as a Chrome trace (JSON for ui.perfetto.dev)
* ``plot``   - the same timeline as a PNG (needs matplotlib: ``pip install matplotlib``)

>>> import pyflow as flow
>>> from pyflow.trace import trace
>>> with trace() as tracer:
...     y = flow.relu(flow.tensor([[1.0, -2.0]], device="cuda"))
>>> tracer.save("relu_trace.json")      # doctest: +SKIP
>>> print(tracer.summary())            # doctest: +SKIP
"""

from pyflow.trace.tracer import InstructionRecord, Tracer, trace

__all__ = ["InstructionRecord", "Tracer", "trace"]
