"""Deterministic mode's driver: the caller's thread delivers a Runtime's messages, one at a time (seed 003).

``Runtime(plan, deterministic=True, seed=...)`` starts no thread at all: every actor lives on
the ``DeterministicThread`` (``thread.py``), one pool of pending messages, and nothing moves
until the caller's thread delivers them: ``runtime.step()`` one message,
``runtime.run_until(predicate)`` until ``predicate()`` holds (``CallHandle.result()`` drives it
for its own call).  With ``seed`` the next message is picked at random, so tests can try many
interleavings and replay any of them.  No watchdog is needed: an empty pool while a call is
unfinished is reported at once.
"""

from __future__ import annotations

from pyflow.errors import RuntimeHangError

__all__ = ["deliver", "deliver_until", "step_once"]


def step_once(runtime, index: int | None = None, act: bool = True):
    """Deliver one message (the next one, or ``pending()[index]``); returns it (None: the pool is empty)."""
    msg = runtime.home.take(index)
    if msg is not None:
        deliver(runtime, msg, act)
    return msg


def deliver_until(runtime, predicate, max_call: int | None = None, notified: bool = False) -> None:
    """Deliver messages (about calls up to ``max_call``) until ``predicate()``; RuntimeHangError if none is left.

    ``notified``: ``predicate()`` can only turn true where the runtime notifies (``Runtime.run_until``), so it
    is asked after a notification only (``runtime.notifications`` changed), not once per message delivered."""
    home = runtime.home
    take, handle, actors = home.take, home.handle, home.actors
    queue, parked, limit = home._queue, home._parked, float("inf") if max_call is None else max_call
    asked = None   # ``runtime.notifications`` when ``predicate()`` was last asked (false then)
    while runtime.error is None:
        if not notified or asked != runtime.notifications:
            asked = runtime.notifications
            if predicate():
                break
        seen = home.enqueued
        if (queue and queue[0][1] <= limit and home._rng is None and not home._ready
                and (not parked or parked[0][0] > limit)):
            msg = queue.popleft()[2]   # (``take``'s usual case, inlined: the queue's head is next and allowed)
        else:
            msg = take(None, max_call)
        if msg is not None:   # (``deliver(runtime, msg, True)``, inlined: this loop runs once per message)
            try:
                if msg.dst in actors:   # (``home.handle``'s usual case, inlined too)
                    actor = actors[msg.dst]
                    actor.process_msg(msg)
                    if actor.exited:
                        del actors[msg.dst]
                else:
                    handle(msg)   # a construct, or a message to an actor that exited
            except BaseException as error:  # noqa: BLE001 - the runtime stops; result() raises it
                runtime.fail(error)
            continue
        with runtime._lock:
            coming = any(not h.started for h in runtime._calls.values())
        if coming and home.wait_for_message(seen, runtime.hang_timeout):
            continue   # a launch from another thread (the VM's launch instruction) is on its way
        error = RuntimeHangError(runtime.hang_report(0.0, "running calls"))
        runtime.fail(error)
        raise error


def deliver(runtime, msg, act: bool) -> None:
    """Hand ``msg`` to its actor (``act=False``: the actor only takes it in, ``actor.receive``).  An exception
    stops the runtime: ``result()`` raises it."""
    try:
        if act or msg.kind == "cmd" and msg.cmd == "construct":
            runtime.home.handle(msg)
        else:
            runtime.home.actors[msg.dst].receive(msg)
    except BaseException as error:  # noqa: BLE001 - the runtime stops; result() raises it
        runtime.fail(error)
