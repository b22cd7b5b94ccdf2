"""Seeds 000/002: the eager interpreter: from ``apply("relu", [x])`` to an OpCall instruction.

For one op call, in OneFlow's order:

1. **GetDefaultDevice** - the first input's device; with no inputs, the
   ``device`` attribute (which must exist on this machine), else cpu.  Every
   input must be on that device; mixing devices is an error that says to use
   ``.to()``.
2. **InferDeviceAndStream** - the device's default (compute) stream, unless the op
   defines its own (copies between devices use host2device / device2host).
3. **Type promotion** (``OpDef.promote_inputs``, PyTorch's rule in
   ``dtypes.py``) and **shape/dtype inference** (``OpDef.infer``) - here, at the
   call: bad input raises now, naming op, shapes, dtypes and devices.  Nothing
   has been issued yet, so a rejected call leaves no instruction behind.
4. Issue: Python scalars become tensors, operands are cast to the common dtype,
   the output tensors are created (no memory yet: the VM allocates when it
   prepares the instruction), and **PhysicalRun** issues an
   ``InstructionsBuilder.call``.

**Writing into existing tensors** (``out=``): in-place ops (``x.add_(y)``,
``x += y``, ``x[idx] = v``) pass the tensors to write.  The OpCall then *writes*
their storage, so the VM orders it after every earlier reader (WAR) and writer
(WAW).  PyTorch's rule applies: the result must broadcast to the output's shape
and be castable to its dtype (``int_tensor.add_(1.5)`` is a ``DTypeError``); when
it has another shape or dtype, the op writes a temporary that a ``cast`` then
copies into the output.  An input that overlaps an output's memory without
being the very same view (``x[1:] += x[:-1]``) is copied first, decided on the
blobs' layouts alone (no data is read).  Every write bumps the storage's version
counter (``tensor._version``).

**The inference cache.**  Steps 1-3 depend only on the op, each input's (shape,
dtype, device) or Python scalar type, and the attributes, so their result (an
``Inferred``: device, stream, each input's kernel dtype, the output metas, the
kernel) is kept per such *signature*, as OneFlow caches its op interpreter
contexts.  A signature seen before skips straight to step 4; any change of shape,
dtype, device, scalar type or attribute is a different signature, inferred (and
checked) afresh.  A call that fails inference is never cached.
"""

from __future__ import annotations

import math

import numpy as np

from pyflow import vm
from pyflow.device import Device, DeviceType, default_stream
from pyflow.errors import ArgumentTypeError, AxisError, DeviceError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import DEFAULT_FLOAT, can_cast, category, is_scalar, result_type, to_scalar
from pyflow.framework.op_registry import TensorMeta, get_op
from pyflow.kernels.layout import contiguous_strides, padded_strides
from pyflow.kernels.registry import get_kernel

__all__ = ["apply", "get_default_device", "kernel_target", "describe", "global_interpreter"]

# OneFlow picks an interpreter per call: EagerLocalInterpreter for local tensors,
# EagerGlobalInterpreter when an input is global.  pyflow.distributed installs the
# global one here (it sits above this layer: placement, SBP signatures, boxing).
_global_interpreter = None


def global_interpreter():
    """The interpreter of global tensors (``pyflow.distributed.global_ops``)."""
    if _global_interpreter is None:
        import pyflow.distributed  # noqa: F401  (installs it)
    return _global_interpreter


def install_global_interpreter(interpreter) -> None:
    global _global_interpreter
    _global_interpreter = interpreter


# Autograd records each op here (pyflow.autograd installs its Recorder; it sits above this layer).
_recorder = None


def install_recorder(recorder) -> None:
    global _recorder
    _recorder = recorder

# nn.Graph's lazy mode records ops into a Job instead of running them (pyflow.compiler.lazy installs it).
_lazy_tracer = None


def install_lazy_tracer(tracer) -> None:
    global _lazy_tracer
    _lazy_tracer = tracer


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


def _internal_overlap(t) -> bool:
    """Do two elements of ``t`` share memory (a stride-0, expanded dim)?"""
    return math.prod(t.shape) > 1 and any(s == 0 and n > 1 for n, s in zip(t.shape, t._blob.strides))


def _check_out(name, out, metas, device) -> None:
    """PyTorch's rules for writing an op's results into existing tensors."""
    from pyflow.framework.tensor import Tensor

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
        if _internal_overlap(o):
            raise ShapeError(f"op {name!r}: several elements of the output {describe(o)} share one memory "
                             "location (an expanded view); write to a .clone() instead")


def _span(blob) -> tuple:
    """The first and last storage element a blob's layout can touch."""
    last = blob.offset + sum((n - 1) * s for n, s in zip(blob.shape, blob.strides))
    return blob.offset, last


def _same_view(a, b) -> bool:
    return (a.storage is b.storage and a.shape == b.shape and a.strides == b.strides
            and a.offset == b.offset and a.dtype == b.dtype)


def may_overlap(a, b) -> bool:
    """Could blobs ``a`` and ``b`` touch a common element?  (The layouts' ranges intersect.)"""
    if a.storage is not b.storage or not math.prod(a.shape) or not math.prod(b.shape):
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 <= b1 and b0 <= a1


def broadcast_view(t, shape):
    """``t`` seen with ``shape`` (stride 0 on broadcast dims): a view, no copy."""
    shape = tuple(shape)
    if tuple(t.shape) == shape:
        return t
    return t._view(shape, padded_strides(t.shape, t._blob.strides, shape), t._blob.offset)


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
    from pyflow.framework.tensor import Tensor

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


def infer(op, name: str, inputs: list, tensors: list, attrs: dict) -> Inferred:
    """Steps 1-3 for a call (device, stream, promotion, shapes), from the cache when the signature was seen."""
    key = _signature(op, inputs, attrs)
    found = _inferred.get(key) if key is not None else None
    if found is not None and found.op is op:
        cache_stats["hits"] += 1
        return found
    cache_stats["misses"] += 1
    if op.infer_device_and_stream is not None:
        device, stream = op.infer_device_and_stream(tensors, attrs)
    else:
        device = get_default_device(name, tensors, attrs.get("device"))
        stream = default_stream(device)
    dtypes = _promoted_dtypes(op, inputs)
    metas = op.infer([TensorMeta(tuple(getattr(x, "shape", ())), d) for x, d in zip(inputs, dtypes)], attrs)
    found = Inferred(op, device, stream, dtypes, metas, attrs, inputs)
    if key is not None:
        if len(_inferred) >= _CACHE_LIMIT:
            _inferred.clear()
        _inferred[key] = found
    return found


def clear_inference_cache() -> None:
    """Forget every cached signature (tests; an op re-registered under a name)."""
    _inferred.clear()


def apply(name: str, inputs, *, out=None, **attrs) -> list:
    """Run op ``name`` eagerly on ``inputs``; returns the output tensors.

    ``inputs`` are tensors, and Python scalars where the op promotes.  ``out``: a
    list of existing tensors to write the results into (see the module docstring).
    """
    from pyflow.framework.tensor import Tensor, tensor

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
    for x in inputs if len(tensors) != len(inputs) else ():
        if not isinstance(x, Tensor) and not is_scalar(x):
            raise ArgumentTypeError(f"op {name!r}: expects tensors (or numbers), got {type(x).__name__}: {x!r:.60}")
    if "device" in attrs:
        attrs["device"] = args.device(attrs["device"], name)
    if op.updates_input is not None and out is None and isinstance(inputs[op.updates_input], Tensor):
        out = [inputs[op.updates_input].clone()]   # out of place: the op updates a copy of that input
        inputs[op.updates_input] = out[0]
    try:
        inferred = infer(op, name, inputs, tensors, attrs)
        device, stream, dtypes, metas = inferred.device, inferred.stream, inferred.dtypes, inferred.metas
        values = [to_scalar(x, d, name) if is_scalar(x) else None
                  for x, d in zip(inputs, dtypes)] if inferred.converts else None
        if out is not None:
            out = list(out)
            _check_out(name, out, metas, device)
    except _CHECK_ERRORS as error:
        if inputs:
            raise type(error)(f"{error} [op {name!r}, inputs: {_describe(inputs)}]") from None
        raise
    kernel = inferred.kernel
    if recording:
        _recorder.check_inplace(name, out)

    # --- everything is checked: from here on, instructions are issued -------------------------------
    if values is not None:
        for i, (x, dtype) in enumerate(zip(inputs, dtypes)):
            if values[i] is not None:
                inputs[i] = tensor(values[i], device=device)
            elif x.dtype != dtype:
                inputs[i] = apply("cast", [x], dtype=dtype)[0]
    if out is None:
        outputs, written = [Tensor._new(device, *spec) for spec in inferred.outputs], ()
    else:
        outputs, written = [], []   # written: the out= tensors the kernel writes itself
        for o, meta, spec in zip(out, metas, inferred.outputs):
            if o.shape == meta.shape and o.dtype == meta.dtype:
                written.append(o)
                outputs.append(o)
            else:
                outputs.append(Tensor._new(device, *spec))
    for i, x in enumerate(inputs if written else ()):
        if any(may_overlap(x._blob, o._blob) and not (op.same_view_in_place and _same_view(x._blob, o._blob))
               for o in written):
            inputs[i] = apply("contiguous", [x])[0]   # a copy: the op must read x before it changes
    kernel_attrs = inferred.kernel_attrs

    def run(out_arrays, in_arrays, native_stream):
        op.launch(kernel, out_arrays, in_arrays, kernel_attrs, native_stream)

    on_failed = None if op.on_failed_inputs is None else (lambda failure: op.on_failed_inputs(attrs, failure))
    saved = _recorder.before(name, inputs, written) if recording else None
    vm.run(lambda builder: builder.call(name, run, [t._blob for t in inputs], [t._blob for t in outputs],
                                        stream, op.mutable_inputs, on_failed_inputs=on_failed))
    for o in written:
        o._bump_version()
    if recording:
        _recorder.after(name, op.backward, saved, outputs, attrs)
    if out is None:
        return outputs
    for o, result in zip(out, outputs):
        if result is not o:   # another shape or dtype: the result is broadcast and cast into o
            apply("cast", [broadcast_view(result, o.shape)], dtype=o.dtype, out=[o])
    return out
