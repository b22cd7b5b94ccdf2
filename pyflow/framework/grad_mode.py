"""Grad mode, the flag: are ops on tensors that require grad recorded for backward now (per thread)?

The flag lives here, below autograd, because ops ask it too: an op that writes its input
in place without being recorded (``fill_diagonal_``, the fused optimizer updates) refuses
a tensor that requires grad while grad mode is on.  ``pyflow.autograd`` turns it on and off
(``flow.no_grad()``, ``flow.enable_grad()``, ``flow.set_grad_enabled()``), as OneFlow's
Python ``oneflow.no_grad`` sets the core's ``GradMode`` (``oneflow/core/autograd/autograd_mode.h``).

>>> import pyflow as flow
>>> with flow.no_grad():
...     print(is_grad_enabled())
False
>>> requires_grad(flow.ones(2, requires_grad=True)), requires_grad(flow.ones(2))
(True, False)
"""

from __future__ import annotations

import threading

__all__ = ["is_grad_enabled", "set_grad_mode", "requires_grad"]

_local = threading.local()


def is_grad_enabled() -> bool:
    """Are ops on tensors that require grad recorded now (in this thread)?"""
    return getattr(_local, "enabled", True)


def set_grad_mode(enabled: bool) -> None:
    """Turn recording on or off in this thread (what ``no_grad`` and its siblings do on enter and exit)."""
    _local.enabled = bool(enabled)


def requires_grad(t) -> bool:
    """Does tensor ``t`` require grad?  Read from its autograd slot (None until autograd gives it a meta)."""
    info = getattr(t, "_autograd", None)
    return info is not None and info.requires_grad
