"""Interpreter exit: a script whose ops failed unseen does not end with status 0.

pyflow's failure semantics (``pyflow/vm/failure.py``) never drop an error: a
failed op that no read and no ``flow.sync()`` reported is printed to stderr
when the VM shuts down at exit, and then the process must not report success.
Python offers no way to change the exit status from an exit handler, so this
one ends the process with ``os._exit(1)``.  It is registered when pyflow is
first imported, before pyflow imports anything else, so it runs after every
exit handler registered later (numba's, pyflow's own VM shutdown); handlers
registered before ``import pyflow`` are skipped in that case.

This module imports nothing from pyflow.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["mark_unseen_failures"]

_unseen = 0


def mark_unseen_failures(count: int) -> None:
    """``count`` failures were printed at exit without anyone having seen them."""
    global _unseen
    _unseen += count


def _finish() -> None:
    if _unseen:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        os._exit(1)


atexit.register(_finish)
