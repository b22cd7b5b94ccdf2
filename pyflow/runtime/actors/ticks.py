"""Seed 003: the source and sink tick actors: where a call of the graph starts and where it ends.

The compiler's ``ticks`` pass gives every Plan one ``source_tick`` (every op that reads
no blob waits for it) and one ``sink_tick`` (it waits for every op whose results
nobody reads).  At run time:

* the **source tick** acts once per launched call (OneFlow sends ``kStart`` to the
  source actors; pyflow sends one ``launch`` command per call).  Its act stamps a new
  piece ``(call, 0)`` on its control regst, and the call flows from there.  It admits
  at most ``max_calls_in_flight`` calls at once (the graph's output buffer size): a
  call starts only when the call that many places before it has reached the sink.
  On ``close`` it stops taking calls; once its calls have finished, its eord starts
  the runtime's wind-down;
* the **sink tick** acts once per call, after every op of the call has acted: it
  completes the caller's handle and tells the source (``call_done``).
"""

from __future__ import annotations

import heapq

from pyflow.runtime.actors.base import Actor
from pyflow.runtime.msg import cmd_msg

__all__ = ["SourceTickActor", "SinkTickActor"]


class SourceTickActor(Actor):
    """Acts once per ``launch`` command, in call order, with a bounded number of calls in flight."""

    kind = "source_tick"

    def __init__(self, runtime, task, thread):
        super().__init__(runtime, task, thread)
        self.launches: list[int] = []    # call indexes launched and not started yet (a heap)
        self.calls_done = 0
        self.close_after = None          # after ``close``: how many calls to run in all

    def on_cmd(self, msg) -> None:
        if msg.cmd == "launch":
            heapq.heappush(self.launches, msg.arg)
        elif msg.cmd == "call_done":
            self.calls_done += 1
        elif msg.cmd == "close":
            self.close_after = msg.arg
            self.ended = True   # no eord comes to a source: close is its end
        else:
            super().on_cmd(msg)

    def is_read_ready(self) -> bool:
        """A launched call is next in order, and fewer than the bound are in flight."""
        return (bool(self.launches) and self.launches[0] == self.acts
                and self.acts < self.calls_done + self.runtime.max_calls_in_flight)

    def act_once(self) -> None:
        heapq.heappop(self.launches)
        super().act_once()

    def input_finished(self) -> bool:
        """Closed, and every call it started has reached the sink (no ``call_done`` is on its way)."""
        return self.close_after is not None and self.acts >= self.close_after and self.calls_done >= self.acts

    def why_waiting(self) -> list[str]:
        if not self.launches:
            return super().why_waiting()
        if self.launches[0] != self.acts:
            return [f"waits for the launch of call {self.acts} (has {sorted(self.launches)})"]
        if self.acts >= self.calls_done + self.runtime.max_calls_in_flight:
            return [f"call {self.acts} waits: {self.runtime.max_calls_in_flight} call(s) in flight, none finished "
                    f"(calls done: {self.calls_done})"]
        return super().why_waiting() or [f"call {self.acts} is launched but the source tick cannot act"]


class SinkTickActor(Actor):
    """Its act for call n means every op of call n has acted: the call is complete."""

    kind = "sink_tick"

    def after_act(self, n: int, j: int, start: float, end: float) -> None:
        super().after_act(n, j, start, end)
        self.runtime.complete_call(n)
        self.runtime.bus.send(cmd_msg(self.runtime.source_id, "call_done", n), self.thread)
