"""hypothesis strategies shared by the kernel tests, and helpers to compare results.

* ``shapes()``: tuples of small sides, 0-d (``()``) and zero-size (a side of 0) included.
* ``dtypes`` / ``float_dtypes`` / ``int_dtypes``: float32, float64, int32, int64 (what
  every family took first); ``all_dtypes`` / ``numeric_dtypes``: all nine dtypes of
  ``kernels/dtypes.py`` (bool, uint8, int8, int16, float16 too) / the same without bool.
* ``operands(shape, dtype)``: an array with the given *logical* shape and a random
  layout: contiguous, axes permuted, sliced with a step, or (for inputs) broadcast
  with stride 0.  An ``Operand`` holds a contiguous ``base`` plus the view recipe;
  ``on(target)`` applies the same recipe to a numpy array ("cpu") or to a device
  array ("cuda"), so both targets see the same layout.  The recipes are
  ``kernels/layout.py``'s views: numba's own ``DeviceNDArray.transpose`` fails
  above 2-D and its slicing fails on empty arrays.
* ``empty_on`` / ``to_host``: allocate on a target, bring a result back.
* ``assert_close``: tolerances by dtype (float16 rtol 4e-3, float32 1e-5, float64
  1e-12, exact otherwise), NaN where the reference has NaN; prints shapes and the worst diff.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import strategies as st

from pyflow.kernels.backend import cuda
from pyflow.kernels.dtypes import NUMERIC_DTYPES, SUPPORTED_DTYPES
from pyflow.kernels.layout import broadcast_view, permuted_view, sliced_view

TARGETS = ("cpu", "cuda")
float_dtypes = st.sampled_from([np.dtype(np.float32), np.dtype(np.float64)])
int_dtypes = st.sampled_from([np.dtype(np.int32), np.dtype(np.int64)])
dtypes = st.one_of(float_dtypes, int_dtypes)
all_dtypes = st.sampled_from(SUPPORTED_DTYPES)
numeric_dtypes = st.sampled_from(NUMERIC_DTYPES)
RTOL = {np.dtype(np.float16): 4e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}
ATOL = {np.dtype(np.float16): 1e-3, np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 5):
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def values(shape, dtype, low=-10, high=10, seed=None):
    """Deterministic random values of ``shape``/``dtype`` (ints in [low, high])."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(low, high, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(low, high + 1, size=shape).astype(dtype)


@dataclasses.dataclass
class Operand:
    """A contiguous ``base`` and how to view it so it has the logical shape."""

    base: np.ndarray
    layout: str
    view: callable

    def on(self, target: str):
        if target == "cpu":
            return self.view(self.base)
        return self.view(cuda.to_device(self.base))

    def numpy(self) -> np.ndarray:
        return np.array(self.view(self.base))


@st.composite
def operands(draw, shape, dtype, allow_broadcast: bool = True, low=-10, high=10):
    """An ``Operand`` of logical ``shape`` with a random (non-)contiguous layout."""
    shape = tuple(shape)
    layouts = ["contiguous"]
    if len(shape) >= 2:
        layouts.append("permuted")
    if shape:
        layouts.append("sliced")
    if allow_broadcast and any(n != 1 for n in shape):
        layouts.append("broadcast")
    layout = draw(st.sampled_from(layouts))
    seed = draw(st.integers(0, 2**32 - 1))
    if layout == "permuted":
        perm = draw(st.permutations(range(len(shape))))
        base = values(tuple(shape[p] for p in perm), dtype, low, high, seed)
        inverse = tuple(int(i) for i in np.argsort(perm))
        return Operand(base, layout, lambda a: permuted_view(a, inverse))
    if layout == "sliced":
        starts = draw(st.lists(st.integers(0, 2), min_size=len(shape), max_size=len(shape)))
        base = values(tuple(2 * n + s for n, s in zip(shape, starts)), dtype, low, high, seed)
        index = tuple(slice(s, s + 2 * n, 2) for n, s in zip(shape, starts))
        return Operand(base, layout, lambda a: sliced_view(a, index))
    if layout == "broadcast":
        keep = draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
        small = tuple(n if k else 1 for n, k in zip(shape, keep))
        base = values(small, dtype, low, high, seed)
        return Operand(base, layout, lambda a: broadcast_view(a, shape))
    return Operand(values(shape, dtype, low, high, seed), layout, lambda a: a)


def empty_on(target: str, shape, dtype):
    """An uninitialised array on ``target`` (filled with garbage to catch unwritten cells)."""
    host = np.empty(shape, dtype)
    if host.size:
        host.reshape(-1).view(np.uint8).fill(0xCD)
    return host if target == "cpu" else cuda.to_device(host)


def to_host(array) -> np.ndarray:
    return np.asarray(array) if isinstance(array, np.ndarray) else array.copy_to_host()


def assert_close(actual, expected, dtype=None, what: str = "") -> None:
    """Equal up to the dtype's tolerance; NaN must match NaN."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    dtype = np.dtype(dtype or expected.dtype)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if dtype.kind != "f":
        mismatch = actual != expected
        assert not mismatch.any(), (
            f"{what}: {int(mismatch.sum())} of {actual.size} values differ; first at "
            f"{np.argwhere(mismatch)[0].tolist()}: {actual[mismatch][0]!r} != {expected[mismatch][0]!r}")
        return
    ok = np.isclose(actual, expected, rtol=RTOL.get(dtype, 1e-5), atol=ATOL.get(dtype, 1e-6), equal_nan=True)
    if not ok.all():
        bad = np.argwhere(~ok)[0]
        diff = np.nanmax(np.abs(np.where(ok, 0, actual.astype(np.float64) - expected)))
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {actual.size} values differ ({dtype}, shape {actual.shape}); "
            f"first at {bad.tolist()}: {actual[tuple(bad)]!r} vs {expected[tuple(bad)]!r}; max |diff| {diff:g}")


def cocktailer_programs(depth: int, ops: int = 1, loops: int = 1):
    """Random Cocktailer program descriptions (the format of ``pyflow.cocktailer.random_programs``).

    Statements nest up to ``depth``; ``ops`` and ``loops`` weight how often a
    statement is a plain op or a for loop (against one while loop and one cond).
    """
    from pyflow.cocktailer.random_programs import OPS

    op = st.tuples(st.just("op"), st.sampled_from(OPS))
    if depth == 0:
        return st.lists(op, min_size=1, max_size=2)
    inner = cocktailer_programs(depth - 1, ops, loops)
    loop = st.tuples(st.just("for"), st.integers(0, 2), st.booleans(), inner)
    wloop = st.tuples(st.just("while"), st.integers(0, 2), st.booleans(), inner)
    branch = st.tuples(st.just("cond"), st.sampled_from(["flag", "sign"]), st.integers(0, 2), inner, inner)
    return st.lists(st.one_of(*[op] * ops, *[loop] * loops, wloop, branch), min_size=1, max_size=3)
