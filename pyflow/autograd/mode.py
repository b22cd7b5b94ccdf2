"""Grad mode: whether ops are recorded for backward (``flow.no_grad()``), per thread as in PyTorch.

The flag itself is the framework's (``pyflow/framework/grad_mode.py``: ops below autograd
ask it too); these are the context managers and decorators that set it.

>>> import pyflow as flow
>>> with flow.no_grad():
...     print(flow.is_grad_enabled())
False
>>> flow.is_grad_enabled()
True
"""

from __future__ import annotations

import contextlib
import functools

from pyflow.framework.grad_mode import is_grad_enabled, set_grad_mode

__all__ = ["is_grad_enabled", "set_grad_enabled", "no_grad", "enable_grad"]


class set_grad_enabled:  # noqa: N801 - torch's name
    """``set_grad_enabled(False)``: turn recording off (or on); also a context manager and a decorator."""

    def __init__(self, mode: bool) -> None:
        self.previous = is_grad_enabled()
        self.mode = bool(mode)
        set_grad_mode(self.mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        set_grad_mode(self.previous)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with set_grad_enabled(self.mode):
                return fn(*args, **kwargs)
        set_grad_mode(self.previous)  # used as a decorator: building it must not change the mode
        return wrapped


class _GradMode(contextlib.ContextDecorator):
    enabled = True

    def _recreate_cm(self):  # a fresh one per decorated call: recursion and threads keep their own state
        return type(self)()

    def __enter__(self):
        self.previous = is_grad_enabled()
        set_grad_mode(self.enabled)
        return self

    def __exit__(self, *exc) -> bool:
        set_grad_mode(self.previous)
        return False


class no_grad(_GradMode):  # noqa: N801 - torch's name
    """Inside, nothing is recorded for backward (a context manager or a decorator)."""

    enabled = False


class enable_grad(_GradMode):  # noqa: N801 - torch's name
    """Inside, ops are recorded again (inside a ``no_grad`` block, for instance)."""

    enabled = True
