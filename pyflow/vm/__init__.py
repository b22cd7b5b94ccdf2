"""Seed 002: OneFlow's eager virtual machine, in Python threads.

* ``dependence``      - LocalDepObject: read/write edges between instructions
* ``instruction``     - Instruction: a policy on a vm stream, with its edges and status
* ``policies/``       - OpCall, AllocateTensors, ReleaseTensor, AccessBlobByCallback,
                        RecordEvent, StreamWait, StreamRecordEvent/StreamWaitEvent, Barrier, Fuse,
                        LaunchLazyJob (an nn.Graph call), LaunchProgram (a Cocktailer program call)
* ``eager_blob_object`` - TensorStorage and EagerBlobObject, what instructions touch
* ``stream``          - VmStream, OneFlow's vm::Stream (+ StreamPolicy::Run)
* ``thread_ctx``      - ThreadCtx, its worker loop, Notifier
* ``engine``          - VirtualMachineEngine: the lists and the schedule() round
* ``virtual_machine`` - VirtualMachine: scheduler thread, workers, errors
* ``waiting``         - where callers block: back pressure, wait_until (slow vs hung)
* ``builder``         - InstructionsBuilder, physical_run, SoftSyncStream
* ``failure``         - who owns an op's error (its outputs, its thread), Failure
* ``interrupts``      - Ctrl-C never lands in the middle of the VM's bookkeeping

One VM serves each rank (``get_vm()``: the calling thread's rank context,
``pyflow/env.py``, owns it; outside rank threads that is the process's one VM).
``PYFLOW_VM_SYNC=1`` or ``with sync_mode():`` runs everything on the caller's
thread (step-through mode).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

from pyflow import _exit, env
from pyflow.device.ep.base import is_interrupt
from pyflow.kernels.backend import release_threads
from pyflow.vm.builder import InstructionsBuilder, no_instructions, physical_run, set_issuer
from pyflow.vm.eager_blob_object import EagerBlobObject, TensorStorage
from pyflow.vm.failure import Failure
from pyflow.vm.virtual_machine import VirtualMachine, report_unseen

__all__ = ["VirtualMachine", "InstructionsBuilder", "physical_run", "EagerBlobObject", "TensorStorage",
           "Failure", "get_vm", "current_vm", "run", "sync", "add_sync_hook", "wait_for_issuers", "sync_mode",
           "add_shutdown_hook", "shutdown", "no_instructions", "set_issuer", "drain"]

_vm_lock = threading.Lock()


def get_vm() -> VirtualMachine:
    """The calling rank's virtual machine (made on first use; PYFLOW_VM_SYNC=1: step-through mode)."""
    ctx = env.current()
    machine = ctx.vm
    if machine is None or machine.closed:
        with _vm_lock:
            if ctx.vm is None or ctx.vm.closed:
                ctx.vm = VirtualMachine(sync_mode=os.environ.get("PYFLOW_VM_SYNC", "0") not in ("", "0"))
            machine = ctx.vm
    return machine


def current_vm() -> VirtualMachine | None:
    """The calling rank's virtual machine if it has one running, else None (makes none)."""
    machine = env.current().vm
    return None if machine is None or machine.closed else machine


def run(build, site=None) -> None:
    """``physical_run(build, get_vm(), site)``."""
    physical_run(build, get_vm(), site)


_sync_hooks: list = []   # callables run first by every sync() (see add_sync_hook)


def add_sync_hook(hook) -> None:
    """``hook()`` runs at the start of every ``sync()`` (``wait_for_issuers``): a layer above the VM waits
    there for work it still issues to the VM (the actor runtime: the calls of nn.Graph still in flight)."""
    _sync_hooks.append(hook)


_shutdown_hooks: list = []   # callables run first by every shutdown() (see add_shutdown_hook)


def add_shutdown_hook(hook) -> None:
    """``hook()`` runs at the start of every ``shutdown()``, in the rank context whose VM stops: a layer above
    the VM stops what issues work to it (the actor runtime: that rank's nn.Graph runtimes, whose threads would
    otherwise outlive the VM they issue to, as long as a graph object is kept, say by a failed rank's traceback)."""
    _shutdown_hooks.append(hook)


def wait_for_issuers() -> None:
    """Run the sync hooks: once this returns, the layers above the VM have issued all they owe it."""
    for hook in list(_sync_hooks):
        hook()


def sync() -> None:
    """Wait for everything issued so far (device work included), nn.Graph calls in flight included.

    Then raise, as one ``OpError``, every failure of an op issued by the *calling
    thread* that no read has reported yet (other threads' failures stay theirs).
    """
    wait_for_issuers()
    vm = get_vm()
    drain(vm, "flow.sync()")
    vm.raise_failures()


def drain(vm: VirtualMachine | None, what: str) -> None:
    """Wait until everything issued to ``vm`` so far has finished, its device work included (failures stay
    pending: ``sync()`` reports them); nothing to wait for without a VM, or with one shut down."""
    if vm is None or vm.closed:
        return
    done = threading.Event()
    physical_run(lambda builder: builder.global_sync(done.set), vm)
    vm.wait_until(done.is_set, what, drive=vm.sync_mode)


@contextlib.contextmanager
def sync_mode(enabled: bool = True):
    """Run the VM on the caller's thread inside the block (step through ops with pdb).

    Everything issued before is finished first, and everything issued inside is
    finished on the way out (then, as ``flow.sync()``, the block's unseen failures are
    raised, unless another exception is already leaving the block).  Do not switch
    while other threads issue ops.
    """
    vm = get_vm()
    sync()
    previous, vm.sync_mode = vm.sync_mode, enabled
    try:
        yield vm
    finally:
        try:
            drain(vm, "the end of a sync_mode block")
        finally:
            vm.sync_mode = previous
    vm.raise_failures()


def shutdown(at_exit: bool = False, release_held: bool = False) -> None:
    """Finish all work, stop the VM's threads and destroy its ep streams (a later op starts a new VM).

    Failures no read and no ``flow.sync()`` reported are printed to stderr; at
    interpreter exit they also make the exit status 1 (``pyflow/_exit.py``).
    ``release_held``: also give back the memory of tensors still alive (a rank that
    ended: its tensors are nobody's now, though an exception's frames may keep them);
    otherwise a tensor outlives its VM and the next VM uses it.

    **Ctrl-C while it waits** (for the graph calls in flight, or the queued work): at exit the queued work
    is abandoned and the process ends with status 130 (``_abandoned_on_ctrl_c``).  Called by the program, the
    interrupt goes up at once and nothing is shut down: the VM stays the rank's VM and goes on with its queued
    work (``_interrupted``).  Abandoning it there would leave tensors written by work that never ran, in a
    process that goes on; so a second ``shutdown()`` waits for the rest, and exit gives it up on Ctrl-C.
    """
    with _abandoned_on_ctrl_c(at_exit, "the graph calls in flight"):
        for hook in list(_shutdown_hooks):
            hook()
    ctx = env.current()
    with _vm_lock:
        vm, ctx.vm = ctx.vm, None
    if vm is None or vm.closed:
        release_threads()   # (kernels launched without a VM may have started the simulator's)
        return
    try:
        with _abandoned_on_ctrl_c(at_exit, "the VM's queued work"):
            drain(vm, "shutdown")
    except BaseException as error:
        if not at_exit and is_interrupt(error):
            _interrupted(ctx, vm, release_held)
        else:
            _stop(vm, release_held, at_exit)
        raise
    _stop(vm, release_held, at_exit)


def _stop(vm: VirtualMachine, release_held: bool, at_exit: bool) -> None:
    """Stop ``vm`` (drained, or failed while draining) and report the failures nobody saw."""
    unseen = vm.shutdown(release_held=release_held)
    release_threads()   # the simulator's helper threads, idle now that the VM's streams are drained
    report_unseen(unseen)
    if at_exit and unseen:
        _exit.mark_unseen_failures(len(unseen))


def _interrupted(ctx, vm: VirtualMachine, release_held: bool) -> None:
    """Ctrl-C while the program's own ``shutdown()`` waited for ``vm``'s queued work: ``vm`` is the rank's VM
    again, its work going on (``shutdown``'s docstring), unless another thread made the rank a new VM
    meanwhile: then ``vm`` finishes its work and stops on a thread of its own (``pyflow-vm-shutdown``)."""
    with _vm_lock:
        kept = ctx.vm is None
        if kept:
            ctx.vm = vm
    if not kept:
        threading.Thread(target=_stop, args=(vm, release_held, False), daemon=True, name="pyflow-vm-shutdown").start()


@contextlib.contextmanager
def _abandoned_on_ctrl_c(at_exit: bool, what: str):
    """At exit, Ctrl-C while the block waits for ``what`` gives the queued work up and ends the process with
    status 130 (``_exit.abandon``), before anything else would wait for that work (``vm.shutdown`` joins the
    workers and drains the streams)."""
    try:
        yield
    except KeyboardInterrupt:
        if at_exit:
            _exit.abandon(what)
        raise


atexit.register(shutdown, at_exit=True)
