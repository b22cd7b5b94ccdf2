"""How the tensor methods that are not ops treat a global tensor (installed on ``Tensor`` at import).

Ops (``x + y``, ``x.sum()``, ``flow.matmul``...) reach the global interpreter by
themselves.  The rest of the Tensor API works on global tensors too:

* ``to_global`` / ``to_local`` (``global_tensor.py``);
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

import functools

from pyflow import env
from pyflow.device import Device
from pyflow.distributed.boxing_steps import Layout
from pyflow.distributed.global_tensor import box, layout_of, make_global, to_global, to_local
from pyflow.framework.args import describe
from pyflow.framework.indexing import is_basic
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.tensor import Tensor
from pyflow.vm import no_instructions

__all__ = ["install", "global_to"]

_B = SbpParallel("broadcast")
_ON_BROADCAST = ("__getitem__", "repeat")


def _traced(x: Tensor):
    """Inside ``nn.Graph.build``, an eager global tensor's method works on its lazy twin (the graph
    reads the tensor at run time); None otherwise."""
    from pyflow.framework import interpreter

    hook = interpreter._lazy_tracer
    if x._global is None or hook is None or not hook.active():
        return None
    return hook.lazy(x)


def _to_global(x: Tensor, placement=None, sbp=None) -> Tensor:
    lazy = _traced(x)
    if lazy is not None:
        return lazy.to_global(placement, sbp)
    return to_global(x, placement, sbp)


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


def _on_broadcast(method, name: str):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._global is None:
            return method(self, *args, **kwargs)
        lazy = _traced(self)
        if lazy is not None:
            return method(lazy, *args, **kwargs)
        placement = self._global.placement
        if name == "__getitem__":
            if is_basic(args[0]):   # the slice_view op: the global interpreter (or the graph) runs it
                return method(self, *args)
            args = (_consistent_index(args[0], placement),)
        if placement.has(env.get_rank()):
            return _wrap_results(method(to_local(_broadcast(self)), *args, **kwargs), placement)
        with no_instructions(f"{name} of a global tensor on rank {env.get_rank()}, outside its placement"):
            return _wrap_results(method(_ghost(self), *args, **kwargs), placement)
    return wrapper


def _to(method):
    @functools.wraps(method)
    def wrapper(self, *where, **kwargs):
        if self._global is None:
            return method(self, *where, **kwargs)
        return global_to(self, *where, **kwargs)
    return wrapper


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


def _setitem(method):
    @functools.wraps(method)
    def wrapper(self, index, value):
        if self._global is None or is_basic(index):   # basic: the slice_update op, run by the global interpreter
            return method(self, index, value)
        placement = self._global.placement
        index = _consistent_index(index, placement)
        if isinstance(value, Tensor):   # the same value on every rank, as the index (a local one: rank 0's)
            value = _consistent_index(value, placement)
        whole = _broadcast(self)
        if whole is self:  # already broadcast: write its pieces directly
            if placement.has(env.get_rank()):
                method(to_local(self), index, value)
            return None
        if placement.has(env.get_rank()):
            updated = to_local(whole).clone()
            method(updated, index, value)
        else:
            updated = None
        result = make_global(updated, placement, whole._global.sbp, self.shape, self.dtype)
        written = box(result, layout_of(self), f"x[...] = v into {describe(self)}")
        if placement.has(env.get_rank()):
            to_local(self).copy_(to_local(written))
        return None
    return wrapper


def install() -> None:
    """Make Tensor's methods global-aware (idempotent)."""
    if getattr(Tensor, "_global_methods_installed", False):
        return
    Tensor.to_global = _to_global
    Tensor.to_local = to_local
    for name in _ON_BROADCAST:
        if hasattr(Tensor, name):
            setattr(Tensor, name, _on_broadcast(getattr(Tensor, name), name))
    Tensor.to = _to(Tensor.to)
    Tensor.__setitem__ = _setitem(Tensor.__setitem__)
    Tensor._global_methods_installed = True

