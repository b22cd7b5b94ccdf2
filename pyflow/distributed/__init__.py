"""Ranks, the transport between them, global tensors and their boxing (seeds 000 §3, 003 CommNet, 004).

* ``run``            - ``flow.distributed.run(fn, world_size)``: N ranks as threads of one process
* ``transport``      - the ``Transport`` interface and ``CollectiveDesc`` (checked across ranks)
* ``inprocess``      - ``InProcessWorld`` / ``InProcessTransport``: rounds, mailboxes, the watchdog
* ``mpi_transport``  - ``MPITransport``: ranks as MPI processes; collectives as rounds of messages
* ``mpi_protocols``  - those rounds: the generators the comm-net thread drives, the descriptor check in round 1
* ``host_pool``      - ``HostPool``: the caching pool of host arrays the MPI transport receives into
* ``mpi_commnet``    - ``CommNet``: the thread that alone calls MPI, the control channel
* ``mpi_watchdog``   - ``CollectiveWatchdog``: divergent code, ranks that ended or died, the collective timeout
* ``mpi``            - how a process becomes its MPI rank (joined at import under ``mpiexec``), faults, exit
* ``launch``         - ``python -m pyflow.distributed.launch --nproc_per_node N script.py``: runs it under mpiexec
* ``ccl``            - collectives as VM instructions on the ccl stream
* ``global_tensor``  - local <-> global, ``numpy()`` of a global tensor, ``flow.tensor(.., placement, sbp)``
* ``boxing``         - the chain of boxing builders and their plans
* ``signatures``     - the cost model: the cheapest of an op's SBP signatures (declared by each op, ``pyflow/ops/``)
* ``global_ops``     - the global interpreter (an op on global tensors)
* ``global_methods`` - the Tensor methods on global tensors that the interpreter does not run: ``to_global`` (an op,
                     ``pyflow/ops/to_global.py``, run by the boxing chain), indexing, ``.to()``

A rank behaves as a process (``pyflow/env.py``); ranks meet only through a transport.
Importing this package installs the global interpreter and ``global_methods`` into the framework
(``interpreter.py``, ``tensor_methods.py``), and, in a
process that ``mpiexec`` started, makes the process its MPI rank (``mpi.init_if_launched``).
"""

from pyflow.distributed.inprocess import InProcessTransport, InProcessWorld
from pyflow.distributed.mpi import init_mpi
from pyflow.distributed.run import run
from pyflow.distributed.transport import CollectiveDesc, SoloTransport, Transport

from pyflow.distributed import boxing, global_methods, mpi  # noqa: E402, I001
from pyflow.distributed.global_ops import GlobalInterpreter  # noqa: E402
from pyflow.framework.interpreter import install_global_interpreter  # noqa: E402
from pyflow.framework.tensor_methods import install_global_methods  # noqa: E402
from pyflow import env as _env  # noqa: E402

install_global_interpreter(GlobalInterpreter())
install_global_methods(global_methods)
mpi.init_if_launched()   # under mpiexec: this process becomes its MPI rank
if _env.process_context().transport is None and _env.process_context().world_size == 1:
    _env.process_context().transport = SoloTransport()   # a plain script: a world of one, as in OneFlow

__all__ = ["run", "init_mpi", "Transport", "SoloTransport", "CollectiveDesc", "InProcessTransport", "InProcessWorld", "boxing",
           "GlobalInterpreter"]
