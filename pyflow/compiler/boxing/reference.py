"""A numpy reference interpreter of a ``BoxingGraph`` (seed 004): the living definition of the node kinds.

``evaluate(g, src_pieces)`` runs the nodes in order on numpy arrays and
returns the consumer's pieces.  On the way it checks what the runtime will
rely on: every node reads pieces that live on its own rank and device (a
``copy`` reads its own rank's other device, a ``comm_net`` reads
``attrs["src_rank"]``), every output has its declared shape and dtype, and
every consumer piece sits on its rank and device with the consumer layout's
piece shape.  A broken graph raises ``CompileError`` naming the node.
"""

from __future__ import annotations

import numpy as np

from pyflow.distributed.boxing_chain.graph import BoxingGraph, device_of, region_of, shape_of_region
from pyflow.errors import CompileError

__all__ = ["evaluate"]


def _fail(g: BoxingGraph, what: str):
    raise CompileError(f"boxing graph {g.src.short()} -> {g.dst.short()} ({g.builder}): {what}")


def _check_inputs(g: BoxingGraph, index: int, node) -> None:
    here = (node.rank, node.device)
    for ref in node.inputs:
        at = g.where(ref)
        if node.kind == "comm_net":
            ok = at[0] == node.attrs["src_rank"] != node.rank and at[1].split(":")[0] == node.device.split(":")[0]
        elif node.kind == "copy":
            want = ("cpu", "cuda") if node.attrs["direction"] == "h2d" else ("cuda", "cpu")
            ok = at[0] == node.rank and (at[1].split(":")[0], node.device.split(":")[0]) == want
        else:
            ok = at == here
        if not ok:
            _fail(g, f"n{index} {node} reads {ref} on rank {at[0]} {at[1]}")


def _slice(region: tuple):
    return tuple(slice(a, b) for a, b in region)


def _collective(node, members: list, inputs: dict) -> dict:
    """Each member node's output (index -> array or None) of one collective, as the transports compute it."""
    op, attrs = node.attrs["op"], node.attrs
    arrays = [inputs[m][0] if inputs[m] else None for m in members]
    group = list(attrs["group"])
    if op in ("all_reduce", "reduce", "reduce_scatter"):
        total = arrays[0].copy()
        for a in arrays[1:]:
            total = total + a
    if op == "all_reduce":
        return {m: total.copy() for m in members}
    if op == "reduce":
        return {m: (total if group[k] == attrs["root"] else None) for k, m in enumerate(members)}
    if op == "reduce_scatter":
        cut = (slice(None),) * attrs["axis"]
        return {m: total[cut + (slice(*attrs["bounds"][k]),)].copy() for k, m in enumerate(members)}
    if op == "all_gather":
        whole = np.concatenate(arrays, axis=attrs["axis"])
        return {m: whole.copy() for m in members}
    if op == "all_to_all":
        cut = (slice(None),) * attrs["split_axis"]
        parts = [[a[cut + (slice(lo, hi),)] for lo, hi in attrs["bounds"]] for a in arrays]
        return {m: np.concatenate([parts[sender][k] for sender in range(len(members))], axis=attrs["concat_axis"])
                for k, m in enumerate(members)}
    if op == "broadcast":
        root = arrays[group.index(attrs["root"])]
        return {m: root.copy() for m in members}
    raise CompileError(f"unknown collective op {op!r}")


def evaluate(g: BoxingGraph, src_pieces) -> list:
    """The consumer's pieces (a list by dst parallel_id) that ``g`` makes of ``src_pieces`` (by src parallel_id)."""
    pieces = dict(enumerate(src_pieces)) if isinstance(src_pieces, (list, tuple)) else dict(src_pieces)
    values: dict = {}
    for i in range(g.src.placement.parallel_num):
        want = shape_of_region(region_of(g.src, i, g.shape))
        piece = np.asarray(pieces.get(i))
        if pieces.get(i) is None or piece.shape != want or piece.dtype != g.dtype:
            _fail(g, f"source piece {i} must be a {g.dtype} array of shape {want}, got "
                     f"{None if pieces.get(i) is None else (piece.dtype, piece.shape)}")
        values[("in", i)] = piece
    members: dict = {}
    for index, node in enumerate(g.nodes):
        if node.kind == "collective":
            members.setdefault(node.attrs["collective_id"], []).append(index)
    for index, node in enumerate(g.nodes):
        _check_inputs(g, index, node)
        if ("node", index) in values:
            continue  # computed with its collective
        ins = [values[ref] for ref in node.inputs]
        if node.kind == "collective":
            group = members[node.attrs["collective_id"]]
            outs = _collective(node, group, {m: [values[r] for r in g.nodes[m].inputs] for m in group})
        else:
            outs = {index: _run(g, index, node, ins)}
        for m, out in outs.items():
            _check_output(g, m, g.nodes[m], out)
            values[("node", m)] = out
    results = []
    for j, ref in enumerate(g.outputs):
        rank = g.dst.placement.flat_ranks[j]
        want = (rank, device_of(g.dst, rank)), shape_of_region(region_of(g.dst, j, g.shape))
        if (g.where(ref), g.shape_of(ref)) != want:
            _fail(g, f"output {j} is {ref} on {g.where(ref)} with shape {g.shape_of(ref)}; expected {want}")
        results.append(values[ref])
    return results


def _run(g, index, node, ins):
    kind, attrs = node.kind, node.attrs
    if kind == "slice":
        (a,) = ins
        region = attrs["region"]
        if len(region) != a.ndim or any(not 0 <= lo <= hi <= n for (lo, hi), n in zip(region, a.shape)):
            _fail(g, f"n{index} {node}: region {region} outside its input of shape {a.shape}")
        return a[_slice(region)].copy()
    if kind == "concat":
        return np.concatenate(ins, axis=attrs["axis"])
    if kind == "add":
        total = ins[0].copy()
        for a in ins[1:]:
            if a.shape != total.shape:
                _fail(g, f"n{index} {node}: adds shapes {[x.shape for x in ins]}")
            total = total + a
        return total
    if kind == "assemble":
        out = np.zeros(node.shape, g.dtype)
        for a, region in zip(ins, attrs["regions"], strict=True):
            out[_slice(region)] += a
        return out
    if kind == "zeros":
        return np.zeros(node.shape, g.dtype)
    if kind in ("copy", "comm_net"):
        return ins[0].copy()
    raise CompileError(f"n{index}: unknown boxing node kind {kind!r}")


def _check_output(g, index, node, out) -> None:
    if node.shape is None and out is None:
        return
    if out is None or tuple(out.shape) != node.shape or out.dtype != g.dtype:
        got = None if out is None else (out.dtype, tuple(out.shape))
        _fail(g, f"n{index} {node} made {got}, declared {(g.dtype, node.shape)}")
