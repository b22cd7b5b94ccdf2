"""Seed 004: lazy mode: while ``nn.Graph.build`` runs, ops record into a Job instead of running.

OneFlow switches its interpreter: inside ``build`` every op goes to the
*LazyInterpreter*, which infers shapes and dtypes (so bad input still fails at the
call) and appends an OpConf to the Job; nothing runs.  pyflow does the same:
``pyflow.framework.interpreter.apply`` hands the call to the installed ``LazyTracer``
while a trace is open on this thread.

* A **LazyTensor** is a tensor with a name (its lbn) and no memory: shape, dtype,
  device, nothing to read.  ``numpy()``, ``item()``, ``if x.sum() > 0`` are errors
  that name the Python line: a traced graph cannot depend on values (for control
  flow on the device, see ``pyflow.cocktailer``).
* An **eager tensor** used by ``build`` (a parameter, a buffer, a captured tensor)
  becomes a ``variable`` op, once per tensor: the graph reads its memory at run time.
* **Views** (the view ops ``reshape``, ``permute``...; ``x[i]``) are ``view`` JobOps: a
  layout over the input's blob, run as an alias of its memory (``lazy_views.py``).
* **Global tensors**: each op's SBP signature is chosen as it is recorded, ``to_global`` is an
  op (``lazy_global.py``).
* **Writes**: ``x.add_(1)`` on a lazy tensor records the op and renames ``x`` to the
  result (a view's base would not see it, so writing into a view, or into a tensor
  that has views, is an error).  Writing an eager tensor (``running_mean.mul_(m)``,
  an optimizer's update) records an op that writes the variable, ordered after
  every earlier reader and writer of it (control edges: ``passes/variable_order.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading

import numpy as np

from pyflow.compiler.job import BlobDesc, Job, JobOp, lbn_of
from pyflow.compiler.lazy_global import record_global_op, record_to_global
from pyflow.compiler.lazy_views import record_view, record_view_op
from pyflow.errors import ArgumentTypeError, CompileError, GraphError
from pyflow.framework import args, interpreter
from pyflow.framework.dtypes import is_scalar
from pyflow.framework.op_registry import get_op
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor
from pyflow.kernels.layout import contiguous_strides

__all__ = ["LazyTensor", "LazyTracer", "tracing", "paused", "current_job", "user_line", "device_of"]

_S0 = SbpParallel("split", 0)
_PYFLOW_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_line() -> str:
    """``file.py:12`` of the innermost caller outside the pyflow package (the user's line in build)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_PYFLOW_DIR) or "/tutorials/" in filename:
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def device_of(desc: BlobDesc):
    """Where this rank keeps a blob: a local blob's device, a global blob's device on this rank."""
    if desc.placement is not None:
        from pyflow import env

        return desc.placement.device(env.get_rank())
    return desc.device


class LazyBlob:
    """A LazyTensor's stand-in for an EagerBlobObject: the layout of a contiguous blob, no storage."""

    __slots__ = ("shape", "dtype", "strides", "offset", "device", "storage")

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = tuple(int(n) for n in shape), dtype, device
        self.strides, self.offset, self.storage = contiguous_strides(self.shape), 0, None


def _no_values(what: str):
    def method(self, *args, **kwargs):
        raise GraphError(f"{what} of a lazy tensor ({self._lbn}) at {user_line()}: inside nn.Graph.build ops are "
                         "recorded, not run, so there is no value to read. Return the tensor from build() and read "
                         "it after the call; for control flow that depends on values, run it on the device "
                         "with pyflow.cocktailer")
    return method


class LazyTensor(Tensor):
    """A tensor inside ``build``: a logical blob name (lbn) with a shape, a dtype and a device."""

    __slots__ = ("_lbn", "_trace", "_has_views", "_is_view")

    @classmethod
    def _make(cls, trace: "LazyTracer", lbn: str, desc: BlobDesc) -> "LazyTensor":
        t = cls.over_blob(LazyBlob(desc.shape, desc.dtype, device_of(desc)), None)
        t._lbn, t._trace, t._has_views, t._is_view = lbn, trace, False, False
        return t

    # A global lazy tensor keeps ``_global`` None (nothing eager may touch its pieces); its
    # placement and SBP are its blob desc's, the SBP as the signature inference left it.

    @property
    def _desc(self) -> BlobDesc:
        return self._trace.job.blobs[self._lbn]

    @property
    def is_global(self) -> bool:
        return self._desc.placement is not None

    @property
    def is_local(self) -> bool:
        return self._desc.placement is None

    @property
    def placement(self):
        if self._desc.placement is None:
            return Tensor.placement.fget(self)   # the local tensor's error
        return self._desc.placement

    @property
    def sbp(self) -> tuple:
        if self._desc.placement is None:
            return Tensor.sbp.fget(self)
        return tuple(self._desc.sbp)

    def to_global(self, placement=None, sbp=None) -> "LazyTensor":
        """Inside build: a ``to_global`` op (the TaskGraph gives its edge the boxing sub-graph)."""
        return record_to_global(self._trace, self, placement, sbp)

    def to(self, *where, **kwargs) -> "LazyTensor":
        """A global lazy tensor ``.to("cuda")`` / ``.to(dtype)``: as an eager global one
        (``distributed.global_methods.global_to``); a local one: the local ``to``."""
        if not self.is_global:
            return Tensor.to(self, *where, **kwargs)
        from pyflow.distributed.global_methods import global_to

        return global_to(self, *where, **kwargs)

    def to_local(self) -> "LazyTensor":
        raise GraphError(f"to_local() of {self!r} at {user_line()}: inside nn.Graph.build a global tensor stays "
                         "global; return it and call .to_local() on the result")

    def _view(self, shape, strides, offset) -> "LazyTensor":
        return self._trace.view(self, shape, strides, offset)

    def stride(self, dim: int | None = None):
        """Strides in elements, as the blob will have them at run time where the trace knows them: a view op's
        view (``w.T``) of a blob that is no view (contiguous at run time) has the view's; any other blob is
        taken as contiguous.  A backward rule may pick its gradient's layout by them (``ops/linalg.py``)."""
        strides = self._trace.view_strides.get(self._lbn)
        if strides is None:
            return Tensor.stride(self, dim)
        return strides if dim is None else strides[args.dim(dim, self.ndim, "stride", self)]

    def detach(self) -> "LazyTensor":
        return self._trace.view(self, self.shape, contiguous_strides(self.shape), 0, detach=True)

    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
        """Inside build: mark this scalar as the loss (the autograd pass makes the backward ops)."""
        self._trace.set_loss(self, gradient)

    numpy = _no_values("numpy()")
    item = _no_values("item()")
    tolist = _no_values("tolist()")
    __array__ = _no_values("np.asarray()")
    __bool__ = _no_values("bool() (an `if` or `while` on a tensor)")
    __float__ = _no_values("float()")
    __int__ = _no_values("int()")
    __index__ = _no_values("using it as an index")
    __str__ = _no_values("print()")

    def __repr__(self) -> str:
        return f"LazyTensor({self._lbn}, shape={list(self.shape)}, dtype={self.dtype}, device='{self.device}')"


class _State(threading.local):
    tracer = None


_state = _State()


def current_job() -> Job | None:
    return None if _state.tracer is None else _state.tracer.job


@contextlib.contextmanager
def tracing(tracer: "LazyTracer"):
    """Lazy mode on this thread while the block runs (``build`` is traced inside it)."""
    if _state.tracer is not None:
        raise GraphError(f"nn.Graph {tracer.job.name!r} called while graph {_state.tracer.job.name!r} is being "
                         "traced: graphs cannot be nested; call the inner graph's modules directly")
    from pyflow.autograd.mode import no_grad

    _state.tracer = tracer
    try:
        with no_grad():   # no tape: the autograd pass makes the backward ops from the Job
            yield tracer
    finally:
        _state.tracer = None


@contextlib.contextmanager
def paused():
    """Eager mode again while the block runs (a pass making persistent state: optimizer buffers)."""
    tracer, _state.tracer = _state.tracer, None
    try:
        yield
    finally:
        _state.tracer = tracer


class _Hook:
    """What the interpreter sees: is a trace open on this thread, and where do ops go."""

    def active(self) -> bool:
        return _state.tracer is not None

    def paused(self):
        """Eager mode while the block runs (``paused`` above), for the framework's own use."""
        return paused()

    def apply(self, name, inputs, out, attrs):
        return _state.tracer.apply(name, inputs, out, attrs)

    def lazy(self, x):
        """The lazy twin of eager ``x`` (its variable op) in the open trace."""
        return _state.tracer.lazy(x)

    def view(self, x, shape, strides, offset):
        """A view of a captured eager tensor: its offset made relative to the tensor's own (the blob the
        variable binds at run time is that tensor)."""
        tracer = _state.tracer
        return tracer.view(tracer.lazy(x), shape, strides, offset - x._blob.offset)


interpreter.install_lazy_tracer(_Hook())


class LazyTracer:
    """Records one ``build`` call into ``job``."""

    def __init__(self, job: Job):
        self.job = job
        self._variables: dict[int, tuple] = {}      # id(eager tensor) -> (tensor, its LazyTensor)
        self.stage: int | None = None               # the pipeline stage of the module being called
        self.line: str | None = None                # set by passes: "backward of build.py:12"
        self.names: dict[int, str] = {}             # id(eager tensor) -> readable name ("first.weight")
        self.view_strides: dict[str, tuple | None] = {}   # lbn of a view -> its strides at run time, if known

    # --- blobs ------------------------------------------------------------------------------------

    def _record(self, op_type: str, inputs: list, descs: list, attrs: dict | None = None, *, prefix=None,
                writes=None, line=None) -> list:
        job = self.job
        name = job.new_name(prefix or op_type)
        op = JobOp(name, op_type, list(inputs), [lbn_of(name, i) for i in range(len(descs))], dict(attrs or {}),
                   writes=dict(writes or {}), stage=self.stage, line=line or self.line or user_line())
        job.add_op(op, descs)
        return [LazyTensor._make(self, lbn, desc) for lbn, desc in zip(op.outputs, descs)]

    def lazy_of(self, lbn: str) -> "LazyTensor":
        """A LazyTensor naming an existing blob of the job (for passes)."""
        return LazyTensor._make(self, lbn, self.job.blobs[lbn])

    def _is_variable(self, lbn: str) -> bool:
        return lbn.split("/")[0] in self.job.variables

    def lazy(self, x) -> "LazyTensor":
        """The LazyTensor of ``x``: itself, or the variable op of an eager tensor (made once)."""
        if isinstance(x, LazyTensor):
            if x._trace is not self:
                raise GraphError(f"{x!r} comes from another graph's build: a graph cannot use another's "
                                 "lazy tensors")
            return x
        found = self._variables.get(id(x))
        if found is not None:
            return found[1]
        if x._global is not None:
            desc = BlobDesc(tuple(x.shape), x.dtype, placement=x._global.placement, sbp=tuple(x._global.sbp))
        else:
            desc = BlobDesc(tuple(x.shape), x.dtype, device=x.device)
        name = self.job.new_name("variable")
        op = JobOp(name, "variable", [], [lbn_of(name)], {}, stage=self.stage, line=user_line())
        self.job.add_op(op, [desc])
        self.job.variables[name] = x
        if id(x) in self.names:
            self.job.variable_names[name] = self.names[id(x)]
        lazy = LazyTensor._make(self, op.outputs[0], desc)
        lazy._global = None
        self._variables[id(x)] = (x, lazy)
        return lazy

    def input(self, x: Tensor, index: int) -> "LazyTensor":
        """Graph input ``index`` (an eager tensor given to the call)."""
        desc = BlobDesc(tuple(x.shape), x.dtype, device=None if x._global else x.device,
                        placement=x._global.placement if x._global else None,
                        sbp=tuple(x._global.sbp) if x._global else None)
        (t,) = self._record("input", [], [desc], {"index": index}, prefix="input")
        self.job.input_ops.append(t._lbn.split("/")[0])
        k = self.job.grad_acc_steps
        if k == 1:
            return t
        # gradient accumulation: build sees one micro-batch (OneFlow's GradAccUnpack at the input)
        pieces = 1   # a global input is unpacked piece by piece (OneFlow): each S(0) piece splits into k
        if desc.placement is not None:
            pieces = int(np.prod([n for n, s in zip(desc.placement.hierarchy, desc.sbp) if s == _S0], dtype=np.int64))
        if not desc.shape or desc.shape[0] % (k * pieces):
            raise GraphError(f"gradient accumulation {k}: graph input {index} has shape {list(desc.shape)}, whose "
                             f"dim 0 is not a multiple of {k * pieces} ({k} micro-batches"
                             f"{f' of each of {pieces} S(0) pieces' if pieces > 1 else ''}); give a batch that "
                             f"splits into {k} micro-batches")
        micro = dataclasses.replace(desc, shape=(desc.shape[0] // k,) + tuple(desc.shape[1:]))
        (piece,) = self._record("unpack", [t._lbn], [micro], {"unpack_num": k}, prefix="unpack")
        return piece

    def output(self, x, index: int) -> str:
        if not isinstance(x, Tensor):
            raise GraphError(f"nn.Graph {self.job.name!r}: build() returned {type(x).__name__} {x!r:.40} as output "
                             f"{index}; outputs must be tensors (or tuples/lists/dicts of tensors)")
        t = self.lazy(x)
        desc = self.job.blobs[t._lbn]
        (o,) = self._record("output", [t._lbn], [dataclasses.replace(desc)], {"index": index}, prefix="output")
        self.job.output_ops.append(o._lbn.split("/")[0])
        return o._lbn

    # --- ops --------------------------------------------------------------------------------------

    def apply(self, name: str, inputs, out, attrs: dict) -> list:
        """Record op ``name`` (the lazy twin of ``interpreter.apply``): check, infer, append."""
        op = get_op(name)
        if op.view is not None:
            return [record_view_op(self, op, inputs[0], attrs)]
        inputs = [self.lazy(x) if isinstance(x, Tensor) else x for x in inputs]
        for x in inputs:
            if not isinstance(x, Tensor) and not is_scalar(x):
                raise ArgumentTypeError(f"op {name!r}: expects tensors (or numbers), got {type(x).__name__}")
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        if any(self.job.blobs[t._lbn].placement is not None for t in tensors):
            return record_global_op(self, name, op, inputs, out, attrs)
        if "device" in attrs:
            attrs["device"] = args.device(attrs["device"], name)

        def where():   # a rejected call names the user's line in build
            return f"op {name!r} in nn.Graph build at {user_line()}"

        device, _ = interpreter.infer_device_and_stream(op, inputs, attrs, where)
        _, metas = interpreter.infer_logical(op, inputs, attrs, where)
        descs = [BlobDesc(tuple(m.shape), m.dtype, device=device) for m in metas]
        writes = {i: inputs[i]._lbn for i in op.mutable_inputs if i < len(inputs) and isinstance(inputs[i], Tensor)}
        for i, lbn in writes.items():
            if not self._is_variable(lbn):
                raise GraphError(f"op {name!r} at {user_line()} writes its input {i} in place; inside build only "
                                 "module parameters, buffers and captured tensors can be written so")
        if out is None:
            return self._record(name, [x._lbn if isinstance(x, Tensor) else x for x in inputs], descs, attrs,
                                writes=writes)
        return self._write(name, op, inputs, list(out), descs, attrs, writes)

    def _write(self, name, op, inputs, out, descs, attrs, writes) -> list:
        """``out=``: into a variable (an op that writes it), or a lazy tensor (renamed to the result)."""
        if len(out) != len(descs):
            raise ArgumentTypeError(f"op {name!r}: {len(out)} output tensor(s) given, the op makes {len(descs)}")
        into = {}
        for j, o in enumerate(out):
            if isinstance(o, LazyTensor) and (o._is_view or o._has_views):
                raise GraphError(f"op {name!r} at {user_line()} writes in place into {o!r}, which is a view or has "
                                 "views; inside nn.Graph.build write into views with out-of-place ops "
                                 "(x = x.index_copy(...), flow.where) instead")
            if not isinstance(o, LazyTensor):
                target = self.lazy(o)
                if tuple(o.shape) != tuple(descs[j].shape) or o.dtype != descs[j].dtype:
                    raise GraphError(f"op {name!r} at {user_line()} writes a {descs[j].dtype}{list(descs[j].shape)} "
                                     f"result into the captured tensor {target._lbn} ({o.dtype}{list(o.shape)}); "
                                     "inside build an in-place write into a captured tensor must keep its shape "
                                     "and dtype")
                into[j] = target._lbn
        lbns = [x._lbn if isinstance(x, Tensor) else x for x in inputs]
        for j in sorted(into):   # each variable becomes an extra input the op writes (OneFlow: a mutable input)
            writes[len(lbns)] = into[j]
            lbns.append(into[j])
        results = self._record(name, lbns, descs, dict(attrs, _out_into=sorted(into)) if into else attrs,
                               writes=writes)
        for j, (o, result) in enumerate(zip(out, results)):
            if j in into:
                continue
            value = result
            if tuple(o.shape) != tuple(result.shape) or o.dtype != result.dtype:   # broadcast by the expand op
                expanded = result if tuple(o.shape) == tuple(result.shape) else result.expand(*o.shape)
                (value,) = self.apply("cast", [expanded], None, {"dtype": o.dtype})
            o._lbn = value._lbn
        return out

    view = record_view

    def set_loss(self, loss: LazyTensor, gradient) -> None:
        if gradient is not None or loss.numel() != 1:
            raise GraphError(f"backward() at {user_line()} inside nn.Graph.build: only a scalar loss is supported "
                             f"(got shape {list(loss.shape)}{' and a gradient' if gradient is not None else ''}); "
                             "reduce it first, e.g. loss.sum()")
        if not loss.dtype.kind == "f":
            raise GraphError(f"backward() at {user_line()}: the loss must be floating point, not {loss.dtype}")
        if self.job.loss_lbn is not None:
            raise CompileError(f"backward() called twice in build ({self.job.loss_lbn} and {loss._lbn}); "
                               "sum the losses and call backward() once")
        self.job.loss_lbn = loss._lbn

