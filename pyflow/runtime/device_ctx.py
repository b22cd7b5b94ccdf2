"""Seed 003 (5.5.3, 5.7): the DeviceCtx callback: send an act's messages once its device work is done.

An act only *issues* work: its kernels are eager ops in the rank's virtual machine
(``pyflow/vm``), which runs them later on worker threads (and, on a GPU, on CUDA
streams).  When may the actor tell others about it?

* a consumer on the **same thread** (the same stream) may hear at once: whatever it
  issues goes into the same stream after this act's work, and a stream runs in order.
  This hides the actors' control overhead behind the device work (seed 003, 5.5.3);
* anyone on **another thread** hears only after the work is done.  OneFlow pushes
  ``AsyncSendQueuedMsg`` onto the CUDA stream as a callback (``DeviceCtx::AddCallBack``);
  a callback poller thread runs it when the stream gets there.

pyflow's VM already has that callback: ``AccessBlobByCallback`` runs a Python function
on a VM worker, in stream order, after every earlier instruction that writes the
blob (and, with the "mut" modifier, every earlier one that reads it).  So
``after_device_work`` issues one such access per memory the act touched: "mut" for
what it read (its inputs go back to producers that will overwrite them), "const" for
what it wrote.  On a device the callback also syncs the ep stream (the kernels have
*run*, not just been queued).  When the last callback has run, ``on_done`` sends the
messages.  It also reports a kernel that failed writing the act's outputs.

**Reached, or only issued** (``on_reached``): the first callback to run tells the actor runtime
that the VM got to the act's work; on a device it then waits in the stream's sync while the
kernels run.  The runtime's watchdog (``watchdog.py``) takes that for device work in progress
(a long kernel is no hang).  A callback the VM never gets to (its stream's worker blocked, a
dependence that is never met) is no work in progress: the call is stuck, and the watchdog says so.

pyflow's VM would order a consumer's reads after the producer's writes even without
the wait (both are eager ops with dependences); the callback is what keeps the seed's
rule that no actor on another thread touches a regst before its producer's kernel ran.
"""

from __future__ import annotations

import threading

from pyflow import vm as _vm
from pyflow.device import DeviceType
from pyflow.errors import OpError
from pyflow.vm.failure import first_failure

__all__ = ["after_device_work", "device_work_error"]


def device_work_error(actor, failure) -> BaseException:
    """The error that stops the runtime when ``failure`` (a ``Failure`` of the VM, or an exception) is what an
    act of ``actor`` issued: an ``OpError`` naming the actor and its op."""
    where = f"actor {actor.actor_id} ({actor.kind} actor of op {actor.op_name!r})"
    if isinstance(failure, BaseException):
        error = OpError(f"{where}: its device work failed: {type(failure).__name__}: {failure}", op=actor.op_name)
        error.__cause__ = failure
        return error
    failure.reported = True
    return failure.to_error(reading=f"{where}: its device work failed")


def after_device_work(reads, writes, name: str, on_done, on_reached=None) -> int:
    """Call ``on_done(failure)`` on a VM worker once the work on ``reads`` / ``writes`` (tensors) is done.

    ``failure`` is the first failure among what ``writes`` hold (a kernel that failed),
    else None.  ``on_reached()``, if given, runs once, before ``on_done``: when the VM got to the
    first callback (see the module docstring).  Returns how many callbacks were issued (0: nothing
    to wait for, and both have already run on the calling thread).
    """
    modes: dict[int, tuple] = {}   # storage id -> (blob, modifier)
    for tensor in writes:
        blob = tensor._blob
        modes.setdefault(blob.storage.id, (blob, "const"))
    for tensor in reads:
        blob = tensor._blob
        modes[blob.storage.id] = (modes.get(blob.storage.id, (blob,))[0], "mut")
    written = [t._blob for t in writes]
    if not modes:
        if on_reached is not None:
            on_reached()
        on_done(None)
        return 0
    remaining = [len(modes)]
    reached = [on_reached is None]
    errors: list = []
    lock = threading.Lock()

    def callback(ep_stream, blob):   # on a VM worker, in stream order
        with lock:
            first, reached[0] = not reached[0], True
        if first:
            on_reached()
        try:
            if blob.device.device_type is not DeviceType.cpu:
                ep_stream.sync()   # the kernels queued before this point have run
        except Exception as error:  # noqa: BLE001 - a kernel failed; reported through on_done
            errors.append(error)
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            on_done(first_failure(written) or (errors[0] if errors else None))

    def build(builder):
        for blob, modifier in modes.values():
            builder.access_blob_by_callback(blob, callback, modifier, name=name)

    _vm.run(build)
    return len(modes)
