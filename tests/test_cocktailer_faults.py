"""Cocktailer's answers to bad or unusual input, and to concurrent or deep calls (the reported faults).

What this pins down:

1. Names.  Whatever a traced callable is called (``<lambda>``, a
   ``functools.partial``, ``outer.<locals>.prog``, non-ASCII, a name the generated
   code uses itself) and whatever its parameters are called (``base``, like a frame
   field), the generated kernels and device functions have valid, distinct ASCII
   identifiers and compute the right thing; messages keep the readable name.
2. ``pyflow.Tensor`` inputs: ``trace`` takes their shape and dtype, a compiled
   program reads their values and returns ``pyflow.Tensor`` outputs (both modes;
   ``tests/test_cocktailer_tensors.py`` covers the tensor path in depth).
3. Threads: one ``Compiled`` called from 4 threads returns exactly what sequential
   calls return (both modes); ``last_stats`` is always one whole call's counts.
4. Depth: the host executor walks the program with an explicit stack, so a
   recursion 1000 calls deep runs (and equals the compiled kernel and numpy), and
   one past ``stack_depth`` (up to 5000) raises ``StackOverflowError``, on both
   executors; a stack too big for shared memory is a ``LaunchConfigError`` at
   ``compile``.  Counts stay exact.
5. Static integers (trip counts, ``max_iters``, sizes, indices, ``threads``,
   ``blocks``, ``stack_depth``, ``chunk``, ``tile``...): a non-int (a float, a
   bool) is a ``DTypeError`` at the call that names the argument and the value;
   an int out of range a ``ShapeError`` (program sizes and counts) or a
   ``LaunchConfigError`` (how it runs).  Other bad input fails at the call with a
   pyflow error too.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import threading

import numpy as np
import pytest

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow.errors import ArgumentTypeError, DTypeError, LaunchConfigError, ShapeError, StackOverflowError
from pyflow.models import RAE, StackedLSTM

# ---- 1. names -----------------------------------------------------------------------


def named_program(name: str):
    """A program whose program, recursive function and function uTask are all called ``name``.

    The recursion sums ``values`` along the chain ``next_`` (-1 ends it); its
    parameter is called ``base``, the name of a frame field; one input is called ``λ``.
    """

    def prog(values, next_, λ):
        def walk(base):
            return ck.cond(next_[base].item() < 0, lambda: values[base],
                           lambda: values[base] + chain_sum(next_[base].item()))

        def scale(h):
            return flow.tanh(h * λ)

        walk.__name__ = scale.__name__ = name
        chain_sum = ck.function(walk, returns=ck.spec(2))
        return ck.function(scale)(chain_sum(0))

    prog.__name__ = prog.__qualname__ = name
    return prog


NAMED_ARGS = (np.arange(6, dtype=np.float32).reshape(3, 2) / 4, np.array([2, -1, 1], np.int64),
              np.array([0.5, -1.0], np.float32))
NAMED_WANT = np.tanh(NAMED_ARGS[0].sum(0) * NAMED_ARGS[2])


def assert_valid_distinct_identifiers(compiled):
    names = [k.name for k in compiled.kernels]
    tree = ast.parse(compiled.source)   # a SyntaxError here is the reported fault
    defs = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    names += [d.name for d in defs] + [a.arg for d in defs for a in d.args.args]
    assert all(n.isascii() and n.isidentifier() for n in names), names
    assert len({d.name for d in defs}) == len(defs)


@pytest.mark.parametrize("name", ["<lambda>", "outer.<locals>.prog", "λ", "données", "2nd", "", "top",
                                  "status", "copy_utask", "def"])
def test_any_callable_name_gives_valid_distinct_identifiers_and_the_right_result(name):
    program = ck.trace(named_program(name), *NAMED_ARGS, chunk=4, tile=4)
    assert program.name == (name or "program")
    for mode, options in (("compiled", {"blocks": 2, "inline": False}), ("host", {})):
        compiled = ck.compile(program, mode=mode, threads=2, **options)
        np.testing.assert_allclose(compiled(*NAMED_ARGS), NAMED_WANT, rtol=1e-6)
        assert_valid_distinct_identifiers(compiled)


def test_names_made_from_other_names_do_not_collide():
    """``frames_w0_alk0`` would be both the frame stack of ``w0_alk`` and the parameter ``alk0`` of ``frames_w``."""

    def prog(values):
        def first(alk0):
            return ck.cond(alk0 >= 1, lambda: values[alk0], lambda: values[alk0] + f(alk0 + 1))

        def second(n):
            return ck.cond(n >= 2, lambda: values[n], lambda: values[n] + g(n + 1))

        first.__name__, second.__name__ = "frames_w", "w0_alk"
        f, g = ck.function(first, returns=ck.spec(2)), ck.function(second, returns=ck.spec(2))
        return f(0) + g(0)

    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    program = ck.trace(prog, values, chunk=4, tile=4)
    for mode in ("compiled", "host"):
        compiled = ck.compile(program, mode=mode, threads=2, blocks=2)
        np.testing.assert_array_equal(compiled(values), 2 * values[0] + 2 * values[1] + values[2])


def test_a_traced_lambda_compiles_and_messages_keep_its_readable_name():
    program = ck.trace(lambda x: flow.tanh(x), ck.spec(4), chunk=4)
    compiled = ck.compile(program, mode="compiled", threads=2)
    np.testing.assert_allclose(compiled(np.ones(4, np.float32)), np.tanh(np.ones(4)), rtol=1e-6)
    assert compiled.kernels[0].name == "lambda_uprogram"
    with pytest.raises(ShapeError, match="^<lambda>: expected 1 inputs"):
        compiled()


def test_partials_trace_as_programs_and_as_recursive_functions():
    def prog(values, k):
        def pick(values, n):
            return ck.cond(n < k, lambda: values[n] + walk(n + 1), lambda: values[n])

        walk = ck.function(functools.partial(pick, values), returns=ck.spec(2))
        return walk(0)

    values = np.arange(8, dtype=np.float32).reshape(4, 2)
    program = ck.trace(functools.partial(prog, k=2), values, chunk=4, tile=4)
    assert program.name == "prog" and [f.name for f in program.functions] == ["pick0"]
    for mode in ("compiled", "host"):
        np.testing.assert_array_equal(ck.compile(program, mode=mode, threads=2)(values), values[:3].sum(0))


def test_inputs_passed_as_star_args_get_distinct_names():
    program = ck.trace(lambda *p1: p1[0] + p1[1], ck.spec(2), ck.spec(2), chunk=4)
    assert len({buffer.name for _, buffer, _ in program.inputs}) == 2
    args = (np.ones(2, np.float32), np.full(2, 2, np.float32))
    np.testing.assert_array_equal(ck.compile(program, mode="compiled", threads=2)(*args), [3, 3])


# ---- 2. pyflow.Tensor inputs ----------------------------------------------------------


@pytest.fixture
def fresh_vm():
    """pyflow.Tensors start the VM; stop it afterwards (a later test may destroy the ep streams it holds)."""
    flow.vm.shutdown()
    yield
    flow.vm.shutdown()


def flow_program(h0, xs, steps):
    return ck.for_loop(steps[0].item(), lambda t, h: flow.tanh(h + xs[t]), h0)


@pytest.mark.parametrize("mode", ["host", "compiled"])
def test_pyflow_tensors_trace_by_shape_and_dtype_and_run_by_value(mode, fresh_vm):
    rng = np.random.default_rng(2)
    arrays = (rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((4, 2, 3)).astype(np.float32),
              np.array([3], np.int64))
    tensors = [flow.tensor(a) for a in arrays]
    program = ck.trace(flow_program, *tensors, chunk=4, tile=4)
    assert [s for _, _, s in program.inputs] == [ck.spec(2, 3), ck.spec(4, 2, 3), ck.spec(1, dtype="int64")]
    compiled = ck.compile(program, mode=mode, threads=2, blocks=2)
    want = compiled(*arrays)
    got = compiled(*tensors)
    assert isinstance(got, flow.Tensor)   # tensors in, tensors out
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(compiled(tensors[0], arrays[1], tensors[2]).numpy(), want)   # mixed
    with pytest.raises(DTypeError, match="input 'h0' is float64"):
        compiled(flow.tensor(arrays[0].astype(np.float64)), *tensors[1:])


# ---- 3. threads -------------------------------------------------------------------------


def doubling_program(h):
    """Doubles ``h`` until its first element reaches 10: how many times depends on the input."""
    return ck.while_loop(lambda h: h[0].item() < 10, lambda h: h + h, h, max_iters=20)


@pytest.mark.parametrize("mode", ["host", "compiled"])
def test_one_compiled_program_called_from_four_threads_gives_the_sequential_results(mode):
    inputs = [np.array([start, start + 1, -start], np.float32) for start in (0.3, 1.5, 2.5, 4.0, 0.6, 7.0)]
    compiled = ck.compile(ck.trace(doubling_program, inputs[0], chunk=2), mode=mode, threads=2, blocks=2)
    want, stats = [], []
    for x in inputs:
        want.append(compiled(x))
        stats.append(compiled.last_stats)
    assert len({str(s) for s in stats}) > 1   # the counts differ by input, so a mix would show

    got, seen_stats, errors = {}, [], []

    def worker(k):
        try:
            for j in range(4):
                i = (k + j) % len(inputs)
                got[k, j] = i, compiled(inputs[i])
                seen_stats.append(compiled.last_stats)
        except Exception as e:   # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == 16
    for i, out in got.values():
        np.testing.assert_array_equal(out, want[i])
    assert all(s in stats for s in seen_stats)   # always one whole call's counts
    assert compiled.last_stats in stats


# ---- 4. deep recursion: an explicit stack on the host -----------------------------------


def tail_sums(last: int):
    """``tail(n) = values[n] + tail(n + 1)``, ``tail(last) = values[last]``: a chain ``last + 1`` calls deep."""

    def prog(values):
        @ck.function(returns=ck.spec(values.shape[1]))
        def tail(n):
            return ck.cond(n >= last, lambda: values[n], lambda: values[n] + tail(n + 1))

        return tail(0)

    return prog


def test_a_recursion_1000_calls_deep_runs_on_the_host_and_equals_the_kernel_and_numpy():
    depth = 1000
    values = np.random.default_rng(4).standard_normal((depth, 2)).astype(np.float32)
    want = values[-1]
    for n in range(depth - 2, -1, -1):
        want = values[n] + want   # the program's order of float32 additions
    program = ck.trace(tail_sums(depth - 1), values, chunk=4, tile=4)
    host = ck.compile(program, mode="host", threads=1, stack_depth=depth)
    compiled = ck.compile(program, mode="compiled", threads=1, blocks=1, stack_depth=depth)
    got = host(values)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(compiled(values), got)
    # per call: add, the cond's output copy and the return copy (the leaf: two); then two copies out
    assert (host.last_stats.launches, host.last_stats.host_syncs) == (3 * depth + 1, 0)


def nested_loops(levels: int):
    def prog(h):
        def level(k, h):
            if k == levels:
                return flow.tanh(h)
            return ck.for_loop(2, lambda i, h: level(k + 1, h), h)

        return level(0, h)

    return prog


def test_the_python_stack_of_the_host_walk_does_not_grow_with_recursion_or_nesting(monkeypatch):
    from pyflow.cocktailer.executor import Executor

    depth_at_launch = []
    launch = Executor._operator

    def spy(self, item, env):
        frame, n = sys._getframe(), 0
        while frame is not None:
            frame, n = frame.f_back, n + 1
        depth_at_launch.append(n)
        return launch(self, item, env)

    monkeypatch.setattr(Executor, "_operator", spy)

    def deepest(fn, x, **options):
        depth_at_launch.clear()
        ck.compile(ck.trace(fn, x, chunk=4), mode="host", threads=1, **options)(x)
        return max(depth_at_launch)

    x = np.ones((61, 2), np.float32)
    assert deepest(tail_sums(1), x) == deepest(tail_sums(60), x)   # 2 calls deep, 61 calls deep
    assert deepest(nested_loops(1), x[0]) == deepest(nested_loops(5), x[0])


def endless(x):
    @ck.function(returns=ck.spec(1))
    def down(n):
        return down(n + 1)

    return down(0) + x


@pytest.mark.parametrize("mode, stack_depth", [("host", 5000), ("host", 7), ("compiled", 7), ("compiled", 1024)])
def test_a_recursion_past_stack_depth_raises_stack_overflow_on_both_executors(mode, stack_depth):
    program = ck.trace(endless, ck.spec(1), chunk=4)
    compiled = ck.compile(program, mode=mode, threads=2, blocks=1, stack_depth=stack_depth)
    with pytest.raises(StackOverflowError, match=f"'down0' went deeper than stack_depth={stack_depth} frames"):
        compiled(np.zeros(1, np.float32))


def test_a_frame_stack_too_big_for_shared_memory_is_refused_at_compile_or_left_on_the_host():
    program = ck.trace(endless, ck.spec(1), chunk=4)
    with pytest.raises(LaunchConfigError, match=r"endless: stack_depth=5000 .* Use stack_depth <= 1024, or mode='host'"):
        ck.compile(program, mode="compiled", stack_depth=5000)
    auto = ck.compile(program, mode="auto", threads=2, stack_depth=5000)   # the recursion stays on the host
    assert "set_resource failed" in str(auto.schedule) and not auto.kernels
    with pytest.raises(StackOverflowError, match="stack_depth=5000"):
        auto(np.zeros(1, np.float32))


# ---- 5. static integers ---------------------------------------------------------------------


def trace_h(fn, *specs):
    return ck.trace(fn, *(specs or (ck.spec(2, 3),)), chunk=4, tile=4)


def body(i, h):
    return flow.tanh(h)


@pytest.mark.parametrize("trip", [2.5, 2.0, True, np.float32(2), "2", None])
def test_a_for_loop_trip_count_that_is_not_an_int_is_a_dtype_error_at_trace_time(trip):
    with pytest.raises(DTypeError, match=re.escape(f"for_loop: the trip count must be an int, got {trip!r}")):
        trace_h(lambda h: ck.for_loop(trip, body, h))


def test_a_negative_trip_count_is_a_shape_error_and_numpy_ints_are_fine():
    with pytest.raises(ShapeError, match="for_loop: the trip count must be an int >= 0, got -1"):
        trace_h(lambda h: ck.for_loop(-1, body, h))
    program = trace_h(lambda h: ck.for_loop(np.int64(2), body, h))
    x = np.full((2, 3), 0.5, np.float32)
    np.testing.assert_allclose(ck.compile(program, mode="host", threads=2)(x), np.tanh(np.tanh(x)), rtol=1e-6)


def test_a_device_trip_count_index_or_node_id_read_from_a_float_tensor_is_a_dtype_error():
    float_count = (ck.spec(2, 3), ck.spec(1))
    with pytest.raises(DTypeError, match=r"for_loop: the trip count must be an int, got the float device value"):
        trace_h(lambda h, n: ck.for_loop(n[0].item(), body, h), *float_count)
    with pytest.raises(DTypeError, match="indexing: a device index must be an int"):
        trace_h(lambda h, n: flow.tanh(h[n[0].item()]), *float_count)

    def recursive(h, n):
        f = ck.function(lambda k: flow.tanh(h[0]), returns=ck.spec(3))
        return f(n[0].item())

    with pytest.raises(DTypeError, match="recursive function '<lambda>': an argument must be an int"):
        trace_h(recursive, *float_count)


@pytest.mark.parametrize("bad", [1.0, True, np.float64(1)])
def test_indices_and_node_ids_that_are_not_ints_are_dtype_errors(bad):
    with pytest.raises(DTypeError, match="indexing: an index"):
        trace_h(lambda h: flow.tanh(h[bad]))
    with pytest.raises(DTypeError, match="recursive function '<lambda>': an argument must be an int"):
        trace_h(lambda h: ck.function(lambda k: flow.tanh(h[0]), returns=ck.spec(3))(bad))


@pytest.mark.parametrize("max_iters, error", [(True, DTypeError), (4.0, DTypeError), (-1, ShapeError)])
def test_while_loop_max_iters_must_be_an_int_at_least_zero(max_iters, error):
    def prog(h):
        return ck.while_loop(lambda h: h[0][0].item() > 0, lambda h: flow.tanh(h), h, max_iters=max_iters)

    with pytest.raises(error, match=f"while_loop: max_iters must be an int.*got {max_iters!r}"):
        trace_h(prog)


@pytest.mark.parametrize("make, error, message", [
    (lambda: ck.spec(2.5), DTypeError, r"TensorSpec size .* must be an int, got 2.5"),
    (lambda: ck.spec(True, 3), DTypeError, "must be an int, got True"),
    (lambda: ck.spec(-1), ShapeError, "must be an int >= 0, got -1"),
    (lambda: ck.spec(2, dtype="no such dtype"), DTypeError, "dtype"),
    (lambda: trace_h(lambda h: flow.zeros(2.0, 3)), ArgumentTypeError, "zeros: sizes must be ints, got 2.0"),
    (lambda: trace_h(lambda h: flow.zeros(-2, 3)), ShapeError, r"zeros: invalid shape \(-2, 3\)"),
    (lambda: trace_h(lambda h: h.reshape(3.0, 2)), DTypeError, "reshape: a size .* got 3.0"),
    (lambda: ck.trace(lambda h: h, ck.spec(2), chunk=4.0), DTypeError, "trace: chunk must be an int, got 4.0"),
    (lambda: ck.trace(lambda h: h, ck.spec(2), chunk=True), DTypeError, "trace: chunk must be an int, got True"),
    (lambda: ck.trace(lambda h: h, ck.spec(2), tile=64), ShapeError, r"trace: tile must be an int in 1..32"),
    (lambda: StackedLSTM(2.0, 3), DTypeError, "StackedLSTM: input_size must be an int, got 2.0"),
    (lambda: StackedLSTM(2, True), DTypeError, "StackedLSTM: hidden_size must be an int, got True"),
    (lambda: RAE(True), DTypeError, "RAE: dim must be an int, got True"),
    (lambda: RAE(2, tile=4.0), DTypeError, "tile an int in 1..32"),
    (lambda: RAE(2, threads=2).check_tree([0], [0], [1], np.ones((1, 2)), True), DTypeError, "root must be an int"),
])
def test_sizes_and_model_arguments_that_are_not_ints_fail_at_the_call(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("option, value, error", [
    ("threads", 2.0, DTypeError), ("threads", True, DTypeError), ("threads", 0, LaunchConfigError),
    ("threads", 2048, LaunchConfigError), ("blocks", True, DTypeError), ("blocks", 1.5, DTypeError),
    ("blocks", 0, LaunchConfigError), ("stack_depth", 64.0, DTypeError), ("stack_depth", True, DTypeError),
    ("stack_depth", 0, LaunchConfigError), ("host_blocks", 2.5, DTypeError), ("host_blocks", 0, LaunchConfigError),
])
def test_compile_options_must_be_ints_in_range(option, value, error):
    program = trace_h(lambda h: flow.tanh(h))
    for mode in ("host", "compiled"):
        with pytest.raises(error, match=f"Options: {option} must be an int"):
            ck.compile(program, mode=mode, **{option: value})
    assert ck.Options(threads=np.int64(4), blocks=np.int32(2)).threads == 4   # numpy ints are ints


# ---- other bad input: a pyflow error at the call ---------------------------------------------


def test_other_misuse_is_a_pyflow_error_at_the_call(fresh_vm):
    with pytest.raises(ck.TraceError, match="compile: expected a Program"):
        ck.compile(lambda h: h)
    with pytest.raises(ck.TraceError, match="cond: the predicate is a TracedTensor"):
        trace_h(lambda h, f: ck.cond(f, lambda: h, lambda: flow.tanh(h)), ck.spec(2), ck.spec(1, dtype="int64"))
    with pytest.raises(ck.TraceError, match="for_loop: the trip count is a TracedTensor"):
        trace_h(lambda h, n: ck.for_loop(n, body, h), ck.spec(2), ck.spec(1, dtype="int64"))
    with pytest.raises(ck.TraceError, match="returns must be a TensorSpec"):
        ck.function(returns=4)
    with pytest.raises(ck.TraceError, match="trace: name must be a str"):
        ck.trace(lambda h: h, ck.spec(2), name=5)
    with pytest.raises(ck.TraceError, match="trace: expected the program as a Python function"):
        ck.trace("prog", ck.spec(2))
    with pytest.raises(ck.TraceError, match="is a tensor from outside the program; pass it to cocktailer.trace"):
        trace_h(lambda h: h + flow.tensor(np.ones((2, 3), np.float32)))
    kept = []
    trace_h(lambda h: kept.append(h) or flow.tanh(h))
    with pytest.raises(ck.TraceError, match="belongs to another trace"):
        trace_h(lambda h: h + kept[0])
