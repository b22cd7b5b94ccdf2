"""``flow.nn.parallel.DistributedDataParallel``: data parallel over local tensors, as OneFlow's and PyTorch's.

Each rank keeps a whole replica of the model as ordinary local tensors and trains it on its own
shard of the batch; after every backward the ranks' gradients are averaged, so every replica
takes the same optimizer step and the replicas stay equal.  The other way to train data
parallel in pyflow is the global one (the model's parameters global with SBP B, the batch S(0):
``pyflow/distributed``, and ``nn.Graph``); it runs every op through the global interpreter, where
this runs each rank's ops locally and adds one collective per bucket of gradients.

``DistributedDataParallel(module)`` returns ``module`` itself, with:

1. **Equal replicas.**  At the call, every parameter and buffer takes rank 0's value (a local
   tensor made global with SBP B is broadcast from rank 0: ``distributed/global_tensor.py``).
2. **Buckets.**  The parameters, last first (a backward reaches the last layer's first), are
   grouped into buckets of ``bucket_size`` parameters of one device and dtype.
3. **All-reduce when ready.**  Each parameter's ``register_post_accumulate_grad_hook`` counts it
   in its bucket; when a bucket is complete, and every bucket before it has gone, its gradients
   are flattened into one tensor, all-reduced (a partial sum boxed to broadcast: one collective)
   and divided by the number of ranks; each ``.grad`` becomes its piece of that mean (a view, no copy).  Buckets go in their
   fixed order on every rank, so the ranks' collectives match even if their backwards reach the
   parameters in another order; those of later layers run while the backward goes on.
4. **Every parameter gets a gradient** in every backward (PyTorch's default,
   ``find_unused_parameters=False``): a bucket left incomplete is an error at the next forward,
   naming the parameters that got none, rather than a collective that waits for ever.
5. **Buffers** (``broadcast_buffers``, the default) take rank 0's values again before every forward.

It is meant for eager training (``nn.Graph`` refuses such a module, with a ``GraphError``: a
compiled backward runs no hook, so its gradients would never be averaged; a graph trains data
parallel with global tensors); gradients accumulated over several backwards without
``zero_grad`` are averaged at every backward (PyTorch needs ``no_sync`` for that, which this has
not).  In a world of one rank it changes nothing.

>>> import pyflow as flow
>>> from pyflow import nn
>>> def rank_loss():
...     flow.manual_seed(flow.env.get_rank())   # different initial weights on each rank ...
...     model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1))   # ... rank 0's on both from here
...     x = flow.ones(2, 3) * (flow.env.get_rank() + 1)   # each rank its own shard
...     model(x).sum().backward()
...     return model.weight.grad.tolist()
>>> flow.distributed.run(rank_loss, 2)   # the mean of the ranks' gradients, 2 * 1 and 2 * 2
[[[3.0, 3.0, 3.0]], [[3.0, 3.0, 3.0]]]
"""

from __future__ import annotations

import weakref

from pyflow import env
from pyflow.autograd import no_grad
from pyflow.distributed.global_tensor import make_global, to_local
from pyflow.errors import ArgumentTypeError, DistributedError
from pyflow.framework.placement import placement as Placement
from pyflow.framework.sbp import SbpParallel
from pyflow.framework.movement import cat
from pyflow.nn.module import Module

__all__ = ["DistributedDataParallel", "is_distributed_data_parallel"]

_BROADCAST, _PARTIAL_SUM = (SbpParallel("broadcast"),), (SbpParallel("partial_sum"),)


def DistributedDataParallel(module: Module, *, broadcast_buffers: bool = True, bucket_size: int = 10) -> Module:  # noqa: N802
    """``module`` trained data parallel over this world's ranks (the module docstring): its parameters and
    buffers take rank 0's values now, and each backward averages its gradients over the ranks, ``bucket_size``
    parameters per collective.  Returns ``module``."""
    if not isinstance(module, Module):
        raise ArgumentTypeError(f"DistributedDataParallel: expected a flow.nn.Module, got {type(module).__name__}")
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
        raise ArgumentTypeError(f"DistributedDataParallel: bucket_size must be an int >= 1 (parameters per "
                                f"all-reduce), got {bucket_size!r}")
    params = [p for p in module.parameters() if p.requires_grad]
    if any(t.is_global for t in list(module.parameters()) + list(module.buffers())):
        raise DistributedError("DistributedDataParallel: the module has global parameters or buffers; it trains "
                               "local replicas (a global model is data parallel through its SBP already)")
    if env.get_world_size() == 1:
        return module
    _broadcast_from_rank_0(list(module.parameters()) + list(module.buffers()))
    reducer = _Reducer(params, bucket_size)
    object.__setattr__(module, "forward", _Forward(module, reducer, broadcast_buffers))   # (no submodule)
    object.__setattr__(module, "_ddp_reducer", reducer)
    return module


class _Forward:
    """The module's forward, after the checks of the last backward and the buffers' broadcast.  It holds the
    module weakly (the module holds it: no reference cycle, so a DDP model is freed as soon as it is dropped,
    not whenever the cycle collector runs, with its tensors' releases at a random point of a later op)."""

    def __init__(self, module: Module, reducer: "_Reducer", broadcast_buffers: bool):
        self.module = weakref.ref(module)
        self.own = module.__dict__.get("forward")   # a forward set on the instance before, if any
        self.reducer, self.broadcast_buffers = reducer, broadcast_buffers

    def __call__(self, *args, **kwargs):
        module = self.module()
        self.reducer.check_previous_backward()
        if self.broadcast_buffers:
            _broadcast_from_rank_0(list(module.buffers()))
        return self.own(*args, **kwargs) if self.own is not None else type(module).forward(module, *args, **kwargs)


class _WeakHook:
    """``reducer.accumulated``, holding the reducer weakly (the module holds it strongly)."""

    def __init__(self, reducer: "_Reducer"):
        self.reducer = weakref.ref(reducer)

    def __call__(self, p) -> None:
        reducer = self.reducer()
        if reducer is not None:
            reducer.accumulated(p)


def is_distributed_data_parallel(module: Module) -> bool:
    """Is ``module``, or one of its submodules, averaging its gradients through ``DistributedDataParallel``'s hooks?
    (``nn.Graph`` refuses such a module: its compiled backward runs no hook.)"""
    return any("_ddp_reducer" in m.__dict__ for m in module.modules())


def _placement_of(t) -> Placement:
    return Placement(t.device.type, list(range(env.get_world_size())))


def _broadcast_from_rank_0(tensors: list) -> None:
    """Every rank's ``tensors`` take rank 0's values (in place: optimizers keep their references)."""
    with no_grad():
        for t in tensors:
            t.copy_(to_local(t.to_global(placement=_placement_of(t), sbp=_BROADCAST)))


class _Reducer:
    """The buckets of one DDP module, and which of their parameters this backward has accumulated so far."""

    def __init__(self, params: list, bucket_size: int = 10):
        self.buckets: list = []   # lists of parameters, all-reduced in this order
        for p in reversed(params):
            last = self.buckets[-1] if self.buckets else None
            if last is None or len(last) == bucket_size or (last[0].device, last[0].dtype) != (p.device, p.dtype):
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready: list = [set() for _ in self.buckets]   # per bucket: ids of the parameters accumulated
        self.next = 0   # the next bucket to all-reduce
        hook = _WeakHook(self)   # (the parameters hold the hook, the reducer holds them: weakly, so no cycle)
        for p in params:
            p.register_post_accumulate_grad_hook(hook)

    def accumulated(self, p) -> None:
        """``p``'s gradient is complete for this backward: all-reduce every bucket that is now ready, in order."""
        i = self.bucket_of[id(p)]
        self.ready[i].add(id(p))
        while self.next < len(self.buckets) and len(self.ready[self.next]) == len(self.buckets[self.next]):
            self.all_reduce(self.buckets[self.next])
            self.ready[self.next].clear()
            self.next += 1
        if self.next == len(self.buckets):
            self.next = 0   # every bucket went: the next backward starts again

    def all_reduce(self, bucket: list) -> None:
        """The mean over the ranks of the bucket's gradients, each ``.grad`` a view of it: one collective."""
        grads = [p.grad for p in bucket]
        world = env.get_world_size()
        with no_grad():
            flat = cat([g.reshape(-1) for g in grads]) if len(grads) > 1 else grads[0].reshape(-1)
            shared = make_global(flat, _placement_of(flat), _PARTIAL_SUM, tuple(flat.shape), flat.dtype)
            mean = to_local(shared.to_global(sbp=_BROADCAST)) / world
            offset = 0
            for p, g in zip(bucket, grads):   # each .grad a view of the mean (no copy)
                size = g.numel()
                p.grad = mean.narrow(0, offset, size).reshape(tuple(g.shape))
                offset += size

    def check_previous_backward(self) -> None:
        """A forward after a backward that left a bucket incomplete: say which parameters got no gradient."""
        if self.next == 0 and not any(self.ready):
            return
        missing = [p for bucket, ready in zip(self.buckets[self.next:], self.ready[self.next:])
                   for p in bucket if id(p) not in ready]
        shapes = ", ".join(f"{p.dtype}{list(p.shape)}" for p in missing)
        for ready in self.ready:
            ready.clear()
        self.next = 0
        raise DistributedError(f"DistributedDataParallel: the last backward gave no gradient to {len(missing)} "
                               f"parameter(s) ({shapes}), so their bucket was never all-reduced; every parameter "
                               "must take part in the loss (or set requires_grad=False on those left out)")
