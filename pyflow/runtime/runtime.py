"""Seed 003 (5): ``Runtime(plan)``: bring a compiled Plan to life as actors, run calls, shut down.

OneFlow's runtime is three steps: make the global objects, construct every actor
from the Plan on its thread, send the start signal to the source actors.  After that
nothing is central: actors react to messages.  pyflow's Runtime:

1. **Globals**: the ``RegstMgr`` (every regst, memory allocated once, as the Plan's
   memory plan lays it out; a Plan whose regst nums were edited by hand is planned
   again first, ``regst.py``; one closed for fewer calls in flight, ``rank_ticks.py``, is
   closed again; for nn.Graph, its view tasks folded into their readers' acts, ``fold.py``: new Plans,
   never an edit), the ``ActorMsgBus``, the ``ThreadMgr`` (one thread per stream id of the Plan).
2. **Construct**: a ``construct`` command per task goes to its thread; the thread
   builds the actor there; the runtime waits until all are built.  Interrupted (Ctrl-C), or
   failed (an actor that cannot be built), construction tells every thread it started to leave.
3. **Calls**: ``launch(inputs)`` registers a call (its ``CallContext``: the inputs,
   this call's learning rate and step, where outputs go) and sends ``launch`` to the
   source tick.  The call flows through the actors as pieces ``(call, j)``; the sink
   tick's act completes the ``CallHandle``.  Calls overlap: call n + 1 starts while
   call n is still in flight, bounded by the regst nums and by
   ``max_calls_in_flight`` (``Graph.config.outputs_buffer_size``).  Before that, the
   call's *frontier* (``call.py``) acting sets ``handle.issued()``, and each output's
   value is handed to ``handle.output(i)`` once written: what ``nn.Graph`` waits for.
4. **Close**: ``close()`` tells the source tick to stop after the calls launched so
   far; its eord spreads through the graph, every actor exits once its regsts are
   back, every thread leaves its loop and is joined (``live.py`` closes those still open at exit).

**Deterministic mode** (``deterministic=True``): no threads at all.  One pool of messages, delivered on the
caller's thread (``CallHandle.result()`` drives it, or ``step()`` one message at a time); with ``seed`` the next
message is picked at random, so tests can try many interleavings and replay any of them (``deterministic.py``).

**Watchdog** (``watchdog.py``): a thread notices when calls are in flight, no device
work the VM got to is running, and no actor acted for ``hang_timeout`` seconds
(``PYFLOW_HANG_TIMEOUT``, default 60).  It stops the runtime with a
``RuntimeHangError`` naming every waiting actor and the regst desc it waits for.  A caller
waiting here blocks on ``changed`` (notified by what it waits for) and reports a hang itself the
same way.  In deterministic mode an empty pool with a call unfinished is reported at once.

**Ranks**: a Runtime runs the tasks of the rank that makes it (``rank_tasks``: each rank's calls are closed
by its own ticks, ``rank_ticks.py``); each rank makes its own, and they meet through send / recv /
collective tasks (``comm_net.py``).

**Faults**: an exception in an act stops the runtime: every pending ``result()`` raises it (an ``OpError``
naming the actor, the op and the piece), every thread leaves.  The runtime is then dead (``nn.Graph`` makes a new one).
"""

from __future__ import annotations

import collections
import threading
import time

from pyflow import env
from pyflow import vm as _vm
from pyflow.compiler.plan import replan_memory
from pyflow.compiler.rank_ticks import close_calls, rank_tasks
from pyflow.errors import RuntimeHangError
from pyflow.runtime.act import act_table, quiet_tasks
from pyflow.runtime.fold import fold_views
from pyflow.runtime.call import CallContext, CallHandle, CallTemplate, frontier_tasks
from pyflow.runtime.comm_net import CommOrder
from pyflow.runtime.deterministic import deliver_until, step_once
from pyflow.runtime.device_ctx import device_work_error
from pyflow.runtime.live import live_runtimes
from pyflow.runtime.msg import cmd_msg
from pyflow.runtime.msg_bus import ActorMsgBus
from pyflow.runtime.regst import RegstMgr, memory_fits
from pyflow.runtime.thread import DeterministicThread, ThreadMgr
from pyflow.runtime.timeline import (ActRecord, act_record, issuing_acts, plot, report_to_tracers,
                                     save_chrome_trace, with_device_runs)
from pyflow.runtime.watchdog import Watchdog, default_hang_timeout, hang_report, wait_until

__all__ = ["Runtime", "CallHandle"]


class Runtime:
    """Actors for every task of ``plan`` (see the module docstring).

    ``job`` gives the variables and per-call feeds (``nn.Graph`` passes its Job); a
    hand-made Plan without variables may leave it None.  ``act_fn`` replaces
    ``act`` (``act.py``; tests and benchmarks: e.g. tasks that sleep).  ``timeline``
    keeps that many act records (0: none), with when each act's device work ran (``timeline.py``).  ``fold``
    (nn.Graph's): view tasks act inside their readers' acts (``fold.py``; not with an ``act_fn``).
    """

    def __init__(self, plan, job=None, *, deterministic: bool = False, seed: int | None = None,
                 max_calls_in_flight: int = 2, hang_timeout: float | None = None, name: str = "",
                 act_fn=None, timeline: int = 10_000, fold: bool = False):
        if max_calls_in_flight < 1:
            raise ValueError(f"max_calls_in_flight must be >= 1, got {max_calls_in_flight}")
        self.job, self.name = job, name
        self.ctx = env.current()
        self.rank = self.ctx.rank   # this rank's tasks of the Plan (every rank runs its own Runtime)
        self.deterministic, self.seed, self.max_calls_in_flight = deterministic, seed, max_calls_in_flight
        self.hang_timeout = hang_timeout if hang_timeout is not None else default_hang_timeout()
        if not memory_fits(plan):   # regst nums edited by hand: plan its memory, and the guards, again
            plan = replan_memory(plan)
        if plan.calls_in_flight < max_calls_in_flight:   # closed for fewer calls (or none): close it for ours
            plan = close_calls(plan, max_calls_in_flight)
        unfolded, (plan, self.folded) = plan, fold_views(plan) if fold and act_fn is None else (plan, {})
        self.plan = plan   # read, never edited: the steps above make new Plans (the compiler's)
        mine, self.source_id, self.sink_id = rank_tasks(plan, self.rank)
        self.comm_order = CommOrder(self.plan, [t.task_id for t in mine])
        acting = [unfolded.tasks[t.task_id] for t in mine]   # what a task does is the compiler's Plan's (fold.py)
        self._act_fn = act_fn or act_table(unfolded, acting, self.folded)   # each task's act, made now
        self._device_work: dict = {}   # actor id -> its act's ActDeviceWork, until record_act takes it
        self.set_timeline_limit(timeline)   # (sets ``act_fn``: ``_act_fn``, timed if the timeline is on)
        self.error, self.closed, self.actors = None, False, {}
        self._calls: dict[int, CallHandle] = {}
        self._next_call = 0
        self._lock = threading.Lock()
        self.changed, self.notifications = threading.Condition(), 0   # a waiting caller's wake-ups (``_notify``)
        self._progress, self._callbacks, self._exited = time.perf_counter(), 0, 0
        self._all_built, self._all_exited = threading.Event(), threading.Event()
        self.regst_mgr = RegstMgr(self.plan, [t.task_id for t in mine], self.rank)
        self.frontier = frontier_tasks(self.plan, mine)   # see call.py: what a call must issue before returning
        self.template = CallTemplate(self.plan, job, [t for t in mine if t.kind == "input"])   # what calls share
        self.quiet = set() if act_fn else quiet_tasks(unfolded, acting, self.template.feeds)   # acts with no issuer
        self.bus = ActorMsgBus()
        self._task_count = len(mine)
        self.home = DeterministicThread(self, seed) if deterministic else None
        self.thread_mgr, self._watchdog = None if deterministic else ThreadMgr(self, mine), None
        for task in mine:
            self.bus.add_route(task.task_id, self.home if deterministic else self.thread_mgr.thread(task.thread_id))
        try:
            self._construct(mine)
        except BaseException:   # Ctrl-C, an actor that failed to build: every thread started leaves (after the
            self.closed = True   # constructs queued before), unwaited for, so that a Ctrl-C goes up at once
            if self.thread_mgr is not None:
                self.thread_mgr.stop()
            if self._watchdog is not None:
                self._watchdog.stop(join=False)
            raise
        live_runtimes.add(self)

    def _construct(self, tasks) -> None:
        """Start the threads, build every actor on its thread, start the watchdog (the module docstring's 2)."""
        if self.thread_mgr is not None:
            self.thread_mgr.start()
        for task in tasks:
            self.bus.send(cmd_msg(task.task_id, "construct", task))
        if self.deterministic:
            self.run_until(self._all_built.is_set)
            if self.error is not None:
                raise self.error
        else:
            self._wait(self._all_built.is_set, "constructing the actors")
            self._watchdog = Watchdog(self)
            self._watchdog.start()

    # --- calls ----------------------------------------------------------------------------------

    def check_inputs(self, inputs) -> None:
        """Raise before anything runs if ``inputs`` do not match the Plan's input regsts."""
        self.template.check(list(inputs))

    def register(self, inputs) -> CallHandle:
        """Make a call's handle and context (this call's feeds are read now); ``start`` launches it."""
        self._check_usable()
        inputs = list(inputs)
        self.template.check(inputs)
        context = self.template.context(inputs)
        with self._lock:
            handle = CallHandle(self, self._next_call, context, len(self.frontier))
            self._calls[handle.index] = handle
            self._next_call += 1
        return handle

    def start(self, handle: CallHandle) -> None:
        """Send the call's ``launch`` to the source tick (any thread may call it; it never waits)."""
        with self._lock:
            if handle.started:
                return
            handle.started = True
            self._progress = time.perf_counter()
        self.bus.send(cmd_msg(self.source_id, "launch", handle.index))

    def launch(self, inputs) -> CallHandle:
        """Start one call of the Plan with ``inputs``; ``result()`` of the handle gives its outputs."""
        handle = self.register(inputs)
        self.start(handle)
        return handle

    def __call__(self, *inputs) -> list:
        """Run one call and wait for it: ``runtime(x)`` is ``runtime.launch([x]).result()``."""
        return self.launch(inputs).result()

    def call_context(self, index: int) -> CallContext:
        handle = self._calls.get(index)   # (every act asks: one look-up)
        return handle.context if handle is not None else self.handle(index).context

    def handle(self, index: int) -> CallHandle:
        """The handle of call ``index`` while it is in flight."""
        handle = self._calls.get(index)
        if handle is None:
            raise RuntimeError(f"call {index} is not in flight (finished, or the runtime stopped)")
        return handle

    def complete_call(self, index: int) -> None:
        """The sink tick acted for call ``index``: hand its outputs to the caller."""
        with self._lock:
            handle = self._calls.pop(index)
        handle._finish(handle.context.results())
        self._notify()

    def calls_in_flight(self) -> list[int]:
        with self._lock:
            return sorted(i for i, h in self._calls.items() if h.started)

    def activity(self) -> tuple:
        """(calls in flight?, seconds since an actor last acted, device work pending?): the watchdog's view."""
        with self._lock:
            return (any(h.started for h in self._calls.values()), time.perf_counter() - self._progress,
                    self._callbacks > 0)

    # --- what actors report -----------------------------------------------------------------------

    def on_constructed(self, actor) -> None:
        with self._lock:
            self.actors[actor.actor_id] = actor
            if len(self.actors) != self._task_count:
                return
            self._all_built.set()
        self._notify()

    def on_actor_exit(self, actor) -> None:
        with self._lock:
            self._exited += 1
            self._progress = time.perf_counter()
            if self._exited != self._task_count:
                return
            self._all_exited.set()
        self._notify()

    def record_act(self, actor, piece: tuple, start: float, end: float, consumed: list, produced: list) -> None:
        """An actor acted: progress for the watchdog, the call's frontier, a record for the timeline and for
        ``flow.trace()``."""
        self._progress = end   # (the acts' clock is perf_counter, as is every _progress: no call per act)
        if actor.actor_id in self.frontier and actor.acts == (piece[0] + 1) * actor.acts_per_call:
            with self._lock:   # its last act of this call: its ops on the caller's memory are issued
                handle = self._calls.get(piece[0])
                issued = False
                if handle is not None:
                    handle.frontier_left -= 1
                    if not handle.frontier_left:
                        handle._issued.set()
                        issued = True
            if issued:
                self._notify()
        vm = self.ctx.vm   # (the acts' rank's VM: ``current_vm()`` without two calls per act)
        tracing = vm is not None and vm.tracers and not vm.closed
        if not tracing and self._timeline.maxlen == 0:
            return
        # a plain tuple: ``timeline()`` makes the ``ActRecord`` (a frozen dataclass costs ~20x a tuple per act)
        entry = (actor, piece, start, end, consumed, produced, self._device_work.pop(actor.actor_id, None))
        self._timeline.append(entry)
        if tracing:
            report_to_tracers(vm, act_record(*entry[:6]))

    def callback_started(self) -> None:
        with self._lock:
            self._callbacks += 1

    def callback_finished(self) -> None:
        with self._lock:
            self._callbacks -= 1
            self._progress = time.perf_counter()

    def fail_from_device(self, actor, failure) -> None:
        """A kernel an act issued failed (seen by its device callback)."""
        self.fail(device_work_error(actor, failure))

    def fail(self, error: BaseException) -> None:
        """Stop the runtime: every pending call raises ``error``; every thread leaves its loop."""
        with self._lock:
            if self.error is not None:
                return
            self.error = error
            handles = list(self._calls.values())
            self._calls.clear()
        for handle in handles:
            handle._finish(error=error)
        self._notify()
        if self.thread_mgr is not None:
            self.thread_mgr.stop()

    def _notify(self) -> None:
        """Wake every caller blocked in ``_wait`` to look again (never called holding ``_lock``: a waiter
        holds ``changed`` while its predicate takes ``_lock``)."""
        self.notifications += 1   # (deterministic mode asks an event's predicate only after one: ``run_until``)
        with self.changed:
            self.changed.notify_all()

    # --- timeline ---------------------------------------------------------------------------------

    def timeline(self, wait: bool = True) -> list[ActRecord]:
        """Every recorded act (the last ``timeline`` of them), in the order they were recorded.

        ``wait``: first let the calls in flight finish (``wait_calls``), since ``nn.Graph`` returns before
        its call is over, and then the device work they issued (each record's ``device``: when it ran);
        ``wait=False`` (or a call from an actor's own thread): the acts, and their device runs, so far.
        """
        if wait and threading.current_thread() not in self.threads():
            self.wait_calls()
            _vm.drain(self.ctx.vm, "the device work of the timeline's acts")
        return [with_device_runs(act_record(*entry[:6]), entry[6]) for entry in list(self._timeline)]

    def wait_calls(self) -> None:
        """Threaded mode, from outside the runtime's threads: wait until no call is in flight (a hang raises
        ``RuntimeHangError``).  A runtime stopped by an error has none in flight: its error was raised to the
        calls.  Deterministic mode runs a call only when its result is asked for: nothing to wait for."""
        if self.deterministic or threading.current_thread() in self.threads():
            return
        self._wait(lambda: not self.calls_in_flight() or self.error is not None, "the calls in flight to finish")

    def set_timeline_limit(self, records: int) -> None:
        """Keep at most ``records`` act records from now on (0: none); the records so far are dropped."""
        self._timeline = collections.deque(maxlen=records)
        self.act_fn = issuing_acts(self._act_fn, self._device_work) if records else self._act_fn

    def save_timeline(self, path) -> str:
        """The timeline as a Chrome/Perfetto trace (JSON) at ``path``."""
        return save_chrome_trace(self.timeline(), path)

    def plot_timeline(self, path, title: str | None = None) -> str:
        """The timeline as a PNG at ``path`` (matplotlib)."""
        return plot(self.timeline(), path, title or f"actors of {self.plan.job_name}")

    # --- deterministic mode: stepping -------------------------------------------------------------

    def pending(self) -> list:
        """Deterministic mode: the messages not delivered yet."""
        self._need_deterministic("pending")
        return self.home.pending()

    def step(self, index: int | None = None, act: bool = True):
        """Deterministic mode: deliver one message (the next one, or ``pending()[index]``); returns it.

        With ``act=False`` the actor only takes the message in (``actor.receive``); call
        ``runtime.actor(...).act_until_fail()`` yourself to watch it act.
        """
        self._need_deterministic("step")
        return step_once(self, index, act)

    def actor(self, key):
        """The actor of a task id or an op name."""
        if key in self.actors:
            return self.actors[key]
        found = [a for a in self.actors.values() if a.op_name == key]
        if len(found) != 1:
            raise KeyError(f"no single actor for {key!r}: {[a.op_name for a in self.actors.values()]}")
        return found[0]

    def run_until(self, predicate, max_call: int | None = None, notified: bool = False) -> None:
        """Deterministic mode: deliver messages (calls up to ``max_call``) until ``predicate()``, asked only after a
        ``_notify`` if ``notified`` (it turns true only there); none left: RuntimeHangError (``deterministic.py``)."""
        self._need_deterministic("run_until")
        deliver_until(self, predicate, max_call, notified)

    def _need_deterministic(self, what: str) -> None:
        if not self.deterministic:
            raise RuntimeError(f"Runtime.{what}() steps a deterministic runtime: make it with deterministic=True")

    # --- waiting, watchdog, hang report ---------------------------------------------------------

    def wait_issued(self, handle: CallHandle) -> None:
        """Wait until the call's frontier acted (``call.py``), or the runtime stopped."""
        if self.deterministic:
            self.run_until(handle.issued, max_call=handle.index, notified=True)
        else:
            self._wait(handle.issued, f"call {handle.index} to be issued")

    def wait_for(self, handle: CallHandle, timeout: float | None = None) -> None:
        if self.deterministic:   # (set where the call finishes, which notifies: asked only then)
            self.run_until(handle._done.is_set, max_call=handle.index, notified=True)
            return
        if not handle._done.wait(timeout):
            raise TimeoutError(f"call {handle.index} of {self.plan.job_name} is not done after {timeout} s")

    def _wait(self, predicate, what: str) -> None:
        """Threaded mode: block until ``predicate()``, never polling (``watchdog.wait_until``: woken by
        ``_notify``); RuntimeHangError naming ``what`` if nothing moves for the hang timeout."""
        wait_until(self, predicate, what)

    def hang_report(self, idle: float, what: str) -> str:
        """Every waiting actor and the regst desc it waits for (``watchdog.hang_report``)."""
        return hang_report(self, idle, what)

    # --- teardown ---------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"this runtime of {self.plan.job_name!r} stopped after an error ({self.error}); "
                               "make a new Runtime") from self.error
        if self.closed:
            raise RuntimeError(f"this runtime of {self.plan.job_name!r} is closed")

    def threads(self) -> list:
        """Every Python thread this runtime started (actor threads and the watchdog)."""
        found = [t.thread for t in self.thread_mgr.all()] if self.thread_mgr is not None else []
        return found + ([self._watchdog.thread] if self._watchdog is not None else [])

    def close(self) -> None:
        """Finish the calls launched so far, spread eord, let every actor exit, join every thread."""
        if self.closed:
            return
        self.closed = True
        own_thread = threading.current_thread() in self.threads()
        hang = None
        healthy = self.error is None
        try:
            if healthy:
                with self._lock:
                    pending = [h for h in self._calls.values() if not h.started]
                for handle in pending:
                    self.start(handle)
                self.bus.send(cmd_msg(self.source_id, "close", self._next_call))
                if not own_thread:
                    try:
                        if self.deterministic:
                            self.run_until(self._all_exited.is_set)
                        else:
                            self._wait(lambda: self._all_exited.is_set() or self.error is not None, "closing")
                    except RuntimeHangError as error:
                        hang = error
        finally:
            if self.thread_mgr is not None:
                if self.error is not None:
                    self.thread_mgr.stop()
                if not own_thread:
                    alive = self.thread_mgr.join(timeout=self.hang_timeout)
                    if alive and hang is None:
                        hang = RuntimeHangError(f"threads {alive} of {self.plan.job_name!r} did not stop")
            if self._watchdog is not None:
                self._watchdog.stop(join=not own_thread)
            live_runtimes.discard(self)
        if hang is not None:
            raise hang
        if healthy and self.error is not None:   # something failed while the calls finished
            raise self.error

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = f"deterministic(seed={self.seed})" if self.deterministic else f"{len(self.thread_mgr.all())} threads"
        state = "failed" if self.error else "closed" if self.closed else "running"
        return f"<Runtime {self.plan.job_name} (rank {self.rank}): {self._task_count} actors, {mode}, {state}>"
