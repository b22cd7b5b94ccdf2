"""The floor of an eager op in Python: seed 002's path with nothing on it but the path itself.

``bench_eager_ops.py`` compares pyflow's eager VM with PyTorch's C++ dispatcher.
This module answers the other question a reader of that ratio asks: how fast
could *any* Python VM with the seed's stages be?  It is the leanest such VM we
could write, every stage one short function or class:

    interpreter (signature cache) -> builder (one Instruction) -> engine
    (dependence edges, ready list) -> stream policy (allocate, run) -> kernel (numpy)

and memory given back when the last tensor dies (a per-size free list, the
releases batched into the next op, as pyflow batches ReleaseTensor).

What it leaves out, on purpose, is everything pyflow's VM must also do: no
threads (it runs each instruction at once, like step-through mode), no
failure semantics (no failed blobs, no sites of the user's line, no Ctrl-C
safe points), one stream (no SoftSyncStream), no back pressure, no
tracing marks, no fusion, no barriers, no inference checks beyond a cache
lookup, no autograd or global-tensor hooks.  So its time per op is a lower
bound for pyflow's, not a target pyflow could reach by tuning.

    >>> value, buffers = floor_chain(8, 4)
    >>> value.tolist() == numpy_chain_value(8, 4).tolist(), buffers <= 4
    (True, True)
"""

from __future__ import annotations

import collections
import math
import time

import numpy as np

__all__ = ["floor_chain", "floor_seconds", "numpy_chain_value"]

STEPS = ("add", "relu", "mul", "exp")


class Dependence:
    """Who wrote a storage last, and who read it since (seed 002's LocalDepObject, minus forgetting)."""

    __slots__ = ("last_write", "reads")

    def __init__(self):
        self.last_write, self.reads = None, []


class Storage:
    __slots__ = ("nbytes", "buffer", "dep")

    def __init__(self, nbytes: int):
        self.nbytes, self.buffer, self.dep = nbytes, None, Dependence()


class Instruction:
    __slots__ = ("kernel", "inputs", "outputs", "waits", "successors", "done")

    def __init__(self, kernel, inputs, outputs):
        self.kernel, self.inputs, self.outputs = kernel, inputs, outputs
        self.waits, self.successors, self.done = 0, [], False


class Engine:
    """Dependences into edges on receipt; ``schedule`` runs ready instructions (prepare, compute, done)."""

    def __init__(self):
        self.ready: collections.deque = collections.deque()
        self.free: dict = collections.defaultdict(list)   # nbytes -> buffers (the caching allocator)
        self.buffers_made = 0

    def _wait_for(self, instruction, source) -> None:
        if source is not None and source is not instruction and not source.done:
            instruction.waits += 1
            source.successors.append(instruction)

    def receive(self, instruction) -> None:
        for storage in instruction.inputs:    # read after write
            self._wait_for(instruction, storage.dep.last_write)
            storage.dep.reads.append(instruction)
        for storage in instruction.outputs:   # write after write and after read
            dep = storage.dep
            self._wait_for(instruction, dep.last_write)
            for reader in dep.reads:
                self._wait_for(instruction, reader)
            dep.last_write, dep.reads = instruction, []
        if instruction.waits == 0:
            self.ready.append(instruction)

    def schedule(self) -> None:
        ready = self.ready
        while ready:
            instruction = ready.popleft()
            for storage in instruction.outputs:   # prepare: allocate
                if storage.buffer is None:
                    free = self.free[storage.nbytes]
                    if not free:
                        self.buffers_made += 1
                    storage.buffer = free.pop() if free else np.empty(storage.nbytes // 4, np.float32)
            instruction.kernel(*[s.buffer for s in instruction.inputs], out=instruction.outputs[0].buffer)
            instruction.done = True
            for successor in instruction.successors:
                successor.waits -= 1
                if successor.waits == 0:
                    ready.append(successor)

    def release(self, storages: list) -> None:
        for storage in storages:
            if storage.buffer is not None:
                self.free[storage.nbytes].append(storage.buffer)
                storage.buffer = None
        storages.clear()


ENGINE = Engine()
DEAD: list = []   # storages whose last tensor died since the last op (released by the next one)
KERNELS = {"add": np.add, "mul": np.multiply, "neg": np.negative, "exp": np.exp,
           "relu": lambda x, out: np.maximum(x, 0, out=out)}
INFERRED: dict = {}   # signature -> (kernel, shape, dtype, nbytes)


class Tensor:
    __slots__ = ("shape", "dtype", "storage")

    def __init__(self, shape, dtype, storage):
        self.shape, self.dtype, self.storage = shape, dtype, storage

    def __del__(self):
        DEAD.append(self.storage)

    def __add__(self, other):
        return apply("add", (self, other))

    def __mul__(self, other):
        return apply("mul", (self, other))

    def __neg__(self):
        return apply("neg", (self,))

    def numpy(self) -> np.ndarray:
        ENGINE.schedule()
        return self.storage.buffer.copy()


def apply(name: str, inputs: tuple) -> Tensor:
    """The interpreter: infer (cached per signature), make the output, build one instruction, run."""
    key = (name,) + tuple((t.shape, t.dtype) for t in inputs)
    inferred = INFERRED.get(key)
    if inferred is None:
        shape, dtype = inputs[0].shape, inputs[0].dtype
        inferred = INFERRED[key] = (KERNELS[name], shape, dtype, math.prod(shape) * dtype.itemsize)
    kernel, shape, dtype, nbytes = inferred
    out = Tensor(shape, dtype, Storage(nbytes))
    if DEAD:
        ENGINE.release(DEAD)
    ENGINE.receive(Instruction(kernel, [t.storage for t in inputs], [out.storage]))
    ENGINE.schedule()
    return out


def relu(x: Tensor) -> Tensor:
    return apply("relu", (x,))


def exp(x: Tensor) -> Tensor:
    return apply("exp", (x,))


def tensor(values: np.ndarray) -> Tensor:
    values = np.ascontiguousarray(values, np.float32)
    t = Tensor(values.shape, values.dtype, Storage(values.nbytes))
    t.storage.buffer = values.copy()
    return t


def _chain(n_ops: int, size: int):
    x, y = tensor(np.full(size, 0.5, np.float32)), tensor(np.full(size, 0.25, np.float32))
    start = time.perf_counter()
    for i in range(n_ops):   # bench_eager_ops.py's chain, step for step
        step = STEPS[i % 4]
        x = x + y if step == "add" else relu(x) if step == "relu" else x * y if step == "mul" else exp(-x)
    return time.perf_counter() - start, x


def floor_chain(n_ops: int, size: int):
    """The chain of ``bench_eager_ops.py``; returns (its final value, buffers the allocator ever made)."""
    made = ENGINE.buffers_made
    _, x = _chain(n_ops, size)
    return x.numpy(), ENGINE.buffers_made - made


def floor_seconds(n_ops: int, size: int) -> float:
    """Seconds for the chain of ``n_ops`` ops on ``size``-element tensors."""
    return _chain(n_ops, size)[0]


def numpy_chain_value(n_ops: int, size: int) -> np.ndarray:
    x, y = np.full(size, 0.5, np.float32), np.full(size, 0.25, np.float32)
    for i in range(n_ops):
        step = STEPS[i % 4]
        x = x + y if step == "add" else np.maximum(x, 0) if step == "relu" else x * y if step == "mul" else np.exp(-x)
    return x
