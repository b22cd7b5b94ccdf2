"""Gradients of what is not an op yet: advanced indexing (``x[i]``, ``x[i] = v``), local <-> global.

The view ops (``reshape``, ``permute``, ``expand``, ``narrow``, ``squeeze``, ``unsqueeze``, and
``slice_view``: ``x[index]`` with ints, slices, None, ...) and ``slice_update`` (``x[index] = v``
for such an index) are ops with their backward rules in ``pyflow/ops/views.py``.  These Tensor
methods do not go through the interpreter as one op, so autograd wraps them (``install``) and
records a Node for each, with these rules (``g`` is the result's gradient):

============================  ==================================================================
``x[index]``, advanced        zeros of the input's shape with ``g`` added at the elements the index
                              selected; an index may select an element twice (``x[[0, 0]]``), so
                              the positions come from indexing ``arange(numel)`` the same way,
                              and ``index_add`` sums
``x[index] = v``, advanced    x's history gets ``g`` with the written elements zeroed; ``v`` gets
                              ``g[index]`` summed to its shape
``to_global``, ``to_local``   ``g`` boxed back to the input's placement, with the *dual* SBP
                              (B <-> P, S stays): e.g. the local tensors that became a B tensor
                              get parallel_id 0's share of the gradient, the others zeros
============================  ==================================================================
"""

from __future__ import annotations

import functools
import math

from pyflow.autograd.engine import dual_sbp
from pyflow.autograd.graph import requires_grad
from pyflow.autograd.mode import is_grad_enabled
from pyflow.autograd.record import Recorder, record_unary_view
from pyflow.framework.indexing import is_basic
from pyflow.framework.tensor import Tensor
from pyflow.ops._grad import sum_to

__all__ = ["install"]


def _scatter_into_zeros(shape, dtype, g, index):
    """Zeros of ``shape`` with ``g`` added at the elements ``[index]`` selects (duplicates add up)."""
    from pyflow.framework.creation import arange, zeros

    n = math.prod(shape)
    if g.is_global:
        b = tuple(type(s)("broadcast") for s in g.sbp)
        positions = arange(n).to_global(g.placement, b)
        flat = zeros(n, dtype=dtype, placement=g.placement, sbp=b)
    else:
        positions, flat = arange(n, device=g.device), zeros(n, dtype=dtype, device=g.device)
    flat.index_add_(0, positions.reshape(shape)[index].reshape(-1), g.reshape(-1))
    return flat.reshape(shape)


def _index_rule(ctx, g):
    return [_scatter_into_zeros(ctx.input_shapes[0], g.dtype, g, ctx.attrs["index"])]


def _setitem_rule(ctx, g):
    index = ctx.attrs["index"]
    grads = [None, None]
    if ctx.needs_grad(0):
        kept = g.clone()
        kept[index] = 0.0
        grads[0] = kept
    if ctx.needs_grad(1):
        grads[1] = sum_to(g[index], ctx.input_shapes[1])
    return grads


def _to_global_rule(ctx, g):
    layout = ctx.input_layouts[0]
    if layout is not None:  # global -> global: box back, to the dual SBP
        return [g.to_global(layout[0], dual_sbp(layout[1]))]
    placement, sbp = ctx.attrs["placement"], ctx.attrs["sbp"]  # local -> global: each rank's share
    return [g.to_global(placement, dual_sbp(sbp)).to_local()]


def _to_local_rule(ctx, g):
    placement, sbp = ctx.input_layouts[0]
    return [g.to_global(placement, dual_sbp(sbp))]


def _getitem(method):
    @functools.wraps(method)
    def wrapper(self, index):
        result = method(self, index)
        if not is_basic(index) and is_grad_enabled() and requires_grad(self):   # basic: the slice_view op
            record_unary_view("index", _index_rule, self, result, {"index": index})
        return result
    return wrapper


def _setitem(method):
    @functools.wraps(method)
    def wrapper(self, index, value):
        if is_basic(index):   # the slice_update op: recorded by the interpreter
            return method(self, index, value)
        recording = is_grad_enabled() and (requires_grad(self) or requires_grad(value))
        if recording:
            Recorder().check_inplace("setitem", [self])
        method(self, index, value)
        if recording:
            from pyflow.autograd.graph import AutogradMeta, Node

            node = Node("setitem", _setitem_rule, [self, value], [self], {"index": index})
            self._autograd = AutogradMeta(requires_grad=True, grad_fn=node, output_nr=0)
    return wrapper


def _to_global(method):
    @functools.wraps(method)
    def wrapper(self, placement=None, sbp=None):
        result = method(self, placement, sbp)
        if result is not self and is_grad_enabled() and requires_grad(self):
            record_unary_view("to_global", _to_global_rule, self, result,
                              {"placement": result.placement, "sbp": result.sbp})
        return result
    return wrapper


def _to_local(method):
    @functools.wraps(method)
    def wrapper(self):
        result = method(self)
        if result is not self and is_grad_enabled() and requires_grad(self):
            record_unary_view("to_local", _to_local_rule, self, result)
        return result
    return wrapper


def install() -> None:
    """Wrap the indexing methods and to_global/to_local (after pyflow.distributed has made them global-aware)."""
    if getattr(Tensor, "_autograd_views_installed", False):
        return
    Tensor.__getitem__ = _getitem(Tensor.__getitem__)
    Tensor.__setitem__ = _setitem(Tensor.__setitem__)
    Tensor.to_global = _to_global(Tensor.to_global)
    Tensor.to_local = _to_local(Tensor.to_local)
    Tensor._autograd_views_installed = True
