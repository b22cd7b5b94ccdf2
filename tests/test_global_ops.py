"""Ops on global tensors: SBP signatures, auto-boxing, and random programs against numpy.

Every op of the eager API works on global tensors: the interpreter infers the
logical result, picks the cheapest SBP signature for the inputs' SBPs (the cost
model of SEMANTICS §4), boxes the inputs and runs the op piece by piece.  The
choices are asserted for matmul and reductions; random programs on 1, 2 and 4
ranks equal numpy; ranks outside the placement run nothing; bad mixes are errors
at the call on every rank; and a rank whose input failed, a rank that raises, or
a rank that runs other code ends every rank promptly with a named error.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow.errors import DeviceError, OpError, RankAbortedError, RankError

run = flow.distributed.run
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


def last_signature() -> str:
    name, signature = flow.framework.interpreter.global_interpreter().last_signature
    return f"{name} {signature}"


# --- which signature each op picks -------------------------------------------------------------------------------

MATMUL = [
    ((S(0), B), "matmul (S(0), B) -> S(0)", (S(0),)),
    ((B, S(1)), "matmul (B, S(1)) -> S(1)", (S(1),)),
    ((S(1), S(0)), "matmul (S(1), S(0)) -> P", (P,)),
    ((P, B), "matmul (P, B) -> P", (P,)),
    ((B, P), "matmul (B, P) -> P", (P,)),
    ((B, B), "matmul (B, B) -> B", (B,)),
    ((S(1), B), "matmul (S(1), S(0)) -> P", (P,)),  # auto-boxing: b B -> S(0) is the cheapest move
    ((P, P), "matmul (P, B) -> P", (P,)),           # one all-reduce, not two
]


@pytest.mark.parametrize("sbps, chosen, out", MATMUL, ids=[c for _, c, _ in MATMUL])
def test_matmul_picks_the_signature_of_the_cost_model_and_equals_numpy(sbps, chosen, out):
    a = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    b = np.arange(6, dtype=np.float32).reshape(3, 2) - 2

    def body():
        p = flow.placement("cpu", [0, 1])
        x, w = flow.tensor(a, placement=p, sbp=sbps[0]), flow.tensor(b, placement=p, sbp=sbps[1])
        y = x @ w
        return last_signature(), y.sbp, y.numpy()

    for signature, sbp, value in run(body, world_size=2):
        assert signature == chosen and sbp == out
        np.testing.assert_allclose(value, a @ b)


REDUCTIONS = [
    ("sum", 0, S(0), "reduce_sum (S(0)) -> P"),
    ("sum", 1, S(0), "reduce_sum (S(0)) -> S(0)"),
    ("sum", None, P, "reduce_sum (P) -> P"),
    ("mean", 1, S(0), "reduce_mean (S(0)) -> S(0)"),
    ("mean", 0, S(0), "reduce_mean (S(1)) -> S(0)"),   # a split reduced dim is moved, not made P
    ("amax", 0, S(1), "reduce_max (S(1)) -> S(0)"),
    ("amax", 0, S(0), "reduce_max (S(1)) -> S(0)"),    # all-to-all is cheaper than all-gather
    ("argmax", 0, S(0), "argmax (S(1)) -> S(0)"),
]


@pytest.mark.parametrize("op, dim, sbp, chosen", REDUCTIONS, ids=[c for *_, c in REDUCTIONS])
def test_reductions_pick_their_signature_and_equal_numpy(op, dim, sbp, chosen):
    a = np.arange(24, dtype=np.float32).reshape(4, 6) - 7

    def body():
        x = flow.tensor(a, placement=flow.placement("cpu", [0, 1]), sbp=sbp)
        if op == "amax":  # the values of max(dim): the reduce_max op alone
            y = flow.framework.interpreter.apply("reduce_max", [x], axis=dim, keepdims=False)[0]
        else:
            y = getattr(x, op)() if dim is None else getattr(x, op)(dim=dim)
        return last_signature(), y.numpy()

    expected = getattr(np, op)(a, axis=dim)
    for signature, value in run(body, world_size=2):
        assert signature == chosen
        np.testing.assert_allclose(value, expected, rtol=1e-6)


def test_elementwise_ops_keep_splits_and_partial_sums_where_they_are_linear():
    def body():
        p = flow.placement("cpu", [0, 1, 2])
        x = flow.tensor(np.arange(6.0).reshape(3, 2), placement=p, sbp=S(0))
        y = flow.tensor(np.ones((3, 2)), placement=p, sbp=P)
        return [(f(x, y).sbp, f(x, y).numpy()) for f in (lambda a, b: a + 1, lambda a, b: b + b,
                                                          lambda a, b: b * 3.0, lambda a, b: flow.relu(a - 2))]

    got = run(body, world_size=3)[0]
    assert [sbp for sbp, _ in got] == [(S(0),), (P,), (P,), (S(0),)]
    np.testing.assert_array_equal(got[1][1], np.full((3, 2), 2.0))  # y is the logical ones: y + y
    np.testing.assert_array_equal(got[3][1], np.maximum(np.arange(6.0).reshape(3, 2) - 2, 0))


# --- random programs on global tensors equal numpy ----------------------------------------------------------------

UNARY = {"relu": (flow.relu, lambda a: np.maximum(a, 0)), "tanh": (flow.tanh, np.tanh),
         "neg": (lambda x: -x, np.negative), "scale": (lambda x: x * 0.5 + 1, lambda a: a * 0.5 + 1)}
BINARY = {"add": (lambda x, y: x + y, np.add), "mul": (lambda x, y: x * y, np.multiply),
          "sub": (lambda x, y: x - y, np.subtract)}


@st.composite
def programs(draw):
    world = draw(st.sampled_from([1, 2, 4]))
    hierarchy = draw(st.sampled_from(["1d", "2d"])) if world == 4 else "1d"
    n = draw(st.integers(2, 5))
    steps = []
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "sum", "softmax", "transpose", "reshard"]))
        steps.append((kind, draw(st.sampled_from(sorted(UNARY))), draw(st.sampled_from(sorted(BINARY))),
                      draw(st.integers(0, 1)), draw(st.integers(0, 2))))
    seed = draw(st.integers(0, 2**16))
    return world, hierarchy, n, steps, seed


def _sbp_choice(k, hierarchy):
    one = [S(0), S(1), B, P][k % 4]
    return (one,) if hierarchy == "1d" else (one, [B, S(1), S(0), P][k % 4])


def run_program(world, hierarchy, n, steps, seed, lib):
    """The program with ``lib`` = "numpy" (the reference) or "flow"; the values it ends with."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, (n, n)).astype(np.float32), rng.uniform(-1, 1, (n, n)).astype(np.float32)
    if lib == "flow":
        ranks = list(range(world)) if hierarchy == "1d" else [[0, 1], [2, 3]]
        place = flow.placement("cpu", ranks)
        a = flow.tensor(a, placement=place, sbp=_sbp_choice(seed, hierarchy))
        b = flow.tensor(b, placement=place, sbp=_sbp_choice(seed + 1, hierarchy))
    for kind, unary, binary, dim, k in steps:
        if kind == "unary":
            a = UNARY[unary][0 if lib == "flow" else 1](a)
        elif kind == "binary":
            a = BINARY[binary][0 if lib == "flow" else 1](a, b)
        elif kind == "matmul":
            a = (a @ b) * 0.5
        elif kind == "sum":
            a = a + (a.sum(dim=dim, keepdim=True) if lib == "flow" else a.sum(axis=dim, keepdims=True)) * 0.1
        elif kind == "softmax":
            if lib == "flow":
                a = flow.softmax(a, dim=dim)
            else:
                e = np.exp(a - a.max(axis=dim, keepdims=True))
                a = e / e.sum(axis=dim, keepdims=True)
        elif kind == "transpose":
            a = a.T
        elif lib == "flow":  # reshard: an explicit to_global
            a = a.to_global(sbp=_sbp_choice(k, hierarchy))
    return a.numpy() if lib == "flow" else a


@settings(max_examples=20)
@given(program=programs())
def test_random_programs_on_global_tensors_equal_numpy(program):
    expected = run_program(*program, "numpy")
    for value in run(run_program, world_size=program[0], args=(*program, "flow")):
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-5)


# --- ranks outside the placement, in place, views -----------------------------------------------------------------


def test_ranks_outside_the_placement_run_nothing_and_hold_an_empty_piece_of_the_right_shape():
    def body():
        x = flow.ones(4, 2, placement=flow.placement("cpu", [1, 2]), sbp=S(0))
        vm = flow.vm.get_vm()
        before = vm.engine.received
        y = (x * 3).sum(dim=1)
        issued = vm.engine.received - before
        return y.shape, y.to_local().numpy().shape, issued, y.numpy()

    results = run(body, world_size=4)
    for rank, (shape, local, issued, value) in enumerate(results):
        assert shape == (4,)
        np.testing.assert_array_equal(value, np.full(4, 6.0))
        if rank in (0, 3):
            assert local == (0,) and issued == 0, f"rank {rank} issued {issued} instruction(s)"
        else:
            assert local == (2,)


def test_in_place_ops_setitem_and_views_work_on_global_tensors():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)

    def body():
        x = flow.tensor(a, placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        x += 1
        x[:, 0] = -1.0
        r = x.reshape(2, 6)
        return x.sbp, x.numpy(), r.shape, r.numpy(), x.T.sbp, x.T.numpy()

    expected = a + 1
    expected[:, 0] = -1
    for sbp, value, r_shape, r_value, t_sbp, t_value in run(body, world_size=2):
        assert sbp == (S(0),) and r_shape == (2, 6) and t_sbp == (S(1),)
        np.testing.assert_array_equal(value, expected)
        np.testing.assert_array_equal(r_value, expected.reshape(2, 6))
        np.testing.assert_array_equal(t_value, expected.T)


@pytest.mark.parametrize("op", ["index_copy_", "index_add_", "scatter_add_"])
@pytest.mark.parametrize("sbp", ["broadcast", "split", "partial_sum"])
def test_index_writes_on_global_tensors_equal_local_ones(op, sbp):
    """Regression: the global interpreter runs an op piece by piece without ``out=``; the index writes
    used to add into an uninitialised piece then (updates_input now makes them work on a copy)."""
    target = np.arange(8.0).reshape(4, 2)
    index = np.array([[1], [0], [1], [1]]) if op == "scatter_add_" else np.array([2, 0, 2] if op == "index_add_"
                                                                                 else [2, 0, 3])
    source = np.arange(1.0, 5.0).reshape(4, 1) if op == "scatter_add_" else np.arange(6.0).reshape(3, 2) + 1
    dim = 1 if op == "scatter_add_" else 0
    expected = getattr(flow.tensor(target), op)(dim, flow.tensor(index), flow.tensor(source)).numpy()

    def per_rank():
        ranks = flow.placement("cpu", [0, 1])
        layout = {"broadcast": flow.sbp.broadcast, "split": flow.sbp.split(0), "partial_sum": flow.sbp.partial_sum}
        t = flow.tensor(target, placement=ranks, sbp=flow.sbp.broadcast)
        getattr(t, op)(dim, flow.tensor(index, placement=ranks, sbp=flow.sbp.broadcast),
                       flow.tensor(source, placement=ranks, sbp=layout[sbp] if op != "index_copy_" or sbp != "partial_sum"
                                   else flow.sbp.broadcast))
        return t.to_local().numpy()

    for piece in flow.distributed.run(per_rank, world_size=2):
        np.testing.assert_array_equal(piece, expected)


def test_global_creation_functions_make_the_same_logical_tensor_on_every_rank():
    def body():
        p = flow.placement("cpu", [0, 1, 2])
        flow.manual_seed(flow.env.get_rank())  # different seeds: parallel_id 0's values still win
        made = [flow.zeros(3, 2, placement=p, sbp=S(0)), flow.ones(3, placement=p, sbp=P),
                flow.full((2, 2), 7.0, placement=p, sbp=B), flow.randn(5, placement=p, sbp=S(0)),
                flow.rand(2, 3, placement=p, sbp=S(1))]
        return [m.numpy() for m in made], [m.sbp for m in made]

    results = run(body, world_size=3)
    for values, sbps in results:
        np.testing.assert_array_equal(values[0], np.zeros((3, 2)))
        np.testing.assert_array_equal(values[1], np.ones(3))
        np.testing.assert_array_equal(values[2], np.full((2, 2), 7.0))
        np.testing.assert_array_equal(values[3], results[0][0][3])
        assert sbps == [(S(0),), (P,), (B,), (S(0),), (S(1),)]


# --- bad input and faults -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["mixed", "placements", "split-dim", "sbp-length", "no-sbp"])
def test_bad_global_calls_are_errors_at_the_call_on_every_rank_and_the_ranks_go_on(case):
    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.ones(2, 2, placement=p, sbp=S(0))
        calls = {
            "mixed": lambda: x + flow.ones(2, 2),
            "placements": lambda: x + flow.ones(2, 2, placement=flow.placement("cpu", [1]), sbp=B),
            "split-dim": lambda: x.to_global(sbp=S(2)),
            "sbp-length": lambda: x.to_global(flow.placement("cpu", [[0], [1]]), S(0)),
            "no-sbp": lambda: flow.ones(2).to_global(p),
        }
        try:
            calls[case]()
        except (DeviceError, flow.errors.ShapeError, flow.errors.ArgumentTypeError) as error:
            message = f"{type(error).__name__}: {error}"
        else:
            message = None
        return message, (x * 2).numpy()

    for message, after in run(body, world_size=2):
        assert message is not None, f"{case} was accepted"
        np.testing.assert_array_equal(after, np.full((2, 2), 2.0))


def test_a_rank_whose_input_failed_makes_its_peers_fail_at_once_naming_it():
    from pyflow.framework.interpreter import apply
    from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta

    def boom(kernel, outputs, inputs, attrs, stream):
        raise ValueError("rank 1's kernel fails")

    OP_REGISTRY["global_test_boom"] = OpDef("global_test_boom", lambda i, a: [TensorMeta(i[0].shape, i[0].dtype)],
                                            kernel="", launch=boom)

    def body():
        local = flow.ones(2, 2)
        if flow.env.get_rank() == 1:
            local = apply("global_test_boom", [local])[0]
        x = local.to_global(flow.placement("cpu", [0, 1]), S(0))
        try:
            x.to_global(sbp=B).numpy()
        except OpError as error:
            return error

    try:
        start = time.monotonic()
        errors = run(body, world_size=2, timeout=30)
        elapsed = time.monotonic() - start
    finally:
        del OP_REGISTRY["global_test_boom"]
    assert elapsed < 5, f"rank 0 waited {elapsed:.1f} s for rank 1"
    assert errors[1].op == "global_test_boom" and "rank 1's kernel fails" in str(errors[1])
    assert isinstance(errors[0].__cause__, RankAbortedError)
    assert "rank 1 could not take part" in str(errors[0]) and "rank 1's kernel fails" in str(errors[0])


def test_a_rank_that_skips_a_boxing_is_reported_with_every_ranks_line():
    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        if flow.env.get_rank() == 0:
            x = x.to_global(sbp=B)
        return x.numpy()

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=2, timeout=30)
    assert time.monotonic() - start < 5
    text = f"{info.value} {info.value.__cause__} {info.value.__cause__.__cause__}"
    assert "test_global_ops.py" in text and ("different code" in text or "different collectives" in text)


def test_an_exception_on_one_rank_stops_ranks_waiting_in_a_collective():
    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1, 2]), sbp=S(0))
        if flow.env.get_rank() == 2:
            raise KeyError("rank 2 gives up")
        return x.to_global(sbp=B).numpy()

    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(body, world_size=3, timeout=30)
    assert time.monotonic() - start < 5
    assert info.value.rank == 2 and isinstance(info.value.__cause__, KeyError)


def test_waiting_ranks_see_a_rank_aborted_error_naming_the_one_that_failed():
    seen = {}

    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1]), sbp=S(0))
        if flow.env.get_rank() == 1:
            raise RuntimeError("rank 1 stops")
        try:
            x.to_global(sbp=B).numpy()
        except OpError as error:
            seen["cause"] = error.__cause__
            raise

    with pytest.raises(RankError):
        run(body, world_size=2, timeout=30)
    assert isinstance(seen.get("cause"), RankAbortedError) and "rank 1 failed" in str(seen["cause"])


# --- the whole eager API on global tensors ------------------------------------------------------------------------

API = {
    "add_scalar": lambda x, i: x + 1, "radd": lambda x, i: 1 + x, "rsub": lambda x, i: 2 - x,
    "pow": lambda x, i: x ** 2, "where": lambda x, i: flow.where(x > 0, x, 0.0),
    "clamp": lambda x, i: flow.clamp(x, -1, 1), "abs": lambda x, i: abs(x), "sum": lambda x, i: x.sum(),
    "mean": lambda x, i: x.mean(dim=0), "max": lambda x, i: flow.max(x, dim=1)[0],
    "argmax": lambda x, i: x.argmax(dim=1), "softmax": lambda x, i: flow.softmax(x, dim=1),
    "var": lambda x, i: x.var(dim=0), "std": lambda x, i: x.std(), "norm": lambda x, i: x.norm(),
    "cumsum": lambda x, i: x.cumsum(dim=1), "topk": lambda x, i: flow.topk(x, 2, dim=1).values,
    "cat": lambda x, i: flow.cat([x, x], dim=1), "stack": lambda x, i: flow.stack([x, x]),
    "reshape": lambda x, i: x.reshape(3, 4), "view": lambda x, i: x.view(-1), "flatten": lambda x, i: x.flatten(),
    "unsqueeze": lambda x, i: x.unsqueeze(0), "T": lambda x, i: x.T, "getitem": lambda x, i: x[1:3, 0],
    "mask": lambda x, i: x[x > 0], "gather": lambda x, i: flow.gather(x, 1, i),
    "to_f64": lambda x, i: x.to(flow.float64), "double": lambda x, i: x.double(),
    "clone": lambda x, i: x.clone(), "detach": lambda x, i: x.detach(), "matmul_T": lambda x, i: x @ x.T,
    "sigmoid": lambda x, i: flow.sigmoid(x), "floor_div": lambda x, i: x // 2, "neg": lambda x, i: -x,
    "eq": lambda x, i: x == x, "logical": lambda x, i: flow.logical_and(x > 0, x < 3),
    "repeat": lambda x, i: x.repeat(2, 1), "expand": lambda x, i: x[:, :1].expand(4, 3),
    "chunk": lambda x, i: x.chunk(2, dim=1)[0], "split": lambda x, i: x.split(1, dim=1)[0],
    "narrow": lambda x, i: x.narrow(0, 1, 2), "squeeze": lambda x, i: x.unsqueeze(1).squeeze(1),
    "zeros_like": lambda x, i: flow.zeros_like(x), "ones_like": lambda x, i: flow.ones_like(x),
}


@pytest.mark.parametrize("name", sorted(API))
def test_every_op_of_the_eager_api_works_on_global_tensors_as_on_local_ones(name):
    a = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    index = np.array([[0], [2], [1], [0]])
    local = API[name](flow.tensor(a), flow.tensor(index)).numpy()

    def body():
        p = flow.placement("cpu", [0, 1])
        x = flow.tensor(a, placement=p, sbp=S(0))
        return API[name](x, flow.tensor(index, placement=p, sbp=B)).numpy()

    for value in run(body, world_size=2):
        np.testing.assert_allclose(value, local, rtol=1e-6)
