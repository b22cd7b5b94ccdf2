"""``x[index]`` and ``x[index] = value``: basic indexing (a view), boolean masks and integer tensors.

* **Basic** - ints, slices with a positive step, ``...`` and ``None``: a view of the
  same storage (numpy's basic indexing).  Assigning to it is ``view.fill_(v)`` or
  ``view.copy_(v)``.
* **Advanced** - an integer tensor (or list, range, numpy array), or one boolean
  mask covering some dims, together with any basic items.  The result has numpy's
  shape: the index's dims replace the indexed dim (or, when ints and the index
  are separated by a slice, come first).  Reading is an ``index_select`` (a
  copy); writing is an in-place ``index_copy``, a VM write of ``x``.
* **Several index tensors** (``x[rows, cols]``) are broadcast together and become
  one linear index into the indexed dims, merged (``_several``); a list holding
  lists is a tuple of indices, as PyTorch reads it.
* **Boolean masks read the mask**: the result's size is the number of True
  values, so ``x[mask]`` (and ``x[mask] = v``) first copies the mask to the host
  and waits for it, as PyTorch does on CUDA.  The positions of the True values
  then index the merged mask dims.
* **Indices out of range**: in a list or a numpy array they are found at the
  call; in a tensor (whose values live on the device) by the kernel, which
  fails the op: reading its result (for a write, the tensor) raises ``OpError``.

Everything else is checked before anything is issued: the index's dtype, the
mask's shape, the number of indices, the value's type and shape.

>>> import pyflow as flow
>>> x = flow.tensor([[1.0, -2.0], [-3.0, 4.0]])
>>> x[x > 0].tolist(), x[flow.tensor([1, 0, 1])].shape, x[:, [1]].tolist()
([1.0, 4.0], (3, 2), [[-2.0], [4.0]])
>>> x[x < 0] = 0.0
>>> x.tolist()
[[1.0, 0.0], [0.0, 4.0]]
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from pyflow.errors import ArgumentTypeError, DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.framework import args
from pyflow.framework.args import describe
from pyflow.framework.dtypes import BOOL, DEFAULT_INT, is_scalar, to_scalar
from pyflow.framework.functional import where
from pyflow.framework.grad_mode import is_grad_enabled, set_grad_mode
from pyflow.framework.inplace import _writable
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import get_op
from pyflow.framework.sbp import B
from pyflow.framework.tensor import Tensor, tensor
from pyflow.framework.views import WHOLE, view_strides
from pyflow.kernels.dtypes import INDEX_DTYPES
from pyflow.kernels.layout import contiguous_strides

__all__ = ["getitem", "setitem", "is_basic"]


@dataclasses.dataclass
class _Advanced:
    """The one tensor-like item of an index: what it is, and where it lands in the basic view."""

    source: object          # a Tensor or a numpy array
    is_mask: bool
    ndim: int               # dims of x it consumes (a mask's rank; 1 for integers; k for k index tensors)
    position: int = 0       # the first of those dims in the basic view
    to_front: bool = False  # numpy puts the index's dims first (ints and the index are apart)
    shape: tuple | None = None   # several index tensors: their broadcast shape (``source``: the linear index)


def _advanced(item, t) -> _Advanced:
    where = f"indexing {describe(t)}"
    if isinstance(item, Tensor):
        dtype, ndim = item.dtype, item.ndim
    else:
        try:
            item = np.asarray(item)
        except ValueError as error:
            raise ShapeError(f"{where}: the index list is not rectangular ({error})") from None
        if item.size == 0 and item.dtype.kind == "f":
            item = item.astype(DEFAULT_INT)   # [] is an empty integer index, as in torch
        dtype, ndim = item.dtype, item.ndim
    if dtype == BOOL:
        return _Advanced(item, True, ndim)
    if dtype.kind not in "iu":
        raise DTypeError(f"{where}: tensors used as indices must be integer or bool, got {dtype}")
    return _Advanced(item, False, 1)


def _sequence_as_tuple(index) -> bool:
    """PyTorch's (and OneFlow's, and old numpy's) reading of a list index: ``x[[[0, 1], [1, 0]]]`` is
    ``x[[0, 1], [1, 0]]`` when the list holds a sequence, a tensor, a slice, ``...`` or None (and is shorter
    than 32).  numpy >= 1.23 reads it as one array index instead: a silently different shape."""
    if not isinstance(index, list) or len(index) >= 32:
        return False
    return any(item is None or item is Ellipsis or isinstance(item, (list, tuple, slice, Tensor, np.ndarray))
               for item in index)


def _parse(t: Tensor, index):
    """(basic items over t's dims, the advanced item or None), checked; nothing is issued."""
    where = f"indexing {describe(t)}"
    if _sequence_as_tuple(index):
        index = tuple(index)
    items = list(index) if isinstance(index, tuple) else [index]
    advanced = None
    for i, item in enumerate(items):
        if item is None or item is Ellipsis or isinstance(item, slice):
            continue
        if isinstance(item, (bool, np.bool_)):
            raise ArgumentTypeError(f"{where}: a bool ({item!r}) is not an index; use a bool tensor as a mask")
        if isinstance(item, numbers.Integral):
            items[i] = int(item)
        elif isinstance(item, (Tensor, list, np.ndarray, range)):
            if advanced is not None:
                raise ArgumentTypeError(f"{where}: pyflow supports one tensor (or list) per index, got {index!r:.80}")
            advanced = items[i] = _advanced(item, t)
        else:
            raise ArgumentTypeError(f"{where}: unsupported index {item!r} ({type(item).__name__}); use ints, "
                                    "slices, ..., None, an integer tensor or a bool mask")
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexOutOfRangeError(f"{where}: an index can only have a single ellipsis ('...')")
    used = sum(item.ndim if isinstance(item, _Advanced) else 1 for item in items
               if item is not None and item is not Ellipsis)
    if used > t.ndim:
        raise IndexOutOfRangeError(f"{where}: too many indices ({used}) for a tensor of rank {t.ndim}")
    if any(item is Ellipsis for item in items):
        at = next(i for i, item in enumerate(items) if item is Ellipsis)
        items[at:at + 1] = [slice(None)] * (t.ndim - used)
    if advanced is not None:
        _place(t, items, advanced)
    return items, advanced


def _place(t, items, advanced: _Advanced) -> None:
    """Where the advanced item's dims are in the basic view; numpy's rule for putting them first."""
    dims_before, x_dim = 0, 0
    for item in items:
        if item is advanced:
            break
        dims_before += 0 if isinstance(item, int) else 1
        x_dim += 0 if item is None else 1
    advanced.position = dims_before
    source = advanced.source
    if advanced.is_mask:
        mask_shape, covered = tuple(source.shape), t.shape[x_dim:x_dim + advanced.ndim]
        if mask_shape != covered:
            raise IndexOutOfRangeError(f"indexing {describe(t)}: the mask's shape {list(mask_shape)} does not match "
                                       f"the indexed dims {list(covered)} (starting at dim {x_dim})")
    elif isinstance(source, np.ndarray) and source.size:   # indices on the host: checked now, not by the kernel
        size = t.shape[x_dim]
        bad = source[(source < -size) | (source >= size)]
        if bad.size:
            raise IndexOutOfRangeError(f"indexing {describe(t)}: index {int(bad[0])} is out of bounds for "
                                       f"dimension {x_dim} with size {size}")
    joined = [i for i, item in enumerate(items) if isinstance(item, int) or item is advanced]
    advanced.to_front = joined != list(range(joined[0], joined[-1] + 1))


def _basic(t: Tensor, items) -> Tensor:
    """The view of ints, slices and None: the ``slice_view`` op (an advanced item stands for ``ndim`` whole
    dims)."""
    return apply("slice_view", [t], index=_slice_index(t, items))[0]


def _slice_index(t: Tensor, items) -> tuple:
    """The ``slice_view`` op's index for ``items``: ints in range, slices as (start, stop, step) of the dim's
    size, a slice that keeps the whole dim as ``WHOLE`` (which a split dim's pieces can take too), None."""
    index, dim = [], 0
    for item in items:
        if item is None:
            index.append(None)
            continue
        if isinstance(item, _Advanced):
            index += [WHOLE] * item.ndim
            dim += item.ndim
            continue
        size = t.shape[dim]
        if isinstance(item, int):
            if not -size <= item < size:
                raise IndexOutOfRangeError(f"indexing {describe(t)}: index {item} is out of bounds for "
                                           f"dimension {dim} with size {size}")
            index.append(item % size)
        else:
            start, stop, step = (args.as_int(v, "indexing", "a slice bound") if v is not None else None
                                 for v in (item.start, item.stop, item.step))
            if step is not None and step <= 0:
                raise ShapeError(f"indexing {describe(t)}: slice step must be positive, got {step}")
            start, stop, step = slice(start, stop, step).indices(size)
            index.append(WHOLE if (start, step) == (0, 1) and stop == size else (start, stop, step))
        dim += 1
    return tuple(index) + (WHOLE,) * (t.ndim - dim)


def is_basic(index) -> bool:
    """Is ``index`` basic (ints, slices, ``...``, None: ``x[index]`` is a view, the ``slice_view`` op), not
    advanced (a tensor, list or mask in it: a copy)?

    >>> is_basic((0, slice(None), None, Ellipsis)), is_basic([0, 1]), is_basic([0, slice(1)]), is_basic((0, True))
    (True, False, True, False)
    """
    if _sequence_as_tuple(index):
        index = tuple(index)
    items = index if isinstance(index, tuple) else (index,)
    return all(item is None or item is Ellipsis or isinstance(item, slice)
               or isinstance(item, numbers.Integral) and not isinstance(item, (bool, np.bool_)) for item in items)


def _positions(advanced: _Advanced, device, wrap: int | None = None) -> Tensor:
    """The advanced item as a 1-D int index on ``device`` (a mask: the flat positions of its True values).

    ``wrap``: the indexed dim's size, to turn negative indices ``-wrap..-1`` into positions (index_copy
    takes none; index_select wraps them itself).
    """
    source = advanced.source
    if advanced.shape is not None:   # several index tensors, already one linear index into the merged dims
        return source.reshape(-1)
    if advanced.is_mask:
        values = source.numpy() if isinstance(source, Tensor) else source   # a Tensor mask: a sync
        return tensor(np.flatnonzero(values).astype(DEFAULT_INT), device=device)
    if not isinstance(source, Tensor):
        source = source.astype(DEFAULT_INT)
        return tensor(np.where(source < 0, source + wrap, source) if wrap else source, device=device).reshape(-1)
    index = source if source.dtype in INDEX_DTYPES else source.to(dtype=DEFAULT_INT)
    index = index.to(device).reshape(-1)
    return where(index < 0, index + wrap, index) if wrap else index


def _index_shape(advanced: _Advanced, positions: Tensor) -> tuple:
    if advanced.shape is not None:
        return advanced.shape
    return tuple(positions.shape) if advanced.is_mask else tuple(advanced.source.shape)


def _several(t: Tensor, index):
    """``x[i, j]`` with several integer index tensors (or lists), broadcast together, as numpy and PyTorch:
    one linear index ``(i * size_j + j)`` into the indexed dims, merged (``None`` if ``index`` has fewer than
    two).  Ints among them count as 0-d indices.  Where the indexed dims are apart (a slice between them),
    numpy puts the index's dims first: ``t`` is permuted so that they come first, together.  Returns the
    tensor to index (``t`` or a permuted view of it) and its items, the one ``_Advanced`` among them."""
    if not isinstance(index, tuple):
        return None
    arrays = [item for item in index if isinstance(item, (Tensor, list, np.ndarray, range))]
    if len(arrays) < 2:
        return None
    place = f"indexing {describe(t)}"
    if any(item is None for item in index) or sum(item is Ellipsis for item in index) > 1:
        raise ArgumentTypeError(f"{place}: None or several '...' beside several index tensors is not supported; "
                                "index in two steps")
    items = list(index)
    if any(item is Ellipsis for item in items):
        at = next(k for k, item in enumerate(items) if item is Ellipsis)
        items[at:at + 1] = [slice(None)] * (t.ndim - (len(items) - 1))
    if len(items) > t.ndim:
        raise IndexOutOfRangeError(f"{place}: too many indices ({len(items)}) for a tensor of rank {t.ndim}")
    items += [slice(None)] * (t.ndim - len(items))
    dims = [d for d, item in enumerate(items) if not isinstance(item, slice)]
    checked = []   # every index checked (type, mask, range on the host, shapes) before anything is issued
    for d in dims:
        item = items[d]
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (numbers.Integral, Tensor, list, np.ndarray,
                                                                         range)):
            raise ArgumentTypeError(f"{place}: unsupported index {item!r:.60} beside several index tensors")
        one = _advanced(item if not isinstance(item, numbers.Integral) else [int(item)], t)
        if one.is_mask:
            raise ArgumentTypeError(f"{place}: a bool mask beside other index tensors is not supported; use "
                                    "mask.nonzero() to turn it into integer indices")
        if isinstance(one.source, np.ndarray):
            _place(t, [slice(None)] * d + [one], one)   # indices on the host: checked now
        checked.append((d, one, () if isinstance(item, numbers.Integral) else tuple(one.source.shape)))
    try:
        shape = tuple(np.broadcast_shapes(*[s for _, _, s in checked]))
    except ValueError:
        raise ShapeError(f"{place}: the index tensors' shapes {[list(s) for _, _, s in checked]} do not "
                         "broadcast together") from None
    indices = []
    for d, one, one_shape in checked:
        source = one.source if isinstance(one.source, Tensor) else tensor(one.source.astype(DEFAULT_INT),
                                                                           device=t.device)
        source = source.reshape(one_shape).to(t.device, DEFAULT_INT)
        indices.append(where(source < 0, source + t.shape[d], source))
    linear = indices[0]
    for d, i in zip(dims[1:], indices[1:]):
        linear = linear * t.shape[d] + i
    linear = linear.expand(shape) if tuple(linear.shape) != shape else linear
    if dims != list(range(dims[0], dims[0] + len(dims))):   # apart: the index's dims go first
        rest = [d for d in range(t.ndim) if d not in dims]
        t, items = t.permute(dims + rest), [slice(None)] * len(dims) + [items[d] for d in rest]
        dims = list(range(len(dims)))
    advanced = _Advanced(linear, False, len(dims), position=dims[0], shape=shape)
    return t, items[:dims[0]] + [advanced] + items[dims[-1] + 1:]


def _merged(view: Tensor, advanced: _Advanced, count: int) -> tuple:
    p, k = advanced.position, advanced.ndim
    return view.shape[:p] + (count,) + view.shape[p + k:]


def _to_front(t: Tensor, advanced: _Advanced, ndim_index: int, inverse=False) -> Tensor:
    """Permute the index's dims (at ``position``) to the front, or back (``inverse``)."""
    p = advanced.position
    order = list(range(p, p + ndim_index)) + [d for d in range(t.ndim) if not p <= d < p + ndim_index]
    if inverse:
        order = [order.index(d) for d in range(t.ndim)]
    return t.permute(order)


def _items(self: Tensor, index) -> tuple:
    """(the tensor to index, its items, the advanced item or None)."""
    if _sequence_as_tuple(index):
        index = tuple(index)
    several = _several(self, index)
    if several is not None:
        t, items = several
        return t, items, next(item for item in items if isinstance(item, _Advanced))
    return (self, *_parse(self, index))


def getitem(self: Tensor, index) -> Tensor:
    """``self[index]``: a view for basic indexing, a copy (``index_select``) for a tensor or a mask."""
    self, items, advanced = _items(self, index)
    view = _basic(self, items)
    if advanced is None:
        return view
    if advanced.ndim == 0:   # a 0-d mask: a new dim of size 1 (True) or 0 (False)
        view, advanced.ndim = view.unsqueeze(advanced.position), 1
        advanced.source = advanced.source.reshape(1)
    positions = _positions(advanced, self.device)
    source = view.reshape(_merged(view, advanced, math.prod(view.shape[advanced.position:][:advanced.ndim])))
    result = apply("index_select", [source, positions], axis=advanced.position)[0]
    index_shape = _index_shape(advanced, positions)
    p = advanced.position
    result = result.view(view.shape[:p] + index_shape + view.shape[p + advanced.ndim:])
    return _to_front(result, advanced, len(index_shape)) if advanced.to_front else result


def _value(value, t: Tensor):
    """A scalar converted to ``t``'s dtype, or a tensor; checked before anything is issued."""
    if is_scalar(value):
        return to_scalar(value, t.dtype, "setitem")
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        return tensor(value, device=t.device)
    raise ArgumentTypeError(f"setitem of {describe(t)}: the value must be a number or a tensor, got "
                            f"{type(value).__name__}")


def setitem(self: Tensor, index, value) -> None:
    """``self[index] = value``, in place: a basic index is the ``slice_update`` op; with a tensor or a mask
    in it, an ``index_copy`` into the basic view, which autograd records as one node
    (``pyflow/autograd/views.py``), so the ops it issues are issued with grad mode off."""
    self, items, advanced = _items(self, index)
    if advanced is None:
        _slice_update(self, _slice_index(self, items), value)
        return
    enabled = is_grad_enabled()
    set_grad_mode(False)
    try:
        _index_copy(self, items, advanced, value)
    finally:
        set_grad_mode(enabled)


def _slice_update(self: Tensor, index: tuple, value) -> None:
    """The ``slice_update`` op (OneFlow's): an int of the index is a length-1 slice of the region it
    writes, and the value, expanded to the view's shape, gets those dims (and loses the None ones)."""
    strides = contiguous_strides(self.shape) if self.is_global else tuple(self._blob.strides)   # (a piece may be
    shape, strides, offset = get_op("slice_view").view(tuple(self.shape), strides, 0, {"index": index})   # absent)
    blob = value._blob if isinstance(value, Tensor) and not (self.is_global or value.is_global) else None
    if blob is not None and blob.storage is self._blob.storage and value.dtype == self.dtype and \
            (tuple(blob.shape), tuple(blob.strides), blob.offset) == (shape, strides, self._blob.offset + offset):
        return   # the very region (``x[1:] += y`` wrote it in place, then assigns it): nothing to copy, as copy_
    if math.prod(shape) > 1 and any(s == 0 and n > 1 for n, s in zip(shape, strides)):
        raise ShapeError(f"setitem: several elements of {describe(self)}[...] share one memory location "
                         "(an expanded view); write to a .clone() instead")
    if not isinstance(value, Tensor):   # a number, a list...: a tensor where self is
        value = _placed(value, self)
    if not args.broadcasts_to(value.shape, shape):
        raise ShapeError(f"setitem: the value {describe(value)} does not broadcast to the indexed shape "
                         f"{list(shape)} of {describe(self)}")
    value = _placed(value, self).expand(shape)
    dropped = tuple(j for j, item in enumerate(i for i in index if not isinstance(i, int)) if item is None)
    if dropped:
        value = value.squeeze(dropped)
    region = tuple(item for item in index if item is not None)
    for d, item in enumerate(region):
        if isinstance(item, int):
            value = value.unsqueeze(d)
    region = tuple((item, item + 1, 1) if isinstance(item, int) else item for item in region)
    apply("slice_update", [self, value], out=[self], index=region)


def _placed(value, t: Tensor) -> Tensor:
    """``value`` (a number, a list or array, or a tensor) as a tensor where ``t`` is: on its device, or global
    on its placement (broadcast; a local tensor: rank 0's values, as ``to_global`` makes them)."""
    if not t.is_global:
        value = _value(value, t)
        if isinstance(value, Tensor):
            return value.to(t.device)
        return apply("fill", [], shape=(), dtype=t.dtype, value=value, device=t.device)[0]
    whole = (B,) * len(t.placement.hierarchy)
    if isinstance(value, (list, tuple, np.ndarray)):   # the same on every rank, as the program is
        return tensor(value, placement=t.placement, sbp=whole)
    value = _value(value, t)
    if isinstance(value, Tensor):
        return value if value.is_global else value.to_global(t.placement, whole)
    return tensor(value, dtype=t.dtype, placement=t.placement, sbp=whole)


def _index_copy(self: Tensor, items, advanced: _Advanced, value) -> None:
    view = _basic(self, items)
    _writable(view, "setitem")
    value = _value(value, self)
    if advanced.ndim == 0:
        view, advanced.ndim = view.unsqueeze(advanced.position), 1
        advanced.source = advanced.source.reshape(1)
    positions = _positions(advanced, self.device, wrap=view.shape[advanced.position])
    p, k, count = advanced.position, advanced.ndim, positions.shape[0]
    index_shape = _index_shape(advanced, positions)
    result_shape = view.shape[:p] + index_shape + view.shape[p + k:]
    shown = result_shape
    if advanced.to_front:   # the shape self[index] has: the index's dims first
        n = len(index_shape)
        shown = result_shape[p:p + n] + result_shape[:p] + result_shape[p + n:]
    if isinstance(value, Tensor):
        if not args.broadcasts_to(value.shape, shown):
            raise ShapeError(f"setitem: the value {describe(value)} does not broadcast to the indexed "
                             f"shape {list(shown)} of {describe(self)}")
        source = value.to(self.device, self.dtype).expand(shown)
    else:
        source = apply("fill", [], shape=(), dtype=self.dtype, value=value, device=self.device)[0].expand(shown)
    if advanced.to_front:
        source = _to_front(source, advanced, len(index_shape), inverse=True)
    source = source.reshape(_merged(view, advanced, count))
    merged = _merged(view, advanced, math.prod(view.shape[p:p + k]))
    strides = view_strides(view.shape, view._blob.strides, merged)
    if strides is not None:   # the mask's dims merge in place: write self directly
        target = view._view(merged, strides, view._blob.offset)
        apply("index_copy", [target, positions, source], out=[target], axis=p)
    else:                     # they do not: write a contiguous copy, then copy it back
        copy = view.clone()
        target = copy.view(merged)
        apply("index_copy", [target, positions, source], out=[target], axis=p)
        view.copy_(copy)
