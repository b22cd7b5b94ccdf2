"""Seeds 000/002: the eager interpreter: from ``apply("relu", [x])`` to an OpCall instruction.

For one op call, in OneFlow's order:

1. **GetDefaultDevice** - the first input's device; with no inputs, the
   ``device`` attribute, else cpu.  Every input must be on that device; mixing
   devices is an error that says to use ``.to()``.
2. **InferDeviceAndStream** - the device's default (compute) stream, unless the op
   defines its own (copies between devices use host2device / device2host).
3. **Shape/dtype inference** (``OpDef.infer``) - here, at the call: a bad shape
   raises now, naming op, shapes, dtypes and devices, and no instruction exists.
4. Create the output tensors (no memory yet: the VM allocates when it prepares
   the instruction) and **PhysicalRun** an ``InstructionsBuilder.call``.
"""

from __future__ import annotations

from pyflow import vm
from pyflow.device import Device, DeviceType, default_stream
from pyflow.errors import AxisError, DeviceError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework.op_registry import TensorMeta, get_op
from pyflow.kernels.registry import get_kernel

__all__ = ["apply", "get_default_device", "kernel_target", "describe"]


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


def describe(t) -> str:
    """A tensor as error messages name it: ``float32[2, 3] on cuda:0``."""
    return f"{t.dtype}{list(t.shape)} on {t.device}"


def _describe(inputs) -> str:
    return "; ".join(describe(t) for t in inputs)


def apply(name: str, inputs, **attrs) -> list:
    """Run op ``name`` eagerly on ``inputs`` (tensors); returns the output tensors."""
    from pyflow.framework.tensor import Tensor

    op = get_op(name)
    if op.infer_device_and_stream is not None:
        device, stream = op.infer_device_and_stream(inputs, attrs)
    else:
        device = get_default_device(name, inputs, attrs.get("device"))
        stream = default_stream(device)
    try:
        metas = op.infer([TensorMeta(tuple(t.shape), t.dtype) for t in inputs], attrs)
    except (ShapeError, DTypeError, AxisError, IndexOutOfRangeError) as error:
        if inputs:
            raise type(error)(f"{error} [op {name!r}, inputs: {_describe(inputs)}]") from None
        raise
    outputs = [Tensor._empty(device, meta.shape, meta.dtype) for meta in metas]
    kernel = get_kernel(op.kernel, kernel_target(stream.device)) if op.kernel else None
    kernel_attrs = {k: attrs[k] for k in op.kernel_attrs if k in attrs}

    def run(out_arrays, in_arrays, native_stream):
        op.launch(kernel, out_arrays, in_arrays, kernel_attrs, native_stream)

    vm.run(lambda builder: builder.call(name, run, [t._blob for t in inputs], [t._blob for t in outputs],
                                        stream, op.mutable_inputs))
    return outputs
