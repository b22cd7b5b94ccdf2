# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 2: devices, streams, events and memory (seed 000)
#
# Before an op can run, OneFlow's eager runtime needs four things:
# - a **device** to run it on;
# - a **stream** that orders the work;
# - **events** to order work across streams;
# - **memory**, from a caching allocator.
#
# This tutorial builds each one with pyflow's `pyflow.device` package.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import numpy as np

import pyflow as flow
from pyflow.device import CachingAllocator, Stream, StreamMgr, StreamType, ep
from pyflow.device.stream import need_soft_sync, supports_stream_wait

# %% [markdown]
# ## 1. Devices are interned symbols
#
# `flow.device("cuda:1")` returns *the* object for (cuda, 1): every spelling
# gives the same one, so comparing devices is comparing pointers.

# %%
d = flow.device("cuda:1")
print(repr(d), str(d))
assert d is flow.device("cuda", 1) is flow.device(str(d))

try:
    flow.device("gpu:0")
except flow.errors.DeviceError as error:
    print("DeviceError:", error)

# %% [markdown]
# ## 2. Streams are symbols with a dense id
#
# A `Stream` says *which device* and *what kind of work*: compute, copies
# host→device or device→host, collectives, and so on.  `StreamMgr` numbers
# streams in creation order.  The VM uses this `unique_stream_id` as an index.
# Stream traits decide how two streams are synchronised (SoftSyncStream, issue 4).

# %%
compute = Stream.new("cuda:0", StreamType.compute)
h2d = Stream.new("cuda:0", StreamType.host2device)
print(compute, h2d, "ids:", compute.unique_stream_id, h2d.unique_stream_id)
assert StreamMgr.stream_for_id(h2d.unique_stream_id) is h2d
for st in (StreamType.compute, StreamType.host2device, StreamType.critical_section):
    print(f"  {st.name:17} need_soft_sync on cuda: {need_soft_sync(st, flow.DeviceType.cuda)!s:5} "
          f"stream wait on cuda: {supports_stream_wait(st, flow.DeviceType.cuda)}")

# %% [markdown]
# ## 3. ep streams and events: ordering work across streams
#
# The *ep* (execution provider) layer does the work.  Here CUDA is emulated:
# each ep stream is a worker thread running its tasks in order.  We add seeded
# random delays, so the two streams race.
#
# A producer stream writes an array and a consumer stream copies it.  Without
# an event the consumer may run first and copy stale data.  With
# `record_event` on the producer and `wait_event` on the consumer it cannot.


# %%
def trial(use_event: bool, seed: int) -> bool:
    with ep.emulation(max_delay=0.003, seed=seed):
        cuda0 = ep.get_device("cuda:0")
        producer, consumer = cuda0.create_stream("producer"), cuda0.create_stream("consumer")
    data, copy = np.zeros(4), np.zeros(4)
    event = cuda0.create_event()
    producer.launch(lambda: data.__setitem__(slice(None), 7.0), name="write")
    if use_event:
        producer.record_event(event)
        consumer.wait_event(event)
    consumer.launch(np.copyto, copy, data, name="copy")
    consumer.sync()
    producer.sync()
    cuda0.destroy_stream(producer)
    cuda0.destroy_stream(consumer)
    return bool((copy == 7.0).all())


with_event = sum(trial(True, seed) for seed in range(10))
without_event = sum(trial(False, seed) for seed in range(10))
print(f"right answers with the event: {with_event}/10, without: {without_event}/10")
assert with_event == 10

# %% [markdown]
# ## 4. The caching allocator
#
# Asking the device for memory (cudaMalloc) is slow, so OneFlow's BinAllocator
# buys big *blocks* and cuts them into *pieces*:
# - **bins:** free pieces are kept in 20 power-of-two bins;
# - **split:** a piece much larger than the request is split;
# - **merge:** free neighbours merge back together;
# - **shrink:** `shrink()` returns blocks that are entirely free.

# %%
cuda0 = ep.get_device("cuda:0")
allocator = CachingAllocator(cuda0, device="cuda:0")
a = allocator.allocate(1000)      # rounded up to 1024; buys a 2 MiB block
b = allocator.allocate(5000)
print(allocator.describe())
view = cuda0.as_array(a.raw, a.offset, (250,), np.float32)  # what a kernel would receive
print("a kernel sees:", type(view).__name__, view.shape)
allocator.deallocate(a.ptr)
allocator.deallocate(b.ptr)        # neighbours merge back into one free piece
print(allocator.describe())
print("returned by shrink():", allocator.shrink(), "bytes")

# %% [markdown]
# A capacity makes out-of-memory easy to provoke.  The error names the request,
# the device and the allocator's state:

# %%
small = CachingAllocator(cuda0, device="cuda:0", capacity=1 << 20)
try:
    small.allocate(2 << 20)
except flow.errors.OutOfMemoryError as error:
    print("OutOfMemoryError:", error)
ep.shutdown()  # join every stream worker thread
