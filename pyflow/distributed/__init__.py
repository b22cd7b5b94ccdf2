"""Ranks, the transport between them, global tensors and their boxing (seeds 000 §3, 003 CommNet, 004).

* ``run``            - ``flow.distributed.run(fn, world_size)``: N ranks as threads of one process
* ``transport``      - the ``Transport`` interface and ``CollectiveDesc`` (checked across ranks)
* ``inprocess``      - ``InProcessWorld`` / ``InProcessTransport``: rounds, mailboxes, the watchdog
* ``ccl``            - collectives as VM instructions on the ccl stream
* ``global_tensor``  - local <-> global, ``numpy()`` of a global tensor, ``flow.tensor(.., placement, sbp)``
* ``boxing``         - the chain of boxing builders and their plans
* ``signatures``     - each op's SBP signatures and the cost model
* ``global_ops``     - the global interpreter (an op on global tensors)
* ``global_methods`` - views, indexing and ``.to()`` of global tensors

A rank behaves as a process (``pyflow/env.py``); ranks meet only through a transport.
Importing this package installs the global interpreter into the framework.
"""

from pyflow.distributed.inprocess import InProcessTransport, InProcessWorld
from pyflow.distributed.run import run
from pyflow.distributed.transport import CollectiveDesc, Transport

from pyflow.distributed import boxing, global_methods  # noqa: E402, I001
from pyflow.distributed.global_ops import GlobalInterpreter  # noqa: E402
from pyflow.framework.interpreter import install_global_interpreter  # noqa: E402

install_global_interpreter(GlobalInterpreter())
global_methods.install()

__all__ = ["run", "Transport", "CollectiveDesc", "InProcessTransport", "InProcessWorld", "boxing",
           "GlobalInterpreter"]
