"""Gradients of what is not an op yet: advanced indexing (``x[i]``, ``x[i] = v``), ``to_local``.

The view ops (``reshape``, ``permute``, ``expand``, ``narrow``, ``squeeze``, ``unsqueeze``, and
``slice_view``: ``x[index]`` with ints, slices, None, ...) and ``slice_update`` (``x[index] = v``
for such an index) are ops with their backward rules in ``pyflow/ops/views.py``; so is ``to_global``
(``pyflow/ops/to_global.py``), whose eager runner is the boxing chain, not the interpreter.  These
Tensor methods are not run by the interpreter, so it does not record them: the methods themselves
(``pyflow/framework/tensor_methods.py``) call ``record_call`` / ``record_write`` here, through
the hook ``pyflow.autograd`` installs, and each records one Node with these rules (``g`` is
the result's gradient), ``to_global`` with its op's own ``backward``, the rule nn.Graph's autograd
pass calls too:

============================  ==================================================================
``x[index]``, advanced        zeros of the input's shape with ``g`` added at the elements the index
                              selected; an index may select an element twice (``x[[0, 0]]``), so
                              the positions come from indexing ``arange(numel)`` the same way,
                              and ``index_add`` sums
``x[index] = v``, advanced    x's history gets ``g`` with the written elements zeroed; ``v`` gets
                              ``g[index]`` summed to its shape
``to_local``                  ``g`` made global again, with the *dual* SBP of the input's
                              (B <-> P, S stays): the inverse of ``to_global``'s rule
============================  ==================================================================
"""

from __future__ import annotations

import math

from pyflow.autograd.graph import AutogradMeta, Node
from pyflow.autograd.record import Recorder, record_unary_view
from pyflow.framework.op_registry import get_op
from pyflow.ops.grad_rules import sum_to
from pyflow.ops.to_global import dual_sbp

__all__ = ["record_call", "check_write", "record_write"]


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


def _to_local_rule(ctx, g):
    placement, sbp = ctx.input_layouts[0]
    return [g.to_global(placement, dual_sbp(sbp))]


_RULES = {"index": _index_rule, "setitem": _setitem_rule, "to_local": _to_local_rule}


def record_call(name: str, x, result, attrs: dict) -> None:
    """After ``x[index]`` (``"index"``) or ``x.to_local()``: ``result``'s Node, with the call's rule above;
    after ``x.to_global(...)``, with the op's ``backward`` (``attrs``: what the rule needs, e.g. the index)."""
    record_unary_view(name, _RULES[name] if name in _RULES else get_op(name).backward, x, result, attrs)


def check_write(name: str, x) -> None:
    """Before ``x[index] = v`` writes ``x``: the checks of an in-place op (not into a leaf that requires
    grad, nor a view of one)."""
    Recorder().check_inplace(name, [x])


def record_write(name: str, inputs: list, x, attrs: dict) -> None:
    """After ``x[index] = v`` (``"setitem"``, ``inputs`` ``[x, v]``) wrote ``x``: ``x``'s history now
    ends with this Node (the tensor object stays, as for an in-place op)."""
    node = Node(name, _RULES[name], inputs, [x], attrs)
    x._autograd = AutogradMeta(requires_grad=True, grad_fn=node, output_nr=0)
