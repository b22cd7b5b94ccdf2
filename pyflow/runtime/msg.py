"""Seed 003: ``ActorMsg``, the only thing actors ever send each other.

OneFlow's runtime has no central scheduler: actors react to messages.  A message
has a kind (``ActorMsgType``) and a destination actor:

=========  ==========================================================================
``regst``  carries a Regst.  A producer sends a filled regst to each consumer; a
           consumer that is done reading sends the same regst back to its producer
           (the "return"; the producer knows it from ``regst.producer``).
``eord``   "end of regst desc": the producer of ``desc_id`` will send nothing more.
           When all of an actor's inputs saw eord it winds down (see ``actors/base.py``).
``cmd``    a command without data: ``construct`` (the thread builds the actor),
           ``launch`` (the source tick starts a call), ``call_done`` (the sink tells the
           source a call finished), ``close`` (the source stops taking calls), ``turn``
           (a send / recv / collective actor's turn came, ``comm_net.py``), ``stop`` (the
           thread leaves its poll loop at once: teardown after a failure).
=========  ==========================================================================

``piece`` is the piece id a regst message is about: ``(call index, micro-batch j)``.
Every regst carries the piece it holds, so an actor always knows which call of the
graph (and which micro-batch of it) it is working on.
"""

from __future__ import annotations

import dataclasses

__all__ = ["ActorMsg", "REGST", "EORD", "CMD", "regst_msg", "eord_msg", "cmd_msg"]

REGST, EORD, CMD = "regst", "eord", "cmd"


@dataclasses.dataclass(eq=False, slots=True)
class ActorMsg:
    """One message: ``kind`` (regst / eord / cmd), from actor ``src`` to actor ``dst``."""

    kind: str
    src: int | None            # the sending actor's id (None: the runtime itself)
    dst: int                   # the receiving actor's id
    regst: object = None       # the Regst (kind "regst")
    piece: tuple | None = None  # (call, j) of that regst when the message was sent
    desc_id: int | None = None  # the regst desc that ended (kind "eord")
    cmd: str | None = None     # the command (kind "cmd")
    arg: object = None         # its argument (a task for "construct", a call index for "launch"...)

    def __repr__(self) -> str:
        if self.kind == REGST:
            what = f"regst {self.regst.desc.lbn}#{self.regst.index} piece {self.piece}"
        elif self.kind == EORD:
            what = f"eord of regst desc {self.desc_id}"
        else:
            what = f"cmd {self.cmd}" + (f"({self.arg})" if self.cmd in ("launch", "call_done") else "")
        return f"<ActorMsg {what}: {self.src} -> {self.dst}>"


def regst_msg(src: int, dst: int, regst) -> ActorMsg:
    return ActorMsg(REGST, src, dst, regst=regst, piece=regst.piece)


def eord_msg(src: int, dst: int, desc_id: int) -> ActorMsg:
    return ActorMsg(EORD, src, dst, desc_id=desc_id)


def cmd_msg(dst: int, cmd: str, arg=None) -> ActorMsg:
    return ActorMsg(CMD, None, dst, cmd=cmd, arg=arg)
