"""Kernels and device functions in the simulator: ``SimKernel``, ``SimDeviceFunction``.

``pyflow.kernels.jit`` returns these when the backend is the simulator.  They
keep the API of a numba.cuda dispatcher (``kernel[grid, block, stream, shmem](*args)``,
``kernel.overloads[sig].max_cooperative_grid_blocks(blockdim, dynsmem)``,
``py_func``) so the same source runs on a GPU unchanged.

A launch:
1. validates the configuration (``launch_config.validate_launch``);
2. if the kernel uses grid sync (found by reading its bytecode and that of the
   device functions it calls), checks that the grid fits the co-resident limit;
3. unwraps device arrays to the numpy arrays behind them (no copies);
4. runs it on the tier ``tiers.compiled_for`` picks: compiled (njit loops over
   blocks and threads, ``compiled.py``), or threaded (a ``grid.GridRun``; only one
   threaded launch runs at a time).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import threading

from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray, FakeWithinKernelCUDAArray
from numba.cuda.simulator.kernel import FakeCUDAKernel

from pyflow.errors import CooperativeLaunchTooLargeError, KernelError, LaunchConfigError
from pyflow.kernels.backend import cuda
from pyflow.kernels.launch_config import split_config, validate_launch

from . import settings as _settings
from .fake_cuda import SharedMemory, SimCudaModule
from .grid import GridRun, SimThread
from .tiers import compiled_for, launch_work

__all__ = ["jit", "SimKernel", "SimDeviceFunction", "SimLaunch"]

_launch_lock = threading.Lock()
# Numba's own simulated device functions look up the active fake module here.
_stock_kernel_module = sys.modules["numba.cuda.simulator.kernel"]
_CODEGEN_ONLY_OPTIONS = {"debug", "opt", "lineinfo", "fastmath", "max_registers", "cache",
                         "inline", "lto", "boundscheck", "forceinline", "argtypes", "restype",
                         "shared_memory_carveout"}


def jit(func_or_sig=None, device: bool = False, **options):
    """The simulator's ``cuda.jit``: same arguments, returns a SimKernel / SimDeviceFunction."""
    unknown = set(options) - _CODEGEN_ONLY_OPTIONS - {"link"}
    if unknown:
        raise TypeError(f"jit() got unexpected options {sorted(unknown)}")
    if options.get("link"):
        raise LaunchConfigError("the CUDA simulator cannot link PTX/CUDA sources (jit(link=...))")

    def build(fn):
        if not inspect.isfunction(fn):
            raise TypeError(f"jit expects a Python function, got {fn!r}")
        return SimDeviceFunction(fn) if device else SimKernel(fn, debug=bool(options.get("debug")))

    if inspect.isfunction(func_or_sig):
        return build(func_or_sig)
    return build  # jit("void(float32[:])") or jit(device=True): a decorator


class SimDeviceFunction:
    """A device function; called inside a launch it sees that launch's ``cuda``."""

    def __init__(self, fn):
        self.py_func = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        grid = getattr(threading.current_thread(), "sim_grid", None)
        if grid is None:  # called from host code (handy in tests)
            return self.py_func(*args)
        return grid.rebind(self.py_func)(*args)


class _SimOverload:
    """Stands for a compiled overload: answers the co-residency question."""

    def __init__(self, kernel: "SimKernel"):
        self._kernel = kernel

    def max_cooperative_grid_blocks(self, blockdim, dynsmemsize: int = 0) -> int:
        return self._kernel.max_cooperative_grid_blocks(blockdim, dynsmemsize)


class _SimOverloads(dict):
    def __init__(self, kernel):
        super().__init__()
        self._kernel = kernel

    def __getitem__(self, signature):
        return _SimOverload(self._kernel)


class SimKernel:
    """A ``@jit`` kernel in the simulator.  ``kernel[grid, block]`` gives a launcher."""

    def __init__(self, fn, debug: bool = False):
        self.py_func = fn
        self.debug = debug
        functools.update_wrapper(self, fn)
        self._uses_grid_sync = None

    def __getitem__(self, config) -> "SimLaunch":
        grid, block, stream, dynshared = split_config(config, self.__name__)
        grid, block = validate_launch(grid, block, dynshared, self.__name__)
        return SimLaunch(self, grid, block, stream, dynshared)

    def __call__(self, *args):
        raise LaunchConfigError(
            f"kernel {self.__name__!r} needs a launch configuration: {self.__name__}[blocks, threads](...)")

    def forall(self, ntasks: int, tpb: int = 0, stream=0, sharedmem: int = 0) -> "SimLaunch":
        if ntasks < 0:
            raise LaunchConfigError(f"forall needs a non-negative task count, got {ntasks}")
        tpb = tpb or 128
        return self[max(1, math.ceil(ntasks / tpb)), tpb, stream, sharedmem]

    @property
    def overloads(self):
        return _SimOverloads(self)

    def specialize(self, *args):
        return self

    def compile(self, signature=None):
        return _SimOverload(self)

    def max_cooperative_grid_blocks(self, blockdim, dynsmemsize: int = 0) -> int:
        """The simulated GPU's co-resident block limit for this block shape."""
        _, block = validate_launch(1, blockdim, dynsmemsize, self.__name__)
        return _settings.max_coresident_blocks(block[0] * block[1] * block[2], dynsmemsize)

    @property
    def uses_grid_sync(self) -> bool:
        """Does the kernel (or a device function it calls) use ``this_grid()``?"""
        if self._uses_grid_sync is None:
            self._uses_grid_sync = _mentions_this_grid(self.py_func, set())
        return self._uses_grid_sync


class SimLaunch:
    """``kernel[grid, block, stream, shmem]``: build once, call many times."""

    def __init__(self, kernel: SimKernel, grid, block, stream, dynshared: int):
        self.kernel, self.grid, self.block = kernel, grid, block
        self.stream, self.dynshared = stream, dynshared

    def __call__(self, *args) -> None:
        if isinstance(threading.current_thread(), SimThread):
            raise LaunchConfigError("launching a kernel from device code is not supported")
        name = self.kernel.__name__
        s = _settings.settings()
        threads = self.block[0] * self.block[1] * self.block[2]
        blocks = self.grid[0] * self.grid[1] * self.grid[2]
        limit = _settings.max_coresident_blocks(threads, self.dynshared, s)
        cooperative = self.kernel.uses_grid_sync
        if cooperative and blocks > limit:
            raise CooperativeLaunchTooLargeError(
                f"kernel {name!r} uses grid sync, so all {blocks} blocks must be co-resident, but the "
                f"simulated GPU fits {limit} blocks of {threads} threads ({s.multiprocessor_count} SMs); "
                "launch at most kernel.max_cooperative_grid_blocks(blockdim, dynsmem) blocks")
        args = [_kernel_argument(a) for a in args]
        work = launch_work(threads * blocks, args)
        chosen = compiled_for(self.kernel, threads * blocks, args, s, work)
        if chosen is not None:   # the compiled tier (tiers.py): no simulated threads, no launch lock
            compiled, prepared = chosen
            self.kernel.last_tier = "compiled"
            try:
                compiled.launch(prepared, self.grid, self.block, self.dynshared, args, s.hang_timeout, s.cores,
                                work)
            except KernelError as error:
                if cooperative or error.block_idx is None:
                    raise
                self._rerun_threaded(args, error, limit, s)
                raise
            return
        self.kernel.last_tier = "threads"
        self._run_threaded(args, limit, cooperative, s)

    def _run_threaded(self, args, limit, cooperative, s, only_blocks=None) -> None:
        fake = SimCudaModule(self.grid, self.block)
        run = GridRun(self.kernel.__name__, self.kernel.py_func, args,
                      self.grid, self.block, lambda: SharedMemory(self.dynshared),
                      limit, cooperative, s, cuda, fake, debug=self.kernel.debug, only_blocks=only_blocks)
        with _launch_lock:
            previous_interval = sys.getswitchinterval()
            _stock_kernel_module._kernel_context = fake
            try:
                if s.switch_interval:
                    sys.setswitchinterval(s.switch_interval)
                run.execute()
            finally:
                sys.setswitchinterval(previous_interval)
                _stock_kernel_module._kernel_context = None

    def _rerun_threaded(self, args, error, limit, s) -> None:
        """A compiled launch failed in a block: run that block threaded, which names the failing line.

        Its blocks are independent (no grid barrier), so the block alone fails the same way, unless
        what it read was written by another block of the failed launch; then the compiled error stands.
        """
        try:
            self._run_threaded(args, limit, False, s, only_blocks={tuple(error.block_idx)})
        except KernelError as located:
            raise KernelError(f"{located} (the compiled tier failed in this block; re-run threaded to name the "
                              "line)", kernel=located.kernel, thread_idx=located.thread_idx,
                              block_idx=located.block_idx) from error


def _kernel_argument(arg):
    """What a simulated kernel receives: the numpy array behind a device array."""
    if isinstance(arg, FakeWithinKernelCUDAArray):
        arg = arg._item
    if isinstance(arg, FakeCUDAArray):
        return arg._ary
    return arg


def _mentions_this_grid(fn, seen: set) -> bool:
    """Read bytecode names: does fn, or a device function it reaches, use this_grid?"""
    if fn in seen:
        return False
    seen.add(fn)
    code = fn.__code__
    if "this_grid" in code.co_names:
        return True
    referenced = [fn.__globals__.get(n) for n in code.co_names]
    referenced += [cell.cell_contents for cell in (fn.__closure__ or ()) if _cell_is_set(cell)]
    for obj in referenced:
        if isinstance(obj, SimDeviceFunction):
            target = obj.py_func
        elif isinstance(obj, FakeCUDAKernel):  # a device function made by numba's own cuda.jit
            target = obj.fn
        else:
            continue
        if _mentions_this_grid(target, seen):
            return True
    return False


def _cell_is_set(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
