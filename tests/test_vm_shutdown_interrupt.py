"""Ctrl-C while the program's own ``flow.vm.shutdown()`` waits for queued work (issue 32).

At exit, a Ctrl-C while pyflow waits for the queued work abandons it and ends the process with status 130
(``tests/test_ctrl_c.py``).  A program's own ``shutdown()`` used to go on waiting after the interrupt (it
joined the VM's threads, each for up to 10 s, and drained its ep streams): now the interrupt goes up at
once, and nothing is shut down: the VM stays the rank's VM and runs its queued work on; a second
``shutdown()`` waits for it.  The queued kernels here block on an event, so "the work is still queued" is
a fact when the signal arrives, not a matter of timing; the bounds are "within N s", far above the expected
hundredths of a second.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OP_REGISTRY, OpDef, TensorMeta, get_op

BOUND = 5.0   # seconds (the old code went on for 20 s or more: two thread joins of 10 s, then the drain)


@pytest.fixture
def gated_op(monkeypatch):
    """An op whose kernel (on the VM's worker) adds 1 once ``release`` is set."""
    get_op("relu")   # the real ops first
    release, started = threading.Event(), threading.Event()

    def gated(kernel, outputs, inputs, attrs, stream):
        started.set()
        release.wait(60)
        outputs[0][...] = inputs[0] + 1   # (numpy arrays on cpu)

    op = OpDef("gated_add_one", lambda i, a: [TensorMeta(i[0].shape, i[0].dtype)], kernel="", launch=gated,
               sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD)
    monkeypatch.setitem(OP_REGISTRY, op.name, op)
    yield op.name, release, started
    release.set()
    flow.vm.shutdown()


def test_ctrl_c_in_an_explicit_shutdown_goes_up_at_once_and_the_vm_goes_on(gated_op):
    name, release, started = gated_op
    flow.vm.shutdown()
    x = flow.zeros(3)
    for _ in range(3):
        x = apply(name, [x])[0]
    vm = flow.vm.get_vm()
    assert started.wait(BOUND)   # the first kernel runs (and waits): the rest is queued behind it
    sent = []

    def ctrl_c():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Timer(0.2, ctrl_c)   # the shutdown is waiting for the queued work by then
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        flow.vm.shutdown()
    assert sent and time.monotonic() - sent[0] < BOUND
    assert flow.vm.current_vm() is vm and not vm.closed   # nothing was shut down
    release.set()
    np.testing.assert_array_equal(x.numpy(), np.full(3, 3.0, np.float32))   # the queued work ran on
    flow.vm.shutdown()   # and a second shutdown finishes
    assert vm.closed and flow.vm.current_vm() is None
