"""``pyflow.kernels.jit``: numba's ``cuda.jit`` plus pyflow's launch checks, on either backend.

Write kernels exactly as for ``numba.cuda.jit`` (same arguments), with
``from pyflow.kernels.backend import cuda`` at module level and ``cuda.x``
inside the kernel:

    @jit
    def add_one(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1

    add_one[blocks, threads](x)

On a GPU this is a numba.cuda dispatcher wrapped by ``GpuKernel``, which
validates each launch configuration (the driver's own error for a 0-block grid
is cryptic) and offers ``max_cooperative_grid_blocks(blockdim, dynsmem)``.  In
the simulator it is a ``sim.SimKernel``, which runs all blocks concurrently with
real grid barriers.  Device functions (``jit(device=True)``) are numba's own on a
GPU and ``sim.SimDeviceFunction`` in the simulator.
"""

from __future__ import annotations

import inspect

from pyflow.errors import LaunchConfigError
from pyflow.kernels import backend
from pyflow.kernels.launch_config import split_config, validate_launch

__all__ = ["jit", "GpuKernel", "max_cooperative_grid_blocks"]


def jit(func_or_sig=None, device: bool = False, **options):
    """Make a kernel (or, with ``device=True``, a device function) for the active backend."""
    if backend.is_simulator():
        from pyflow.kernels import sim

        return sim.jit(func_or_sig, device=device, **options)

    def build(fn):
        compiled = (backend.cuda.jit(func_or_sig, device=device, **options)(fn)
                    if not inspect.isfunction(func_or_sig) and func_or_sig is not None
                    else backend.cuda.jit(fn, device=device, **options))
        return compiled if device else GpuKernel(compiled)

    if inspect.isfunction(func_or_sig):
        return build(func_or_sig)
    return build


class GpuKernel:
    """A numba.cuda kernel dispatcher whose launches are validated first."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        self.py_func = dispatcher.py_func
        self.__name__ = self.py_func.__name__
        self.__doc__ = self.py_func.__doc__

    def __getitem__(self, config):
        grid, block, _stream, dynshared = split_config(config, self.__name__)
        validate_launch(grid, block, dynshared, self.__name__)
        return self.dispatcher[config]

    def __call__(self, *args):
        raise LaunchConfigError(
            f"kernel {self.__name__!r} needs a launch configuration: {self.__name__}[blocks, threads](...)")

    def max_cooperative_grid_blocks(self, blockdim, dynsmemsize: int = 0, signature=None) -> int:
        """The GPU's co-resident block limit for this kernel, compiled for ``signature``.

        The limit depends on the compiled code (its registers and shared memory), so
        the kernel must be compiled for the argument types of the launch first:
        ``signature`` is a tuple of numba types (``(float64[::1], int64)``; compiled
        here if it is not yet).  Without one, the kernel's only compiled signature
        is used; ``LaunchConfigError`` when it has none or several.
        """
        overloads = self.dispatcher.overloads
        if signature is not None:
            compiled = self.dispatcher.compile(signature)
        elif len(overloads) == 1:
            compiled = next(iter(overloads.values()))
        else:
            compiled_for = ("it is not compiled yet" if not overloads else
                            f"it is compiled for {len(overloads)} signatures: "
                            + "; ".join(str(tuple(sig)) for sig in overloads))
            raise LaunchConfigError(
                f"max_cooperative_grid_blocks: kernel {self.__name__!r} has no single compiled signature to "
                f"measure ({compiled_for}); pass the launch's argument types, signature=tuple(numba.typeof(a) "
                f"for a in args), or call pyflow.kernels.utask.generated.cooperative_grid_limit(kernel, args, "
                f"block), which compiles for them first")
        return compiled.max_cooperative_grid_blocks(blockdim, dynsmemsize)

    def __getattr__(self, name):
        return getattr(self.dispatcher, name)


def max_cooperative_grid_blocks(kernel, blockdim, dynsmemsize: int = 0, signature=None) -> int:
    """Co-resident block limit of ``kernel`` on the active backend (GPU or simulator)."""
    if backend.is_simulator():
        return kernel.max_cooperative_grid_blocks(blockdim, dynsmemsize)
    return kernel.max_cooperative_grid_blocks(blockdim, dynsmemsize, signature)
