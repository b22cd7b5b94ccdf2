"""Seed 003 (5.5): the Actor: a task of the Plan brought to life, driven only by messages.

An actor owns (``slots.py``)

* one **consumed slot** per regst desc it reads (``InSlot``): the regsts that arrived
  from the producer, in piece order;
* one **produced slot** per regst desc it writes (``OutSlot``): its own Regsts, the
  free ones in a deque.

Its state machine (OneFlow's ``HandlerNormal`` / ``HandlerZombie``)::

    process_msg(msg)                       a regst arrived / came back, an eord, a cmd
      -> act_until_fail()                  while is_read_ready() and is_write_ready(): act
    every input saw eord, nothing left     -> zombie: wait until every produced regst is
                                              back, then send eord downstream and exit

``is_read_ready``: every consumed slot holds the piece this act needs.
``is_write_ready``: every produced slot has a free regst (or one it is still filling).

One **act** (``act_once``): take the inputs' tensors, perform the task with
``act(plan, task, ins, outs, j, call)`` (``runtime/act.py``: the one definition of what a task
does, shared with the sequential interpreter), then send each produced regst to its
consumers (reading count = number of consumers) and return each consumed regst to
its producer.  Messages to actors on this thread go out at once; the others after
the act's device work is done (``device_ctx.py``).

**Rates** (time shapes).  An actor acts ``A = time_shape[1]`` times per call (k inside
the gradient-accumulation loop, else 1).  A regst desc whose producer makes ``P``
pieces per call is consumed

* one piece per act when ``P == A``;
* each piece **held** for ``A / P`` acts when ``P < A`` (Repeat, Unpack: one input,
  k acts; the input goes back after the k-th);
* ``P / A`` pieces per act when ``P > A``: only control regsts do this (an optimizer
  update waiting for every micro-batch's last read of its variable); all but the last
  piece of each group go straight back (**absorbed**).

A produced desc normally gets one piece per act; Acc and Pack fill one regst over k acts
and send it after the k-th (``acts_per_piece``; their ``mem_guard`` ctrl regst still goes
out after every act: ``pieces_per_call`` in ``pyflow/compiler/task_graph.py``).

**Alias regsts** (a repeat's output, an op writing a variable in place) and **inplace
regsts** (an output the compiler put in its input's memory) are the memory of a regst
the actor consumed.  That input stays **pinned** until every alias made
from it came back (seed 003: inplace stretches the consumed regst's life to the produced
one's), so its producer cannot overwrite memory someone still reads.
"""

from __future__ import annotations

import collections
import time

from pyflow.compiler.task_graph import pieces_per_call
from pyflow.errors import OpError
from pyflow.runtime.act import produced_regsts
from pyflow.runtime.actors.slots import InSlot, OutSlot
from pyflow.runtime.device_ctx import after_device_work
from pyflow.runtime.msg import CMD, EORD, REGST, ActorMsg, eord_msg, regst_msg

__all__ = ["Actor", "pieces_per_call"]


class Actor:
    """The normal actor (OneFlow's NormalForward): all inputs there, a free output, act, repeat."""

    kind = "normal"

    def __init__(self, runtime, task, thread):
        self.runtime, self.plan, self.task, self.thread = runtime, runtime.plan, task, thread
        self.actor_id = task.task_id
        self.op_name = task.op_name
        self.acts_per_call = task.time_shape[1]
        self.acts = 0                   # acts done since the runtime started
        self.device_work: dict = {}     # device work its messages wait for, not done yet -> acts when issued
        self.exited = False
        self.zombie = False
        self.in_slots: dict[int, InSlot] = {}
        for key, ids in task.consumed.items():
            for rid in ids:
                desc = self.plan.regsts[rid]
                self.in_slots[rid] = InSlot(key, desc, self.plan.tasks[desc.producer], self.acts_per_call)
        self.data_keys = [(key, ids[0]) for key, ids in task.consumed.items() if key != "ctrl"]
        self.data_in = [(key, self.in_slots[rid]) for key, rid in self.data_keys]
        for slot in self.in_slots.values():
            if slot.mode == "absorb" and slot.desc.mem != "ctrl":
                raise ValueError(f"actor {self.actor_id} ({self.op_name}): data regst {slot.desc.lbn} arrives "
                                 f"{slot.ratio}x per act; only control regsts may be absorbed")
        self.out_slots: dict[int, OutSlot] = {}
        for key, rid in task.produced.items():
            desc = self.plan.regsts[rid]
            self.out_slots[rid] = OutSlot(key, desc, runtime.regst_mgr.regsts_of(rid),
                                          self.acts_per_call // pieces_per_call(task, key),
                                          list(dict.fromkeys(desc.consumers)))
        self.data_out = [self.out_slots[r.id] for r in produced_regsts(self.plan, task)]
        for slot in self.out_slots.values():
            desc = slot.desc
            slot.pinned_source = self.in_slots.get(desc.alias_of if desc.mem == "alias" else desc.inplace_of)
        # what every act walks, as lists made once (OneFlow's actors hold theirs from construction too)
        self.in_list, self.out_list = list(self.in_slots.values()), list(self.out_slots.values())
        # the regst messages its acts send, made once (``Regst.sends`` / ``Regst.returns``: reused, a send sets
        # only the piece; OneFlow's actors also keep their regst messages from construction)
        for slot in self.out_list:
            for regst in slot.regsts:
                regst.sends = [ActorMsg(REGST, self.actor_id, consumer, regst) for consumer in slot.consumers]
        for slot in self.in_list:
            for regst in runtime.regst_mgr.copies_of(slot.desc.id):
                regst.returns[self.actor_id] = ActorMsg(REGST, self.actor_id, slot.producer, regst)
        self.pins: collections.Counter = collections.Counter()   # consumed regst -> its aliases in flight
        self.deferred: set = set()      # consumed regsts used up, going back once their pins reach 0
        self.ended = False              # an eord arrived: from now on, check whether the inputs are finished
        # every actor it sends to on its own thread? Then an act's messages go to the local queue in one call
        thread_of = runtime.bus.thread_of
        peers = [c for slot in self.out_list for c in slot.consumers] + [s.producer for s in self.in_list]
        self.all_local = all(thread_of(peer) is thread for peer in peers)
        # ``process_msg(msg)``: update the state with ``msg``, act while possible, wind down once the inputs
        # ended; the handler of the actor's state (``handler_normal``, then ``handler_zombie``), one call
        cls = type(self)   # (an actor whose readiness and arrivals are the normal actor's takes the inlined handler)
        plain = (cls.is_read_ready is Actor.is_read_ready and cls.is_write_ready is Actor.is_write_ready
                 and cls.on_arrived is Actor.on_arrived)
        self.process_msg = self.handler_plain if plain else self.handler_normal
        # an act that issues no VM instruction runs without the timeline's issuer (``Runtime.quiet``)
        self.quiet = self.actor_id in runtime.quiet
        # and calls its task's act itself, ``(ins, outs, j, call) -> results``, not through the runtime's table
        self.quiet_act = runtime._act_fn.acts[task.task_id] if self.quiet else None   # (``act.act_table``)

    # --- messages ---------------------------------------------------------------------------

    def handler_normal(self, msg) -> None:
        # ``receive(msg)``, then ``act_until_fail()``, inlined for a regst message: every message passes here
        if msg.kind == REGST:
            regst = msg.regst
            if regst.producer == self.actor_id:   # (``on_returned``, inlined)
                readers = regst.readers_left
                readers.discard(msg.src)
                if readers:
                    return   # others still read it: nothing changed that could let this actor act or end
                self.free_regst(regst)
            else:
                self.on_arrived(regst)
        else:
            self.receive(msg)
        while not self.zombie and self.is_read_ready() and self.is_write_ready():
            self.act_once()
        if self.ended and self.input_finished():
            self.become_zombie()

    def handler_plain(self, msg) -> None:
        """``handler_normal`` for an actor that keeps the normal actor's ``on_arrived``, ``is_read_ready`` and
        ``is_write_ready``, with their usual cases inlined: a regst message costs no call of them."""
        if msg.kind != REGST:
            self.handler_normal(msg)
            return
        regst = msg.regst
        if regst.producer == self.actor_id:   # (``on_returned``, inlined)
            readers = regst.readers_left
            readers.discard(msg.src)
            if readers:
                return   # others still read it: nothing changed that could let this actor act or end
            self.free_regst(regst)
        else:
            slot = self.in_slots[regst.desc.id]
            if slot.mode == "one" and (not slot.regsts or slot.regsts[-1].piece < regst.piece):
                slot.regsts.append(regst)   # (``on_arrived``'s usual case: one piece per act, in order)
            else:
                self.on_arrived(regst)
        while not self.zombie:
            piece = (self.acts, 0) if self.acts_per_call == 1 else divmod(self.acts, self.acts_per_call)
            for slot in self.in_list:   # (``is_read_ready``)
                regsts = slot.regsts
                if not regsts or (regsts[0].piece != piece if slot.mode == "one" else not slot.ready_at(*piece)):
                    break
            else:
                for slot in self.out_list:   # (``is_write_ready``)
                    if slot.current is None and not slot.free:
                        break
                else:
                    self.act_once()
                    continue
            break
        if self.ended and self.input_finished():
            self.become_zombie()

    def handler_zombie(self, msg) -> None:
        """After eord: only returned regsts matter; exit once all of them are back."""
        if msg.kind == REGST and msg.regst.producer == self.actor_id:
            self.on_returned(msg.regst, msg.src)
        self.try_exit()

    def receive(self, msg) -> None:
        """The state change of one message, without acting (step-through mode calls it alone)."""
        if msg.kind == REGST:
            regst = msg.regst
            if regst.producer == self.actor_id:
                self.on_returned(regst, msg.src)
            else:
                self.on_arrived(regst)
        elif msg.kind == EORD:
            self.in_slots[msg.desc_id].eord = True
            self.ended = True
        elif msg.kind == CMD:
            self.on_cmd(msg)

    def on_arrived(self, regst) -> None:
        slot = self.in_slots[regst.desc.id]
        if slot.mode == "absorb" and regst.piece[1] % slot.ratio != slot.ratio - 1:
            self.give_back([regst], [])   # not the last of its group: only its arrival counted
            return
        if slot.regsts and not slot.regsts[-1].piece < regst.piece:
            slot.add(regst)   # out of order: sorted in
        else:
            slot.regsts.append(regst)   # (``slot.add``'s usual case, inlined: pieces arrive in order)

    def on_returned(self, regst, consumer: int) -> None:
        regst.readers_left.discard(consumer)
        if regst.readers_left:
            return
        self.free_regst(regst)

    def free_regst(self, regst) -> None:
        regst.piece = None
        if regst.desc.mem not in ("planned", "ctrl"):
            regst.tensor = None   # a parameter, an input, an alias: not ours to keep alive
        self.out_slots[regst.desc.id].free.append(regst)
        pinned = regst.pinned_input
        if pinned is not None:   # an alias came back: its input may go back too
            regst.pinned_input = None
            self.pins[pinned] -= 1
            if not self.pins[pinned]:
                del self.pins[pinned]
                if pinned in self.deferred:
                    self.deferred.remove(pinned)
                    self.give_back([pinned], [pinned.tensor] if pinned.tensor is not None else [])

    def on_cmd(self, msg) -> None:
        raise RuntimeError(f"actor {self.actor_id} ({self.op_name}) got an unexpected command {msg.cmd!r}")

    # --- readiness --------------------------------------------------------------------------

    def is_read_ready(self) -> bool:
        piece = (self.acts, 0) if self.acts_per_call == 1 else divmod(self.acts, self.acts_per_call)   # (no call)
        for slot in self.in_list:
            regsts = slot.regsts
            if not regsts:
                return False
            if slot.mode == "one":   # (``slot.ready_at`` inlined: the common case, asked at every message)
                if regsts[0].piece != piece:
                    return False
            elif not slot.ready_at(*piece):
                return False
        return True

    def is_write_ready(self) -> bool:
        for slot in self.out_list:
            if slot.current is None and not slot.free:
                return False
        return True

    def act_until_fail(self) -> int:
        """Act while read-ready and write-ready; returns how many acts ran."""
        count = 0
        while not self.zombie and self.is_read_ready() and self.is_write_ready():
            self.act_once()
            count += 1
        return count

    # --- one act ----------------------------------------------------------------------------

    def piece(self) -> tuple:
        """(call, j) of the next act."""
        return divmod(self.acts, self.acts_per_call)

    def act_once(self) -> None:
        n, j = (self.acts, 0) if self.acts_per_call == 1 else divmod(self.acts, self.acts_per_call)
        calls = self.runtime._calls   # (``runtime.call_context(n)``, inlined: every act asks)
        call = calls[n].context if n in calls else self.runtime.call_context(n)
        ins, outs = {}, []   # (plain loops: a comprehension is one more Python call per act)
        for key, slot in self.data_in:
            ins[key] = slot.regsts[0].tensor
        for slot in self.out_list:
            if slot.current is None:
                slot.current = slot.free.pop(0)
        for slot in self.data_out:
            outs.append(slot.current.tensor)
        start = time.perf_counter()
        try:
            quiet_act = self.quiet_act
            results = (quiet_act(ins, outs, j, call) if quiet_act is not None
                       else self.runtime.act_fn(self.plan, self.task, ins, outs, j, call))
        except Exception as error:
            raise OpError(f"actor {self.actor_id} ({self.kind} actor of op {self.op_name!r}, task kind "
                          f"{self.task.kind}) failed at piece {(n, j)}: {type(error).__name__}: {error}",
                          op=self.op_name) from error
        end = time.perf_counter()
        for slot, tensor in zip(self.data_out, results):
            slot.current.tensor = tensor
        self.acts += 1
        self.after_act(n, j, start, end)

    def after_act(self, n: int, j: int, start: float, end: float, slots=None, consumed=None) -> None:
        """Send what is complete downstream, give back what was used up (``slots``: those consumed slots,
        default all); record the act (``consumed``: more (desc, index, piece) it read)."""
        sends, written, produced = [], [], ()   # (the record's tuples are built as tuples: no copy to make)
        me, local = self.actor_id, self.all_local   # (all local: nothing waits for the act's device work, so the
        #                                             tensors it read and wrote need not be listed)
        for slot in self.out_list:
            per = slot.acts_per_piece
            if per != 1 and j % per != per - 1:
                continue   # Acc / Pack: this regst is not full yet
            regst, slot.current = slot.current, None
            regst.piece = piece = (n, j // per)
            produced += ((slot.desc.id, regst.index, piece),)
            if regst.tensor is not None and not local:
                written.append(regst.tensor)
            if slot.pinned_source is not None:
                self.pin_alias(regst, slot.pinned_source)
            if not slot.consumers:
                self.free_regst(regst)
                continue
            regst.readers_left = set(slot.consumers)
            for msg in regst.sends:
                msg.piece = piece
            sends += regst.sends
        read = []
        consumed = tuple(consumed) if consumed else ()
        for slot in self.in_list if slots is None else slots:
            regst = slot.regsts[0]
            consumed += ((slot.desc.id, regst.index, regst.piece),)
            slot.uses += 1
            if slot.mode == "held" and slot.uses < slot.ratio:
                continue
            slot.uses = 0
            slot.regsts.pop(0)
            if regst in self.pins:   # (a Counter's subscript would call ``__missing__`` for every other regst)
                self.deferred.add(regst)   # an alias of it is still out there
                continue
            msg = regst.returns[me]   # given back
            msg.piece = regst.piece
            sends.append(msg)
            if regst.tensor is not None and not local:
                read.append(regst.tensor)
        self.runtime.record_act(self, (n, j), start, end, consumed, produced)
        if local:   # (``dispatch``'s first case, inlined: every message goes to this thread's queue)
            self.thread.enqueue_local(sends)
        else:
            self.dispatch(sends, read, written)

    def pin_alias(self, regst, source_slot: InSlot) -> None:
        """An alias (or inplace) regst keeps the consumed regst whose memory it is (the front of
        ``source_slot``) from going back."""
        source = source_slot.regsts[0]
        self.pins[source] += 1
        regst.pinned_input = source

    def give_back(self, regsts: list, read: list) -> None:
        self.dispatch([regst_msg(self.actor_id, r.producer, r) for r in regsts], read, [])

    # --- sending ----------------------------------------------------------------------------

    def dispatch(self, msgs: list, read: list, written: list) -> None:
        """Send ``msgs``: to this thread at once; to other threads once the device work is done."""
        bus, here = self.runtime.bus, self.thread
        if self.all_local:   # (decided once, when the actor was made)
            here.enqueue_local(msgs)
            return
        thread_of, later = bus.thread_of, []
        for msg in msgs:
            if thread_of(msg.dst) is here:
                here.enqueue(msg, True)   # the bus's own choice for a message to this thread: its local queue
            else:
                later.append(msg)
        if not later:
            return
        if not read and not written:
            for msg in later:
                bus.send(msg, here)
            return
        runtime, token = self.runtime, object()
        self.device_work[token] = self.acts   # (one dict store / pop each: atomic; the VM worker pops it)

        def on_done(failure):   # on a VM worker thread: only the thread-safe channels are touched
            try:
                if failure is not None:
                    runtime.fail_from_device(self, failure)
                    return
                for msg in later:
                    bus.send(msg, None)
            finally:
                self.device_work.pop(token, None)
                runtime.callback_finished()

        after_device_work(read, written, f"actor {self.op_name} done", on_done, runtime.callback_started)

    # --- eord and exit ----------------------------------------------------------------------

    def input_finished(self) -> bool:
        """Every input desc saw eord and nothing of them is left to use."""
        return all(slot.eord and not slot.regsts for slot in self.in_slots.values())

    def become_zombie(self) -> None:
        self.zombie = True
        self.process_msg = self.handler_zombie
        self.try_exit()

    def try_exit(self) -> None:
        """A zombie exits once every produced regst is back: then eord goes downstream."""
        if self.exited or not all(slot.all_back() for slot in self.out_slots.values()):
            return
        for slot in self.out_slots.values():
            for consumer in slot.consumers:
                self.runtime.bus.send(eord_msg(self.actor_id, consumer, slot.desc.id), self.thread)
        self.exited = True
        self.runtime.on_actor_exit(self)

    # --- reports ----------------------------------------------------------------------------

    def why_waiting(self) -> list[str]:
        """Why this actor cannot act now (for hang reports); empty if it merely has no input yet."""
        reasons = []
        started = any(slot.regsts for slot in self.in_slots.values())
        if not started and not self.busy_outputs():
            return reasons
        for slot in self.in_slots.values():
            if not slot.ready(self.acts, self.acts_per_call):
                have = f"it holds piece {slot.regsts[0].piece}" if slot.regsts else "it is empty"
                reasons.append(f"not read-ready: consumed regst desc {slot.desc.id} ({slot.desc.lbn}, from actor "
                               f"{slot.producer} {slot.producer_op!r}) needs piece "
                               f"{slot.expected_piece(self.acts, self.acts_per_call)}, {have}")
        for slot in self.out_slots.values():
            if slot.current is None and not slot.free:
                if not slot.regsts:
                    reasons.append(f"not write-ready: produced regst desc {slot.desc.id} ({slot.desc.lbn}) has "
                                   "regst num 0: no regst can ever be written")
                    continue
                held = [f"copy {r.index} (piece {r.piece}) still read by "
                        + ", ".join(f"actor {c} {self.plan.tasks[c].op_name!r}" for c in sorted(r.readers_left))
                        for r in slot.regsts if r.readers_left]
                reasons.append(f"not write-ready: produced regst desc {slot.desc.id} ({slot.desc.lbn}, regst num "
                               f"{len(slot.regsts)}) has no free regst: {'; '.join(held) or 'none came back yet'}")
        return reasons

    def busy_outputs(self) -> bool:
        return any(not slot.all_back() for slot in self.out_slots.values())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.actor_id} {self.op_name!r} acts={self.acts}>"
