"""pyflow's failure semantics: an op's error belongs to the op, its outputs and its thread.

OneFlow raises a failed instruction's error at "the next synchronisation point",
so an error can surface in an unrelated ``numpy()``, in another thread, or never.
pyflow keeps these rules instead (the README's "When an op fails"):

1. **The error belongs to the op and its outputs.**  When an instruction fails
   (in ``prepare``, in ``compute``, or later in its kernel on an ep stream) every
   storage it writes is marked failed with a ``Failure``: the op's name, the
   error, and the line of user code that issued the op.
2. **Failure flows along the data.**  An op whose input is failed does not run;
   its outputs carry the same ``Failure``.  Reading any of them (``numpy()``,
   ``item()``, ``print``) raises that error as ``OpError``, on every read.
   Unrelated tensors, and other threads, never see it.
3. **Nothing is dropped.**  A failure nobody has read yet is *pending* for the
   thread that issued the op: ``flow.sync()`` raises the calling thread's
   pending failures (all of them, in one ``OpError``).  At interpreter exit the
   ones still pending are printed to stderr and the exit status becomes 1.
4. **Fusion never changes failure.**  The members of a fused instruction are
   prepared and computed one by one; a failing member fails alone.

``issue_site()`` finds the user's line: the innermost frame outside pyflow.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading

from pyflow.errors import OpError

__all__ = ["Failure", "issue_site", "first_failure"]

_OWN_DIRS: tuple | None = None  # pyflow/ and kernels/ (separate directories in an editable install)


_is_own: dict = {}  # code object -> is it pyflow's (asked once per code object)


def issue_site() -> tuple:
    """``(filename, lineno)`` of the innermost frame outside pyflow (the user's line)."""
    global _OWN_DIRS
    if _OWN_DIRS is None:
        from pyflow import kernels

        _OWN_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                          for m in (sys.modules["pyflow"], kernels))
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        own = _is_own.get(code)
        if own is None:
            if len(_is_own) > 10_000:   # (code made by exec in a long session: forget, ask again)
                _is_own.clear()
            own = _is_own[code] = code.co_filename.startswith(_OWN_DIRS)
        if not own:
            return (code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return ("<pyflow>", 0)


def describe_site(site) -> str:
    """``script.py:12 (y = flow.relu(x))`` for a site from ``issue_site``."""
    filename, lineno = site
    text = linecache.getline(filename, lineno).strip() if lineno else ""
    where = f"{filename}:{lineno}" if lineno else filename   # (lineno 0: a site that is no line of a file)
    return f"{where} ({text})" if text else where


class Failure:
    """One failed op: what failed, why, where the user issued it, and who has seen it."""

    __slots__ = ("op", "error", "site", "thread", "reported")

    def __init__(self, op: str, error: BaseException, site=("<pyflow>", 0), thread: int | None = None):
        self.op = op
        self.error = error
        self.site = site
        self.thread = thread if thread is not None else threading.get_ident()
        self.reported = False

    def describe(self) -> str:
        cause = self.error
        return (f"op {self.op!r} issued at {describe_site(self.site)} failed: "
                f"{type(cause).__name__}: {cause}")

    def to_error(self, reading: str | None = None, others=()) -> OpError:
        """A fresh ``OpError`` for this failure (its ``__cause__`` is the original error)."""
        message = self.describe()
        if reading:
            message = f"{reading}: {message}"
        if others:
            listed = "; ".join(o.describe() for o in others)
            message += f"\n(and {len(others)} more failed op(s) issued by this thread: {listed})"
        error = OpError(message, op=self.op)
        error.failure = self
        error.others = list(others)
        error.__cause__ = self.error
        return error

    def __repr__(self) -> str:
        return f"<Failure {self.describe()}>"


def first_failure(blobs):
    """The failure of the first failed storage among ``blobs`` (EagerBlobObjects), or None."""
    for blob in blobs:
        failure = blob.storage.failure
        if failure is not None:
            return failure
    return None
