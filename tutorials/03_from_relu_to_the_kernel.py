# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 3: from `flow.relu(x)` to the kernel
#
# Calling `flow.relu(x)` runs nothing.  It returns at once with a tensor whose
# values do not exist yet.  On the way, pyflow (like OneFlow's eager runtime):
# 1. looks up the op's definition (**OpDef**);
# 2. infers its **device and stream** and its output shape;
# 3. builds **instructions** and hands them to the **virtual machine** (VM);
# 4. the VM orders them by their **dependences**, and a **worker thread** runs
#    the kernel on the stream.
#
# This tutorial follows one relu through each step.  It then shows how an
# **in-place op** (`x.add_(y)`) becomes a write that the VM orders after every
# earlier reader (WAR) and writer (WAW), how to **trace** the VM, and how to
# **step through** it with a debugger.
#
# Run it as a script (`python tutorials/03_from_relu_to_the_kernel.py`) or open
# it as a notebook with jupytext.  It pokes at internals (`tensor._blob`, the
# interpreter's steps one by one) on purpose.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import importlib.util
import tempfile
import threading
import time
import traceback

import numpy as np

import pyflow as flow
from pyflow.framework.interpreter import (build_op_call, check_out, infer, infer_device_and_stream, infer_logical,
                                         kernel_target, make_outputs)
from pyflow.framework.op_registry import get_op
from pyflow.kernels.registry import get_kernel
from pyflow.vm import InstructionsBuilder

print(flow.backend_description())

# %% [markdown]
# ## 1. The call
#
# A 2x2 tensor on the (simulated) GPU, and its relu.  `flow.relu` returns
# before the kernel has run; printing the result reads the values, and that
# waits.

# %%
x = flow.tensor([[1.0, -2.0], [3.0, -4.0]], device="cuda")
y = flow.relu(x)
print(y.shape, y.dtype, y.device)  # known at once: the op is only issued
print(y)        # the values: this waits for the kernel
assert (y.numpy() == np.array([[1.0, 0.0], [3.0, 0.0]], dtype=np.float32)).all()

# %% [markdown]
# ## 2. The OpDef: what the interpreter knows about relu
#
# `flow.relu(x)` is `interpreter.apply("relu", [x])`.  `apply` looks the op up
# in the op registry.  An `OpDef` holds the op's shape and dtype inference, the
# name of its kernel, and whether it picks its own stream.
#
# `apply` is a few named steps, each a function of
# `pyflow/framework/interpreter.py`; this tutorial calls them one by one.  The
# first is `infer_logical`: type promotion (the dtype each input has for the
# kernel) and the op's shape and dtype inference.  The global interpreter and
# nn.Graph's tracer run the same step.  Bad input fails here, before anything
# is issued.

# %%
op = get_op("relu")
print("name:", op.name, "| kernel:", op.kernel, "| mutable inputs:", op.mutable_inputs,
      "| own device/stream inference:", op.infer_device_and_stream)
print("infer_logical:", infer_logical(op, [x], {}))
try:
    infer_logical(get_op("matmul"), [x, flow.ones(3, 3, device="cuda")], {})
except flow.errors.ShapeError as error:
    print("ShapeError:", error)
kernel = get_kernel(op.kernel, kernel_target(x.device))
print("the kernel for", kernel_target(x.device), "is", f"{kernel.__module__}.{kernel.__qualname__}")

# %% [markdown]
# ## 3. Device and stream inference
#
# The next step is `infer_device_and_stream`.  relu defines no inference of its
# own, so the default rules apply.  The device is the first input's device.  The
# stream is that device's default stream, (device, compute).  A *stream
# symbol* is an interned description of a stream, and each new one gets a dense
# `unique_stream_id`.  The `copy` op picks its own stream: cpu -> cuda runs on
# the target's host2device stream.

# %%
device, stream = infer_device_and_stream(op, [x], {})
print("device:", device, "| stream symbol:", stream, "| unique_stream_id:", stream.unique_stream_id)
x_cpu = flow.tensor([[1.0, -2.0], [3.0, -4.0]])
copy_device, copy_stream = infer_device_and_stream(get_op("copy"), [x_cpu], {"device": flow.device("cuda")})
print("copy cpu -> cuda runs on:", copy_device, copy_stream.stream_type.name)


# %% [markdown]
# ## 4. The OpCall instruction and its dependences
#
# `apply` ends with a *PhysicalRun* (`pyflow.vm.physical_run`): it builds
# instructions with an `InstructionsBuilder` and hands the list to the VM
# (`vm.receive`).  Below, `op_call` does what `apply` does, with `apply`'s own
# steps, on a builder we hold:
# - `infer` is the two steps above, through a cache keyed by the call's
#   signature (op, input shapes, dtypes, devices, attributes), so a call seen
#   before infers nothing.  Its result also holds the kernel;
# - (`convert_inputs` makes tensors of Python numbers and casts inputs to the
#   kernel's dtype; relu on a float tensor needs neither, so `op_call` skips it)
# - `make_outputs` creates the output tensors, with no memory yet: the VM
#   allocates when it prepares the instruction;
# - `build_op_call` appends the OpCall instruction to the builder.
#
# `physical_run_by_hand` prints the list before the VM receives it.


# %%
def op_call(builder, name, inputs, **attrs):
    """interpreter.apply, appending to ``builder`` instead of starting its own PhysicalRun."""
    op = get_op(name)
    inferred = infer(op, inputs, attrs)  # device, stream, dtypes, output shapes, kernel
    outputs = make_outputs(inferred)  # no memory yet
    build_op_call(builder, inputs, outputs, inferred, attrs)
    return outputs[0]


inferred = infer(op, [x], {})
print("inferred:", inferred.device, inferred.stream, "| input dtypes:", inferred.dtypes,
      "| outputs (shape, dtype, nbytes, strides):", inferred.outputs)


vm = flow.vm.get_vm()


def physical_run_by_hand(build):
    """pyflow.vm.physical_run, spelled out: build the list, print it, hand it to the VM."""
    with vm.build_lock:  # one PhysicalRun at a time
        builder = InstructionsBuilder(vm)
        result = build(builder)
        for instruction in builder.instructions:
            print(f"  {instruction.name:17} on {instruction.stream.name}")
        vm.receive(builder.instructions)
    return builder.instructions, result


# %% [markdown]
# Every tensor storage has a dependence object (`LocalDepObject`).  An
# instruction *reads* its inputs' objects and *writes* its outputs' objects.
# To see an in-edge, we first queue an instruction that writes `x` and then
# blocks (it waits for a `threading.Event`).  Then we issue relu.  relu reads
# `x`, so it gets an in-edge from that writer.

# %%
gate = threading.Event()
flow.vm.run(lambda b: b.access_blob_by_callback(x._blob, lambda ep_stream, blob: gate.wait(), "mut",
                                                name="hold_x"))
(relu,), relu_out = physical_run_by_hand(lambda builder: op_call(builder, "relu", [x]))
deadline = time.monotonic() + 30
while not relu.dispatched and time.monotonic() < deadline:
    time.sleep(0.001)  # the scheduler thread handles it
print("instruction:", relu, "| policy:", relu.policy)
print("reads:", relu.policy.input_dependences(), "| writes:", relu.policy.output_dependences())
print("in-edges:", relu.in_edges)
(hold,) = relu.in_edges
assert hold.name == "hold_x" and not hold.launched and relu.dispatched

# %% [markdown]
# relu is already *dispatched* although `hold_x` has not finished.  An edge
# between two instructions of the **same** vm stream is satisfied once its source
# is dispatched: the worker runs a stream's instructions in order, so relu
# simply queues behind `hold_x`.  From another stream it would wait until
# `hold_x` was released.  Now open the gate:

# %%
gate.set()
print(relu_out)
flow.sync()  # returns once every instruction issued so far is released
print("after flow.sync():", hold, relu)
assert hold.released and relu.released

# %% [markdown]
# ## 5. An in-place op: a write, with WAR and WAW edges
#
# `x.add_(one)` (or `x += one`) is the `add` op with `out=[x]`
# (`interpreter.apply("add", [x, one], out=[x])`).  The OpCall's output is not a
# new tensor but `x`'s own blob, so the instruction **writes** `x`'s storage.
# A write waits for the last writer (WAW) and for every reader since it (WAR):
# a relu issued before the `add_` must read the old values.
#
# `op_call_into` below is `op_call` with an existing output.  `check_out`
# applies PyTorch's rules for writing into it, and `make_outputs` hands back
# `out` itself, since it has the result's shape and dtype.  As in section 4, a
# gate holds an earlier writer of `x`; then we issue a relu that reads `x`, and
# the in-place add.

# %%
def op_call_into(builder, name, inputs, out):
    """apply(name, inputs, out=[out]) in miniature: the OpCall writes ``out``'s blob."""
    op = get_op(name)
    inferred = infer(op, inputs, {})
    check_out([out], inferred)
    (output,) = make_outputs(inferred, [out])
    assert output is out
    build_op_call(builder, inputs, [output], inferred, {})


one = flow.ones(2, 2, device="cuda")
old_x = x.numpy()
gate = threading.Event()
flow.vm.run(lambda b: b.access_blob_by_callback(x._blob, lambda ep_stream, blob: gate.wait(), "mut",
                                                name="hold_x"))
(reader,), relu_of_x = physical_run_by_hand(lambda builder: op_call(builder, "relu", [x]))
(writer,), _ = physical_run_by_hand(lambda builder: op_call_into(builder, "add", [x, one], out=x))
deadline = time.monotonic() + 30
while not writer.dispatched and time.monotonic() < deadline:
    time.sleep(0.001)
print("the add writes:", writer.policy.output_dependences(), "| reads:", writer.policy.input_dependences())
print("its in-edges:", sorted(writer.in_edges, key=lambda i: i.name))
assert {i.name for i in writer.in_edges} == {"hold_x", "relu"}   # WAW from hold_x, WAR from relu
gate.set()
assert (relu_of_x.numpy() == np.maximum(old_x, 0)).all()    # relu read x before the add wrote it
assert (x.numpy() == old_x + 1).all()

# %% [markdown]
# Through the public API the same write is one line, and PyTorch's in-place
# rules are checked at the call: the result must keep `x`'s shape and dtype
# category.  Every write bumps the storage's version counter, which all views
# share (autograd will use it).

# %%
before = x._version
x.add_(one)
x[0] *= 2                    # through a view: the same storage, the same counter
print("x._version:", before, "->", x._version)
try:
    flow.tensor([1, 2], device="cuda").add_(0.5)   # an int tensor cannot hold a float result
except flow.errors.DTypeError as error:
    print("DTypeError:", error)

# %% [markdown]
# ## 6. Streams: symbol, vm stream, worker
#
# The instruction runs on a `VmStream` (OneFlow's vm::Stream), the VM's side of one stream symbol.
# A vm stream has a `ThreadCtx`, the worker thread that computes its
# instructions.  OneFlow has one ThreadCtx per device type (and thread uid), so
# cuda:0's compute and host2device streams share one worker.

# %%
for symbol in (stream, copy_stream):
    vm_stream = vm.get_vm_stream(symbol)
    ctx = vm_stream.thread_ctx
    print(f"symbol {symbol} (unique_stream_id {symbol.unique_stream_id}) -> {vm_stream} -> "
          f"ThreadCtx {ctx.key[0].name}/{ctx.key[1]} (thread {ctx.thread.name if ctx.thread else 'not started'})")
assert vm.get_vm_stream(stream).thread_ctx is vm.get_vm_stream(copy_stream).thread_ctx

# %% [markdown]
# ## 7. SoftSyncStream: a cpu -> cuda copy, then a cuda op
#
# Each storage remembers the stream that last used it.  Before an op on stream
# S, the builder orders every input or output last used on another stream L
# before S:
# - **StreamWait** on S when L and S are on one CUDA device.  The device orders
#   the work and the host does not wait.
# - **RecordEvent** on L otherwise (e.g. L is the cpu).  The consumer waits for
#   it through its in-edge.
#
# Below, one PhysicalRun copies `x_cpu` to cuda and applies relu.  We print the
# instruction list before the VM receives it.

# %%
instructions, relu_of_copy = physical_run_by_hand(
    lambda builder: op_call(builder, "relu", [op_call(builder, "copy", [x_cpu], device=flow.device("cuda"))]))
print(relu_of_copy)
assert [(i.name, i.stream.name) for i in instructions] == [
    ("allocate_tensors", "cuda:0/compute"), ("stream_wait", "cuda:0/host2device"), ("record_event", "cpu:0/compute"),
    ("copy", "cuda:0/host2device"), ("stream_wait", "cuda:0/compute"), ("relu", "cuda:0/compute")]

# %% [markdown]
# Reading the list:
# - `allocate_tensors` on cuda:0/compute: the copy's output is allocated on the
#   stream that owns cuda:0's memory.
# - `stream_wait` on host2device: so the copy waits for that allocation.
# - `record_event` on cpu:0/compute: the copy reads `x_cpu`, last used on the
#   cpu (a no-op event, since the cpu needs no soft sync, but its edge orders the
#   copy after the cpu's work).
# - `copy` on host2device.
# - `stream_wait` on cuda:0/compute: relu reads the copy's output, last used on
#   host2device.
# - `relu` on cuda:0/compute.

# %% [markdown]
# ## 8. A trace: when each instruction waited and ran
#
# `flow.trace.trace()` records, per stream, when each instruction was received,
# dispatched, started and launched.  (`flow.trace` is the module
# `pyflow.trace`; its `trace()` is the context manager.)  It waits for
# the block's work on exit.  `tracer.save(path)` writes a Chrome trace: open it
# at ui.perfetto.dev (or chrome://tracing).  Each stream has a track with its
# compute, and under it *waiting* lanes: "waiting for dependences" (received ->
# dispatched), then "queued on worker" (dispatched -> started).

# %%
with flow.trace.trace() as tracer:
    a = flow.relu(flow.tensor([[1.0, -2.0], [3.0, -4.0]]))
    b = flow.relu(a.to("cuda") - 2.0) * 2.0
    print(b.numpy())
print(tracer.summary())
for r in sorted(tracer.records, key=lambda r: r.received)[:6]:
    print(f"  {r.name:17} #{r.serial:<4} {r.stream:20} waited {r.dependence_wait * 1e6:8.1f} us, "
          f"queued {r.queue_wait * 1e6:8.1f} us, computed {r.compute_time * 1e6:8.1f} us")
out_dir = tempfile.mkdtemp(prefix="pyflow_trace_")
print("Chrome trace written to", tracer.save(os.path.join(out_dir, "relu_trace.json")))
if importlib.util.find_spec("matplotlib") is not None:
    print("timeline drawn to", tracer.plot(os.path.join(out_dir, "relu_trace.png")))
else:
    print("(pip install matplotlib to draw the timeline as a PNG with tracer.plot)")

# %% [markdown]
# ## 9. Stepping through with a debugger
#
# Normally other threads run the kernel: a VM worker, and for cuda also the ep
# stream's thread.  A breakpoint in a kernel then stops on a thread you did not
# step from.  In **step-through mode** the VM runs
# everything on the caller's thread: the scheduling rounds, the compute, and
# the ep streams.  Set `PYFLOW_VM_SYNC=1`, or wrap the code:
#
# ```python
# with flow.vm.sync_mode():
#     breakpoint()          # then step (s) into flow.relu(x) ... down to the kernel
#     y = flow.relu(x)
# ```
#
# A callback instruction shows which thread computes:

# %%
def who_computes(mode_name):
    seen = {}

    def callback(ep_stream, blob):
        seen["thread"] = threading.current_thread().name
        seen["stack"] = [frame.name for frame in traceback.extract_stack()]

    flow.vm.run(lambda b: b.access_blob_by_callback(x._blob, callback, "const", name="who_computes"))
    flow.sync()
    print(f"{mode_name:14} computed on thread {seen['thread']!r}")
    return seen


threaded = who_computes("threaded VM:")
with flow.vm.sync_mode():
    stepped = who_computes("sync mode:")
assert stepped["thread"] == threading.main_thread().name != threaded["thread"]
chain = stepped["stack"]
print("call chain in sync mode:", " -> ".join(chain[chain.index("who_computes"):]))

# %% [markdown]
# In sync mode the callback runs under `flow.vm.run`, inside the caller's own
# call: `physical_run` -> `receive` -> the engine's `schedule` -> `_dispatch`
# -> the stream's `run` -> the policy's `compute`.  A debugger steps along the
# same path from `flow.relu(x)` to the kernel.

# %%
flow.vm.shutdown()  # stop the VM's threads
