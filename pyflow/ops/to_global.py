"""The op ``to_global``: a tensor laid out anew, on the placement and with the SBP its attrs name.

``x.to_global(placement, sbp)`` is one op, defined here once (OneFlow: the ``to_global`` functor over
the ``LocalToGlobal`` / ``GlobalToGlobal`` op expressions, each with its grad function):

* ``infer``: the output's *global* meta (``GlobalMeta``): the logical shape and dtype kept, the
  placement and SBP from ``attrs`` (the SBP in its 1-D or n-D form, checked against the shape and
  placement by ``checked_layout``, whose errors are the op's: a split of a dim the tensor lacks...).
  A local input's meta is the logical tensor it becomes (nn.Graph: its blob grown along the split
  dims; eager: the ranks' local shapes are exchanged, and ``infer`` only checks the layout);
* ``sbp_signatures`` is ``SETS_LAYOUT``: the op does not run on pieces laid out one way or another,
  it *is* the change of layout, so no signature is chosen for it; its output has the layout
  its attrs name, whatever its input's;
* ``backward``: the gradient boxed back to the input's placement with the *dual* SBP (B <-> P, a
  split stays): a B tensor made from a P one gets a B gradient, ...; of a local input, this rank's
  piece of that (the local tensors that became a B tensor: parallel_id 0's gets the gradient,
  the others zeros).  Eager autograd (``pyflow/autograd/views.py``) and nn.Graph's autograd pass
  (``pyflow/compiler/passes/autograd.py``) both call this rule;
* no kernel.  An op that ``interpreter.apply`` runs is a kernel on each rank's piece, on one
  placement; ``to_global`` moves data between ranks and may start from a local tensor, so it is not
  run by ``apply``: eagerly, ``Tensor.to_global`` calls ``pyflow.distributed``'s runner, the boxing
  chain (``distributed/global_tensor.py``: ``to_global`` reads this op's ``infer``, then boxes); in
  nn.Graph it is a ``to_global`` JobOp whose edge the compiler lowers to boxing tasks
  (``compiler/boxing/``).  ``apply("to_global", ...)`` is an error that says so.

>>> import pyflow as flow
>>> from pyflow.framework.op_registry import TensorMeta, get_op
>>> (meta,) = get_op("to_global").infer([TensorMeta((4, 2), flow.float32)],
...                                     {"placement": flow.placement("cpu", [0]), "sbp": flow.sbp.split(0)})
>>> meta.shape, meta.sbp
((4, 2), (sbp.split(dim=0),))
>>> dual_sbp((flow.sbp.broadcast, flow.sbp.partial_sum, flow.sbp.split(1)))
(sbp.partial_sum, sbp.broadcast, sbp.split(dim=1))
"""

from __future__ import annotations

import dataclasses

from pyflow.errors import ArgumentTypeError
from pyflow.framework.op_registry import SETS_LAYOUT, OpDef, TensorMeta, register_op
from pyflow.framework.sbp import SbpParallel, checked_layout

__all__ = ["GlobalMeta", "dual_sbp"]


@dataclasses.dataclass(frozen=True)
class GlobalMeta(TensorMeta):
    """What ``to_global``'s inference says of its output: the logical shape and dtype, and the layout."""

    placement: object
    sbp: tuple


def dual_sbp(sbp) -> tuple:
    """The SBP of a gradient of a tensor laid out as ``sbp``: B <-> P, a split stays (OneFlow's rule)."""
    return tuple(SbpParallel("partial_sum") if s.is_broadcast else SbpParallel("broadcast") if s.is_partial else s
                 for s in sbp)


def _infer(inputs, attrs):
    (x,) = inputs
    nd = checked_layout(tuple(x.shape), attrs["placement"], attrs["sbp"], "to_global")
    return [GlobalMeta(tuple(x.shape), x.dtype, attrs["placement"], nd)]


def _backward(ctx, g):
    """``g`` boxed back to the input's layout, dual SBP; a local input gets its piece of that."""
    layout = ctx.input_layouts[0]
    if layout is not None:   # global -> global
        return [g.to_global(layout[0], dual_sbp(layout[1]))]
    placement, sbp = ctx.attrs["placement"], ctx.attrs["sbp"]   # local -> global: each rank's share
    return [g.to_global(placement, dual_sbp(sbp)).to_local()]


def _no_device_of_its_own(inputs, attrs):
    """Where ``apply`` would run the op (its first step): nowhere, so it is refused before anything is issued."""
    raise ArgumentTypeError("op 'to_global' is not run by interpreter.apply (no kernel: it moves data between "
                            "ranks); call x.to_global(placement, sbp), which boxes the tensor")


register_op(OpDef("to_global", _infer, kernel="", infer_device_and_stream=_no_device_of_its_own,
                  sbp_signatures=SETS_LAYOUT, backward=_backward,
                  doc="x laid out on attrs['placement'] with attrs['sbp'] (boxed; a local x: each rank's piece)"))
