"""Turn generated kernel source into a ``pyflow.kernels.jit`` kernel (seed 001's code generator output).

``pyflow/cocktailer/codegen.py`` writes the Python source of a persistent kernel;
this module is where that source becomes device code, so device code still only
comes into being inside ``kernels/``:

    kernel = build_kernel(source, "uprogram_0", namespace={"copy_utask": copy_utask, ...})

The source is registered with ``linecache`` under a name like
``<cocktailer uprogram_0 #3>``, so tracebacks, the simulator's error messages and
``pdb`` (``breakpoint()`` inside the kernel, ``list``, ``step``) show the generated
lines like any other file.

``private_copy(fn)`` is a second, separately compiled device function with ``fn``'s
Python source: what a non-inlined function uTask calls instead of the uTasks the
kernel shares with it (``codegen.KernelSource.device_function`` says why).

``uoperator_kernel(fn, n_args)`` is the other half: one operator as its own launch,
``op_kernel[blocks, threads](u_begin, u_end, *args)`` runs uTasks
``u_begin <= u < u_end`` of ``fn`` in the virtual-block loop.  Cocktailer's host
executor (every operator its own kernel) launches these.
"""

from __future__ import annotations

import functools
import itertools
import linecache

from pyflow.kernels.backend import cuda
from pyflow.kernels.jit import jit, max_cooperative_grid_blocks

__all__ = ["build_kernel", "cooperative_grid_limit", "private_copy", "uoperator_kernel"]

_serial = itertools.count()


def build_kernel(source: str, name: str, namespace: dict, **jit_options):
    """``jit`` the function ``name`` defined in ``source``; ``namespace`` gives its globals.

    ``cuda`` and ``jit`` are always in the namespace.  Returns the kernel (a
    ``GpuKernel`` on a GPU, a ``SimKernel`` in the simulator); the source stays
    readable through ``linecache`` and ``inspect``.
    """
    filename = f"<cocktailer {name} #{next(_serial)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    env = {"cuda": cuda, "jit": jit, "__name__": f"pyflow.kernels.utask.generated.{name}"}
    env.update(namespace)
    exec(compile(source, filename, "exec"), env)  # noqa: S102 - our own generated source
    return jit(env[name], **jit_options)


def private_copy(fn):
    """A new device function compiled from ``fn``'s Python function: same code, a module of its own.

    numba-cuda links a device function's module into every caller's module, and a
    kernel's PTX is its module plus every module linked below it, duplicates
    included.  Functions are merged (``linkonce_odr``), shared arrays are not: a
    uTask that declares ``cuda.shared.array`` and is reached from one kernel along
    two paths (called by the kernel, and by a device function the kernel calls)
    defines its shared array twice, and NVVM rejects the kernel with
    ``ERROR_INVALID_IR``.  A copy gets its own module, its own mangled name and its
    own shared array (numba numbers every shared array it compiles), so each path
    reaches a different one.  In the simulator a copy runs the same Python function
    (its shared arrays are keyed by source line, which is harmless: a block runs one
    uTask at a time).
    """
    py_func = getattr(fn, "py_func", None)
    if py_func is None:
        raise TypeError(f"private_copy: {fn!r} is not a device function (it has no py_func)")
    return jit(py_func, device=True)


def cooperative_grid_limit(kernel, args, block: int) -> int:
    """How many blocks of ``block`` threads of ``kernel`` fit on the device at once.

    On a GPU the kernel is compiled for the types of ``args`` first (the limit
    depends on its registers); in the simulator it comes from the occupancy model.
    """
    signature = None
    if hasattr(kernel, "dispatcher"):  # a GpuKernel: compile for these argument types
        from numba import typeof

        signature = tuple(typeof(a) for a in args)
        kernel.dispatcher.compile(signature)
    return max_cooperative_grid_blocks(kernel, block, 0, signature)


@functools.cache
def uoperator_kernel(fn, n_args: int):
    """A kernel running uTasks ``[u_begin, u_end)`` of the device function ``fn(u, *args)``."""
    names = ", ".join(f"a{i}" for i in range(n_args))
    source = (
        f"def uoperator(u_begin, u_end, {names}):\n"
        f"    # the virtual-block loop: block-uniform, so barriers inside fn are safe\n"
        f"    for u in range(u_begin + cuda.blockIdx.x, u_end, cuda.gridDim.x):\n"
        f"        fn(u, {names})\n")
    return build_kernel(source, "uoperator", {"fn": fn})
