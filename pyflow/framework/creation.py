"""Making tensors: ``zeros``, ``ones``, ``full``, ``empty``, ``eye``, ``arange``, ``linspace``, the
``*_like`` family, random tensors and ``from_numpy`` (``tensor`` itself is in ``tensor.py``).

Every function checks its arguments at the call (sizes are non-negative ints,
the dtype is supported, the device exists, the fill value converts to the dtype)
and then issues:
* ``zeros``/``ones``/``full``: one ``fill`` op on the device;
* ``empty``: one ``empty`` op (the VM allocates, nothing is written);
* ``eye``: ``zeros``, then a ``fill_`` of the diagonal, a strided view;
* ``arange``, ``linspace``, ``rand``, ``randn``, ``randint``: the values are computed
  on the host with numpy, then copied to the device (as ``flow.tensor`` does).

``zeros``, ``ones``, ``full``, ``rand`` and ``randn`` take ``placement=`` and
``sbp=`` instead of ``device=`` to make a **global** tensor.  A constant is
filled by each rank on its own piece, nothing sent (a partial sum of a nonzero
value: the pieces at coordinate 0 of each P axis hold it, the others zeros, as
OneFlow's B -> P); random values are drawn by every rank's generator, and
parallel_id 0's win (a broadcast, as ``flow.tensor(data, placement=, sbp=)``).
The random generator belongs to the rank (``manual_seed`` seeds the calling
rank's).

>>> import pyflow as flow
>>> flow.arange(5).tolist(), flow.arange(0, 1, 0.25).dtype, flow.eye(2, 3).tolist()
([0, 1, 2, 3, 4], dtype('float32'), [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
>>> flow.linspace(0, 1, 5).tolist(), flow.full((2,), 7).dtype
([0.0, 0.25, 0.5, 0.75, 1.0], dtype('int64'))
"""

from __future__ import annotations

import math
import threading

import numpy as np

from pyflow import env
from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.dtypes import DEFAULT_FLOAT, DEFAULT_INT, as_dtype, is_scalar, scalar_dtype, to_scalar
from pyflow.framework.interpreter import apply, global_interpreter
from pyflow.framework.sbp import checked_layout
from pyflow.framework.tensor import Tensor, eagerly, tensor

__all__ = ["zeros", "ones", "full", "empty", "eye", "arange", "linspace", "zeros_like", "ones_like", "full_like",
           "empty_like", "rand_like", "randn_like", "rand", "randn", "randint", "from_numpy", "manual_seed"]


def _not_both(op: str, device) -> None:
    if device is not None:
        raise ArgumentTypeError(f"{op}: give device= for a local tensor or placement= and sbp= for a global one, "
                                "not both")


def _global(op: str, values: np.ndarray, device, placement, sbp) -> Tensor:
    """The global tensor whose logical values are ``values`` (made on every rank, parallel_id 0's win)."""
    _not_both(op, device)
    return eagerly(lambda: global_interpreter().tensor(values, values.dtype, placement, sbp))


def _filled(op: str, size: tuple, fill_value, dtype, device=None, placement=None, sbp=None) -> Tensor:
    """One ``fill`` op, every argument checked first (errors name ``op``, the function the user called).

    A global one is filled by each rank on its own piece, nothing sent (``GlobalInterpreter.full``,
    OneFlow's global constant op): every rank knows a constant, so none needs parallel_id 0's data.
    """
    shape = args.sizes(size, op)
    dtype = as_dtype(dtype, op) if dtype is not None else scalar_dtype(_number(fill_value, op))
    value = to_scalar(fill_value, dtype, op)
    if placement is not None or sbp is not None:
        _not_both(op, device)
        if placement is None or sbp is None:
            raise ArgumentTypeError(f"{op}: a global tensor needs both placement= and sbp=")
        nd_sbp = checked_layout(shape, placement, sbp, op)
        return eagerly(lambda: global_interpreter().full(shape, value, dtype, placement, nd_sbp))
    return apply("fill", [], shape=shape, dtype=dtype, value=value, device=args.device(device, op))[0]


def full(size, fill_value, *, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (dtype: the value's, as torch: int64, float32, bool)."""
    return _leaf(_filled("full", (size,), fill_value, dtype, device, placement, sbp), requires_grad)


def _number(value, op):
    if not is_scalar(value):
        raise ArgumentTypeError(f"{op}: the fill value must be a number, got {value!r} ({type(value).__name__})")
    return value


def zeros(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype``)."""
    result = _filled("zeros", size, 0, DEFAULT_FLOAT if dtype is None else dtype, device, placement, sbp)
    return _leaf(result, requires_grad)


def ones(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones (float32 unless ``dtype``)."""
    result = _filled("ones", size, 1, DEFAULT_FLOAT if dtype is None else dtype, device, placement, sbp)
    return _leaf(result, requires_grad)


def empty(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """An uninitialised tensor: memory from the allocator, whatever it holds.  A global one (``placement``,
    ``sbp``) holds zeros: its ranks' pieces must form one logical tensor, which garbage would not."""
    if placement is not None or sbp is not None:
        return zeros(*size, dtype=dtype, device=device, placement=placement, sbp=sbp, requires_grad=requires_grad)
    shape, dtype = args.sizes(size, "empty"), as_dtype(dtype or DEFAULT_FLOAT, "empty")
    result = apply("empty", [], shape=shape, dtype=dtype, device=args.device(device, "empty"))[0]
    return _leaf(result, requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """The ``n x m`` identity: zeros, then ones written through the diagonal view (stride m + 1)."""
    n = args.sizes((n,), "eye")[0]
    m = n if m is None else args.sizes((m,), "eye")[0]
    result = zeros(n, m, dtype=dtype, device=device)
    if n and m:
        result._view((min(n, m),), (m + 1,), 0).fill_(1)
    return _leaf(result, requires_grad)


def _like(x, op) -> Tensor:
    if not isinstance(x, Tensor):
        raise ArgumentTypeError(f"{op}: expects a tensor, got {type(x).__name__}")
    return x


def _where_like(x: Tensor, device) -> dict:
    """Where a ``*_like`` result goes: ``device``, else ``x``'s device, or ``x``'s placement and SBP."""
    if device is None and x.is_global:
        return {"placement": x.placement, "sbp": x.sbp}
    return {"device": device or x.device}


def zeros_like(input: Tensor, *,   # noqa: A002 - torch's name
               dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    x = _like(input, "zeros_like")
    result = _filled("zeros_like", x.shape, 0, x.dtype if dtype is None else dtype, **_where_like(x, device))
    return _leaf(result, requires_grad)


def ones_like(input: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:   # noqa: A002
    x = _like(input, "ones_like")
    result = _filled("ones_like", x.shape, 1, x.dtype if dtype is None else dtype, **_where_like(x, device))
    return _leaf(result, requires_grad)


def full_like(input: Tensor, fill_value, *,   # noqa: A002 - torch's name
              dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    x = _like(input, "full_like")
    dtype = x.dtype if dtype is None else dtype
    result = _filled("full_like", x.shape, fill_value, dtype, **_where_like(x, device))
    return _leaf(result, requires_grad)


def empty_like(input: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:   # noqa: A002
    """Uninitialised, like ``input`` (of a global tensor: zeros, with its placement and SBP)."""
    x = _like(input, "empty_like")
    if device is None and x.is_global:
        return zeros_like(x, dtype=dtype)
    return _leaf(empty(x.shape, dtype=dtype or x.dtype, device=device or x.device), requires_grad)


# --- values computed on the host ---------------------------------------------------------------------


def _leaf(result: Tensor, requires_grad: bool) -> Tensor:
    """``result``, made a leaf that requires grad if asked (``requires_grad=True``; needs pyflow.autograd)."""
    return result.requires_grad_(True) if requires_grad else result


def _host_values(values: np.ndarray, dtype, device, op) -> Tensor:
    return tensor(values.astype(dtype, copy=False), device=args.device(device, op))


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``start, start + step, ...`` below ``end`` (``arange(n)``: 0..n-1); int64 if every bound is an int,
    else float32.  Computed on the host, then copied."""
    if end is None:
        start, end = 0, start
    for value, what in ((start, "start"), (end, "end"), (step, "step")):
        if not is_scalar(value) or isinstance(value, bool):
            raise ArgumentTypeError(f"arange: {what} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ArgumentTypeError(f"arange: {what} must be finite, got {value!r}")
    if step == 0 or (end - start) * step < 0:
        raise ShapeError(f"arange: step {step} cannot go from {start} to {end}")
    integral = all(scalar_dtype(v) == DEFAULT_INT for v in (start, end, step))
    dtype = as_dtype(dtype, "arange") if dtype is not None else DEFAULT_INT if integral else DEFAULT_FLOAT
    count = max(0, math.ceil((end - start) / step))
    return _leaf(_host_values(start + np.arange(count, dtype=np.float64 if not integral else np.int64) * step,
                        dtype, device, "arange"), requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` (both included); float32 by default."""
    steps = args.sizes((steps,), "linspace")[0]
    for value in (start, end):
        if not is_scalar(value) or isinstance(value, bool):
            raise ArgumentTypeError(f"linspace: start and end must be numbers, got {value!r}")
    dtype = as_dtype(dtype, "linspace") if dtype is not None else DEFAULT_FLOAT
    return _leaf(_host_values(np.linspace(start, end, steps), dtype, device, "linspace"), requires_grad)


_rng_lock = threading.Lock()


def _generator() -> np.random.Generator:
    """The calling rank's random generator (a rank owns one, as a OneFlow process does)."""
    ctx = env.current()
    if ctx.generator is None:
        ctx.generator = np.random.default_rng()
    return ctx.generator


def manual_seed(seed: int) -> None:
    """Seed ``rand``, ``randn``, ``randint`` and their ``*_like`` forms (the calling rank's generator)."""
    env.current().generator = np.random.default_rng(args.as_int(seed, "manual_seed", "seed"))


def _draw(op, size, draw, dtype, device, placement=None, sbp=None) -> Tensor:
    shape = args.sizes(size, op)
    dtype = as_dtype(dtype or DEFAULT_FLOAT, op)
    with _rng_lock:
        values = draw(_generator(), shape)
    if placement is not None or sbp is not None:
        return _global(op, values.astype(dtype, copy=False), device, placement, sbp)
    return _host_values(values, dtype, args.device(device, op), op)


def rand(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) (drawn on the host, then copied to ``device``)."""
    result = _draw("rand", size, lambda rng, shape: rng.random(shape), dtype, device, placement, sbp)
    return _leaf(result, requires_grad)


def randn(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples (drawn on the host, then copied to ``device``)."""
    result = _draw("randn", size, lambda rng, shape: rng.standard_normal(shape), dtype, device, placement, sbp)
    return _leaf(result, requires_grad)


def rand_like(input: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:   # noqa: A002
    x = _like(input, "rand_like")
    return _leaf(rand(x.shape, dtype=dtype or x.dtype, **_where_like(x, device)), requires_grad)


def randn_like(input: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:   # noqa: A002
    x = _like(input, "randn_like")
    return _leaf(randn(x.shape, dtype=dtype or x.dtype, **_where_like(x, device)), requires_grad)


def randint(low, high=None, size=None, *, dtype=None, device=None) -> Tensor:
    """Integers uniform in ``[low, high)`` (``randint(high, size)`` for low 0); int64 by default."""
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise ArgumentTypeError("randint: needs a size, e.g. randint(0, 10, (2, 3))")
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    low, high = args.as_int(low, "randint", "low"), args.as_int(high, "randint", "high")
    if low >= high:
        raise ShapeError(f"randint: low {low} must be below high {high}")
    dtype = as_dtype(dtype or DEFAULT_INT, "randint")
    to_scalar(high - 1, dtype, "randint")
    to_scalar(low, dtype, "randint")
    return _draw("randint", (size,), lambda rng, shape: rng.integers(low, high, shape), dtype, device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A cpu tensor with ``array``'s values and dtype.  Unlike torch, a copy: later writes to the
    array do not show in the tensor (pyflow memory belongs to its allocator)."""
    if not isinstance(array, np.ndarray):
        raise ArgumentTypeError(f"from_numpy: expects a numpy array, got {type(array).__name__}")
    return tensor(array, dtype=as_dtype(array.dtype, "from_numpy"))
