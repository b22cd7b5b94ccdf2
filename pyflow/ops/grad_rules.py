"""What the backward rules of ``pyflow/ops/`` share.

A rule is ``rule(ctx, grad) -> one gradient per input`` (``pyflow/autograd/``):
``ctx.inputs`` / ``ctx.outputs`` are the tensors the op read and wrote (saved
when it ran), ``ctx.attrs`` its attributes, ``ctx.needs_grad(i)`` whether input
``i`` wants a gradient, ``ctx.input_shapes`` their shapes.  ``grad`` is the
gradient of the op's output (a list, one per output, for ops with several).
Rules use only the public tensor ops, so backward runs as VM instructions.

* ``sum_to(g, shape)`` - undo broadcasting: sum ``g`` over the dims that
  broadcasting added or stretched, back to ``shape``;
* ``for_inputs(ctx, *grads)`` - each gradient summed to its input's shape, and
  None for the inputs that want none (so a rule states only the math).

>>> import pyflow as flow
>>> sum_to(flow.ones(2, 3), (1, 3)).tolist()
[[2.0, 2.0, 2.0]]
"""

from __future__ import annotations

__all__ = ["sum_to", "for_inputs", "keepdims_shape"]


def sum_to(grad, shape: tuple):
    """``grad`` summed over the dims broadcasting added (leading) or stretched (size 1 in ``shape``)."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.ndim - len(shape)
    dims = list(range(lead)) + [lead + d for d, n in enumerate(shape) if n == 1 and grad.shape[lead + d] != 1]
    summed = grad.sum(dim=tuple(dims), keepdim=True) if dims else grad
    return summed.reshape(shape)


def for_inputs(ctx, *grads) -> list:
    """One gradient per input: ``grads[i]`` (a tensor or a function making it) summed to input ``i``'s
    shape, or None where input ``i`` needs no gradient (a function is then not even called)."""
    result = []
    for i, g in enumerate(grads):
        if g is None or not ctx.needs_grad(i):
            result.append(None)
            continue
        g = g() if callable(g) else g
        result.append(sum_to(g, ctx.input_shapes[i]))
    return result


def keepdims_shape(shape: tuple, axis) -> tuple:
    """``shape`` with the reduced ``axis`` (a tuple, or None: all) kept as size-1 dims."""
    if axis is None:
        return (1,) * len(shape)
    axes = [a % len(shape) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    return tuple(1 if d in axes else n for d, n in enumerate(shape))
