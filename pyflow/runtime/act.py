"""What a task does when its actor acts: OneFlow's kernel call, on the Regsts' blobs.

In OneFlow an actor's ``Act()`` launches its kernels (``AsyncLaunchKernel``) on the blobs of
the regsts it reads and writes.  In pyflow a task's kernel is ``make_act(plan, task)``: a
function ``(ins, outs, j, call) -> list`` over the tensors of its consumed regsts (``ins``,
by slot ``in_0, in_1, ...``) and of its produced ones (``outs``, the regst's memory, or
``None`` where the act supplies it), at micro-batch ``j`` of the call whose ``CallContext``
(``call.py``) it is.  The actor runtime makes one per task when it starts (``act_table``), as
OneFlow's actors build their kernels once; the sequential interpreter (``sequential.py``) runs
the same definitions, so the two always agree.

Each task kind, at micro-batch ``j``:

============  ===========================================================================
compute/copy  the op itself: ``apply(op, inputs, out=[its regsts])`` (the eager op, so
              eager and graph share one definition) at the first act; later acts issue
              the OpCall that first one decided (``PreparedOpCall``: no inference, no
              checks per act); ``view`` (``view_acts.py``): the view of its input (no
              copy: its regst is an alias of the input's, which stays alive while it is read):
              the view op's layout rule and attrs over this rank's piece, its strides included
              (a split piece views its own rows; a view of a view needs no copy)
variable      binds the eager tensor (parameters persist across calls)
input         binds the call's input
unpack        micro-batch j of its input (rows ``j*b .. (j+1)*b``)
repeat        passes its input on (alias)
acc           j = 0: copies its input; later: adds it (the gradient sum over micro-batches)
pack          writes its input into rows ``j*b ..`` of its output
output        a fresh eager tensor with the value (``nn.Graph`` copies it into the tensor it
              handed the caller: its output critical section); its regst is that tensor
tick          nothing
boxing        ``run_boxing_task`` (``pyflow/compiler/boxing_tasks.py``): slice, concat, add...
============  ===========================================================================

**Input-wise tasks** (the compiler's ``is_input_wise``): a boxing ``concat`` and a two-input
boxing ``add`` / ``assemble`` may also be done one input at a time, in any order (``act_input``):
the actor runtime's InputWise actor acts on each piece as it arrives (from another rank, say)
instead of waiting for all of them.  The result is the same bitwise: concat writes disjoint
rows, and with two inputs ``a + b == b + a``.  (OneFlow's ReduceAdd sums any number of pieces
in arrival order; pyflow keeps three or more in a fixed order, so its numbers never depend on
timing.)
"""

from __future__ import annotations

import copy

from pyflow.autograd import no_grad
from pyflow.compiler.boxing_tasks import run_boxing_task
from pyflow.distributed.global_tensor import make_global, to_local
from pyflow.framework.args import device as checked_device
from pyflow.framework.dtypes import is_scalar, to_scalar
from pyflow import vm
from pyflow.framework.interpreter import apply, build_op_call, copy_overlapping_inputs, infer, make_outputs
from pyflow.framework.op_registry import get_op
from pyflow.framework.tensor import Tensor, tensor
from pyflow.runtime.call import CallContext
from pyflow.runtime.view_acts import made_by_view, make_view_act, viewing_act

__all__ = ["act", "make_act", "act_table", "act_input", "produced_regsts", "PreparedOpCall", "issues_nothing",
           "quiet_tasks"]


def produced_regsts(plan, task) -> list:
    """The data regsts ``task`` produces, ``out_0, out_1, ...`` (its ctrl regsts left out)."""
    found, i = [], 0
    while f"out_{i}" in task.produced:
        found.append(plan.regsts[task.produced[f"out_{i}"]])
        i += 1
    return found


def act(plan, task, ins: dict, outs: list, j: int, call: CallContext) -> list:
    """One act of ``task`` at micro-batch ``j`` (the table in the module docstring).

    ``ins`` maps ``"in_0"``... to the tensors of the regsts it consumes; ``outs`` holds,
    per produced regst, the tensor its memory is (planned regsts) or ``None``.  Returns
    the tensor each produced regst is after this act (for an alias, variable or input
    regst: the tensor it stands for).  The sequential interpreter and the actor runtime
    both run tasks through this one definition: ``make_act(plan, task)`` (the runtime makes it
    once per task and keeps it; here it is made for the one act).
    """
    return make_act(plan, task)(ins, outs, j, call)


def act_table(plan, tasks, chains=None):
    """An ``act`` for the actor runtime that runs each of ``tasks`` with its ``make_act``, made now, once per
    task: at every act, one dict look-up by task id.  ``chains`` (``fold.fold_views``'s, of ``plan``): a task
    that reads folded view tasks makes their views first (``view_acts.viewing_act``)."""
    acts = {task.task_id: make_act(plan, task) for task in tasks}
    for tid, chain in (chains or {}).items():
        if tid in acts:
            acts[tid] = viewing_act(acts[tid], plan, chain)

    def act_of(plan, task, ins: dict, outs: list, j: int, call: CallContext) -> list:
        return acts[task.task_id](ins, outs, j, call)
    act_of.acts = acts   # an actor whose acts need no issuer calls its own directly (``Actor.quiet_act``)
    return act_of


def issues_nothing(plan, task, fed) -> bool:
    """Does no act of ``task`` ever issue a VM instruction?  A tick, an input, a regst passed on, a variable not
    refilled per call (``fed``: the names of those that are), a view of a regst that is no view (its act only
    makes a layout: a view of a view may have to copy first, the module docstring).  The runtime's timeline
    then needs no issuer for its acts: there is no device work to hear of (``Runtime``)."""
    op_type = plan.op_attrs[task.op_name][0] if task.op_name in plan.op_attrs else None
    if task.kind in ("tick", "input", "repeat") or op_type == "to_global":
        return True
    if task.kind == "variable":
        return task.op_name not in fed
    return op_type == "view" and not made_by_view(plan, task.consumed["in_0"][0])


def quiet_tasks(plan, tasks, feeds) -> set:
    """The ids of ``tasks`` that ``issues_nothing`` (``feeds``: ``(variable name, value function)`` per variable
    refilled per call, as ``CallTemplate.feeds``)."""
    fed = {name for name, _ in feeds}
    return {task.task_id for task in tasks if issues_nothing(plan, task, fed)}


def make_act(plan, task):
    """``task``'s act as a function ``(ins, outs, j, call) -> list``, with what the Plan fixed decided now.

    Which input slot feeds which argument, the op's attributes and keyword arguments, the outputs it writes
    into its inputs (``_out_into``), whether it updates a copy of an input: all of it is the same at every
    act, so the actor runtime asks once per task when it starts (OneFlow's actors hold their kernels) and
    an act only binds this call's tensors and issues its ops.  The tensors the op's Python numbers become
    are made at its first act and reused (``_numbers_as_tensors``), and so is what ``apply`` decides about
    its op (``PreparedOpCall``: later acts issue the OpCall directly).  A task no act can be made for fails
    when it acts (the runtime names the actor then), not when the runtime starts.
    """
    try:
        return _make_act(plan, task)
    except Exception as error:  # noqa: BLE001 - raised by the act, as before acts were made up front
        failed = error   # Python unbinds ``error`` when the except block ends: the act keeps its own name

        def failing(ins, outs, j, call):
            raise failed
        return failing


def _make_act(plan, task):
    op_type, op_inputs, attrs = plan.op_attrs[task.op_name]
    kind, name = task.kind, task.op_name
    site = (f"<nn.Graph {plan.job_name!r}: task {task.task_id}, op {name!r}>", 0)   # what its failures name
    # per argument: ("in_i", None) to take from the consumed regsts, or (None, constant)
    arg_spec = [(f"in_{i}", None) if isinstance(x, str) else (None, x) for i, x in enumerate(op_inputs)]

    def bind(ins: dict) -> list:
        return [ins[key] if key is not None else x for key, x in arg_spec]

    if kind == "tick":
        return lambda ins, outs, j, call: list(outs)
    if kind == "variable":
        fills: dict = {}   # a fed value -> the PreparedOpCall of ``fill`` that writes it (``_prepared_fill``)

        def variable(ins, outs, j, call):
            tensor = to_local(call.variables[name])   # a global variable: this rank's piece
            if name in call.feeds:   # a learning rate, a step count: this call's value
                value = call.feeds[name]
                if not (is_scalar(value) and _fill_prepared(fills, tensor, value)):
                    tensor.fill_(value)   # (checked: the first call, a value that is no number, or one not prepared)
                    if is_scalar(value) and not fills:
                        fills[value] = _prepared_fill(tensor, value, site)
            return [tensor]
        return variable
    if kind == "input":
        index = attrs["index"]
        return lambda ins, outs, j, call: [to_local(call.inputs[index])]
    if kind == "repeat" or op_type == "to_global":   # the same memory, passed on
        return lambda ins, outs, j, call: [bind(ins)[0]]
    if kind == "output":   # a fresh tensor: the regst's memory is the runtime's, the value is the caller's
        index = attrs["index"]
        clone = _Issuer("contiguous", {}, site)   # ``Tensor.clone``, its checks made once (``PreparedOpCall``)

        def output(ins, outs, j, call):
            desc = call.output_layouts.get(index)
            piece = clone([bind(ins)[0]], [])[0]
            call.outputs[index] = piece if desc is None else make_global(piece, *desc)
            return [piece]   # (the output regst is that tensor: its consumers hear once it is written)
        return output
    if kind == "boxing":
        return lambda ins, outs, j, call: [run_boxing_task(op_type, bind(ins), outs[0] if outs else None, attrs)]
    if kind == "unpack":
        def unpack(ins, outs, j, call):
            b = outs[0].shape[0]
            apply("contiguous", [bind(ins)[0].narrow(0, j * b, b)], out=[outs[0]])
            return list(outs)
        return unpack
    if kind == "acc":
        def acc(ins, outs, j, call):
            x = bind(ins)[0]
            if j == 0:
                apply("contiguous", [x], out=[outs[0]])
            else:
                apply("add", [outs[0], x], out=[outs[0]])
            return list(outs)
        return acc
    if kind == "pack":
        def pack(ins, outs, j, call):
            x = bind(ins)[0]
            b = x.shape[0] if x.shape else 1
            apply("contiguous", [x], out=[outs[0].narrow(0, j * b, b).view(*x.shape)])
            return list(outs)
        return pack
    if op_type == "view":   # no VM instruction: the view's regst is an alias of its input's (task_graph.py)
        return make_view_act(plan, task, attrs)
    into = list(attrs.get("_out_into", ()))
    kwargs = {k: v for k, v in attrs.items() if not k.startswith("_")}
    n_in = len(op_inputs) - len(into)
    into_arg = {i: n_in + into.index(i) for i in into}   # output i written into that argument (a variable)
    k = get_op(op_type).updates_input
    # the Python numbers among the op's arguments: made into tensors at the first act, then reused
    constants = {"pending": any(key is None and is_scalar(x) for key, x in arg_spec), "made": None}
    issue, copy = _Issuer(op_type, kwargs, site), _Issuer("contiguous", {}, site)

    def compute(ins, outs, j, call):
        args = [ins[key] if key is not None else x for key, x in arg_spec]   # (``bind``, inlined: every act)
        targets = [args[into_arg[i]] if i in into_arg else outs[i] for i in range(len(outs))] if into_arg else outs
        if k is not None and targets:   # the op writes only parts of input k: it starts as a copy of it
            copy([args[k]], [targets[0]])
            args[k] = targets[0]
        inputs = args[:n_in]
        if constants["pending"]:
            constants["pending"] = False
            with no_grad():
                constants["made"] = _numbers_as_tensors(op_type, inputs, kwargs)
        if constants["made"] is not None:
            inputs = [made if made is not None else x for x, made in zip(inputs, constants["made"])]
        results = issue(inputs, targets)
        return list(results) if results is not None else list(outs)
    return compute


class _Issuer:
    """One op of a compute task, issued at every act: the first act through ``apply`` (under ``no_grad``: the
    Plan holds its backward already, nothing is recorded for autograd), which checks it; every later act
    through the ``PreparedOpCall`` that first act allows, where it allows one (issued at ``site``, the task's)."""

    def __init__(self, op_type: str, kwargs: dict, site: tuple):
        self.op_type, self.kwargs, self.site = op_type, kwargs, site
        self.first, self.prepared = True, None

    def __call__(self, inputs: list, targets: list) -> list:
        """``apply(op_type, inputs, out=targets or None, **kwargs)``: the op's outputs."""
        prepared = self.prepared
        if prepared is not None:
            results = prepared(inputs, targets)
            if results is not None:
                return results
        with no_grad():
            results = apply(self.op_type, inputs, out=targets or None, **self.kwargs)
        if self.first:   # (after the first act: the call passed apply's checks)
            self.first = False
            self.prepared = PreparedOpCall.of(get_op(self.op_type), inputs, targets, self.kwargs, self.site)
        return results


_FILLS_KEPT = 8   # fed values of one variable whose fill is prepared (a learning rate takes a few values)


def _prepared_fill(tensor: Tensor, value, site: tuple):
    """The ``PreparedOpCall`` of ``tensor.fill_(value)`` (the ``fill`` op ``fill_`` applies, into ``tensor``), made
    after one ``fill_`` checked it: a variable refilled with a feed's value before every call (the learning rate)
    issues its fill as a compute task issues its op, not through ``apply`` each time.  None: not preparable."""
    attrs = dict(shape=tensor.shape, dtype=tensor.dtype, value=to_scalar(value, tensor.dtype, "fill_"),
                 device=tensor.device)
    return PreparedOpCall.of(get_op("fill"), [], [tensor], attrs, site)


def _fill_prepared(fills: dict, tensor: Tensor, value) -> bool:
    """Fill ``tensor`` with the number ``value`` through a ``PreparedOpCall`` of ``fill`` (``fills``: value -> the
    prepared fill, the first made by ``_prepared_fill`` after one checked ``fill_``); False where none applies
    (nothing issued: ``fill_`` does it).  A value not seen before takes the first one's call with its own value
    (``_refill``): a step count, new at every call, is issued as a learning rate is, not through ``apply``."""
    fill = fills.get(value)
    if fill is None:
        first = next(iter(fills.values()), None)
        if first is None:
            return False
        fill = _refill(first, tensor, value)
        if fill is None:
            return False
        if len(fills) < _FILLS_KEPT:
            fills[value] = fill
    return fill([], [tensor]) is not None


def _refill(prepared: "PreparedOpCall", tensor: Tensor, value):
    """``prepared`` (a ``fill`` of ``tensor``) with ``value`` instead: a fill's inference depends on its value only
    through the kernel's ``value`` attribute (the output is ``tensor``'s shape, dtype and device), so the first
    value's inference serves, with ``value`` converted as ``fill_`` converts it.  None: ``value`` does not convert
    (``fill_`` raises the error)."""
    try:
        value = to_scalar(value, tensor.dtype, "fill_")
    except Exception:  # noqa: BLE001 - fill_ raises it, with its own message
        return None
    inferred = copy.copy(prepared.inferred)
    inferred.kernel_attrs = dict(inferred.kernel_attrs, value=value)
    return PreparedOpCall(prepared.op, inferred, dict(prepared.attrs, value=value), prepared.signature, prepared.site)


_LAYOUTS_KEPT = 64   # layouts of one task's inputs and outputs remembered (cleared when full: a cache)


class PreparedOpCall:
    """One compute task's op call with everything ``apply`` decides per call decided once, at the task's first
    act: the inference (device, stream, kernel dtypes, output metas, the kernel: ``interpreter.Inferred``) and
    the checks of its outputs.  An act then only makes its new outputs (none where it writes its regsts) and
    issues the OpCall, as OneFlow's actors hold their kernels and call them with no interpretation.

    The Plan fixes each regst's shape, dtype and device, so every act has the first act's signature; an act
    whose tensors differ anyway (a parameter given another dtype by hand) is left to ``apply`` (``None``).  Calls
    ``apply`` would issue more for are never prepared: global tensors, a number or a cast to convert, a view, an
    output of another shape or dtype than the result (a cast after the op), an op that updates a copy of an input
    it makes itself (no regst to write).  Its ops are issued, never traced (as on an actor thread): a Plan's call is
    the runtime's work, not part of a ``build`` or a Cocktailer trace around it.  A failure of its op names
    ``site`` (its task), known when it is made: no walk of the stack for the user's line at every act.

    Its OpCall keeps its stream's order (``sequential``), as an in-place op's does: the acts of one stream's
    tasks are issued by one actor thread in an order the Plan's regsts already impose, so the order costs
    nothing, and the VM fuses consecutive ones into one instruction (one dispatch, one run on the worker, one
    release for a run of acts' ops instead of one each: ``pyflow/vm/engine.py``).  An op issued later by
    the caller on that stream that waits for the call can hold back no op the call's outputs need: those
    are issued before ``nn.Graph`` returns (the call's frontier, ``call.py``), and a later act's op only ever
    waits for ops issued before it.
    """

    def __init__(self, op, inferred, attrs: dict, signature: list, site: tuple = ("<pyflow>", 0)):
        self.op, self.inferred, self.attrs, self.signature, self.site = op, inferred, attrs, signature, site
        # the layouts (storage id, offset, strides; shape and dtype are the signature's) of the inputs and outputs
        # an act has seen -> does an input overlap an output (``copy_overlapping_inputs``)?  The regsts' memory
        # is the Plan's, a few views of one chunk, so a handful of layouts repeat at every act: each is decided once
        self.overlaps: dict = {}

    @classmethod
    def of(cls, op, inputs: list, targets: list, attrs: dict, site: tuple = ("<pyflow>", 0)):
        """The prepared call of ``op`` on ``inputs`` writing ``targets`` (empty: new outputs), or None where
        ``apply`` must decide at every act (the class docstring)."""
        tensors = inputs + targets
        if (op.view is not None or not all(isinstance(x, Tensor) for x in tensors)
                or any(x.is_global for x in tensors) or (op.updates_input is not None and not targets)):
            return None
        if "device" in attrs:   # (a source op's device, as ``apply`` reads it)
            attrs = dict(attrs, device=checked_device(attrs["device"], op.name))
        inferred = infer(op, inputs, attrs)   # (the inference cache: what the first act's apply decided)
        if inferred.converts or any(o.shape != meta.shape or o.dtype != meta.dtype
                                    for o, meta in zip(targets, inferred.metas)):
            return None
        return cls(op, inferred, attrs, [(x._blob.shape, x._blob.dtype, x.device) for x in tensors], site)

    def __call__(self, inputs: list, targets: list) -> list | None:
        """Issue the op on ``inputs`` into ``targets`` (empty: new tensors); its outputs, or None (not issued)
        where an input's or output's shape, dtype or device is not the prepared one."""
        layouts = ()
        for x, (shape, dtype, device) in zip(inputs + targets, self.signature):
            blob = x._blob
            storage = blob.storage
            if blob.shape != shape or blob.dtype != dtype or storage.device is not device:
                return None
            # (a storage's ``id`` is its own, never another's after it is freed; a key holds no storage alive)
            layouts += (storage.id, blob.offset, blob.strides)
        inferred, attrs = self.inferred, self.attrs
        if targets:
            overlaps = self.overlaps
            if layouts not in overlaps or overlaps[layouts]:   # (no call where the layouts were seen, overlap-free)
                if len(overlaps) > _LAYOUTS_KEPT:
                    overlaps.clear()
                given = list(inputs)
                copy_overlapping_inputs(self.op, inputs, targets)   # (it replaces an overlapping input by a copy)
                overlaps[layouts] = any(x is not y for x, y in zip(given, inputs))
            outputs = targets
        else:
            outputs = make_outputs(inferred)
        vm.run(lambda builder: build_op_call(builder, inputs, outputs, inferred, attrs, sequential=True), self.site)
        for o in targets:
            o._bump_version()
        return outputs


def _numbers_as_tensors(op_type: str, inputs: list, kwargs: dict) -> list | None:
    """Per input of one call of ``op_type``: the tensor ``apply`` makes of a Python number at every call
    (the number converted to the dtype type promotion gives it, on the op's device: one ``tensor``
    instruction each), made now, once; ``None`` for a tensor.  The whole answer is ``None`` where reusing
    them would not be the same call: the inputs are global (their numbers become global tensors), or the
    op's promotion or inference decides otherwise with a 0-d tensor in place of the number.

    Bit for bit the same values: the same tensor is made as before, only not again at every act.
    """
    if "device" in kwargs or any(isinstance(x, Tensor) and x.is_global for x in inputs):
        return None   # (a ``device`` argument: ``apply`` reads it before it infers; left to ``apply``)
    op = get_op(op_type)
    inferred = infer(op, inputs, kwargs)
    made = [tensor(to_scalar(x, d, op_type), device=inferred.device) if is_scalar(x) else None
            for x, d in zip(inputs, inferred.dtypes)]
    again = infer(op, [m if m is not None else x for x, m in zip(inputs, made)], kwargs)
    same = (again.device, again.dtypes, again.metas) == (inferred.device, inferred.dtypes, inferred.metas)
    return made if same else None


def act_input(plan, task, key: str, x: Tensor, out: Tensor, first: bool) -> None:
    """One act of an input-wise task: input ``key`` (``x``) into ``out``; ``first``: the piece's first act.

    concat: ``x`` into its rows of ``out`` (along the axis, after the inputs before it); add: the first
    input is copied, the second added; assemble: ``out`` zeroed at the first act, ``x`` added into its region.
    """
    op_type, _, attrs = plan.op_attrs[task.op_name]
    i = int(key[len("in_"):])
    if op_type == "concat":
        axis = attrs["axis"]
        start = sum(plan.regsts[task.consumed[f"in_{m}"][0]].shape[axis] for m in range(i))
        apply("contiguous", [x], out=[out.narrow(axis, start, x.shape[axis])])
    elif op_type == "add":
        apply("contiguous", [x], out=[out]) if first else apply("add", [out, x], out=[out])
    elif op_type == "assemble":
        if first:
            out.zero_()
        part = out
        for d, (lo, hi) in enumerate(attrs["regions"][i]):
            part = part.narrow(d, lo, hi - lo)
        apply("add", [part, x], out=[part])
    else:
        raise ValueError(f"task {task.op_name} ({op_type}) cannot act one input at a time")
