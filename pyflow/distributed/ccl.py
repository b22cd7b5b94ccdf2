"""Collectives as VM instructions: the ``collective`` op on the CPU's ccl stream (seed 000's kCcl stream).

OneFlow runs a collective (NCCL all-reduce, all-gather...) as an instruction on
a stream of type ``ccl``, ordered with the other instructions by the tensors it
reads and writes.  pyflow does the same: ``collective(call, inputs, shape,
dtype, desc)`` issues one OpCall whose kernel is ``call(*input arrays)``, a
transport call (``transport.all_gather(...)``) that returns the output.

* The transport moves host arrays, so a collective's inputs and outputs are
  cpu tensors; boxing copies device tensors to the host and back around it.
* Every collective of a rank runs on one worker thread (cpu, thread uid
  ``CCL_THREAD_UID``), in the order the rank issued them, and on a ccl stream,
  which keeps its instructions in order (a stream-sequential dependence).  The
  sequence number that matches it with the other ranks' is taken when it is
  issued (``transport.next_seq``), on the user's thread, in program order.
* A collective that fails (divergent ranks, a dead rank, the watchdog) fails
  its op: its output raises the error when read, on every rank.  A rank whose
  input failed still shows up (with a ``FailedPiece``), so its peers fail at
  once, naming it, instead of waiting for it.

``exchange(group, desc, payload)`` is the same, for metadata the caller needs
at once (the local shapes of a local -> global conversion): it waits.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from pyflow import env, vm
from pyflow.device import Device, Stream, StreamType
from pyflow.distributed.transport import CollectiveDesc
from pyflow.framework.interpreter import apply
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OP_REGISTRY, OpDef, TensorMeta, register_op
from pyflow.vm.failure import issue_site
from pyflow.vm.policies import InstructionPolicy

__all__ = ["CCL_THREAD_UID", "ccl_stream", "collective", "exchange", "describe_call"]

CCL_THREAD_UID = 3  # the rank's collective worker (uids 0-2 are taken: see pyflow/device/stream.py)


@functools.cache
def ccl_stream() -> Stream:
    """The stream every collective of a rank runs on (an interned symbol, so looked up once)."""
    return Stream.new(Device("cpu"), StreamType.ccl, thread_uid=CCL_THREAD_UID)


def _infer(inputs, attrs):
    return [TensorMeta(tuple(attrs["shape"]), np.dtype(attrs["dtype"]))]


def _device_and_stream(inputs, attrs):
    return Device("cpu"), ccl_stream()


class CollectiveCall:
    """One collective call, the op's ``call`` attribute: its transport call, its descriptor, and how to
    abandon it (``Transport.abandon``).

    Every call has its own (its sequence number, its closure), so it must never be a key of the
    interpreter's inference cache: a hit would hand the cached first call's transport call to the
    kernel, and every call would add a key no later call meets (the cache filling up, then cleared for
    every op).  Unhashable, it keeps the collective out of the cache (``interpreter._signature``).
    """

    __slots__ = ("transport_call", "desc", "abandon")
    __hash__ = None

    def __init__(self, transport_call, desc: CollectiveDesc, abandon):
        self.transport_call, self.desc, self.abandon = transport_call, desc, abandon


def _launch(kernel, outputs, inputs, attrs, stream):
    this_call = attrs["call"]
    result = this_call.transport_call(*inputs)
    out = outputs[0]
    if tuple(result.shape) != tuple(out.shape):
        raise RuntimeError(f"collective {this_call.desc.describe()}: the transport returned shape "
                           f"{tuple(result.shape)}, expected {tuple(out.shape)}")
    out[...] = result


def _abandon(attrs, failure) -> None:
    """An input failed: still show up at the collective, so the peers fail too instead of waiting."""
    attrs["call"].abandon(f"its input failed: {failure.describe()}")


if "collective" not in OP_REGISTRY:
    register_op(OpDef("collective", _infer, kernel="", launch=_launch, infer_device_and_stream=_device_and_stream,
                      kernel_attrs=("call",), on_failed_inputs=_abandon, sbp_signatures=BROADCAST_ONLY,
                      backward=NO_BACKWARD,
                      doc="a transport call (all-gather, all-reduce...) on the cpu ccl stream"))


def describe_call(op: str, shape, dtype, detail: str = "") -> CollectiveDesc:
    """The descriptor every rank of a collective must agree on, with the user's line."""
    return CollectiveDesc(op, shape, str(np.dtype(dtype)) if dtype else "", detail, issue_site())


def collective(call, inputs, shape, dtype, desc: CollectiveDesc, group: tuple, seq: int):
    """Issue ``call(*arrays of inputs) -> array of shape/dtype`` as one collective instruction.

    ``group`` and ``seq`` are the collective's: if an input fails, the rank still takes part
    (``Transport.abandon``), so its peers' collectives fail instead of waiting for it.
    """
    transport = env.current().transport
    inputs = [x if x.device.type == "cpu" else x.to("cpu") for x in inputs]
    this_call = CollectiveCall(call, desc, lambda reason: transport.abandon(group, seq, desc, reason))
    return apply("collective", inputs, shape=tuple(shape), dtype=np.dtype(dtype), call=this_call)[0]


class PayloadExchange(InstructionPolicy):
    """Run ``fn()`` (``exchange``'s transport call) on the ccl worker, in order with the rank's collectives.

    The order is a stream-sequential write.  Not a boxing step (``boxing_steps.Exchange`` moves a
    tensor's pieces): this one moves the Python payloads of ``exchange``.
    """

    name = "payload_exchange"

    def __init__(self, fn, vm_stream):
        self.fn, self._sequential = fn, vm_stream.schedule_dep

    @property
    def stream_sequential_dependence(self):
        return self._sequential

    def compute(self, instruction) -> None:
        self.fn()


def exchange(group: tuple, desc: CollectiveDesc, payload) -> list:
    """Every rank of ``group`` contributes ``payload`` (any Python value); all payloads, in order.

    Runs in order with the rank's other collectives (on the ccl worker) and waits for it.
    """
    transport = env.current().transport
    group = tuple(group)
    seq = transport.next_seq(group)
    box, done = {}, threading.Event()

    def run():
        try:
            box["payloads"] = transport.exchange(group, seq, desc, payload)
        except BaseException as error:  # noqa: BLE001 - raised in the caller below
            box["error"] = error
        finally:
            done.set()

    machine = vm.get_vm()
    stream = ccl_stream()
    vm.run(lambda builder: builder._append(stream, PayloadExchange(run, machine.get_vm_stream(stream))))
    machine.wait_until(done.is_set, f"exchange {desc.describe()}", drive=machine.sync_mode)
    if "error" in box:
        raise box["error"]
    return box["payloads"]
