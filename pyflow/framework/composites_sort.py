"""Sorting and finding, built from existing ops: ``sort``, ``argsort``, ``nonzero``, ``unique``.

* ``sort``/``argsort`` are the ``topk`` op with ``k`` = the dim's size.  ``topk`` keeps ties in
  index order on both targets (its CPU twin is numpy's stable argsort, its CUDA kernel gives the
  same indices), so **every sort here is stable**, whatever ``stable=`` says: equal values keep
  their order, ascending and descending, and NaN sorts as the largest value (last ascending,
  first descending), as in PyTorch.  The values are differentiable (``topk``'s gradient scatters
  back to the indices).  The CUDA ``topk`` kernel takes k <= 64: a longer CUDA dim is sorted on
  the host instead (numpy's stable argsort of the values, which **syncs**), and the values are
  then gathered on the device with ``gather`` (so they are still differentiable).
* ``nonzero`` and ``unique`` have a data-dependent output shape: they read the tensor on the host
  (they **sync**, as PyTorch's do on CUDA) and copy the result back to the tensor's device.

>>> import pyflow as flow
>>> x = flow.tensor([3, 1, 2, 1])
>>> flow.sort(x)
sort(values=tensor([1, 1, 2, 3]), indices=tensor([1, 3, 2, 0]))
>>> x.argsort(descending=True).tolist(), flow.nonzero(x > 1).tolist()
([0, 2, 1, 3], [[0], [2]])
>>> [t.tolist() for t in flow.unique(x, return_counts=True)]
[[1, 2, 3], [2, 1, 1]]
"""

from __future__ import annotations

import collections

import numpy as np

from pyflow.errors import ArgumentTypeError, ShapeError
from pyflow.framework import args, creation
from pyflow.framework.args import describe
from pyflow.framework.dtypes import DEFAULT_INT
from pyflow.framework.movement import gather
from pyflow.framework.reductions import return_types, topk
from pyflow.framework.tensor import Tensor, tensor
from pyflow.kernels.sort import MAX_TOPK

__all__ = ["sort", "argsort", "nonzero", "unique"]

return_types.sort = collections.namedtuple("sort", ["values", "indices"])


def _host_order(values: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """The stable sorting order along ``axis``, as the topk kernel's CPU twin computes it."""
    if descending:   # a stable sort of the reversed row, reversed: ties keep the lower index first
        n = values.shape[axis]
        return n - 1 - np.flip(np.argsort(np.flip(values, axis), axis=axis, kind="stable"), axis)
    return np.argsort(values, axis=axis, kind="stable")


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):   # noqa: A002
    """``(values, indices)`` of ``input`` sorted along ``dim`` (ascending unless ``descending``); always
    stable (see the module's docstring).  A CUDA dim longer than 64 is sorted on the host (syncs)."""
    x = args.tensor(input, "sort")
    if not isinstance(descending, bool) or not isinstance(stable, bool):
        raise ArgumentTypeError(f"sort: descending and stable must be bools, got {descending!r}, {stable!r}")
    if x.ndim == 0:
        return return_types.sort(x.clone(), creation.zeros((), dtype=DEFAULT_INT, device=x.device))
    axis = args.dim(dim, x.ndim, "sort", x)
    n = x.shape[axis]
    if not x.is_cuda or n <= MAX_TOPK:
        values, indices = topk(x, n, axis, largest=descending)
        return return_types.sort(values, indices)
    if x.is_global:
        raise ShapeError(f"sort: a dim of {n} > {MAX_TOPK} elements of a global CUDA tensor ({describe(x)}); "
                         "sort the local tensor, or move it to the cpu")
    indices = tensor(_host_order(x.numpy(), axis, descending), device=x.device)
    return return_types.sort(gather(x, axis, indices), indices)


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:   # noqa: A002
    """The indices that sort ``input`` along ``dim`` (``sort(...).indices``; stable)."""
    return sort(input, dim, descending, stable).indices


def nonzero(input: Tensor, *, as_tuple: bool = False):   # noqa: A002
    """The indices of the nonzero elements: an int64 ``(count, ndim)`` tensor in row-major order, or
    with ``as_tuple`` one 1-D tensor per dim (a 0-d input counts as 1-D).  Reads ``input`` on the
    host (syncs), then copies the indices to its device."""
    x = args.tensor(input, "nonzero")
    if x.is_global:
        raise ArgumentTypeError(f"nonzero: not for a global tensor ({describe(x)}); use .to_local() or numpy()")
    values = x.numpy()
    if as_tuple:
        return tuple(tensor(i.astype(DEFAULT_INT), device=x.device) for i in np.nonzero(np.atleast_1d(values)))
    return tensor(np.argwhere(values).astype(DEFAULT_INT), device=x.device)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,   # noqa: A002 - torch's names
           return_counts: bool = False, dim=None):
    """The distinct values of ``input`` (flattened), in ascending order, and if asked the index of each
    element's value in them (``input``'s shape) and each value's count (int64).  With ``dim``: the distinct
    slices along ``dim``, in lexicographic order, the index of each slice's (a 1-D tensor of
    ``input.shape[dim]``) and each slice's count, as ``torch.unique(dim=)``.  ``sorted=False`` is accepted
    and still sorts (one valid order).  NaNs are each their own value, as torch's.  Reads ``input`` on the
    host (syncs)."""
    x = args.tensor(input, "unique")
    if x.is_global:
        raise ArgumentTypeError(f"unique: not for a global tensor ({describe(x)}); use .to_local() or numpy()")
    values = x.numpy()
    if dim is None:
        found = np.unique(values.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
        inverse = found[1].reshape(values.shape)
    else:
        if x.ndim == 0:
            raise ShapeError(f"unique: dim={dim!r} of a 0-d tensor ({describe(x)}); use dim=None")
        found = np.unique(values, return_inverse=True, return_counts=True, axis=args.dim(dim, x.ndim, "unique", x))
        inverse = found[1].reshape(-1)
    result = [tensor(found[0], dtype=x.dtype, device=x.device)]
    if return_inverse:
        result.append(tensor(inverse.astype(DEFAULT_INT), device=x.device))
    if return_counts:
        result.append(tensor(found[2].astype(DEFAULT_INT), device=x.device))
    return result[0] if len(result) == 1 else tuple(result)
