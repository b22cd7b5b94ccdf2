"""Function uTasks and recursion in the front end (seed 001): ``@function``.

    @ck.function                            # a function uTask: traced at each call
    def cell(h):
        return flow.tanh(F.linear(h, w, b))

    @ck.function(returns=ck.spec(4))        # may call itself: traced once
    def walk(node):
        return ck.cond(is_leaf[node].item(), lambda: values[node],
                       lambda: walk(left[node].item()) + walk(right[node].item()))

A plain function becomes a ``FunctionCall`` (inlined, or a device function of its
own).  A recursive one becomes a ``FunctionDef`` whose locals live in frames of its
own stack arena; each call is a ``Call`` (a uTask reference).  Its body may hold
``for_loop`` s and ``while_loop`` s, also ones whose body calls the function (their
loop-carried values live in the frame, so each call keeps its own).  Its code names (the
function, its parameters, its frame fields and stack) come from ``names.py``: valid
and distinct whatever the Python function is called.
"""

from __future__ import annotations

import functools

from pyflow.cocktailer.ir import Buffer, Call, FunctionCall, FunctionDef, Offset, StmtBlock, TensorRef
from pyflow.cocktailer.names import readable_name, sanitize
from pyflow.cocktailer.scalars import Var
from pyflow.cocktailer.trace import (FLOAT_DTYPES, TracedTensor, TensorSpec, TraceError, _copy_into, _current, _float,
                                     _Frame, _int_argument, _param_names, _tensor, _Trace)
from pyflow.errors import DTypeError, ShapeError

__all__ = ["Function", "function"]


class Function:
    """``@function``: a function uTask.  With ``returns=spec(...)`` it may call itself (recursion).

    A plain function is traced at each call into a ``FunctionCall`` (inlined by the
    ``inline`` optimization).  A recursive one is traced once into a
    ``FunctionDef``: it takes int Scalars (e.g. a node id) and returns one tensor of
    the declared shape; every call is a ``Call`` (a uTask reference).
    """

    def __init__(self, fn, returns: TensorSpec | None):
        if not callable(fn):
            raise TraceError(f"function: expected a Python function, got {type(fn).__name__}")
        if returns is not None and not isinstance(returns, TensorSpec):
            raise TraceError(f"function: returns must be a TensorSpec (returns=spec(4)), got {returns!r}")
        functools.update_wrapper(self, fn)
        self.__name__ = readable_name(fn, "function")   # a partial has none
        self.fn, self.returns = fn, returns

    def __call__(self, *args):
        t = _current()
        if self.returns is None:
            call = FunctionCall(sanitize(self.__name__, "function"), StmtBlock())
            with t.block(call.body):
                result = self.fn(*args)
            t.emit(call)
            return result
        args = tuple(_int_argument(a, f"recursive function {self.__name__!r}: an argument") for a in args)
        fdef = self._definition(t, len(args))
        caller = t.frames[-1] if t.frames else None
        if caller is not None and caller.fn is fdef:
            result = t.new_ref(fdef.result_shape, fdef.dtype)  # a slot in the caller's frame
        else:  # an outside call: the result lands in the stack's root area, then is copied out
            result = TensorRef(fdef.stack, fdef.result_shape, Offset(None, 0))
        t.emit(Call(fdef, args, result))
        if caller is not None and caller.fn is fdef:
            return TracedTensor(result)
        out = t.new_ref(fdef.result_shape, fdef.dtype)
        _copy_into(out, result, f"result of {fdef.name}")
        return TracedTensor(out)

    def _definition(self, t: _Trace, n_args: int) -> FunctionDef:
        fdef = t.definitions.get(self)
        if fdef is not None:
            if len(fdef.params) != n_args:
                raise TraceError(f"{fdef.name}: called with {n_args} arguments, defined with {len(fdef.params)}")
            return fdef
        if t.frames:
            raise TraceError(f"{self.__name__!r}: a recursive function may only call itself, not "
                             f"{t.frames[-1].fn.name!r}'s other recursive functions")
        dtype = self.returns.dtype
        if dtype not in FLOAT_DTYPES:
            raise DTypeError(f"{self.__name__}: returns must be float32/float64, got {dtype}")
        # its code name, and the names codegen makes from it (frames_: its stack in the kernel)
        name = t.fresh(self.__name__, derived=("stack_{}", "frames_{}", "{}_base", "{}_ret"))
        params = tuple(Var(t.names.unique(f"{name}_{sanitize(p, 'arg')}")) for p in _param_names(self.fn, n_args))
        fdef = FunctionDef(name, params, self.returns.shape, dtype)
        fdef.stack = Buffer(f"stack_{name}", 0, dtype, "stack")
        fdef.base, fdef.ret = Var(f"{name}_base"), Var(f"{name}_ret")
        fdef.body = StmtBlock()
        t.buffers.append(fdef.stack)
        t.functions.append(fdef)
        t.definitions[self] = fdef
        frame = _Frame(fdef)
        t.frames.append(frame)
        saved_depth, t.loop_depth = t.loop_depth, 0
        try:
            with t.block(fdef.body):
                result = self.fn(*fdef.params)
                ref = _float(_tensor(result, fdef.name), fdef.name)
                if ref.shape != fdef.result_shape or ref.dtype != dtype:
                    raise ShapeError(f"{fdef.name}: returns {ref.shape} {ref.dtype}, declared "
                                     f"{fdef.result_shape} {dtype}")
                _copy_into(TensorRef(fdef.stack, ref.shape, Offset(fdef.ret, 0)), ref, "return")
        finally:
            t.frames.pop()
            t.loop_depth = saved_depth
        return fdef


def function(fn=None, *, returns: TensorSpec | None = None):
    """Decorator: ``@function`` (a function uTask) or ``@function(returns=spec(d))`` (may recurse)."""
    if fn is None:
        if returns is not None and not isinstance(returns, TensorSpec):
            raise TraceError(f"function: returns must be a TensorSpec (returns=spec(4)), got {returns!r}")
        return lambda f: Function(f, returns)
    return Function(fn, returns)
