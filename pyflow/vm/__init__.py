"""Seed 002: OneFlow's eager virtual machine, in Python threads.

* ``dependence``      - LocalDepObject: read/write edges between instructions
* ``instruction``     - Instruction: a policy on a vm stream, with its edges and status
* ``policies/``       - OpCall, AllocateTensors, ReleaseTensor, AccessBlobByCallback,
                        RecordEvent, StreamWait, StreamRecordEvent/StreamWaitEvent, Barrier, Fuse
* ``eager_blob_object`` - TensorStorage and EagerBlobObject, what instructions touch
* ``stream``          - vm.Stream (+ StreamPolicy::Run)
* ``thread_ctx``      - ThreadCtx, its worker loop, Notifier
* ``engine``          - VirtualMachineEngine: the lists and the schedule() round
* ``virtual_machine`` - VirtualMachine: scheduler thread, workers, waiting, errors
* ``builder``         - InstructionsBuilder, physical_run, SoftSyncStream

One VM serves the process (``get_vm()``).  ``PYFLOW_VM_SYNC=1`` or ``with
sync_mode():`` runs everything on the caller's thread (step-through mode).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from pyflow.vm.builder import InstructionsBuilder, physical_run
from pyflow.vm.eager_blob_object import EagerBlobObject, TensorStorage
from pyflow.vm.virtual_machine import VirtualMachine

__all__ = ["VirtualMachine", "InstructionsBuilder", "physical_run", "EagerBlobObject", "TensorStorage",
           "get_vm", "run", "sync", "sync_mode", "shutdown"]

_vm: VirtualMachine | None = None
_vm_lock = threading.Lock()


def get_vm() -> VirtualMachine:
    """The process's virtual machine (made on first use; PYFLOW_VM_SYNC=1: step-through mode)."""
    global _vm
    if _vm is None or _vm.closed:
        with _vm_lock:
            if _vm is None or _vm.closed:
                _vm = VirtualMachine(sync_mode=os.environ.get("PYFLOW_VM_SYNC", "0") not in ("", "0"))
    return _vm


def run(build) -> None:
    """``physical_run(build, get_vm())``."""
    physical_run(build, get_vm())


def sync() -> None:
    """Wait for everything issued so far (device work included); raise the first kept error."""
    vm = get_vm()
    done = threading.Event()
    physical_run(lambda builder: builder.global_sync(done.set), vm)
    vm.wait_until(done.is_set, "flow.sync()", drive=vm.sync_mode)
    vm.raise_errors()


@contextlib.contextmanager
def sync_mode(enabled: bool = True):
    """Run the VM on the caller's thread inside the block (step through ops with pdb).

    Everything issued before is finished first; do not switch while other threads issue ops.
    """
    vm = get_vm()
    sync()
    previous, vm.sync_mode = vm.sync_mode, enabled
    try:
        yield vm
    finally:
        sync()
        vm.sync_mode = previous


def shutdown() -> None:
    """Finish all work, stop the VM's threads and destroy its ep streams (a later op starts a new VM)."""
    global _vm
    with _vm_lock:
        vm, _vm = _vm, None
    if vm is None or vm.closed:
        return
    try:
        done = threading.Event()
        physical_run(lambda builder: builder.global_sync(done.set), vm)
        vm.wait_until(done.is_set, "shutdown", drive=vm.sync_mode)
    finally:
        vm.shutdown()


atexit.register(shutdown)
