"""pyflow's GPU-only code paths, checked against numba-cuda's real classes on a machine without a GPU.

The simulator replaces numba's ``DeviceNDArray`` with ``FakeCUDAArray`` (a numpy array), so what
only a real device array does is never seen there: its ``transpose`` works in 2-D only, its
slicing fails on empty arrays, and its memory is reference-counted by numba.  Each check here
runs in a fresh interpreter with ``PYFLOW_CUDA=gpu``: numba-cuda's own ``DeviceNDArray``,
``MemoryPointer`` and ``AutoFreePointer`` classes, over a made-up context (``FakeContext``) that
hands out addresses as numba's memory manager does and prints ``cuMemFree <bytes>`` when numba
frees one.  Nothing reaches a driver, so no data moves: the checks read shapes, strides, addresses
and the order of frees.  What needs a GPU (kernels reading those views) runs in the GPU suite.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numba import types

from pyflow.errors import LaunchConfigError
from pyflow.kernels.jit import GpuKernel

ROOT = pathlib.Path(__file__).resolve().parents[1]

PRELUDE = '''
import contextlib
import numpy as np
from pyflow.kernels.backend import cuda, is_gpu
from numba.cuda.cudadrv import devices, driver
from numba.cuda.cudadrv.devicearray import DeviceNDArray

assert is_gpu()


class FakeContext:
    """numba's context for the calls pyflow makes, at made-up addresses: memalloc does what numba's
    memory manager does (an AutoFreePointer kept in ``allocations``, handed out counted through .own(),
    whose finalizer forgets it and queues cuMemFree: here, prints it)."""

    def __init__(self):
        self.allocations, self.allocated, self.next_address = {}, 0, 0x7F0000000000

    def memalloc(self, size):
        address, self.next_address = self.next_address, self.next_address + (1 << 20)
        self.allocated += 1

        def cu_mem_free():
            self.allocations.pop(address, None)
            print("cuMemFree", size, flush=True)

        memory = driver.AutoFreePointer(self, driver.binding.CUdeviceptr(address), size, finalizer=cu_mem_free)
        self.allocations[address] = memory
        return memory.own()


context = FakeContext()
devices.get_context = lambda devnum=None: context   # where DeviceNDArray(...) allocates, or gets its NULL
devices._runtime.ensure_context = contextlib.nullcontext   # numba's @require_context: "one is current"
cuda.current_context = lambda devnum=None: context  # where CudaDevice.alloc allocates
cuda.gpus = [contextlib.nullcontext()]              # `with cuda.gpus[0]:` makes nothing current


def device_twin(host):
    """A real DeviceNDArray with the shape, strides and dtype of ``host`` (memory made up, no values)."""
    return DeviceNDArray(host.shape, host.strides, host.dtype)


def address(array):
    if hasattr(array, "__cuda_array_interface__"):
        return array.__cuda_array_interface__["data"][0]
    return array.__array_interface__["data"][0]
'''


def run_with_numba_cuda(body: str) -> subprocess.CompletedProcess:
    """Run ``PRELUDE + body`` with PYFLOW_CUDA=gpu; its output, checked for a clean exit."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PYFLOW_CUDA", "NUMBA_ENABLE"))}
    environment["PYFLOW_CUDA"] = "gpu"
    result = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


# --- views: kernels/layout.py on numba's DeviceNDArray --------------------------------------------


def test_the_strategies_layouts_give_numpys_views_of_a_real_device_array():
    """Every layout tests/strategies.py draws (permuted 3-D, sliced empty...) works on a DeviceNDArray,
    with numpy's shape, strides and first element, without a copy; an empty view has no memory."""
    result = run_with_numba_cuda('''
        from hypothesis import find, settings
        from tests.strategies import operands

        CASES = [((2, 3, 4), "permuted"), ((0, 0, 0), "permuted"), ((0,), "sliced"), ((2, 0), "sliced"),
                 ((3, 5), "sliced"), ((4, 3), "broadcast"), ((0, 2), "broadcast")]
        for shape, layout in CASES:
            operand = find(operands(shape, np.dtype(np.float32)),
                           lambda o: o.layout == layout and (0 in shape or not o.view(o.base).flags.c_contiguous),
                           settings=settings(database=None, max_examples=5000))
            host, base = operand.view(operand.base), device_twin(operand.base)
            allocated = context.allocated
            view = operand.view(base)
            what = f"{layout} {shape} of a base {operand.base.shape}"
            assert type(view) is DeviceNDArray, f"{what}: got {type(view).__name__}"
            assert context.allocated == allocated, f"{what}: the view allocated memory (a copy)"
            assert view.shape == host.shape, f"{what}: shape {view.shape}, numpy's {host.shape}"
            if host.size:
                assert view.strides == host.strides, f"{what}: strides {view.strides}, numpy's {host.strides}"
                offset, numpys = address(view) - address(base), address(host) - address(operand.base)
                assert offset == numpys, f"{what}: starts {offset} bytes in, numpy's {numpys}"
            else:
                assert address(view) == 0, f"{what}: an empty view points at memory"
            print("ok", what)
    ''')
    assert result.stdout.count("ok ") == 7, result.stdout


def test_sliced_and_permuted_views_of_a_real_device_array_equal_numpys():
    """Slices with steps of a strided (even broadcast) array, a 4-D permutation, and a 0-d array."""
    run_with_numba_cuda('''
        from pyflow.kernels.layout import broadcast_view, permuted_view, sliced_view

        def same(view, host, what):
            assert type(view) is DeviceNDArray and view.shape == host.shape, f"{what}: {view.shape} {host.shape}"
            assert not host.size or view.strides == host.strides, f"{what}: {view.strides} {host.strides}"

        host = np.empty((6, 5, 4), np.float64)
        device = device_twin(host)
        for index in [(slice(1, 5, 2),), (slice(None), slice(4, 1)), (slice(2, None, 3), slice(1, 4), slice(0, 4, 3)),
                      (slice(9, 12),)]:
            view = sliced_view(device, index)
            same(view, host[index], f"slice {index}")
            if view.size:
                assert address(view) - address(device) == address(host[index]) - address(host), index
        same(permuted_view(device_twin(np.empty((2, 3, 4, 5), np.int16)), (3, 1, 0, 2)),
             np.empty((2, 3, 4, 5), np.int16).transpose(3, 1, 0, 2), "permute 4-D")
        same(permuted_view(device_twin(np.empty((), np.int8)), ()), np.empty((), np.int8), "permute 0-d")
        # numba's own slicing reads stride 0 as "size 1"; a broadcast array must keep its sizes
        wide = broadcast_view(device_twin(np.empty((1, 4), np.float32)), (6, 4))
        same(sliced_view(wide, (slice(1, 5, 2),)), np.broadcast_to(np.empty((1, 4), np.float32), (6, 4))[1:5:2],
             "slice of a broadcast view")
    ''')


def test_views_refuse_what_they_cannot_describe():
    from pyflow.errors import AxisError, ShapeError
    from pyflow.kernels.layout import permuted_view, sliced_view

    with pytest.raises(AxisError, match=r"\(0, 0, 1\) is not a permutation of the axes .* shape \(2, 3, 4\)"):
        permuted_view(np.zeros((2, 3, 4)), (0, 0, 1))
    with pytest.raises(ShapeError, match="step <= 0"):
        sliced_view(np.zeros(4), (slice(None, None, -1),))
    with pytest.raises(ShapeError, match="at most 1 slices"):
        sliced_view(np.zeros(4), (slice(None), slice(None)))


# --- memory: pyflow/device/ep/cuda.py with numba's reference counts --------------------------------


def test_freeing_a_buffer_that_a_view_still_uses_frees_it_once_when_the_view_goes():
    """CudaDevice.free never frees under a live as_array view: numba frees once, when the last view
    goes, at exit too (it used to print "RuntimeError: Freeing dead memory" there); without views at once."""
    result = run_with_numba_cuda('''
        from pyflow.device.device import Device
        from pyflow.device.ep.cuda import CudaDevice

        gpu = CudaDevice(Device("cuda:0"))
        raw = gpu.alloc(256)
        view = gpu.as_array(raw, 0, (64,), np.float32)
        gpu.free(raw)
        print("pyflow freed 256")
        del view
        print("the view is gone")
        raw = gpu.alloc(128)
        gpu.free(raw)
        print("pyflow freed 128")
        raw = gpu.alloc(512)
        kept = gpu.as_array(raw, 64, (2, 3), np.float64, strides=(8, 16))
        gpu.free(raw)
        print("pyflow freed 512; a view lives on until exit")
    ''')
    assert result.stdout.splitlines() == [
        "pyflow freed 256", "cuMemFree 256", "the view is gone",
        "cuMemFree 128", "pyflow freed 128",
        "pyflow freed 512; a view lives on until exit", "cuMemFree 512",
    ]
    assert result.stderr == "", result.stderr


# --- launches: GpuKernel's co-resident limit needs compiled code ----------------------------------


class _Compiled:
    def __init__(self, signature):
        self.signature = signature

    def max_cooperative_grid_blocks(self, blockdim, dynsmemsize):
        return (self.signature, blockdim, dynsmemsize)


class _Dispatcher:
    """What GpuKernel uses of numba's CUDADispatcher: overloads, compile(signature), py_func."""

    def __init__(self, *compiled):
        self.overloads = {signature: _Compiled(signature) for signature in compiled}

    def compile(self, signature):
        return self.overloads.setdefault(signature, _Compiled(signature))

    @staticmethod
    def py_func(x):
        """A kernel."""


def test_a_gpu_kernel_measures_the_code_compiled_for_the_signature_it_is_given():
    kernel = GpuKernel(_Dispatcher())
    assert kernel.max_cooperative_grid_blocks(64, 0, ("f8[::1]",)) == (("f8[::1]",), 64, 0)
    assert kernel.max_cooperative_grid_blocks(32) == (("f8[::1]",), 32, 0)   # now its one signature


def test_a_gpu_kernel_without_one_compiled_signature_says_what_to_pass():
    with pytest.raises(LaunchConfigError, match=r"'py_func' .* not compiled yet\); pass the launch's argument "
                                                r"types, signature=.*cooperative_grid_limit\(kernel, args, block\)"):
        GpuKernel(_Dispatcher()).max_cooperative_grid_blocks(32)
    with pytest.raises(LaunchConfigError, match=r"compiled for 2 signatures: \('a',\); \('b',\)"):
        GpuKernel(_Dispatcher(("a",), ("b",))).max_cooperative_grid_blocks(32)


def test_a_real_numba_kernel_not_yet_compiled_raises_that_error():
    """The demo's failure on the GPU, where two_phase_sum had not been launched yet."""
    result = run_with_numba_cuda('''
        from pyflow.errors import LaunchConfigError
        from pyflow.kernels.examples import two_phase_sum
        try:
            two_phase_sum.max_cooperative_grid_blocks(32)
        except LaunchConfigError as error:
            print(error)
    ''')
    assert "kernel 'two_phase_sum' has no single compiled signature" in result.stdout, result.stdout


def test_the_demo_asks_for_the_limit_of_its_kernels_compiled_for_its_arrays(monkeypatch):
    """python -m pyflow: the limit of each grid-sync kernel for the argument types it launches with."""
    import pyflow.__main__ as demo

    asked = []

    def limit(kernel, blockdim, dynsmemsize=0, signature=None):
        asked.append((kernel.__name__, signature))
        return 16

    monkeypatch.setattr(demo, "max_cooperative_grid_blocks", limit)
    assert demo.run_demo()
    vectors = (types.float64[::1],) * 3   # x, out, block_sums / x, partial, total: float64 vectors
    assert sorted(asked) == [("prefix_sum", vectors), ("two_phase_sum", vectors)]


def test_float64_vectors_are_numbas_type_of_the_demos_device_arrays():
    """So the demo's limit is for the code its launches run (no second compilation at the launch)."""
    result = run_with_numba_cuda('''
        from numba import typeof, types
        from pyflow.device.device import Device
        from pyflow.device.ep.cuda import CudaDevice

        gpu = CudaDevice(Device("cuda:0"))
        raw = gpu.alloc(1024)
        arrays = [gpu.as_array(raw, offset, (n,), np.float64) for offset, n in ((0, 125), (512, 4))]
        print([typeof(a) == types.float64[::1] for a in arrays])
    ''')
    assert result.stdout.splitlines()[0] == "[True, True]", result.stdout


# --- the benchmark's strided case: one launch per call, no host work ----------------------------------


def test_the_strided_benchmark_call_launches_one_kernel_on_a_view_and_nothing_else():
    """bench_kernels.py's ``relu(x.T)``: each timed call is one launch of the strided kernel, for one signature,
    reading ``x``'s own memory; no new kernel defined (a new one compiles at its first launch), no memory
    allocated.  numba's ``x.T`` did both at every call (``numba.cuda.kernels.transpose`` defines its
    ``@cuda.jit`` kernel inside the function), then ran the *contiguous* relu on the copy: the first GPU
    table's ~100 ms of host time per call.  The second half shows that these counters see it."""
    result = run_with_numba_cuda('''
        import importlib.util
        import sys
        import warnings
        from numba import typeof
        from numba.core.errors import NumbaPerformanceWarning
        from numba.cuda import dispatcher

        warnings.simplefilter("ignore", NumbaPerformanceWarning)   # numba's own transpose launches 9 blocks
        defined, launched = [], []
        define = dispatcher.CUDADispatcher.__init__

        def counting_define(self, py_func, *args, **kwargs):   # a new kernel: compiled at its first launch
            defined.append(py_func.__name__)
            define(self, py_func, *args, **kwargs)

        def recorded_launch(self, args, launch_config):        # no driver: what would run, and on what
            launched.append((self.py_func.__name__, tuple(typeof(a) for a in args),
                             [address(a) for a in args if isinstance(a, DeviceNDArray)]))

        class Device:
            MAX_THREADS_PER_BLOCK = 1024

        dispatcher.CUDADispatcher.__init__ = counting_define
        dispatcher.CUDADispatcher.call = recorded_launch
        driver.driver.get_device = lambda devnum=0: Device()   # what numba's transpose asks of the driver

        spec = importlib.util.spec_from_file_location("bench_kernels", "benchmarks/bench_kernels.py")
        bench = sys.modules["bench_kernels"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        square, dense = DeviceNDArray((64, 64), (256, 4), np.float32), DeviceNDArray((64, 64), (256, 4), np.float32)

        def per_call(fn, calls=5):
            fn()                                                # warm: the first call may define and compile
            del defined[:], launched[:]
            allocated = context.allocated
            for _ in range(calls):
                fn()
            return (len(defined) / calls, (context.allocated - allocated) / calls, len(launched) / calls,
                    sorted({name for name, _, _ in launched}), len({types for _, types, _ in launched}))

        timed = bench.transposed_relu(square, dense, 0)
        print("benchmark:", per_call(timed))
        assert {tuple(pointers) for _, _, pointers in launched} == {(address(dense), address(square))}, launched
        relu = bench.get_kernel("relu", "cuda")
        print("numba .T:", per_call(lambda: relu(dense, square.T, stream=0)))
    ''')
    lines = result.stdout.splitlines()
    # kernels defined, allocations, launches per call; the kernels launched; their signatures
    assert "benchmark: (0.0, 0.0, 1.0, ['map_strided'], 1)" in lines, result.stdout
    assert "numba .T: (1.0, 1.0, 2.0, ['kernel', 'map_contiguous'], 2)" in lines, result.stdout
