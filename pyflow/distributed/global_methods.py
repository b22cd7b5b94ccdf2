"""How the tensor methods that are not ops treat a global tensor: the functions Tensor's methods call
(``pyflow/framework/tensor_methods.py``; ``pyflow.distributed`` installs this module there at import).

Ops (``x + y``, ``x.sum()``, ``flow.matmul``...) reach the global interpreter by
themselves.  The rest of the Tensor API works on global tensors too:

* ``to_global`` (the eager runner of the op ``to_global``, ``pyflow/ops/to_global.py``: the boxing
  chain) / ``to_local`` (``global_tensor.py``);
* the view ops (``permute``, ``transpose``, ``.T``, ``reshape``, ``view``, ``flatten``,
  ``expand``, ``narrow``, ``split``, ``squeeze``, ``unsqueeze``...) are ops
  (``pyflow/ops/views.py``): their SBP signatures say which splits carry over
  (a permuted split follows its dim; ``reshape`` works on the broadcast tensor);
* ``.to(device type)``, ``.cpu()``, ``.cuda()``: the same ranks on another
  device type (boxing's device copy); ``.to(dtype)``, ``clone()`` and
  ``contiguous()`` are ops (a partial sum stays one); ``detach()`` keeps the layout;
* ``x[index]`` with ints, slices, None and ``...`` is the view op ``slice_view``: a split of
  a dim the index keeps whole stays a split;
* ``x[index]`` with a tensor, list or mask in it, and ``repeat``: computed on the
  broadcast tensor (every rank of the placement holds it all), and the result is
  broadcast too.  A rank outside the
  placement computes the result's shape on a data-less stand-in and gets an
  empty piece; a method that needs data there is an error naming it.
* ``x[index] = value``: with a basic index, the op ``slice_update`` (a split of a dim the
  index keeps whole stays one); with a tensor, list or mask in it, computed on the broadcast
  tensor, then boxed back into ``x``'s own layout and pieces.
"""

from __future__ import annotations

from pyflow import env
from pyflow.device import Device
from pyflow.distributed.boxing_steps import Layout
from pyflow.distributed.global_tensor import box, layout_of, make_global, to_global, to_local
from pyflow.framework import indexing, movement
from pyflow.framework.args import describe
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor
from pyflow.vm import no_instructions

__all__ = ["to_global", "to_local", "global_to", "getitem", "setitem", "repeat"]

_B = SbpParallel("broadcast")


def _broadcast(x: Tensor) -> Tensor:
    layout = Layout(x._global.placement, (_B,) * len(x._global.placement.hierarchy))
    return x if layout_of(x) == layout else box(x, layout, f"{describe(x)} -> broadcast for a view")


def _ghost(x: Tensor) -> Tensor:
    """A data-less local stand-in with ``x``'s logical shape (no memory until an op writes it)."""
    return Tensor._empty(Device("cpu"), x.shape, x.dtype)


def _wrap_results(result, placement):
    sbp = (_B,) * len(placement.hierarchy)
    member = placement.has(env.get_rank())
    if isinstance(result, Tensor):
        return make_global(result if member else None, placement, sbp, result.shape, result.dtype)
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap_results(r, placement) for r in result)
    return result


def _consistent_index(index, placement):
    """The index of a global tensor, the same on every rank: each tensor in it made broadcast on the tensor's
    placement (a local one as ``to_global(B)`` makes it: rank 0's values, once every rank's shape was checked),
    then this rank's copy.  A local index that differed per rank gave a "global" result whose ranks disagreed."""
    if isinstance(index, tuple):
        return tuple(_consistent_index(item, placement) for item in index)
    if not isinstance(index, Tensor):
        return index
    sbp = (_B,) * len(placement.hierarchy)
    index = _broadcast(index) if index._global is not None else to_global(index, placement, sbp)
    return to_local(index) if placement.has(env.get_rank()) else _ghost(index)


def _on_broadcast(method, name: str, x: Tensor, *args):
    """``method(x, *args)`` computed on the broadcast tensor (every rank of the placement holds it all); the
    result is broadcast too.  A rank outside the placement computes its shape on a data-less stand-in."""
    placement = x._global.placement
    if placement.has(env.get_rank()):
        return _wrap_results(method(to_local(_broadcast(x)), *args), placement)
    with no_instructions(f"{name} of a global tensor on rank {env.get_rank()}, outside its placement"):
        return _wrap_results(method(_ghost(x), *args), placement)


def getitem(x: Tensor, index) -> Tensor:
    """``x[index]`` of a global tensor with a tensor, list or mask in the index (a basic one is the
    ``slice_view`` op): the index made the same on every rank, then computed on the broadcast tensor."""
    return _on_broadcast(indexing.getitem, "__getitem__", x, _consistent_index(index, x._global.placement))


def repeat(x: Tensor, *repeats) -> Tensor:
    """``x.repeat(...)`` of a global tensor: computed on the broadcast tensor."""
    return _on_broadcast(movement.repeat, "repeat", x, *repeats)


def global_to(x: Tensor, *where, **kwargs) -> Tensor:
    """``x.to(...)`` of a global tensor (eager, or lazy inside ``nn.Graph.build``): a dtype is a cast; a
    device type is a ``to_global`` onto the same ranks' devices of that type (the SBP kept)."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("copy", None), kwargs.pop("non_blocking", None)
    for value in where:
        if isinstance(value, Tensor):
            dtype = value.dtype
        elif isinstance(value, (str, Device)):
            device = value
        else:
            dtype = value
    result = x if dtype is None else _cast(x, dtype)
    if device is not None and Device(device).type != result.placement.type:
        target = Placement(Device(device).type, result.placement.ranks)
        result = result.to_global(target, result.sbp)   # a lazy tensor's own to_global inside build
    return result


def _cast(x: Tensor, dtype) -> Tensor:
    from pyflow.framework.dtypes import as_dtype
    from pyflow.framework.interpreter import apply

    dtype = as_dtype(dtype, f"to (of {describe(x)})")
    return x if dtype == x.dtype else apply("cast", [x], dtype=dtype)[0]


def setitem(x: Tensor, index, value) -> None:
    """``x[index] = value`` of a global tensor with a tensor, list or mask in the index (a basic one is the
    ``slice_update`` op): computed on the broadcast tensor, then boxed back into ``x``'s own layout and
    pieces."""
    placement = x._global.placement
    index = _consistent_index(index, placement)
    if isinstance(value, Tensor):   # the same value on every rank, as the index (a local one: rank 0's)
        value = _consistent_index(value, placement)
    whole = _broadcast(x)
    if whole is x:  # already broadcast: write its pieces directly
        if placement.has(env.get_rank()):
            indexing.setitem(to_local(x), index, value)
        return
    if placement.has(env.get_rank()):
        updated = to_local(whole).clone()
        indexing.setitem(updated, index, value)
    else:
        updated = None
    result = make_global(updated, placement, whole._global.sbp, x.shape, x.dtype)
    written = box(result, layout_of(x), f"x[...] = v into {describe(x)}")
    if placement.has(env.get_rank()):
        to_local(x).copy_(to_local(written))
