"""Seed 003: OneFlow's actor runtime: a compiled Plan run by actors that only exchange messages.

The compiler (``pyflow/compiler``) turns a Job into a Plan: tasks, regst descs, thread
ids.  ``Runtime(plan)`` turns each task into an **actor** on the **thread** of its
stream (with ``fold=True``, nn.Graph's, a view task acts inside its readers' acts: ``fold.py``); actors hand each other **regsts** (memory + a piece id) by **messages**, and
a call of the graph is nothing but pieces flowing from the source tick to the sink
tick.  No scheduler decides anything: an actor acts when its inputs are there and it
has a free output (``is_read_ready`` and ``is_write_ready``); the regst num of each
output bounds how far ahead it may run (back pressure).

Map of the package (read in this order):

* ``msg``         - ActorMsg: regst / eord / cmd
* ``regst``       - Regst (one copy of a regst desc: tensor, piece id, reading count), RegstMgr
                    (every regst where the Plan's memory plan put it, bytes shared)
* ``act``         - what a task does when its actor acts (OneFlow's kernel call on the regsts' blobs)
* ``view_acts``   - the act of a view task: a layout over its input's memory, no VM instruction
* ``fold``        - the Runtime's own Plan: view tasks folded into the acts of the tasks that read them
* ``device_ctx``  - when an act's device work is done: the callback that sends its messages
* ``actors/``     - the Actor state machine (``base``), the tick actors, Repeat/Unpack/Acc/Pack,
                    the actors of send / recv / collective tasks, InputWise (a boxing concat / add
                    acting on each piece as it arrives), the output actor (hands values over)
* ``msg_bus``     - ActorMsgBus: a message to the thread that owns its actor
* ``thread``      - Thread (channel + local queue + poll loop), ThreadMgr, deterministic mode
* ``comm_net``    - talking to other ranks: the order send / recv / collective tasks act in
* ``call``        - one call: its CallContext, its inputs checked, its CallHandle, its frontier (what
                    must be issued before ``nn.Graph`` may return while the call still runs)
* ``watchdog``    - the hang watchdog and the hang report
* ``runtime``     - Runtime(plan): construct, launch calls, deterministic stepping, close
* ``deterministic`` - deterministic mode: the caller's thread delivers the messages (``step``, ``run_until``)
* ``live``        - the Runtimes alive in this process: ``flow.sync()`` waits for them, exit closes them
* ``timeline``    - one record per act: Chrome trace, PNG, and the acts inside ``flow.trace()``
* ``pipeline``    - seed 003's four-stage pipeline as a hand-made Plan (benchmarks, tutorial 8)
* ``sequential``  - ``run_plan``: the sequential reference interpreter of a Plan (no actors)

``nn.Graph`` runs its Plan here (``pyflow/graph/graph.py``); what each task *does* is
``act`` (``act.py``), shared with the sequential interpreter, so the two always agree.
The runtime only reads the Plan: each rank's calls are closed by its ticks in the compiler
(``pyflow/compiler/rank_ticks.py``), and a Runtime runs its rank's tasks of it.

>>> import pyflow as flow
>>> from pyflow import nn
>>> class Double(nn.Graph):
...     def build(self, x):
...         return x * 2.0
>>> g = Double()
>>> g(flow.tensor([1.0, 2.0])).numpy()
array([2., 4.], dtype=float32)
>>> with Runtime(g.plan, g.job, deterministic=True, seed=7) as rt:
...     rt.launch([flow.tensor([3.0, 4.0])]).result()[0].numpy()
array([6., 8.], dtype=float32)
"""

from pyflow.runtime.actors import Actor, make_actor
from pyflow.runtime.msg import ActorMsg
from pyflow.runtime.msg_bus import ActorMsgBus
from pyflow.runtime.regst import Regst, RegstMgr
from pyflow.runtime.runtime import CallHandle, Runtime
from pyflow.runtime.thread import DeterministicThread, Thread, ThreadMgr
from pyflow.runtime.timeline import ActRecord

__all__ = ["Runtime", "CallHandle", "Actor", "make_actor", "ActorMsg", "ActorMsgBus", "Regst", "RegstMgr",
           "Thread", "ThreadMgr", "DeterministicThread", "ActRecord"]
