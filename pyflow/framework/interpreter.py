"""Seeds 000/002: the eager interpreter: from ``apply("relu", [x])`` to an OpCall instruction.

For one op call, in OneFlow's order, each step a function of this module (tutorial 03 calls them one by one):

1. **GetDefaultDevice** - the first input's device; with no inputs, the ``device`` attribute (which must exist on this
   machine), else cpu.  Every input must be on that device; mixing devices is an error that says to use ``.to()``.
2. **InferDeviceAndStream** - the device's default (compute) stream, unless the op defines its own (copies between
   devices use host2device / device2host). Steps 1-2 are ``infer_device_and_stream``.
3. **Type promotion** (``OpDef.promote_inputs``, PyTorch's rule in ``dtypes.py``) and **shape/dtype inference**
   (``OpDef.infer``): ``infer_logical``, the prologue the global interpreter, nn.Graph's tracer and Cocktailer's
   share.  Here, at the call, bad input raises, naming op, shapes, dtypes and devices.  Nothing has been issued yet,
   so a rejected call leaves no instruction behind.  ``infer`` is steps 1-3 for one call, through the cache below.
4. Issue: Python scalars become tensors and operands are cast to the common dtype (``convert_inputs``); the output
   tensors are created, with no memory yet: the VM allocates when it prepares the instruction (``make_outputs``); and
   **PhysicalRun** issues an ``InstructionsBuilder.call`` (``build_op_call``, the OpCall instruction).  A view op
   issues nothing (``view_ops.py``).

**Writing into existing tensors** (``out=``): in-place ops (``x.add_(y)``, ``x += y``, ``x[idx] = v``) pass the
tensors to write. The OpCall then *writes* their storage, so the VM orders it after every earlier reader (WAR)
and writer (WAW). PyTorch's rule applies (``check_out``): the result must broadcast to the output's shape and be
castable to its dtype (``int_tensor.add_(1.5)`` is a ``DTypeError``); when it has another shape or dtype, the op
writes a temporary that a ``cast`` then copies into the output. An input that overlaps an output's memory
without being the very same view (``x[1:] += x[:-1]``) is copied first (``copy_overlapping_inputs``), decided on
the blobs' layouts alone (no data is read). Every write bumps the storage's version counter
(``tensor._version``).

**The inference cache.** Steps 1-3 depend only on the op, each input's (shape, dtype, device) or Python scalar
type, and the attributes, so their result (an ``Inferred``: device, stream, each input's kernel dtype, the
output metas, the kernel) is kept per such *signature*, as OneFlow caches its op interpreter contexts. A
signature seen before skips straight to step 4; any change of shape, dtype, device, scalar type or attribute is
a different signature, inferred (and checked) afresh. A call that fails inference is never cached.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pyflow import vm
from pyflow.device import Device, DeviceType, default_stream
from pyflow.errors import ArgumentTypeError, AxisError, DeviceError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import DEFAULT_FLOAT, can_cast, category, is_scalar, result_type, to_scalar
from pyflow.framework.op_registry import TensorMeta, get_op
from pyflow.framework.view_ops import apply_view
from pyflow.kernels.layout import contiguous_strides
from pyflow.kernels.registry import get_kernel

__all__ = ["apply", "apply_local", "get_default_device", "kernel_target", "describe", "global_interpreter",
           "LogicalInference", "infer_device_and_stream", "infer_logical", "infer", "check_out", "convert_inputs",
           "make_outputs", "copy_overlapping_inputs", "build_op_call", "has_internal_overlap", "same_view",
           "may_overlap"]

# OneFlow picks an interpreter per call: EagerLocalInterpreter for local tensors,
# EagerGlobalInterpreter when an input is global.  pyflow.distributed installs the
# global one here when imported (it sits above this layer: placement, SBP signatures,
# boxing), and ``import pyflow`` imports it.
_global_interpreter = None


def global_interpreter():
    """The interpreter of global tensors (``pyflow.distributed.global_ops``), installed by ``pyflow.distributed``."""
    return _global_interpreter


def install_global_interpreter(interpreter) -> None:
    global _global_interpreter
    _global_interpreter = interpreter


# Autograd records each op here (pyflow.autograd installs its Recorder; it sits above this layer).
_recorder = None


def install_recorder(recorder) -> None:
    global _recorder
    _recorder = recorder

# nn.Graph's lazy mode records ops into a Job instead of running them (pyflow.compiler.lazy installs it);
# Cocktailer's trace lowers them to the uTasks of one program (pyflow.cocktailer.lowering installs it).
_lazy_tracer = None
_program_tracer = None


def install_lazy_tracer(tracer) -> None:
    global _lazy_tracer
    _lazy_tracer = tracer


def install_program_tracer(tracer) -> None:
    global _program_tracer
    _program_tracer = tracer


_CHECK_ERRORS = (ShapeError, DTypeError, AxisError, IndexOutOfRangeError, ArgumentTypeError, DeviceError)


def kernel_target(device: Device) -> str:
    """Which kernel family runs on ``device``: CUDA kernels, or numpy twins (cpu, mock)."""
    return "cuda" if device.device_type is DeviceType.cuda else "cpu"


def get_default_device(op_name: str, inputs, device_attr=None) -> Device:
    """OneFlow's GetDefaultDevice, plus the check that all inputs share it."""
    if not inputs:
        return Device(device_attr) if device_attr is not None else Device("cpu")
    device = inputs[0].device
    others = [t.device for t in inputs if t.device is not device]
    if others:
        listed = ", ".join(describe(t) for t in inputs)
        raise DeviceError(f"op {op_name!r}: inputs are on different devices ({listed}); "
                          f"move them with .to({str(device)!r}) first")
    return device


def _describe(inputs) -> str:
    return "; ".join(describe(t) if hasattr(t, "shape") else repr(t) for t in inputs)


def _rejected(error, op_name: str, inputs, where=None):
    """``error``, raised by a check of a call, with the call appended: ``[op 'add', inputs: ...]`` (the
    inputs' shapes, dtypes and devices), or ``[where()]``, the caller's own account of the call."""
    if where is not None:
        return type(error)(f"{error} [{where()}]")
    if not inputs:
        return error
    return type(error)(f"{error} [op {op_name!r}, inputs: {_describe(inputs)}]")


def _promoted_dtypes(op, inputs) -> list:
    """The dtype each input has for the kernel (PyTorch's promotion over ``op.promote_inputs``)."""
    dtypes = [None if is_scalar(x) else x.dtype for x in inputs]
    together = range(len(inputs)) if op.promote_inputs == "all" else [i for i in op.promote_inputs
                                                                         if i < len(inputs)]
    if together:
        common = result_type(*(inputs[i] for i in together))
        if op.floating and category(common) < category(DEFAULT_FLOAT):
            common = DEFAULT_FLOAT
        for i in together:
            dtypes[i] = common
    for i, x in enumerate(inputs):
        if dtypes[i] is None:
            raise ArgumentTypeError(f"op {op.name!r}: input {i} must be a tensor, got {x!r}")
    return dtypes


def infer_device_and_stream(op, inputs, attrs: dict, where=None) -> tuple:
    """Steps 1-2: the (device, stream) the op runs on: the op's own rule (``OpDef.infer_device_and_stream``,
    e.g. a copy's host2device stream), else the inputs' one device (GetDefaultDevice) and its compute
    stream.  ``inputs`` are tensors and Python numbers; a bad call raises as ``infer_logical`` does."""
    tensors = [x for x in inputs if not is_scalar(x)]
    try:
        if op.infer_device_and_stream is not None:
            return op.infer_device_and_stream(tensors, attrs)
        device = get_default_device(op.name, tensors, attrs.get("device"))
        return device, default_stream(device)
    except _CHECK_ERRORS as error:
        raise _rejected(error, op.name, inputs, where) from None


class LogicalInference(NamedTuple):
    """What step 3 decides for a call: ``dtypes``, the dtype each input has for the kernel (after type
    promotion), and ``metas``, each output's shape and dtype (``TensorMeta``)."""

    dtypes: list
    metas: list


def infer_logical(op, inputs, attrs: dict, where=None) -> LogicalInference:
    """Step 3, the interpreters' shared prologue: type promotion over ``op.promote_inputs``, then the
    op's shape and dtype inference (``OpDef.infer``) on the promoted inputs.

    Every interpreter runs it before anything else is decided: the local one here (once per signature,
    through the cache), the global one on logical shapes (``distributed/global_ops.py``), and nn.Graph's
    tracer while ``build`` records (``compiler/lazy.py``).  ``inputs`` are tensors (or anything with
    ``shape`` and ``dtype``) and Python numbers.  Bad input raises the check's error (``ShapeError``,
    ``DTypeError``, ...) with the call appended, ``[op 'add', inputs: float32[2, 3] on cpu:0; 1.5]``, or
    ``[where()]`` when the caller says where the call came from (nn.Graph names the user's line).
    """
    try:
        dtypes = _promoted_dtypes(op, inputs)
        metas = op.infer([TensorMeta(tuple(getattr(x, "shape", ())), d) for x, d in zip(inputs, dtypes)], attrs)
    except _CHECK_ERRORS as error:
        raise _rejected(error, op.name, inputs, where) from None
    return LogicalInference(dtypes, metas)


def has_internal_overlap(t) -> bool:
    """Do two elements of ``t`` share memory (a stride-0, expanded dim)?  Such a tensor can't be written."""
    return math.prod(t.shape) > 1 and any(s == 0 and n > 1 for n, s in zip(t.shape, t._blob.strides))


def check_out(out: list, inferred: Inferred) -> None:
    """PyTorch's rules for writing an op's results into existing tensors (``out=``), checked before
    anything is issued: as many tensors as results, on the op's device, each result broadcasting to its
    output's shape and castable to its dtype, and no output whose elements share memory."""
    name, metas, device = inferred.op.name, inferred.metas, inferred.device
    if len(out) != len(metas):
        raise ArgumentTypeError(f"op {name!r}: {len(out)} output tensor(s) given, the op makes {len(metas)}")
    for o, meta in zip(out, metas):
        if not isinstance(o, Tensor):
            raise ArgumentTypeError(f"op {name!r}: out= must be tensors, got {type(o).__name__}")
        if o.device is not device:
            raise DeviceError(f"op {name!r}: the output {describe(o)} is not on the op's device {device}")
        if not args.broadcasts_to(meta.shape, o.shape):
            raise ShapeError(f"op {name!r}: the result's shape {list(meta.shape)} does not broadcast to the "
                             f"output {describe(o)} (in place, the output keeps its shape)")
        if not can_cast(meta.dtype, o.dtype):
            raise DTypeError(f"op {name!r}: the result type {meta.dtype} can't be cast to the output {describe(o)}")
        if has_internal_overlap(o):
            raise ShapeError(f"op {name!r}: several elements of the output {describe(o)} share one memory "
                             "location (an expanded view); write to a .clone() instead")


def _span(blob) -> tuple:
    """The first and last storage element a blob's layout can touch."""
    last = blob.offset + sum((n - 1) * s for n, s in zip(blob.shape, blob.strides))
    return blob.offset, last


def same_view(a, b) -> bool:
    """Are blobs ``a`` and ``b`` the very same view (storage, layout, dtype)?  An op may then write in place."""
    return (a.storage is b.storage and a.shape == b.shape and a.strides == b.strides
            and a.offset == b.offset and a.dtype == b.dtype)


def may_overlap(a, b) -> bool:
    """Could blobs ``a`` and ``b`` touch a common element?  (The layouts' ranges intersect.)"""
    if a.storage is not b.storage or not math.prod(a.shape) or not math.prod(b.shape):
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 <= b1 and b0 <= a1


def _kernel(op, stream):
    if not op.kernel:
        return None
    target = kernel_target(stream.device)
    if isinstance(op.kernel, tuple):
        return tuple(get_kernel(k, target) for k in op.kernel)
    return get_kernel(op.kernel, target)


def _global_scalars(op, inputs: list) -> list:
    """The inputs backward sees: Python numbers as global B tensors on the op's placement (as the
    local path saves them as tensors), so the same rules serve both."""
    if not any(is_scalar(x) for x in inputs):
        return list(inputs)
    placement = next(x._global.placement for x in inputs if isinstance(x, Tensor) and x._global is not None)
    dtypes = _promoted_dtypes(op, inputs)
    return [global_interpreter().scalar(to_scalar(x, d, op.name), d, placement) if is_scalar(x) else x
            for x, d in zip(inputs, dtypes)]


class Inferred:
    """What steps 1-3 decided for one signature (see "The inference cache" above)."""

    __slots__ = ("op", "device", "stream", "dtypes", "metas", "outputs", "kernel", "kernel_attrs", "converts")

    def __init__(self, op, device, stream, dtypes, metas, attrs, inputs):
        self.op, self.device, self.stream, self.dtypes, self.metas = op, device, stream, dtypes, metas
        # each output as (shape, dtype, nbytes, strides): what Tensor._new needs, computed once
        self.outputs = []
        for meta in metas:
            shape, dtype = tuple(int(n) for n in meta.shape), np.dtype(meta.dtype)
            self.outputs.append((shape, dtype, math.prod(shape) * dtype.itemsize, contiguous_strides(shape)))
        self.kernel = _kernel(op, stream)
        self.kernel_attrs = {k: attrs[k] for k in op.kernel_attrs if k in attrs}
        # does any input need work before the op (a Python scalar to make a tensor of, a cast)?
        self.converts = any(is_scalar(x) or x.dtype != d for x, d in zip(inputs, dtypes))


_inferred: dict = {}          # signature -> Inferred
_CACHE_LIMIT = 4096           # signatures kept (cleared when full: a cache, not a leak)
cache_stats = {"hits": 0, "misses": 0}


def _attr_key(value):
    """An attribute as part of a signature: its type too (``1`` and ``1.0`` give different dtypes)."""
    if type(value) is tuple:
        return tuple(_attr_key(v) for v in value)
    return type(value), value


def _signature(op, inputs, attrs):
    """The cache key of a call: None if an attribute is not hashable (then it is not cached)."""
    key = [op.name]   # (an OpDef is not hashable; a hit checks it is the same OpDef)
    for x in inputs:
        blob = getattr(x, "_blob", None)
        key.append(type(x) if blob is None else (blob.shape, blob.dtype, blob.storage.device))
    if attrs:
        key.append(tuple((k, _attr_key(v)) for k, v in attrs.items()))
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def infer(op, inputs: list, attrs: dict) -> Inferred:
    """Steps 1-3 for a call (``infer_device_and_stream``, ``infer_logical``), from the cache when its
    signature was seen: the cache lookup comes first, so a seen call does nothing else here."""
    key = _signature(op, inputs, attrs)
    found = _inferred.get(key) if key is not None else None
    if found is not None and found.op is op:
        cache_stats["hits"] += 1
        return found
    cache_stats["misses"] += 1
    device, stream = infer_device_and_stream(op, inputs, attrs)
    dtypes, metas = infer_logical(op, inputs, attrs)
    found = Inferred(op, device, stream, dtypes, metas, attrs, inputs)
    if key is not None:
        if len(_inferred) >= _CACHE_LIMIT:
            _inferred.clear()
        _inferred[key] = found
    return found


def clear_inference_cache() -> None:
    """Forget every cached signature (tests; an op re-registered under a name)."""
    _inferred.clear()


def convert_inputs(inputs: list, values: list, inferred: Inferred) -> None:
    """Step 4, the first instructions: each Python number becomes a tensor on the op's device (``values``
    holds each number already converted to its dtype, ``None`` for tensors) and each tensor whose dtype
    is not the kernel's is cast (a ``cast`` op).  ``inputs`` is updated in place."""
    for i, (x, dtype) in enumerate(zip(inputs, inferred.dtypes)):
        if values[i] is not None:
            inputs[i] = tensor(values[i], device=inferred.device)
        elif x.dtype != dtype:
            inputs[i] = apply("cast", [x], dtype=dtype)[0]


def make_outputs(inferred: Inferred, out=None) -> list:
    """Step 4: the tensors the OpCall writes.  New tensors with no memory yet (the VM allocates when it
    prepares the instruction); with ``out=``, each out tensor that has its result's shape and dtype is
    written directly, and another gets a new tensor that ``apply`` casts into it after the op."""
    if out is None:
        return [Tensor._new(inferred.device, *spec) for spec in inferred.outputs]
    return [o if o.shape == meta.shape and o.dtype == meta.dtype else Tensor._new(inferred.device, *spec)
            for o, meta, spec in zip(out, inferred.metas, inferred.outputs)]


def copy_overlapping_inputs(op, inputs: list, written: list) -> None:
    """Step 4, before an OpCall that writes ``written``: an input that may overlap one of them (and is not
    the very same view, for an op that allows it) is replaced by a copy, since the op must read the
    input before it changes.  Decided on the blobs' layouts alone; ``inputs`` is updated in place."""
    for i, x in enumerate(inputs):
        if any(may_overlap(x._blob, o._blob) and not (op.same_view_in_place and same_view(x._blob, o._blob))
               for o in written):
            inputs[i] = apply("contiguous", [x])[0]


def build_op_call(builder, inputs: list, outputs: list, inferred: Inferred, attrs: dict,
                  sequential: bool = False) -> None:
    """Step 4, what PhysicalRun calls with its ``InstructionsBuilder`` (OneFlow's ``builder->Call(...)``):
    append the OpCall instruction.  It reads the inputs' blobs, writes the outputs' blobs (and the op's
    mutable inputs), and runs on ``inferred.stream``, whose worker launches the op's kernel; ``sequential``:
    in that stream's order (an nn.Graph act's op, ``pyflow/runtime/act.py``)."""
    op, kernel, kernel_attrs = inferred.op, inferred.kernel, inferred.kernel_attrs

    def run(out_arrays, in_arrays, native_stream):   # what the worker calls
        op.launch(kernel, out_arrays, in_arrays, kernel_attrs, native_stream)

    on_failed = None if op.on_failed_inputs is None else (lambda failure: op.on_failed_inputs(attrs, failure))
    builder.call(op.name, run, [t._blob for t in inputs], [t._blob for t in outputs], inferred.stream,
                 op.mutable_inputs, sequential, on_failed_inputs=on_failed)


def apply(name: str, inputs, *, out=None, **attrs) -> list:
    """Run op ``name`` eagerly on ``inputs``; returns the output tensors.

    ``inputs`` are tensors, and Python scalars where the op promotes.  ``out``: a
    list of existing tensors to write the results into (see the module docstring).
    """
    if _program_tracer is not None and _program_tracer.active():   # inside cocktailer.trace: lower to uTasks
        return _program_tracer.apply(name, list(inputs), out, attrs)
    if _lazy_tracer is not None and _lazy_tracer.active():   # inside nn.Graph.build: record, don't run
        return _lazy_tracer.apply(name, list(inputs), out, attrs)
    op = get_op(name)
    inputs = list(inputs)
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    recording = _recorder is not None and _recorder.active(tensors, out)
    if any(t._global is not None for t in tensors) or (out and any(getattr(o, "_global", None) is not None
                                                                  for o in out)):
        if recording:
            _recorder.check_inplace(name, out)
        saved = _recorder.before(name, _global_scalars(op, inputs), out) if recording else None
        results = global_interpreter().apply(name, inputs, out, attrs)
        if recording:
            _recorder.after(name, op.backward, saved, results, attrs)
        return results
    return apply_local(op, inputs, len(tensors), out, attrs, recording)


def apply_local(op, inputs: list, tensors: int, out, attrs: dict, recording: bool = False) -> list:
    """The local interpreter on a routed call (``tensors`` inputs are local tensors, the rest numbers; or on pieces)."""
    name = op.name
    if op.view is not None:   # a view op: a new layout over the input's storage, no instruction
        return [apply_view(op, inputs[0], attrs, _recorder if recording else None)]
    for x in inputs if tensors != len(inputs) else ():
        if not isinstance(x, Tensor) and not is_scalar(x):
            raise ArgumentTypeError(f"op {name!r}: expects tensors (or numbers), got {type(x).__name__}: {x!r:.60}")
    if "device" in attrs:
        attrs["device"] = args.device(attrs["device"], name)
    if op.updates_input is not None and out is None and isinstance(inputs[op.updates_input], Tensor):
        out = [inputs[op.updates_input].clone()]   # out of place: the op updates a copy of that input
        inputs[op.updates_input] = out[0]
    inferred = infer(op, inputs, attrs)   # steps 1-3
    try:
        values = [to_scalar(x, d, name) if is_scalar(x) else None
                  for x, d in zip(inputs, inferred.dtypes)] if inferred.converts else None
        if out is not None:
            out = list(out)
            check_out(out, inferred)
    except _CHECK_ERRORS as error:
        raise _rejected(error, name, inputs) from None
    if recording:
        _recorder.check_inplace(name, out)

    # --- everything is checked: from here on, instructions are issued -------------------------------
    if values is not None:
        convert_inputs(inputs, values, inferred)
    outputs = make_outputs(inferred, out)
    written = () if out is None else [o for o, result in zip(out, outputs) if result is o]   # by the kernel itself
    if written:
        copy_overlapping_inputs(op, inputs, written)
    saved = _recorder.before(name, inputs, written) if recording else None
    vm.run(lambda builder: build_op_call(builder, inputs, outputs, inferred, attrs))
    for o in written:
        o._bump_version()
    if recording:
        _recorder.after(name, op.backward, saved, outputs, attrs)
    if out is None:
        return outputs
    for o, result in zip(out, outputs):
        if result is not o:   # another shape or dtype: the result is broadcast (the expand op) and cast into o
            expanded = result if tuple(result.shape) == tuple(o.shape) else result.expand(*o.shape)
            apply("cast", [expanded], dtype=o.dtype, out=[o])
    return out


# The Tensor module imports this one (its methods call ``apply``) and ``apply`` makes Tensors: importing
# it last lets either module load first, and keeps an import statement off the path of every op call.
from pyflow.framework.tensor import Tensor, tensor  # noqa: E402
