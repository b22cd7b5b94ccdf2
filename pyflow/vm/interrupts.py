"""Ctrl-C and the VM: an interrupt reaches the user promptly, and never mid-bookkeeping.

A ``KeyboardInterrupt`` is raised in the main thread between any two bytecodes.
If it lands while the VM's bookkeeping is half done (an instruction marked
dispatched but not queued, a batch of pending instructions taken but not
handled, a tensor's stream history updated but its instruction not received),
the VM is wedged for good.  So the VM marks those stretches *critical*:

* ``with critical():`` - a SIGINT that arrives inside is remembered, not raised;
* ``checkpoint()`` - at a point where the bookkeeping is consistent, raise the
  remembered interrupt (the engine calls it between the steps of a round);
* leaving the outermost critical stretch raises it too;
* ``with allowed():`` - inside a critical stretch, a part that may be
  interrupted at once (a kernel running in step-through mode): the remembered
  interrupt is raised on entry, new ones are raised immediately.

Only the main thread receives signals, so only its stretches count; other
threads' ``critical()`` is free.  ``install()`` wraps the SIGINT handler once
(only if it is Python's default one: a handler the user installed is kept).
Tests can inject interrupts through ``VirtualMachineEngine.interrupt_hook``.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["install", "critical", "allowed", "checkpoint"]


class _State:
    depth = 0          # nesting of critical() in the main thread
    pending = False    # a SIGINT arrived while depth > 0
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
    """Raise a SIGINT that arrived during the critical stretch (the state is consistent here)."""
    if _state.pending and threading.get_ident() == _main:
        _state.pending = False
        raise KeyboardInterrupt


class critical:
    """``with critical():`` defers SIGINT in the main thread until the stretch ends."""

    __slots__ = ("_counted",)

    def __enter__(self):
        self._counted = threading.get_ident() == _main
        if self._counted:
            _state.depth += 1
        return self

    def __exit__(self, kind, value, traceback):
        if self._counted:
            _state.depth -= 1
            if _state.depth == 0 and _state.pending:
                _state.pending = False
                if kind is None:
                    raise KeyboardInterrupt
                # an exception (perhaps this very interrupt) is already on its way up
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
