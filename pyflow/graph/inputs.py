"""A compiled graph's inputs at each call: laid out as traced, and the same verdict on every rank.

The runtime checks a local input's shape, dtype and device against its input regst.  A global
input's pieces are cut per rank by the Plan, so another logical shape, dtype, placement or SBP (or
a local tensor where a global one was traced, or the reverse) would run and fail deep inside an
actor, or run wrong.  OneFlow's graph checks each input against the meta it was compiled with, at
the call (``check_meta_consistency``); so does ``check_inputs``, against the layouts recorded at the
trace (``layout``).

A global graph runs on several ranks, and each checks its own inputs.  Were one rank to refuse a
call alone, the others would start it and wait in their collectives for the refuser until the
collective timeout.  So the ranks of a global graph's inputs first exchange their verdicts (one
small collective per call, ``ccl.exchange``) and all refuse together, naming the rank and input
that differ.  ``PYFLOW_CHECK_GLOBAL_CALLS=0`` skips the exchange (each rank still checks its own).
"""

from __future__ import annotations

import os

from pyflow import env
from pyflow.distributed.ccl import describe_call, exchange
from pyflow.errors import GraphError
from pyflow.framework.tensor import Tensor

__all__ = ["input_layout", "check_inputs"]


def input_layout(x: Tensor) -> tuple:
    """What a graph input must keep from call to call: local or global, then for a global one its
    dtype, logical shape, placement and SBP (a local one's shape, dtype and device the runtime checks)."""
    if not x.is_global:
        return ("local",)
    return ("global", x.dtype, tuple(x.shape), x.placement, tuple(x.sbp))


def _describe(layout_: tuple) -> str:
    _, dtype, shape, placement, sbp = layout_
    return f"dtype {dtype}, logical shape {list(shape)}, {placement}, sbp {sbp}"


def _problem(graph: str, args, traced: list) -> str | None:
    """This rank's reason to refuse the call, or None."""
    for i, (x, was) in enumerate(zip(args, traced)):
        given = input_layout(x)
        if given[0] != was[0]:
            return (f"nn.Graph {graph}: input {i} is a {given[0]} tensor, but the graph was traced with a {was[0]} "
                    "one; a compiled graph takes inputs like those it was traced with (to_global / to_local it, "
                    "or build a new graph)")
        if given[0] == "global" and given != was:
            return (f"nn.Graph {graph}: input {i} is a global tensor of {_describe(given)}, but the graph was traced "
                    f"with {_describe(was)}; a compiled graph takes inputs like those it was traced with (to_global "
                    "it, or build a new graph)")
    return None


def check_inputs(graph: str, args, traced: list) -> None:
    """Raise ``GraphError`` naming the input if a call's input is not laid out as the traced one, on every
    rank of the graph's global inputs if any rank's is not."""
    problem = _problem(graph, args, traced)
    ranks = sorted({r for was in traced if was[0] == "global" for r in was[3].flat_ranks})
    me = env.get_rank()
    if len(ranks) > 1 and me in ranks and os.environ.get("PYFLOW_CHECK_GLOBAL_CALLS", "1") != "0":
        verdicts = exchange(tuple(ranks), describe_call(f"nn.Graph {graph}: its call's input check", (), ""), problem)
        if problem is None:
            problem = next((f"{text} (on rank {rank}; every rank of the graph refuses the call)"
                            for rank, text in zip(ranks, verdicts) if text is not None), None)
    if problem is not None:
        raise GraphError(problem)
