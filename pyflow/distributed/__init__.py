"""Ranks, the transport between them, and global tensors' boxing (seeds 000 §3, 003 CommNet, 004).

* ``run``        - ``flow.distributed.run(fn, world_size)``: N ranks as threads of one process
* ``transport``  - the ``Transport`` interface and ``CollectiveDesc`` (checked across ranks)
* ``inprocess``  - ``InProcessWorld`` / ``InProcessTransport``: rounds, mailboxes, the watchdog

A rank behaves as a process (``pyflow/env.py``); ranks meet only through a transport.
"""

from pyflow.distributed.inprocess import InProcessTransport, InProcessWorld
from pyflow.distributed.run import run
from pyflow.distributed.transport import CollectiveDesc, Transport

__all__ = ["run", "Transport", "CollectiveDesc", "InProcessTransport", "InProcessWorld"]
