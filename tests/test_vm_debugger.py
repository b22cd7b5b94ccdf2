"""Quitting pdb inside ``flow.vm.sync_mode()`` ends the program promptly (issue 32).

pdb's ``q`` makes its trace function raise ``bdb.BdbQuit`` (an ``Exception``) at the next line
that runs: in a kernel (step-through mode runs kernels on the caller's thread), or in the VM's
bookkeeping.  Before: a quit in a kernel was kept as the op's failure (the program went on, and
exited 1 with "never reported ... BdbQuit"); a quit in the bookkeeping wedged the VM, which waited
out its 120 s hang timeout and raised a ``VMHangError`` listing no blocked instruction.  Now the
quit goes up at once (in the bookkeeping: at the next consistent point, as Ctrl-C does), the VM
stays usable, and a ``VMHangError`` always names what is blocked.
"""

from __future__ import annotations

import bdb
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import vm
from pyflow.vm import VirtualMachine
from pyflow.errors import VMIdleWaitError


def _quit(*_):
    raise bdb.BdbQuit


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_quit_inside_an_instruction_goes_up_as_bdbquit_and_fails_nothing(device):
    x = flow.tensor(np.ones(4, np.float32), device=device)
    with pytest.raises(bdb.BdbQuit):
        with flow.vm.sync_mode():
            vm.run(lambda builder: builder.access_blob_by_callback(x._blob, _quit))
            (x + 1).numpy()   # not reached
    np.testing.assert_array_equal((x + 1).numpy(), [2, 2, 2, 2])   # the VM is usable
    flow.sync()   # and nothing is left pending (the quit is no op's failure to report)


class _QuitAtLine(bdb.Bdb):
    """A debugger stepping line by line that quits (pdb's ``q``: ``set_quit``, then its trace function
    raises ``BdbQuit``) at the ``k``-th line it stops at in files ending with ``suffix``."""

    def __init__(self, suffix: str, k: int):
        super().__init__()
        self.suffix, self.k, self.lines = suffix, k, 0

    def user_line(self, frame):
        if frame.f_code.co_filename.endswith(self.suffix):
            self.lines += 1
            if self.lines == self.k:
                self.set_quit()


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["vm/engine.py", "vm/virtual_machine.py", "vm/dependence.py", "vm/stream.py",
                        "vm/builder.py", "vm/policies/op_call.py", "ep/emulated.py"]),
       st.integers(1, 200), st.sampled_from(["cpu", "cuda"]))
def test_a_quit_at_any_line_of_the_vm_goes_up_promptly_and_leaves_the_vm_usable(suffix, k, device):
    machine = vm.get_vm()
    saved_trace, saved_timeout = sys.gettrace(), machine.hang_timeout
    machine.hang_timeout = 5   # a wedged VM raised VMHangError after this (instead of 120 s)
    x = flow.tensor(np.ones(4, np.float32), device=device)
    tracer = _QuitAtLine(suffix, k)
    try:
        with flow.vm.sync_mode():
            tracer.set_trace()   # (stops at once; user_line steps on)
            y = (x + 1) * 2
            sys.settrace(None)
            value = y.numpy()
    except bdb.BdbQuit:
        assert tracer.lines >= k
    else:
        assert tracer.lines < k   # the quit never came: the program ran to its end
        np.testing.assert_array_equal(value, [4, 4, 4, 4])
    finally:
        sys.settrace(saved_trace)
        machine.hang_timeout = saved_timeout
    np.testing.assert_array_equal((x * 3).numpy(), [3, 3, 3, 3])
    flow.sync()


def test_quitting_pdb_in_a_script_ends_it_at_once_with_bdbquit_and_no_unreported_failure():
    """The issue's reproduction, as a program: the quit in a kernel ends it, exit status 1 as for any
    uncaught exception, with BdbQuit's traceback and no "never reported" line (before: 120 s, VMHangError)."""
    script = textwrap.dedent("""
        import bdb, numpy as np, pyflow as flow
        from pyflow import vm
        x = flow.tensor(np.ones(4, np.float32), device="cuda")
        def quit_(*_):
            raise bdb.BdbQuit
        with flow.vm.sync_mode():
            vm.run(lambda builder: builder.access_blob_by_callback(x._blob, quit_))
            print((x + 1).numpy())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stderr
    assert done.stderr.rstrip().endswith("bdb.BdbQuit"), done.stderr
    assert "never reported" not in done.stderr and "VMHangError" not in done.stderr, done.stderr
    assert "[2." not in done.stdout


def test_a_wait_with_nothing_blocked_is_no_hang_and_says_so():
    """A ``VMHangError`` always lists blocked instructions; an idle VM's endless wait is another error."""
    machine = VirtualMachine(sync_mode=True, hang_timeout=0.2)
    try:
        with pytest.raises(VMIdleWaitError, match="the VM is idle: no instruction is blocked or running"):
            machine.wait_until(lambda: False, "a callback never issued", drive=True)
    finally:
        machine.shutdown()
