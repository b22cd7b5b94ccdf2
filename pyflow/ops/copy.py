"""Copy ops: ``copy`` between devices (host<->device streams) and ``contiguous``.

``copy`` chooses its own stream (OneFlow's device-and-stream inference for copy
ops).  cpu -> cuda runs on the target device's host2device stream.  Its output is
allocated on that device's compute stream, which owns the allocator, and the
builder inserts the stream wait.  cuda -> cpu runs on the source device's
device2host stream, into pinned host memory; every instruction there records an
event, so the host knows when the data has landed.

SBP: ``contiguous`` is elementwise (``elementwise_signatures``), and a copy of a
partial sum is one; ``copy`` (a local move between devices) is broadcast only.
"""

from __future__ import annotations

import numpy as np

from pyflow.device import Device, DeviceType, Stream, StreamType, default_stream
from pyflow.errors import DeviceError
from pyflow.framework.op_registry import BROADCAST_ONLY, OpDef, TensorMeta, register_op
from pyflow.framework.sbp import P
from pyflow.kernels.layout import is_device_array
from pyflow.ops.elementwise import elementwise_signatures

__all__ = []


def _infer_same(inputs, attrs):
    return [TensorMeta(inputs[0].shape, inputs[0].dtype)]


def _copy_device_and_stream(inputs, attrs):
    source, target = inputs[0].device, Device(attrs["device"])
    if source.device_type is DeviceType.cpu and target.device_type is not DeviceType.cpu:
        return target, Stream.new(target, StreamType.host2device)
    if source.device_type is not DeviceType.cpu and target.device_type is DeviceType.cpu:
        return target, Stream.new(source, StreamType.device2host)
    if source is target:
        return target, default_stream(target)
    raise DeviceError(f"copy: from {source} to {target} is not a host<->device copy; go through the host")


def _launch_copy(kernel, outputs, inputs, attrs, stream):
    (destination,), (source,) = outputs, inputs
    if destination.size == 0:
        return  # nothing to move (and numba compares the strides of empty arrays)
    if is_device_array(destination) and not is_device_array(source):
        destination.copy_to_device(np.ascontiguousarray(source), stream=stream)
    elif is_device_array(source) and not is_device_array(destination):
        source.copy_to_host(destination, stream=stream)
    else:
        np.copyto(destination, source)


def _copy_rule(ctx, g):
    """Back to the device the input was on (the gradient of a move is the move back)."""
    return [g.to(device=ctx.input_places[0])]


register_op(OpDef("copy", _infer_same, kernel=None, launch=_launch_copy, sbp_signatures=BROADCAST_ONLY,
                  backward=_copy_rule, infer_device_and_stream=_copy_device_and_stream,
                  doc="copy to attrs['device'] (host2device / device2host streams)"))
register_op(OpDef("contiguous", _infer_same, kernel="copy",
                  # a copy of a partial sum is one (autograd clones gradients)
                  sbp_signatures=elementwise_signatures(partial_sums=[(P,)]),
                  backward=lambda ctx, g: [g], doc="a contiguous copy on the same device"))
