"""What a boxing task does when it acts: the node kinds of ``pyflow/compiler/boxing/`` on real pieces.

The TaskGraph turns every node of an edge's boxing sub-graph into a task on the
node's rank (``kind == "boxing"``, ``op_type`` = the node kind); a ``comm_net`` node
becomes two, a ``send`` on the sender's rank and a ``recv`` on the receiver's, so
that each rank's tasks only read and write that rank's memory.  Each act runs
one of these on this rank's pieces, with eager ops (so on any device, in the
VM's order) and the rank's transport for what crosses ranks:

============  =================================================================================
slice         ``out`` = the part ``region`` (per dim ``(start, stop)``) of the input piece
concat        the inputs concatenated along ``axis``
add           the elementwise sum of the inputs
assemble      zeros, then input k added into ``regions[k]`` of ``out`` (P parts sum where they meet)
zeros         zeros (a P piece that holds nothing)
copy          the input on this task's device (h2d / d2h)
send / recv   ``transport.send`` of the piece to ``dst_rank`` / ``transport.recv`` from ``src_rank``,
              with the node's ``tag`` (the same on both ranks: both compiled the same job)
collective    one transport collective (``op``: all_reduce, reduce_scatter, all_gather, all_to_all,
              reduce, broadcast) issued on the rank's ccl stream, as eager boxing issues them
============  =================================================================================

The on-rank kinds and what each collective op computes are eager boxing's own
(``write_piece``, ``collective_call`` in ``pyflow/distributed/boxing_steps.py``):
a node kind is written once for both paths; only send / recv (the compiled
comm_net's two tasks, matched by tag) are the Plan's.  The node kinds' reference
semantics (numpy) are ``pyflow.compiler.boxing.evaluate``; the tests check these
acts against it and against eager boxing.
"""

from __future__ import annotations

import numpy as np

from pyflow import env
from pyflow.distributed.boxing_steps import LOCAL_KINDS, collective_call, write_piece
from pyflow.distributed.ccl import collective, describe_call
from pyflow.framework.creation import tensor

__all__ = ["run_boxing_task"]


def run_boxing_task(kind: str, args: list, out, attrs: dict):
    """One act of a boxing task: writes ``out`` (this rank's planned memory for the node's piece)."""
    if kind in LOCAL_KINDS:
        write_piece(kind, args, out, attrs)
    elif kind == "send":
        env.current().transport.send(np.ascontiguousarray(args[0].numpy()), attrs["dst_rank"], attrs["tag"])
        return None
    elif kind == "recv":
        arrived = env.current().transport.recv(attrs["src_rank"], attrs["tag"])
        out.copy_(tensor(arrived, dtype=out.dtype))
    elif kind == "collective":
        result = _collective(args, out, attrs)
        if out is not None:
            out.copy_(result)
    else:
        raise ValueError(f"unknown boxing task kind {kind!r}")
    return out


def _collective(args: list, out, attrs: dict):
    """Issue the node's collective (its sequence number taken now, in plan order on every rank)."""
    transport = env.current().transport
    group, op = tuple(attrs["group"]), attrs["op"]
    seq = transport.next_seq(group)
    dtype = out.dtype if out is not None else args[0].dtype
    desc = describe_call(f"nn.Graph boxing {op}", tuple(attrs["logical_shape"]), dtype,
                         f"collective {attrs['collective_id']} in group {list(group)}")
    shape = (0,) if out is None else tuple(out.shape)
    call = collective_call(op, attrs, transport, group, seq, desc, dtype)
    return collective(call, list(args), shape, dtype, desc, group, seq)
