"""Backward: from the loss's gradient to every leaf's ``.grad`` (PyTorch's engine, in a page).

1. **Graph**: from the roots' nodes, follow the edges and count, for every node,
   how many edges lead into it (its dependencies).
2. **Order**: a node runs once every node that feeds it a gradient has run
   (Kahn's algorithm over the counts); its output gradients are the sums of
   what arrived.  A missing output gradient is zeros.
3. **Rules**: ``node.rule(node, grads)`` returns one gradient per input (None
   for inputs that need none).  The rules are written with the public ops, so
   every gradient is computed by ordinary VM instructions on the same streams
   as the forward (a trace shows them).  Grad mode is off while they run,
   unless ``create_graph`` asks to record them (for gradients of gradients).
4. **Leaves**: ``AccumulateGrad`` adds the gradient into ``leaf.grad`` (in place,
   after the first: the same tensor across backwards, as in PyTorch).  The first
   gradient becomes ``.grad`` as it is when the engine alone holds it (a rule made its
   memory and shares it with no other gradient: ``_owned``), else a copy of it, as
   PyTorch's AccumulateGrad steals a gradient nobody else holds.  Then it calls the
   leaf's ``register_post_accumulate_grad_hook`` hooks with the leaf (data parallel's
   all-reduce starts there: ``pyflow/nn/parallel.py``); a global
   leaf's gradient is boxed to the *dual* SBP of the leaf (B <-> P, S stays S),
   OneFlow's convention: a broadcast parameter's gradient is a partial sum,
   all-reduced when the optimizer uses it.
5. Unless ``retain_graph``, every node visited frees its saved tensors: a second
   backward through it is an error that says so.
"""

from __future__ import annotations

import collections

from pyflow.autograd.graph import AccumulateGrad, edge_of, meta, requires_grad, zeros_at
from pyflow.autograd.mode import is_grad_enabled, set_grad_enabled
from pyflow.errors import AutogradError, ShapeError
from pyflow.framework.op_registry import NO_BACKWARD
from pyflow.ops.to_global import dual_sbp
from pyflow.vm.eager_blob_object import storage_mark

__all__ = ["run_backward"]


def _check_gradient(root, grad, index: int):
    from pyflow.framework.creation import ones_like
    from pyflow.framework.interpreter import global_interpreter
    from pyflow.framework.sbp import SbpParallel

    if grad is None:
        if root.numel() != 1:
            raise AutogradError(f"backward: output {index} ({root.dtype}{list(root.shape)}) is not a scalar; "
                                "grad can be implicitly created only for scalar outputs: pass gradient= "
                                "(a tensor of the output's shape)")
        if root._global is not None:
            # B ones, filled on every rank with nothing sent: a P loss's gradient is B (dual_sbp), and
            # B's pieces split along the batch again where the backward needs it with no collective
            # (ones_like would keep P: a broadcast to make it and a reduce-scatter to split it)
            broadcast = (SbpParallel("broadcast"),) * len(root.sbp)
            return global_interpreter().full(tuple(root.shape), 1, root.dtype, root.placement, broadcast)
        return ones_like(root)
    if tuple(grad.shape) != tuple(root.shape):
        raise ShapeError(f"backward: the gradient {grad.dtype}{list(grad.shape)} for output {index} does not have "
                         f"its shape {list(root.shape)}")
    return grad


def accumulate(leaf, grad, owned: bool = False) -> None:
    """Add ``grad`` into ``leaf.grad`` (boxed to the dual SBP for a global leaf); ``owned``: nobody but the
    engine holds ``grad`` or its memory (``_owned``), so it may become ``.grad`` with no copy."""
    info = meta(leaf)
    if leaf._global is not None and grad._global is not None:
        grad = grad.to_global(leaf.placement, dual_sbp(leaf.sbp))
        owned = False
    if grad.dtype != leaf.dtype:
        grad = grad.to(dtype=leaf.dtype)
        owned = grad._global is None   # (a new tensor of its own)
    if info.grad is None:
        # .grad must be the leaf's own, writable memory (zero_grad zeroes it, later backwards add): a gradient
        # someone else holds is copied (a rule may hand one tensor to several inputs, as add's does, or a
        # view, as sum's expand; the caller's ``gradient=``), one the engine alone holds is taken as it is
        # (PyTorch's AccumulateGrad steals it too): a Linear's weight gradient is not copied at every step
        keep = owned and not is_grad_enabled() and grad._global is None and grad._blob.covers_storage()
        info.grad = grad if keep else grad.clone()
    elif is_grad_enabled() or not info.grad.is_contiguous():   # create_graph: the sum is recorded
        info.grad = info.grad + grad
    else:
        info.grad.add_(grad)   # in place: .grad stays the same tensor across backwards, as in PyTorch
    if info.post_accumulate_hooks:
        for hook in list(info.post_accumulate_hooks.values()):
            hook(leaf)


def run_backward(roots, grads, retain_graph: bool, create_graph: bool, wanted=None) -> dict:
    """Propagate ``grads`` from ``roots``; with ``wanted`` (tensors), return their gradients instead
    of accumulating into leaves (``flow.autograd.grad``)."""
    starts = []
    for i, (root, grad) in enumerate(zip(roots, grads)):
        if not requires_grad(root):
            raise AutogradError(f"backward: output {i} ({root.dtype}{list(root.shape)}) does not require grad and "
                                "has no grad_fn: no op that made it had an input with requires_grad=True")
        starts.append((edge_of(root), _check_gradient(root, grad, i)))
    wanted_edges = {} if wanted is None else {edge_of(t): k for k, t in enumerate(wanted)}
    found = [None] * (0 if wanted is None else len(wanted))

    # 1. the graph: dependencies of every node reachable from the roots
    deps = collections.Counter()
    seen, stack = set(), [edge[0] for edge, _ in starts]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for edge in node.edges:
            if edge is not None:
                deps[edge[0]] += 1
                stack.append(edge[0])

    # 2-4. run the nodes in dependency order
    pending: dict = collections.defaultdict(dict)  # node -> {output_nr: (summed gradient, the engine alone holds it)}

    def deliver(edge, grad, owned: bool = False) -> None:
        node, nr = edge
        if edge in wanted_edges:
            k = wanted_edges[edge]
            found[k] = grad if found[k] is None else found[k] + grad
            owned = False   # (``found`` holds it too)
        slot = pending[node]
        slot[nr] = (grad, owned) if nr not in slot else (slot[nr][0] + grad, True)   # a sum: a new tensor

    for edge, grad in starts:
        deliver(edge, grad)   # (the caller's ``gradient=`` is the caller's)
    ready = collections.deque(node for node in {e[0] for e, _ in starts} if deps[node] == 0)
    with set_grad_enabled(create_graph):
        while ready:
            node = ready.popleft()
            arrived = pending.pop(node, {})
            if isinstance(node, AccumulateGrad):
                leaf = node.leaf()
                if leaf is not None and wanted is None and 0 in arrived:
                    accumulate(leaf, *arrived[0])
                continue
            # the memory of the arrived gradients only the engine holds: a view rule's result over it is still owned
            handed = {grad._blob.storage.id for grad, own in arrived.values() if own}
            arrived = {nr: grad for nr, (grad, _) in arrived.items()}
            for nr, tensor_ref in node.retained.items():  # non-leaf tensors that called retain_grad()
                t = tensor_ref()
                if t is not None and nr in arrived:   # a copy, as in PyTorch: its own memory, contiguous
                    info = meta(t)
                    info.grad = arrived[nr].clone() if info.grad is None else info.grad + arrived[nr]
            mark = storage_mark()
            input_grads = _run_rule(node, arrived)
            if not retain_graph:
                node.free()
            owned = _owned(input_grads, mark, handed)
            for edge, grad, own in zip(node.edges, input_grads, owned):
                if edge is None:
                    continue
                if grad is not None:
                    deliver(edge, grad, own)
                deps[edge[0]] -= 1
                if deps[edge[0]] == 0:
                    ready.append(edge[0])
    return found


def _owned(grads: list, mark: int, handed: set) -> list:
    """Per gradient a rule returned (its run began at ``storage_mark()`` ``mark``): does the engine alone hold it?
    Yes for a local tensor over memory the rule made (a storage newer than ``mark``) or over the memory of an
    arrived gradient the engine alone held (``handed``: storage ids; a view's rule hands on a view of it), that
    no other gradient of the list shares (a rule handing one tensor, or two views of one, to two inputs).  No
    for an arrived gradient someone else holds, a saved tensor, and a lazy tensor (no memory: ``nn.Graph.build``)."""
    def memory(g):
        blob = getattr(g, "_blob", None)
        return None if blob is None or g._global is not None else blob.storage
    storages = [memory(g) for g in grads]
    counts = collections.Counter(id(m) for m in storages if m is not None)
    return [m is not None and (m.id > mark or m.id in handed) and counts[id(m)] == 1 for m in storages]


def _run_rule(node, arrived: dict) -> list:
    if node.rule is NO_BACKWARD:
        raise AutogradError(f"op {node.op_name!r} has no backward rule: its inputs cannot get a gradient through it")
    grads = [arrived.get(k) for k in range(node.n_outputs)]
    if all(g is None for g in grads):
        return [None] * len(node.edges)
    grads = [g if g is not None else zeros_at(shape, dtype, place)
             for g, shape, dtype, place in zip(grads, node.output_shapes, node.output_dtypes, node.output_places)]
    result = node.rule(node, grads if node.n_outputs > 1 else grads[0])
    result = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(result) != len(node.edges):
        raise AutogradError(f"the backward rule of {node.op_name!r} returned {len(result)} gradient(s) for "
                            f"{len(node.edges)} input(s)")
    for i, (grad, shape) in enumerate(zip(result, node.input_shapes)):
        if grad is not None and node.edges[i] is not None and tuple(grad.shape) != tuple(shape):
            raise AutogradError(f"the backward rule of {node.op_name!r} gave input {i} a gradient of shape "
                                f"{list(grad.shape)}, not its shape {list(shape)}")
    return result
