"""Seed 003: actors, one per task of the Plan, and the kind of actor each task gets.

* ``base``      - the Actor: consumed/produced slots, ``process_msg``, ``act_until_fail``,
                  ``is_read_ready`` / ``is_write_ready``, reading counts, HandlerNormal /
                  HandlerZombie, eord; it is also the *normal* actor (compute, copy,
                  variable, input, output, view, boxing...: anything that acts once per piece)
* ``slots``     - ``InSlot`` / ``OutSlot``: an actor's consumed and produced regst descs
* ``ticks``     - the source tick (starts calls) and the sink tick (ends them)
* ``grad_acc``  - Repeat, Unpack (one piece -> k acts), Acc, Pack (k acts -> one piece)
* ``comm``      - send / recv / collective tasks: they act on their turn (``comm_net.py``)
* ``input_wise`` - InputWise: a boxing concat / add that acts on each input as it arrives
* ``output``    - the output actor: hands each call's value to the call's handle once written

``make_actor(runtime, task, thread)`` picks the class by the task's kind; any other task
(compute, copy, variable, input, the boxing tasks that stay on one rank, a
kind the compiler adds later) is a normal actor: what it *does* is ``act``'s business,
not the actor's.
"""

from __future__ import annotations

from pyflow.compiler.mem_guards import is_input_wise
from pyflow.runtime.actors.base import Actor, pieces_per_call
from pyflow.runtime.actors.comm import CommActor
from pyflow.runtime.actors.grad_acc import AccActor, PackActor, RepeatActor, UnpackActor
from pyflow.runtime.actors.input_wise import InputWiseActor
from pyflow.runtime.actors.output import OutputActor
from pyflow.runtime.actors.slots import InSlot, OutSlot
from pyflow.runtime.actors.ticks import SinkTickActor, SourceTickActor
from pyflow.runtime.comm_net import is_comm

__all__ = ["Actor", "InSlot", "OutSlot", "SourceTickActor", "SinkTickActor", "RepeatActor", "UnpackActor",
           "AccActor", "PackActor", "CommActor", "InputWiseActor", "OutputActor", "make_actor", "actor_class",
           "pieces_per_call"]

_BY_KIND = {"repeat": RepeatActor, "unpack": UnpackActor, "acc": AccActor, "pack": PackActor, "output": OutputActor}
_BY_OP = {"source_tick": SourceTickActor, "sink_tick": SinkTickActor}


def actor_class(task) -> type:
    """The actor class of ``task``: by op type for the ticks, by task kind for grad-acc, else normal."""
    if is_comm(task):
        return CommActor
    if is_input_wise(task):
        return InputWiseActor
    return _BY_OP.get(task.op_type) or _BY_KIND.get(task.kind, Actor)


def make_actor(runtime, task, thread) -> Actor:
    return actor_class(task)(runtime, task, thread)
