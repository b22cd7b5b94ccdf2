"""Everyday tensor functions built from pyflow's public ops: ``flip``, ``roll``, ``logsumexp``,
``amax``/``amin``, ``mm``/``bmm``/``outer``, ``equal``, ``masked_fill``, ``as_tensor``, ``normal``,
``is_floating_point``, ``t``; and the Tensor methods ``new_*``, in-place unary ops (``exp_``...),
``.data``, ``uniform_``, ``normal_``, ``fill_diagonal_``.

No function here defines an op or a kernel: each is a *composition* of ops that
already exist (``index_select``, ``cat``, ``reduce_max``, ``where``, ``matmul``...),
so autograd, CUDA and global tensors work as they do for those ops.  Arguments are
checked at the call, as everywhere in ``pyflow/framework`` (``args.py``).
(Sorting, ``nonzero`` and ``unique`` are in ``composites_sort.py``.)

>>> import pyflow as flow
>>> x = flow.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
>>> flow.flip(x, [1]).tolist(), flow.roll(x, 1, 1).tolist()
([[3.0, 2.0, 1.0], [6.0, 5.0, 4.0]], [[3.0, 1.0, 2.0], [6.0, 4.0, 5.0]])
>>> flow.amax(x, 1).tolist(), round(flow.logsumexp(x, 1)[0].item(), 4), x.t().shape
([3.0, 6.0], 3.4076, (3, 2))
>>> flow.masked_fill(x, x > 4, 0.0).tolist(), flow.equal(x, x.clone())
([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], True)
"""

from __future__ import annotations

import numpy as np

from pyflow.errors import ArgumentTypeError, ArgumentValueError, AutogradError, DTypeError, ShapeError
from pyflow.framework import args, creation, reductions
from pyflow.framework.args import describe
from pyflow.framework.dtypes import BOOL, DEFAULT_FLOAT, is_scalar, to_scalar
from pyflow.framework.functional import exp, isinf, log, matmul, where
from pyflow.framework.grad_mode import is_grad_enabled, requires_grad
from pyflow.framework.interpreter import apply
from pyflow.framework.movement import cat, index_select
from pyflow.framework.tensor import Tensor, tensor

__all__ = ["flip", "roll", "logsumexp", "amax", "amin", "mm", "bmm", "outer", "equal", "masked_fill", "as_tensor",
           "is_floating_point", "normal", "t"]


def _dim_list(dims, x: Tensor, op: str) -> tuple:
    """``dims`` (an int or a sequence of ints) as a tuple of distinct non-negative dims of ``x``."""
    return args.dims(dims if isinstance(dims, (tuple, list)) else (dims,), x.ndim, op, x)


def place_of(x: Tensor) -> dict:
    """Where a helper tensor for ``x`` goes: ``x``'s device, or ``x``'s placement, broadcast."""
    if x.is_global:
        from pyflow.framework.sbp import sbp

        return {"placement": x.placement, "sbp": (sbp.broadcast,) * len(x.sbp)}
    return {"device": x.device}


def flip(input: Tensor, dims) -> Tensor:   # noqa: A002 - torch's name
    """A copy with the order of elements reversed along each of ``dims``: an ``index_select`` of
    ``n-1, ..., 0`` per dim (the index is made on the host and copied, nothing is read back)."""
    x = args.tensor(input, "flip")
    result = x
    for d in _dim_list(dims, x, "flip"):
        n = x.shape[d]
        if n > 1:
            result = index_select(result, d, tensor(np.arange(n - 1, -1, -1), **place_of(x)))
    return result.clone() if result is x else result   # always a new tensor, as torch.flip


def roll(input: Tensor, shifts, dims=None) -> Tensor:   # noqa: A002
    """Elements shifted by ``shifts`` along ``dims`` (wrapping around): ``cat`` of two ``narrow`` views
    per dim.  ``dims=None``: the flattened tensor is rolled, then given its shape back."""
    x = args.tensor(input, "roll")
    shift_list = tuple(shifts) if isinstance(shifts, (tuple, list)) else (shifts,)
    shift_list = tuple(args.as_int(s, "roll", "shifts") for s in shift_list)
    if dims is None:
        if len(shift_list) != 1:
            raise ShapeError(f"roll: without dims, shifts must be one int, got {shifts!r} (for {describe(x)})")
        return roll(x.flatten(), shift_list, 0).reshape(x.shape)
    dim_list = _dim_list(dims, x, "roll")
    if len(dim_list) != len(shift_list):
        raise ShapeError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims (for {describe(x)}); "
                         "give one shift per dim")
    result = x
    for shift, d in zip(shift_list, dim_list):
        n = x.shape[d]
        s = shift % n if n else 0
        if s:
            result = cat([result.narrow(d, n - s, s), result.narrow(d, 0, n - s)], d)
    return result.clone() if result is x else result


def _reduced_dims(dim, x: Tensor, op: str):
    """``dim`` for amax/amin/logsumexp: ``()``/``None`` is every dim; else an int or a tuple, checked."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return None
    return args.dims(dim, x.ndim, op, x)


def _extreme(kernel: str, op: str, input, dim, keepdim, axis):
    x = args.tensor(input, op)
    dims = _reduced_dims(_axis_alias(dim, axis, op, ()), x, op)
    axes = range(x.ndim) if dims is None else (dims,) if isinstance(dims, int) else dims
    if any(x.shape[d] == 0 for d in axes):
        raise ShapeError(f"{op}: cannot reduce over a dim of size 0 of {describe(x)} (there is no {op[1:]})")
    return apply(kernel, [x], axis=dims, keepdims=reductions._keepdim(keepdim, op))[0]


def _axis_alias(dim, axis, op, default):
    """numpy's ``axis=`` as an alias of ``dim=`` (as PyTorch accepts it); not both."""
    if axis is None:
        return dim
    if dim is not default:
        raise ArgumentTypeError(f"{op}: give dim or axis (its numpy alias), not both")
    return axis


def amax(input: Tensor, dim=(), keepdim: bool = False, *, axis=None) -> Tensor:   # noqa: A002
    """The maximum over ``dim`` (an int or a tuple; ``()``: all dims), values only.  Its gradient is
    shared evenly among tied maxima, as torch.amax's."""
    return _extreme("reduce_max", "amax", input, dim, keepdim, axis)


def amin(input: Tensor, dim=(), keepdim: bool = False, *, axis=None) -> Tensor:   # noqa: A002
    """The minimum over ``dim`` (an int or a tuple; ``()``: all dims), values only."""
    return _extreme("reduce_min", "amin", input, dim, keepdim, axis)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:   # noqa: A002
    """``log(sum(exp(x)))`` over ``dim``, computed stably as ``m + log(sum(exp(x - m)))`` with ``m`` the
    (detached) maximum; an infinite ``m`` shifts by 0, so a row of ``-inf`` gives ``-inf``.  Integers
    compute in float32.  Its gradient is ``softmax(x)`` along ``dim``."""
    x = args.tensor(input, "logsumexp")
    if x.dtype.kind != "f":
        x = x.to(dtype=DEFAULT_FLOAT)
    dims = _reduced_dims(dim, x, "logsumexp")
    keepdim = reductions._keepdim(keepdim, "logsumexp")
    axes = tuple(range(x.ndim)) if dims is None else (dims,) if isinstance(dims, int) else dims
    if x.numel() == 0:
        return log(reductions.sum(exp(x), dims, keepdim))   # log(0) = -inf, as torch
    shift = apply("reduce_max", [x.detach()], axis=dims, keepdims=True)[0]
    shift = where(isinf(shift), 0.0, shift)
    total = log(reductions.sum(exp(x - shift), dims, keepdim=True)) + shift
    if keepdim:
        return total
    return total.reshape([n for d, n in enumerate(x.shape) if d not in axes])


def _matrices(op: str, rank: int, a, b) -> tuple:
    a, b = args.tensor(a, op), args.tensor(b, op)
    for t in (a, b):
        if t.ndim != rank:
            raise ShapeError(f"{op}: expects {rank}-D tensors, got {describe(a)} and {describe(b)}")
    return a, b


def mm(input: Tensor, mat2: Tensor) -> Tensor:   # noqa: A002
    """The matrix product of two 2-D tensors (``matmul`` after the shape checks)."""
    a, b = _matrices("mm", 2, input, mat2)
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"mm: {describe(a)} and {describe(b)} cannot be multiplied "
                         f"({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})")
    return matmul(a, b)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:   # noqa: A002
    """Batched matrix product of ``(b, n, m)`` and ``(b, m, p)`` tensors (no broadcasting, as torch.bmm)."""
    a, b = _matrices("bmm", 3, input, mat2)
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ShapeError(f"bmm: {describe(a)} and {describe(b)} need the same batch size and "
                         "input.shape[2] == mat2.shape[1]")
    return matmul(a, b)


def outer(input: Tensor, vec2: Tensor) -> Tensor:   # noqa: A002
    """``out[i, j] = input[i] * vec2[j]`` for two 1-D tensors (a broadcast ``mul``)."""
    a, b = _matrices("outer", 1, input, vec2)
    return a.reshape(-1, 1) * b.reshape(1, -1)


def equal(input: Tensor, other: Tensor) -> bool:   # noqa: A002
    """True if both have the same shape and equal elements (NaN is never equal).  Reads the result
    on the host, so it waits."""
    a, b = args.tensor(input, "equal"), args.tensor(other, "equal")
    if tuple(a.shape) != tuple(b.shape):
        return False
    if a.numel() == 0:
        return True   # (flow.all of an empty tensor has no identity in the reduce_min kernel)
    return bool(reductions.all(a == b).item())


def _fill_value(value, x: Tensor, op: str) -> Tensor:
    """``value`` (a number or a 0-d tensor) as a 0-d tensor of ``x``'s dtype on ``x``'s device."""
    if isinstance(value, Tensor):
        if value.ndim:
            raise ShapeError(f"{op}: the value must be a number or a 0-d tensor, got {describe(value)}")
        return value.to(dtype=x.dtype)
    return creation.full((), to_scalar(value, x.dtype, f"{op} of {describe(x)}"), dtype=x.dtype, **place_of(x))


def _bool_mask(mask, x: Tensor, op: str) -> Tensor:
    mask = args.tensor(mask, op)
    if mask.dtype != BOOL:
        raise DTypeError(f"{op}: the mask must be a bool tensor, got {describe(mask)} (use mask.bool())")
    return mask


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:   # noqa: A002
    """``value`` where ``mask`` (a bool tensor, broadcasting) is True, else ``input``: a ``where``.  The
    result keeps ``input``'s dtype (``value`` is converted to it)."""
    x = args.tensor(input, "masked_fill")
    mask = _bool_mask(mask, x, "masked_fill")
    return where(mask, _fill_value(value, x, "masked_fill"), x)


def masked_fill_(self: Tensor, mask: Tensor, value) -> Tensor:
    """In place ``masked_fill`` (the mask must broadcast to ``self``'s shape); returns self."""
    mask = _bool_mask(mask, self, "masked_fill_")
    if not args.broadcasts_to(mask.shape, self.shape):
        raise ShapeError(f"masked_fill_: the mask {describe(mask)} does not broadcast to {describe(self)}")
    apply("where", [mask, _fill_value(value, self, "masked_fill_"), self], out=[self])
    return self


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """``data`` as a tensor: a tensor that already has ``dtype`` and ``device`` is returned as is (no
    copy); another tensor is converted (``.to``); anything else is copied as ``flow.tensor`` does
    (unlike torch, a numpy array is copied too: pyflow memory belongs to its allocator)."""
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype)
    return tensor(data, dtype=dtype, device=device)


def is_floating_point(input: Tensor) -> bool:   # noqa: A002
    """Is the dtype a floating one (float16, float32, float64)?"""
    return args.tensor(input, "is_floating_point").dtype.kind == "f"


def normal(mean=0.0, std=1.0, size=None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Normal samples ``mean + std * randn`` (seeded by ``flow.manual_seed``, drawn by ``flow.randn``).

    ``normal(mean_tensor, std_tensor)``, ``normal(mean_tensor, std=1.0)``, ``normal(mean, std_tensor)``:
    one sample per element of the broadcast shape, on the tensors' device; ``normal(mean, std, size)``
    with two numbers.  ``mean`` and ``std`` are not differentiated through (torch gives them zero
    gradients)."""
    tensors = [v for v in (mean, std) if isinstance(v, Tensor)]
    for v in (mean, std):
        if not isinstance(v, Tensor) and not is_scalar(v):
            raise ArgumentTypeError(f"normal: mean and std must be numbers or tensors, got {v!r:.40}")
    if not isinstance(std, Tensor) and std < 0:
        raise ArgumentValueError(f"normal: std must be >= 0, got {std}")
    if tensors:
        if size is not None:
            raise ArgumentTypeError("normal: give size only when mean and std are both numbers")
        for t in tensors:
            if t.dtype.kind != "f":
                raise DTypeError(f"normal: mean and std tensors must be floating, got {describe(t)}")
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
        noise = creation.randn(shape, dtype=dtype or tensors[0].dtype, device=device or tensors[0].device)
        mean, std = (v.detach() if isinstance(v, Tensor) else v for v in (mean, std))
    else:
        if size is None:
            raise ArgumentTypeError("normal: with a number mean and std, give the size: normal(0, 1, size=(2, 3))")
        noise = creation.randn(size, dtype=dtype, device=device)
    return creation._leaf(noise * std + mean, requires_grad)


def t(input: Tensor) -> Tensor:   # noqa: A002
    """The transpose of a 2-D tensor (a view); a 0-D or 1-D tensor comes back as is (a view of it)."""
    x = args.tensor(input, "t")
    if x.ndim > 2:
        raise ShapeError(f"t: expects a tensor of at most 2 dims, got {describe(x)} (use transpose(d0, d1))")
    return x.transpose(0, 1) if x.ndim == 2 else x.reshape(x.shape)


# --- Tensor methods: new_*, in-place unary ops, .data, random fills ----------------------------------


def _new_where(self: Tensor, dtype, device) -> dict:
    return {"dtype": self.dtype if dtype is None else dtype, "device": self.device if device is None else device}


def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``size`` with ``self``'s dtype and device (unless given)."""
    return creation.zeros(*size, **_new_where(self, dtype, device), requires_grad=requires_grad)


def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return creation.ones(*size, **_new_where(self, dtype, device), requires_grad=requires_grad)


def new_empty(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return creation.empty(*size, **_new_where(self, dtype, device), requires_grad=requires_grad)


def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return creation.full(size, fill_value, **_new_where(self, dtype, device), requires_grad=requires_grad)


def new_tensor(self, data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A copy of ``data`` with ``self``'s dtype and device (unless given), as torch's new_tensor."""
    return tensor(data, **_new_where(self, dtype, device), requires_grad=requires_grad)


INPLACE_UNARY = ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "sin", "cos", "floor", "ceil",
                 "round", "sign", "logical_not", "bitwise_not")


def inplace_unary_method(name: str):
    def method(self: Tensor) -> Tensor:
        from pyflow.framework.inplace import _writable

        _writable(args.tensor(self, f"{name}_"), f"{name}_")
        apply(name, [self], out=[self])   # an elementwise kernel reads element i before writing it
        return self
    method.__name__ = method.__qualname__ = f"{name}_"
    method.__doc__ = f"In place ``{name}`` (the result must be castable to self's dtype); returns self."
    return method


def get_data(self: Tensor) -> Tensor:
    """A tensor over the same storage, outside autograd (``x.data``: a ``detach()``)."""
    return self.detach()


def set_data(self: Tensor, value: Tensor) -> None:
    """``x.data = y``: ``x`` (the same object, keeping its autograd state: ``requires_grad``, ``grad``) now uses
    ``y``'s storage, device, dtype and layout.  ``Module.to()`` moves its parameters so, as PyTorch does: code
    that holds a parameter (an optimizer) sees the moved one."""
    value = args.tensor(value, "data")
    self._blob, self._handle, self._versions, self._global = value._blob, value._handle, value._versions, \
        value._global


def _float_self(self: Tensor, op: str) -> Tensor:
    if args.tensor(self, op).dtype.kind != "f":
        raise DTypeError(f"{op}: needs a floating tensor, got {describe(self)}")
    return self


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """In place: uniform samples in ``[a, b)`` (drawn by ``flow.rand``, then ``copy_``); returns self."""
    _float_self(self, "uniform_")
    if not (is_scalar(a) and is_scalar(b)) or a > b:
        raise ArgumentValueError(f"uniform_: needs numbers a <= b, got a={a!r}, b={b!r}")
    return self.copy_(creation.rand(self.shape, dtype=self.dtype, device=self.device) * (b - a) + a)


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """In place: normal samples ``mean + std * randn`` (``flow.randn``, then ``copy_``); returns self."""
    _float_self(self, "normal_")
    if not (is_scalar(mean) and is_scalar(std)) or std < 0:
        raise ArgumentValueError(f"normal_: needs numbers mean and std >= 0, got mean={mean!r}, std={std!r}")
    return self.copy_(creation.randn(self.shape, dtype=self.dtype, device=self.device) * std + mean)


def fill_diagonal_(self: Tensor, fill_value, wrap: bool = False) -> Tensor:
    """Write ``fill_value`` on the main diagonal (``x[i, i, ...]``) through a strided view; ``wrap``:
    a tall matrix's diagonal starts again every ``cols + 1`` rows, as torch's.  Returns self.  Not recorded
    by autograd: on a tensor that requires grad, only under ``flow.no_grad()``."""
    x = args.tensor(self, "fill_diagonal_")
    if x.ndim < 2 or (x.ndim > 2 and len(set(x.shape)) != 1):
        raise ShapeError(f"fill_diagonal_: needs at least 2 dims, all of one length beyond 2, got {describe(x)}")
    if requires_grad(x) and is_grad_enabled():   # the strided view below is not recorded by autograd
        raise AutogradError(f"fill_diagonal_: {describe(x)} requires grad (a leaf's values would change under "
                            "its gradient; a non-leaf's write is not recorded); do it under flow.no_grad()")
    rows, cols = x.shape[0], x.shape[1]
    starts = range(0, rows, cols + 1) if wrap and x.ndim == 2 else (0,)
    for start in starts:
        block = x.narrow(0, start, min(rows - start, cols)) if x.ndim == 2 else x
        count = min(block.shape)
        if count:
            block._view((count,), (sum(block.stride()),), block._blob.offset).fill_(fill_value)
    return self
