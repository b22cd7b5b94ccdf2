"""Function uTasks that are not inlined (seed 001): device functions sharing uTasks with their kernel.

With ``inline=False`` each function uTask becomes a device function of its own,
called by every block.  A uTask that declares a shared array (the tiled linear,
the row softmax) may be called by the kernel and by such a device function (or
by two of them, or by one nested in another).  numba-cuda links a device
function's module into every caller's, so one uTask reached along two paths
defined its shared array twice and NVVM rejected the kernel (``ERROR_INVALID_IR``).
The code generator now gives every device function private copies of the uTasks
it calls (``codegen.KernelSource._private_fn``, ``generated.private_copy``).

The properties, on random nestings of functions and shared-memory operators:

* every uTask owning a shared array is reached along exactly one call path of the
  generated kernel (what NVVM needs; checked on the source, no GPU needed);
* the compiled kernel (one launch, concurrent blocks) equals the host executor
  bitwise and a numpy interpretation of the same description.

``tests/test_ptx.py`` compiles the same shape of program to PTX.
"""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.executor import Options
from pyflow.cocktailer.names import kernel_name
from pyflow.cocktailer.uprogram import CompiledUProgram

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py)
pytestmark = pytest.mark.sim_tier("threads")

THREADS = 4

# a statement: ("op", "softmax" | "linear" | "linear_softmax") or ("fn", [statements])


def _statements(depth: int):
    op = st.tuples(st.just("op"), st.sampled_from(["softmax", "linear", "linear_softmax"]))
    if depth == 0:
        return st.lists(op, min_size=1, max_size=2)
    return st.lists(st.one_of(op, op, st.tuples(st.just("fn"), _statements(depth - 1))), min_size=1, max_size=3)


def _build(desc):
    def prog(x, w, b):
        def run(stmts, h):
            for stmt in stmts:
                if stmt[0] == "fn":
                    h = ck.function(lambda h, body=stmt[1]: run(body, h))(h)
                elif stmt[1] == "softmax":
                    h = h.softmax(-1)
                elif stmt[1] == "linear":
                    h = flow.tanh(F.linear(h, w, b))
                else:
                    h = F.linear(h, w, b).softmax(-1)
            return h

        return run(desc, x)

    return prog


def _numpy(desc, x, w, b):
    def softmax(h):
        e = np.exp(h - h.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    h = x.astype(np.float64)
    for stmt in desc:
        if stmt[0] == "fn":
            h = _numpy(stmt[1], h, w, b)
        elif stmt[1] == "softmax":
            h = softmax(h)
        elif stmt[1] == "linear":
            h = np.tanh(h @ w.T + b)
        else:
            h = softmax(h @ w.T + b)
    return h


def _owns_shared_memory(fn) -> bool:
    py_func = getattr(fn, "py_func", None)
    return py_func is not None and "cuda.shared.array" in inspect.getsource(py_func)


def shared_memory_paths(compiled: CompiledUProgram) -> dict:
    """``{id(uTask): [device functions calling it]}`` over the kernel and its device functions' source."""
    namespace = compiled.writer.namespace
    defined = {node.name: node for node in ast.parse(compiled.source).body if isinstance(node, ast.FunctionDef)}
    callers: dict = {}
    for fname, node in defined.items():
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id not in defined:
                fn = namespace.get(call.func.id)
                if fn is not None and _owns_shared_memory(fn):
                    callers.setdefault(id(fn), set()).add(fname)
    return callers


def _function_count(desc) -> int:
    return sum(1 + _function_count(s[1]) for s in desc if s[0] == "fn")


@settings(max_examples=20)
@given(desc=_statements(2), blocks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_functions_not_inlined_sharing_shared_memory_utasks_run_and_reach_each_copy_once(desc, blocks, seed):
    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((2, 6)).astype(np.float32), (rng.standard_normal((6, 6)) * 0.4).astype(np.float32),
            rng.standard_normal(6).astype(np.float32))
    program = ck.trace(_build(desc), *args, chunk=4, tile=4)
    compiled = ck.compile(program, mode="compiled", threads=THREADS, blocks=blocks, inline=False)
    got = compiled(*args)
    np.testing.assert_array_equal(got, ck.compile(program, mode="host", threads=THREADS)(*args))
    np.testing.assert_allclose(got, _numpy(desc, *args), rtol=1e-4, atol=1e-5)
    assert compiled.last_stats.launches == 1 and compiled.last_stats.host_syncs == 0
    kernel = compiled.kernels[0]
    assert kernel.source.count("@jit(device=True)") == _function_count(desc)
    for callers in shared_memory_paths(kernel).values():
        assert len(callers) == 1, f"a shared-memory uTask is called by {sorted(callers)}"


def test_the_kernel_and_four_device_functions_call_five_copies_of_the_tiled_linear():
    """The example the PTX check compiles: without private copies the tiled linear is reached along five
    paths (the kernel, two calls of ``cell``, the ``head`` nested in each) and the softmax along three."""
    from pyflow.cocktailer.compile_check import _shared_utasks

    rng = np.random.default_rng(1)
    args = (rng.standard_normal((2, 8)).astype(np.float32), (rng.standard_normal((8, 8)) * 0.4).astype(np.float32),
            rng.standard_normal(8).astype(np.float32))
    program = ck.trace(_shared_utasks, *args, tile=4)
    kernel = CompiledUProgram(kernel_name(program.name, "uprogram"), program.body, program,
                              Options(threads=THREADS, inline=False))
    paths = shared_memory_paths(kernel)
    namespace = kernel.writer.namespace
    copies = {prefix: {id(fn) for name, fn in namespace.items() if name.startswith(prefix)}
              for prefix in ("linear_bias", "softmax_row", "sum_row")}
    assert {k: len(v) for k, v in copies.items()} == {"linear_bias": 5, "softmax_row": 3, "sum_row": 1}
    assert set(paths) == set().union(*copies.values())
    assert all(len(callers) == 1 for callers in paths.values())
    compiled = ck.compile(program, mode="compiled", threads=THREADS, blocks=2, inline=False)
    out, total = compiled(*args)
    host_out, host_total = ck.compile(program, mode="host", threads=THREADS)(*args)
    np.testing.assert_array_equal(out, host_out)
    np.testing.assert_array_equal(total, host_total)
    x, w, b = (a.astype(np.float64) for a in args)

    def softmax(h):
        e = np.exp(h - h.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    h = softmax(x @ w.T + b)
    h = softmax(np.tanh(h @ w.T + b) @ w.T + b)
    np.testing.assert_allclose(out, softmax(np.tanh(h @ w.T + b) @ w.T + b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(total, h.sum(axis=1), rtol=1e-4, atol=1e-5)
