"""The boxing chain (seed 004): OneFlow's SubTskGphBuilder chain (``oneflow/core/graph/boxing/``), the one plan.

When a tensor changes placement or SBP (a logical edge of an nn.Graph job, or
an eager ``to_global``), ``build_boxing(src, dst, shape)`` offers the edge to
a chain of builders; the first that accepts it emits a small graph of boxing
nodes between the producer's pieces and the consumer's, P layouts as OneFlow's
eager boxing keeps them (SEMANTICS §4a).  Boxing is written once: this graph
is the plan both paths run.  nn.Graph's TaskGraph makes each node a task on
its rank (``pyflow/compiler/task_graph.py``; what a task does:
``pyflow/compiler/boxing_tasks.py``); eager boxing runs, on each rank, the
nodes of that rank (``pyflow/distributed/boxing.py``, the node kinds on a
rank: ``pyflow/distributed/boxing_steps.py``).

=============  =====================================================  ==================
builder        accepts (first taker wins, in this order)              module
=============  =====================================================  ==================
one_to_one     one piece each side, or the same SBP, hierarchy and    ``one_to_one``
               number of pieces (P: pieces stay where OneFlow's
               eager layout keeps them)
b21            one consumer piece; producer one piece or all B        ``one_to_one``
collective_    same 1-D placement: P->B all_reduce, P->S reduce_      ``collective``
boxing(op)     scatter, S->B all_gather, S(i)->S(j) all_to_all;
               P -> one of its devices reduce; one device -> B
               around it broadcast
slice_boxing   1-D, no empty split piece: S2B, S2S, P2S, P2B, B2S,    ``slice_boxing``
(mode)         S2P (slice / concat / add / zeros / moves)
dim_reduce     2-D all-B (or producer all-P) flattened to 1-D         ``hierarchical``
intra_group    2-D, axis 0 kept: 1-D chain per row                    ``hierarchical``
inter_group    2-D, axis 1 kept: 1-D chain per column                 ``hierarchical``
naive_b2b      whole value -> all B: nearest piece per consumer       ``naive``
naive_b2p      whole value -> 1-D P: first consumer keeps it, zeros   ``naive``
naive          everything else: ``routes``, every pair                 ``naive``
=============  =====================================================  ==================

Node kinds (``BoxingNode.kind``; ``rank``/``device`` is where it runs, which is
where its inputs live, except ``copy`` and ``comm_net``):

* ``slice``: one input; ``attrs["region"]`` = ``((start, stop), ...)`` per dim,
  relative to the input piece; output that part.
* ``concat``: inputs concatenated along ``attrs["axis"]``, in input order.
* ``add``: elementwise sum of the inputs (all of the node's shape).
* ``assemble``: zeros of ``shape``, then each input ``k`` *added* into
  ``attrs["regions"][k]`` (regions relative to the output; overlapping inputs
  sum, as P parts must).
* ``zeros``: no input; zeros of ``shape`` (a P piece that holds nothing).
* ``copy``: same rank, the other device type; ``attrs["direction"]`` "h2d"
  (input on cpu, node on cuda) or "d2h".
* ``comm_net``: input on rank ``attrs["src_rank"]``'s host, output on
  ``rank``'s host (node.rank is the receiver).  Cuda pieces cross ranks as
  d2h, comm_net, h2d (OneFlow's GetProxyNode).
* ``collective``: one node per rank of ``attrs["group"]``, all with the same
  ``attrs["collective_id"]`` (one call); input = that rank's piece; output =
  that rank's result.  ``attrs["op"]``, as ``pyflow.distributed.transport``'s
  methods compute them:

  - ``all_reduce``: the elementwise sum over the group;
  - ``reduce_scatter``: the sum, sliced along ``axis`` at ``bounds[i]`` on ``group[i]``;
  - ``all_gather``: the inputs concatenated along ``axis`` in group order;
  - ``all_to_all``: member k cuts its input along ``split_axis`` at ``bounds``
    and sends part i to ``group[i]``; output: the parts received from
    ``group[0], group[1], ...`` concatenated along ``concat_axis``;
  - ``reduce``: the sum on ``attrs["root"]``; the other members output nothing
    (``shape`` None);
  - ``broadcast``: the root's input on every member (the others have no input).

``BoxingGraph``: ``builder`` (the accepting builder's name), ``nodes`` (an
execution order: inputs first), ``outputs[dst_parallel_id]``: a Ref,
``("in", src_parallel_id)`` or ``("node", index)``.  No node is dead: each
feeds an output or is a member of a collective that does.  A numpy
interpreter of the kinds, that also checks where every node runs, is the
compiler's ``pyflow.compiler.boxing.evaluate`` (the tests' reference).

>>> import numpy as np
>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> from pyflow.distributed.boxing_steps import Layout
>>> with env.bound(env.RankContext(rank=0, world_size=4)):
...     g = build_boxing(Layout(placement("cuda", [0, 1]), (sbp.split(0),)),
...                      Layout(placement("cpu", [2]), (sbp.broadcast,)), (3, 2), np.float32)
>>> g.builder
'slice_boxing(S2B)'
>>> print(g)
boxing (S(0)) on cuda [0, 1] -> (B) on cpu [2], float32[3, 2]: slice_boxing(S2B)
  n0 = copy(in0; direction=d2h) -> (2, 2) @ rank 0 cpu:0
  n1 = comm_net(n0; src_rank=0) -> (2, 2) @ rank 2 cpu:0
  n2 = copy(in1; direction=d2h) -> (1, 2) @ rank 1 cpu:0
  n3 = comm_net(n2; src_rank=1) -> (1, 2) @ rank 2 cpu:0
  n4 = concat(n1, n3; axis=0) -> (3, 2) @ rank 2 cpu:0
  out0 = n4
"""

from __future__ import annotations

from pyflow.distributed.boxing_chain.graph import BoxingGraph, BoxingNode
from pyflow.distributed.boxing_chain.hierarchical import CHAIN, build_boxing

__all__ = ["build_boxing", "BoxingGraph", "BoxingNode", "CHAIN", "NODE_KINDS"]

NODE_KINDS = ("slice", "concat", "add", "assemble", "zeros", "copy", "comm_net", "collective")
