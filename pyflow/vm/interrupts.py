"""Ctrl-C and the VM: an interrupt reaches the user promptly, and never mid-bookkeeping.

A ``KeyboardInterrupt`` is raised in the main thread between any two bytecodes.
If it lands while the VM's bookkeeping is half done (an instruction marked
dispatched but not queued, a batch of pending instructions taken but not
handled, a tensor's stream history updated but its instruction not received),
the VM is wedged for good.  So the VM marks those stretches *critical*:

* ``with critical():`` - a SIGINT that arrives inside is remembered, not raised;
* ``checkpoint()`` - at a point where the bookkeeping is consistent, raise the
  remembered interrupt (the engine calls it between the steps of a round);
* leaving the outermost critical stretch raises it too (also when an error ends the stretch: the
  interrupt goes up, with that error as its context, rather than being lost);
* ``with allowed():`` - inside a critical stretch, a part that may be
  interrupted at once (a kernel running in step-through mode): the remembered
  interrupt is raised on entry, new ones are raised immediately.

**Quitting a debugger** (pdb's ``q``) is the same danger by another road: pdb's trace
function raises ``bdb.BdbQuit`` at whatever line runs next, bookkeeping included (the VM
then waited out its hang timeout and reported a hang of nothing).  So while a critical
stretch runs, the main thread's trace function is wrapped (``_QuitDeferring``): a quit there
is remembered and raised as the interrupt is, at a checkpoint or where the stretch ends.
Stepping through the bookkeeping with pdb still works; only the quit waits for it.

Only the main thread receives signals, so only its stretches count; other
threads' ``critical()`` is free.  ``install()`` wraps the SIGINT handler once
(only if it is Python's default one: a handler the user installed is kept).
Tests can inject interrupts through ``VirtualMachineEngine.interrupt_hook``.
"""

from __future__ import annotations

import bdb
import signal
import sys
import threading

from pyflow.device.ep.base import is_interrupt

__all__ = ["install", "critical", "allowed", "checkpoint"]


class _State:
    depth = 0          # nesting of critical() in the main thread
    pending = False    # a SIGINT arrived while depth > 0
    quit_pending = False   # a debugger's trace function raised BdbQuit while depth > 0
    installed = False


_state = _State()
state = _state   # read-only for the VM's hot loops: ``state.pending`` says a checkpoint would raise
_main = threading.main_thread().ident


def _handler(signum, frame):
    if _state.depth > 0:
        _state.pending = True
        return
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt


def install() -> None:
    """Defer SIGINT during critical stretches (once; main thread; only over the default handler)."""
    if _state.installed or threading.get_ident() != _main:
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _handler)
    except (ValueError, OSError):  # no signals here (an embedded interpreter, a sub-interpreter)
        return
    _state.installed = True


def checkpoint() -> None:
    """Raise a SIGINT (or a debugger's quit) that arrived during the critical stretch (the state is consistent
    here)."""
    if (_state.pending or _state.quit_pending) and threading.get_ident() == _main:
        _raise_pending()


def _raise_pending() -> None:
    quit_ = _state.quit_pending
    _state.pending = _state.quit_pending = False
    raise bdb.BdbQuit if quit_ else KeyboardInterrupt


class _QuitDeferring:
    """A debugger's trace function during a critical stretch: its ``BdbQuit`` is remembered, not raised.

    Python calls a thread's trace function at each call, and the function it returns at each line of that
    frame; both are wrapped, so every frame the stretch runs is covered.  Outside a stretch (a frame that
    outlives it, a kernel inside ``allowed()``) the quit goes up at once.
    """

    __slots__ = ("tracer",)

    def __init__(self, tracer):
        self.tracer = tracer

    def __call__(self, frame, event, arg):
        try:
            local = self.tracer(frame, event, arg)
        except bdb.BdbQuit:
            if _state.depth == 0:
                raise
            _state.quit_pending = True   # (pdb stopped tracing before raising: no more events come)
            return None
        return local if local is None or not _is_debugger(local) else _QuitDeferring(local)


def _is_debugger(tracer) -> bool:
    """Is ``tracer`` a ``bdb`` debugger's trace function (pdb's ``trace_dispatch``)?  Other tracers (a coverage
    tool) are left alone: they never raise ``BdbQuit``, and wrapping them would slow every line down."""
    return isinstance(getattr(tracer, "__self__", None), bdb.Bdb)


def _defer_quits(frame) -> None:
    """Entering the outermost stretch: wrap the thread's trace function and that of ``frame`` (the one
    entering), if a debugger traces."""
    tracer = sys.gettrace()
    if _is_debugger(tracer):
        sys.settrace(_QuitDeferring(tracer))
    if _is_debugger(frame.f_trace):
        frame.f_trace = _QuitDeferring(frame.f_trace)


def _undefer_quits() -> None:
    tracer = sys.gettrace()
    if isinstance(tracer, _QuitDeferring):
        sys.settrace(tracer.tracer)


class critical:
    """``with critical():`` defers SIGINT in the main thread until the stretch ends."""

    __slots__ = ("_counted",)

    def __enter__(self):
        self._counted = threading.get_ident() == _main
        if self._counted:
            _state.depth += 1
            if _state.depth == 1 and sys.gettrace() is not None:
                _defer_quits(sys._getframe(1))
        return self

    def __exit__(self, kind, value, traceback):
        if self._counted:
            _state.depth -= 1
            if _state.depth == 0:
                _undefer_quits()
                if (_state.pending or _state.quit_pending) and (kind is None or not is_interrupt(value)):
                    _raise_pending()   # (over an error that ends the stretch too: the Ctrl-C is never lost)
                # else an interrupt (perhaps this very one) is already on its way up
                _state.pending = _state.quit_pending = False
        return False


class allowed:
    """``with allowed():`` inside a critical stretch: interrupts are raised at once again."""

    __slots__ = ("_saved",)

    def __enter__(self):
        self._saved = None
        if threading.get_ident() == _main:
            checkpoint()
            self._saved, _state.depth = _state.depth, 0
        return self

    def __exit__(self, kind, value, traceback):
        if self._saved is not None:
            _state.depth = self._saved
        return False
