"""Tensors in, tensors out: a compiled program's call as ONE VM instruction (seed 001 on seed 002).

``compiled(*args)`` with ``pyflow.Tensor`` arguments comes here.  OneFlow runs a
static graph's call as one instruction with its reads and writes declared
(``LaunchLazyJob``); a Cocktailer program gets the same treatment, so eager ops
and compiled control flow mix on the same tensors with the VM's ordering:

1. **Device**: the first tensor argument's; every tensor must be a local tensor
   on it.  Other arguments (numpy arrays) become tensors there first.
2. **Check** count, shapes and dtypes against the trace, at the call: nothing
   is issued for a bad call.  A non-contiguous tensor is made contiguous (an
   eager op), since a program reads flat buffers.
3. **Outputs** are fresh tensors with no memory yet: the VM allocates them from
   the device's caching allocator when it prepares the instruction, as for any op.
4. **Arena**: every other buffer of the program (intermediates, loop state,
   recursion stacks, the status word) is a flat view into ONE storage
   (``arena_layout``), allocated from the same allocator with the outputs and
   given back by the instruction once the program is queued.
5. **Issue** ``InstructionsBuilder.launch_program``: one instruction on the
   device's compute stream that reads the inputs and writes the outputs and the
   arena; SoftSyncStream adds the waits for inputs last used on other streams.
6. **Run**, on the stream's worker in stream order: ``executor.execute`` over
   those arrays with the ep stream's native stream: the persistent kernel (1
   launch, 0 host syncs) or the host walk (a launch per operator and a host read
   per decision, all inside this one instruction); then each output view is
   copied into its tensor.

The call returns the output tensors at once; reading one (``numpy()``) waits,
as for any op, and raises the program's error (``StackOverflowError``...) as the
cause of an ``OpError``.  ``compiled.last_stats`` are the counts of the last call
that *ran*: read them after a sync.  Outputs carry no autograd history.

Memory the kernels can read: a CUDA device's (GPU or simulator) and, in the
simulator, host memory too (its kernels run on the host), so CPU tensors work
the same way there.  On a real GPU a CPU tensor's program is staged through the
executor's own device buffers (the array path, inside the instruction).
"""

from __future__ import annotations

import math

import numpy as np

from pyflow import vm
from pyflow.cocktailer.executor import copy_into
from pyflow.device import DeviceType, default_stream
from pyflow.errors import ArgumentTypeError, DeviceError
from pyflow.framework.args import describe
from pyflow.framework.tensor import Tensor, tensor
from pyflow.kernels.backend import is_simulator
from pyflow.vm.eager_blob_object import EagerBlobObject, TensorStorage

__all__ = ["call_with_tensors", "arena_layout", "ALIGNMENT", "has_tensors"]

ALIGNMENT = 64   # bytes: every arena buffer starts at a multiple, a whole number of its own elements


def has_tensors(args) -> bool:
    """Does this call take the tensor path (any argument a ``pyflow.Tensor``)?"""
    return any(isinstance(a, Tensor) for a in args)


def arena_layout(buffers) -> tuple:
    """``([(name, byte offset, elements, dtype)], total bytes)`` for ``[(name, elements, dtype)]``, packed in order.

    >>> layout, nbytes = arena_layout([("a", 3, np.dtype("float32")), ("status", 4, np.dtype("int64"))])
    >>> [(name, offset) for name, offset, _, _ in layout], nbytes
    ([('a', 0), ('status', 64)], 128)
    """
    layout, end = [], 0
    for name, size, dtype in buffers:
        layout.append((name, end, size, dtype))
        end = -(-(end + size * dtype.itemsize) // ALIGNMENT) * ALIGNMENT
    return layout, end


def _flat(blob: EagerBlobObject) -> EagerBlobObject:
    """The same (contiguous) memory seen as one flat row: what a program buffer is."""
    return blob.view((math.prod(blob.shape),), (1,), blob.offset)


def _device_of(program_name: str, args):
    tensors = [a for a in args if isinstance(a, Tensor)]
    for t in tensors:
        if t.is_global:
            raise ArgumentTypeError(f"{program_name}: a compiled program takes local tensors, got {describe(t)}; "
                                    "use .to_local()")
    device = tensors[0].device
    others = [t for t in tensors if t.device is not device]
    if others:
        raise DeviceError(f"{program_name}: the tensor arguments are on different devices "
                          f"({', '.join(describe(t) for t in tensors)}); move them with .to({str(device)!r}) first")
    return device


def call_with_tensors(executor, args):
    """Issue one call of ``executor``'s program on tensors (see the module docstring); returns tensors."""
    program = executor.program
    device = _device_of(program.name, args)
    executor.check_inputs(args)
    inputs = []
    for (_, _, spec), a in zip(program.inputs, args):
        if not isinstance(a, Tensor):
            a = tensor(np.ascontiguousarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a,
                                            dtype=spec.dtype).reshape(spec.shape), device=device)
        inputs.append(a if a.is_contiguous() else a.contiguous())
    outputs = [Tensor._empty(device, ref.shape, ref.dtype) for ref in program.outputs]

    host_memory = device.device_type is not DeviceType.cuda
    staged = host_memory and not is_simulator()   # a GPU's kernels cannot read host memory
    layout, nbytes = arena_layout([] if staged else executor.scratch_buffers())
    arena = TensorStorage(device, nbytes)
    scratch = [EagerBlobObject(arena, (size,), dtype, offset=offset // dtype.itemsize)
               for _, offset, size, dtype in layout]
    names = [name for name, _, _, _ in layout]
    count = len(outputs)

    def run(out_arrays, in_arrays, native_stream):   # on the stream's worker, in stream order
        results, arena_arrays = out_arrays[:count], out_arrays[count:]
        if staged:
            views = executor.run(*(a.reshape(s.shape) for a, (_, _, s) in zip(in_arrays, program.inputs)))
            views = [views] if program.single_output else views
            for dst, src in zip(results, views):
                np.copyto(dst, src.reshape(-1))
            return
        memory = {buffer.name: a for (_, buffer, _), a in zip(program.inputs, in_arrays)}
        memory.update(zip(names, arena_arrays))
        with executor._lock:   # one call at a time (another device's worker may run this program too)
            try:
                views = executor.execute(memory, native_stream)
                for dst, src in zip(results, views):
                    copy_into(dst, src, native_stream)
            finally:
                executor.last_stats = executor.stats

    vm.run(lambda builder: builder.launch_program(
        f"cocktailer[{program.name}]", run, [_flat(t._blob) for t in inputs], [_flat(t._blob) for t in outputs],
        scratch, default_stream(device)))
    return outputs[0] if program.single_output else tuple(outputs)

