"""Boxing in nn.Graph's Plan (seed 004; OneFlow's ``oneflow/core/graph/boxing/``): the chain's graph, made tasks.

The plan of a boxing edge is the one boxing chain's
(``pyflow/distributed/boxing_chain/``: the builders, the node kinds, the P
layouts), the same plan eager boxing runs rank by rank.  The compiler's part
is the translation: ``build_boxing(src, dst, shape, dtype)`` asks the chain
for an edge's graph with the blob's dtype on its nodes (the regsts' dtype);
the TaskGraph makes each node a ``boxing`` task on its rank, a ``comm_net`` a
``send`` and a ``recv`` task (``pyflow/compiler/task_graph.py``); what each
task does when it acts is ``pyflow/compiler/boxing_tasks.py``.
``evaluate(g, src_pieces)`` is a numpy interpreter of the node kinds that also
checks where every node runs: the reference the tests hold both paths to.

>>> import numpy as np
>>> from pyflow import env
>>> from pyflow.framework.placement import placement
>>> from pyflow.framework.sbp import sbp
>>> from pyflow.distributed.boxing_steps import Layout
>>> with env.bound(env.RankContext(rank=0, world_size=4)):
...     g = build_boxing(Layout(placement("cuda", [0, 1]), (sbp.split(0),)),
...                      Layout(placement("cpu", [2]), (sbp.broadcast,)), (3, 2), np.float32)
>>> g.builder, [n.kind for n in g.nodes]
('slice_boxing(S2B)', ['copy', 'comm_net', 'copy', 'comm_net', 'concat'])
>>> evaluate(g, [np.ones((2, 2), np.float32), np.zeros((1, 2), np.float32)])[0]
array([[1., 1.],
       [1., 1.],
       [0., 0.]], dtype=float32)
"""

from __future__ import annotations

from pyflow.compiler.boxing.reference import evaluate
from pyflow.distributed.boxing_chain import build_boxing

__all__ = ["build_boxing", "evaluate"]
