"""The program tracer: inside ``cocktailer.trace``, flow ops lower to uTasks instead of running.

As nn.Graph's lazy mode hands every op to its ``LazyTracer`` (``pyflow/compiler/lazy.py``),
Cocktailer installs a tracer into the interpreter (``interpreter.install_program_tracer``):
while a trace is open on this thread, ``flow.relu(x)``, ``x + y``, ``x.sum(-1)``,
``flow.softmax(x, -1)``, ``flow.zeros(...)`` on the program's ``TracedTensor`` s come here.
For one call, in order:

1. the inputs must be this program's tensors (an eager ``pyflow.Tensor`` from outside is
   an error that says to pass it in as an input) or Python numbers;
2. the op's own type promotion and shape/dtype inference (``interpreter.infer_logical``,
   the prologue every interpreter shares): a bad call raises what eager mode raises.  A
   call that would need a cast (inputs of two dtypes) is refused: a uTask computes in its
   inputs' one dtype;
3. the op's uTask lowering (``OpDef.utask_lowering``, ``lowerings.py``) appends its
   ``UOperator`` s to the statement being traced; an op without one is a ``TraceError``
   naming it (it cannot run inside a persistent kernel);
4. each result takes the shape inference gave it (the lowering's row reduction of a
   ``keepdim`` sum is (rows,), the op's result (rows, 1): the same memory, re-viewed), so
   the shapes a program sees are the op's, decided in one place.

In-place flow ops (``out=``, ``x.add_(y)``) are refused: inside a program a tensor is
updated with ``cocktailer.update`` (which makes the old version stale).
"""

from __future__ import annotations

import math

from pyflow.cocktailer.lowerings import LazyView
from pyflow.cocktailer.trace import TracedTensor, TraceError, _local
from pyflow.errors import DTypeError
from pyflow.framework import interpreter
from pyflow.framework.args import describe
from pyflow.framework.dtypes import is_scalar
from pyflow.framework.op_registry import get_op
from pyflow.framework.tensor import Tensor

__all__ = ["lower"]


def _check_inputs(name: str, inputs: list) -> None:
    for k, x in enumerate(inputs):
        if isinstance(x, LazyView):
            x.base._use(name)   # of this trace, not stale; whether the op may read a transpose: its lowering
        elif isinstance(x, TracedTensor):
            x._use(name)   # of this trace, not stale
        elif isinstance(x, Tensor):
            raise TraceError(f"op {name!r}: input {k} ({describe(x)}) is a tensor from outside the program; "
                             "pass it to cocktailer.trace as an input")
        elif not is_scalar(x):
            raise TraceError(f"op {name!r}: expects tensors (or numbers), got {type(x).__name__}: {x!r:.60}")


def _as_inferred(result: TracedTensor, meta, name: str) -> TracedTensor:
    """``result`` with the shape the op's inference gave (a view of the same elements)."""
    shape = tuple(int(n) for n in meta.shape)
    if result.dtype != meta.dtype or result.ref.size != math.prod(shape):
        raise TraceError(f"op {name!r}: its uTask lowering made {result.dtype}{list(result.shape)}, the op's "
                         f"inference {meta.dtype}{list(shape)} (a bug in the lowering)")
    if result.shape == shape:
        return result
    return TracedTensor(result.ref.reshaped(shape), result.readonly)


def lower(name: str, inputs: list, out, attrs: dict) -> list:
    """Steps 1-4 for one flow op called inside ``cocktailer.trace``: the op's results, as TracedTensors."""
    op = get_op(name)
    if out is not None:
        raise TraceError(f"op {name!r}: writing into existing tensors (out=, in-place ops) has no uTask "
                         "lowering; inside a program use cocktailer.update(x, index, value)")
    _check_inputs(name, inputs)
    dtypes, metas = interpreter.infer_logical(op, inputs, attrs, where=lambda: f"op {name!r} in cocktailer.trace")
    if op.utask_lowering is None:
        raise TraceError(f"op {name!r} has no uTask lowering: it cannot run inside a persistent kernel")
    for k, (x, dtype) in enumerate(zip(inputs, dtypes)):
        if isinstance(x, TracedTensor) and x.dtype != dtype:
            raise DTypeError(f"op {name!r}: input {k} is {x.dtype} but the op computes in {dtype}; a uTask "
                             "computes in its inputs' one dtype (give the inputs one dtype)")
    results = op.utask_lowering(_local.trace, inputs, attrs)
    return [_as_inferred(r, m, name) for r, m in zip(results, metas)]


class _Hook:
    """What the interpreter sees: is a trace open on this thread, and where do its ops go."""

    def active(self) -> bool:
        return getattr(_local, "trace", None) is not None

    def apply(self, name, inputs, out, attrs):
        return lower(name, inputs, out, attrs)


interpreter.install_program_tracer(_Hook())
