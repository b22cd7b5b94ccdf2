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

The node kinds' reference semantics (numpy) are ``pyflow.compiler.boxing.evaluate``;
the tests check these acts against it and against eager boxing.
"""

from __future__ import annotations

import numpy as np

from pyflow import env
from pyflow.distributed.ccl import collective, describe_call
from pyflow.framework.creation import tensor
from pyflow.framework.interpreter import apply

__all__ = ["run_boxing_task"]


def _region(x, region):
    for d, (start, stop) in enumerate(region):
        x = x.narrow(d, start, stop - start)
    return x


def run_boxing_task(kind: str, args: list, out, attrs: dict):
    """One act of a boxing task: writes ``out`` (this rank's planned memory for the node's piece)."""
    if kind == "slice":
        apply("contiguous", [_region(args[0], attrs["region"])], out=[out])
    elif kind == "concat":
        apply("cat", list(args), out=[out], axis=attrs["axis"])
    elif kind == "add":
        apply("contiguous", [args[0]], out=[out])
        for x in args[1:]:
            apply("add", [out, x], out=[out])
    elif kind == "assemble":
        out.zero_()
        for x, region in zip(args, attrs["regions"]):
            part = _region(out, region)
            apply("add", [part, x], out=[part])
    elif kind == "zeros":
        out.zero_()
    elif kind == "copy":
        out.copy_(args[0])
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
    nothing = np.zeros(0, dtype=np.dtype(dtype))
    if op == "all_reduce":
        call = lambda a: transport.all_reduce(a, group, seq, desc)  # noqa: E731
    elif op == "reduce_scatter":
        call = lambda a: transport.reduce_scatter(a, group, seq, desc, attrs["bounds"], axis=attrs["axis"])  # noqa
    elif op == "all_gather":
        call = lambda a: transport.all_gather(a, group, seq, desc, axis=attrs["axis"])  # noqa: E731
    elif op == "all_to_all":
        cut = (slice(None),) * attrs["split_axis"]

        def call(a):
            parts = [np.ascontiguousarray(a[cut + (slice(lo, hi),)]) for lo, hi in attrs["bounds"]]
            return np.concatenate(transport.all_to_all(parts, group, seq, desc), axis=attrs["concat_axis"])
    elif op == "reduce":
        def call(a):
            total = transport.reduce(a, attrs["root"], group, seq, desc)
            return nothing if total is None else total
    elif op == "broadcast":
        def call(*a):
            return transport.broadcast(a[0] if a else None, attrs["root"], group, seq, desc)
    else:
        raise ValueError(f"unknown collective {op!r}")
    return collective(call, list(args), shape, dtype, desc, group, seq)
