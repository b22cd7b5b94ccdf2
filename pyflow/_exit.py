"""Interpreter exit: a script whose ops failed unseen does not end with status 0.

pyflow's failure semantics (``pyflow/vm/failure.py``) never drop an error: a
failed op that no read and no ``flow.sync()`` reported is printed to stderr
when the VM shuts down at exit, and then the process must not report success.
Python offers no way to change the exit status from an exit handler, so this
one ends the process with ``os._exit(1)``.  It is registered when pyflow is
first imported, before pyflow imports anything else, so it runs after every
exit handler registered later (numba's, pyflow's own VM shutdown); handlers
registered before ``import pyflow`` are skipped in that case.

**Ctrl-C at exit** (``abandon``): exit waits for the work still queued (every kernel issued, the
graph calls in flight), and a user who presses Ctrl-C then wants out, not the rest of the queue.  So
an interrupt while pyflow's exit handlers wait gives the queued work up and ends the process at once
with status 130 (128 + SIGINT, what a shell reports for a program Ctrl-C ended), through
``os._exit``: draining, joining the VM's threads and closing streams would run that very work.

This module imports nothing from pyflow.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

__all__ = ["mark_unseen_failures", "abandon", "INTERRUPTED_STATUS"]

INTERRUPTED_STATUS = 130   # 128 + SIGINT

_unseen = 0


def mark_unseen_failures(count: int) -> None:
    """``count`` failures were printed at exit without anyone having seen them."""
    global _unseen
    _unseen += count


def abandon(what: str) -> NoReturn:
    """Ctrl-C while an exit handler waits for ``what``: give the queued work up, end now with status 130."""
    print(f"pyflow: interrupted at exit while waiting for {what}; the work still queued is abandoned",
          file=sys.stderr)
    _flush()
    os._exit(INTERRUPTED_STATUS)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
            pass


def _finish() -> None:
    if _unseen:
        _flush()
        os._exit(1)


atexit.register(_finish)
