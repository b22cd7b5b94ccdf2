"""Elementwise ops: unary math, binary arithmetic, comparisons, logical and bitwise ops, where,
clamp, cast, fill, empty.

Dtypes follow PyTorch: the interpreter casts the inputs named in
``promote_inputs`` to their common dtype (``pyflow/framework/dtypes.py``) before
the kernel runs, so a kernel only ever sees equal dtypes, and the kernel
library's own rules (``kernels/ufuncs.py``) then give the result dtype of that one
dtype.  ``floating`` ops (true division, ``sin``...) compute integers in float32.
Every elementwise op may write the very view it reads (``x.add_(y)``).
Each op's backward rule is below its inference (PyTorch's derivative formulas);
ops with integer or bool results say they have none.

SBP (``elementwise_signatures``, OneFlow's broadcast-elementwise ``GetSbpFn``):
the inputs split along the same output dim give an output split there (an
input broadcast along that dim stays B); the linear ops also keep partial sums
(``_PARTIAL_SUMS``).  ``fill`` and ``empty`` (sources) are broadcast only.

>>> from pyflow.framework.op_registry import get_op
>>> [str(sig) for sig in get_op("mul").sbp_signatures([(2, 3), (3,)], [(2, 3)], {})]
['(S(0), B) -> S(0)', '(S(1), S(0)) -> S(1)', '(P, B) -> P', '(B, P) -> P']
"""

from __future__ import annotations

from pyflow.errors import DTypeError, ShapeError
from pyflow.framework import args
from pyflow.framework.dtypes import BOOL, as_dtype, to_scalar
from pyflow.framework.functional import where
from pyflow.framework.op_registry import BROADCAST_ONLY, NO_BACKWARD, OpDef, TensorMeta, register_op
from pyflow.framework.sbp import B, P, S, Signature
from pyflow.kernels.elementwise import binary_result_dtype, unary_result_dtype
from pyflow.kernels.layout import broadcast_shapes
from pyflow.ops.grad_rules import for_inputs

__all__ = ["FLOAT_UNARY", "UNARY_OPS", "BINARY_OPS", "COMPARISONS", "LOGICAL_OPS", "elementwise_signatures"]

FLOAT_UNARY = ("sigmoid", "tanh", "exp", "log", "sqrt", "sin", "cos")      # integers compute in float32
UNARY_OPS = FLOAT_UNARY + ("neg", "abs", "relu", "floor", "ceil", "round", "sign", "isnan", "isinf",
                           "logical_not", "bitwise_not")
BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "floor_divide", "remainder",
              "bitwise_and", "bitwise_or", "bitwise_xor")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL_OPS = ("logical_and", "logical_or", "logical_xor")   # any dtypes, no promotion (as torch)


def _unary(name):
    def infer(inputs, attrs):
        (x,) = inputs
        return [TensorMeta(x.shape, unary_result_dtype(name, x.dtype))]
    return infer


def _binary(name):
    def infer(inputs, attrs):
        a, b = inputs
        return [TensorMeta(broadcast_shapes(a.shape, b.shape, op=name), binary_result_dtype(name, a.dtype, b.dtype))]
    return infer


def _infer_where(inputs, attrs):
    cond, a, b = inputs
    if cond.dtype != BOOL:
        raise DTypeError(f"where: the condition must be bool, got {cond.dtype}")
    return [TensorMeta(broadcast_shapes(cond.shape, a.shape, b.shape, op="where"), a.dtype)]


def _infer_clamp(inputs, attrs):
    x, *bounds = inputs
    for bound in bounds:
        if not args.broadcasts_to(bound.shape, x.shape):
            raise ShapeError(f"clamp: a bound of shape {list(bound.shape)} does not broadcast to the input's "
                             f"shape {list(x.shape)}")
    for kind in attrs["bounds"]:   # "min" runs the max kernel and "max" the min kernel: both check the dtype
        binary_result_dtype("max" if kind == "min" else "min", x.dtype, x.dtype)
    return [TensorMeta(x.shape, x.dtype)]


def _launch_clamp(kernels, outputs, inputs, attrs, stream):
    """``out = min(max(x, low), high)``, two kernels in one instruction (the second reads ``out``)."""
    maximum, minimum = kernels
    (out,), (source, *bounds) = outputs, inputs
    for kind, bound in zip(attrs["bounds"], bounds):
        (maximum if kind == "min" else minimum)(out, source, bound, stream=stream)
        source = out


def _infer_cast(inputs, attrs):
    return [TensorMeta(inputs[0].shape, as_dtype(attrs["dtype"], "cast"))]


def _infer_source(name):
    """``fill`` / ``empty``: a new tensor of attrs shape and dtype (and for fill a value that converts)."""
    def infer(inputs, attrs):
        shape, dtype = args.sizes((attrs["shape"],), name), as_dtype(attrs["dtype"], name)
        if name == "fill":
            to_scalar(attrs["value"], dtype, name)
        return [TensorMeta(shape, dtype)]
    return infer


def _launch_fill(kernel, outputs, inputs, attrs, stream):
    kernel(outputs[0], attrs["value"], stream=stream)


def _launch_nothing(kernel, outputs, inputs, attrs, stream):
    """``empty``: the OpCall allocates the output when it is prepared; nothing is written."""


# --- SBP signatures --------------------------------------------------------------------------------


def elementwise_signatures(partial_sums=()):
    """The SBP rule of a broadcasting elementwise op: for each output dim ``d``, the inputs with a dim
    of the output's size there split along it and the others (broadcast along ``d``) B, giving S(d);
    then one (inputs) -> P per entry of ``partial_sums`` (an SBP per input, P or B: the op is linear
    in its P inputs).  A Python scalar is the same on every rank: it stands where a B may."""
    def signatures(shapes, out_shapes, attrs) -> list:
        (out,) = out_shapes
        found = []
        for d in range(len(out)):
            ins = []
            for shape in shapes:
                if shape is None:
                    ins.append(None)
                    continue
                k = d - (len(out) - len(shape))  # the input's own dim aligned with output dim d
                ins.append(S(k) if k >= 0 and shape[k] == out[d] and out[d] != 1 else B)
            if any(s is not None and s.is_split for s in ins):
                found.append(Signature(tuple(ins), (S(d),)))
        for rule in partial_sums:
            if len(rule) == len(shapes) and all(s is not None or r.is_broadcast for s, r in zip(shapes, rule)):
                found.append(Signature(tuple(None if s is None else r for s, r in zip(shapes, rule)), (P,)))
        return found
    return signatures


_PARTIAL_SUMS = {   # the inputs that may be partial sums (the rest B): the op is linear in them
    "add": [(P, P)], "sub": [(P, P)], "mul": [(P, B), (B, P)], "div": [(P, B)], "neg": [(P,)],
}


def _cast_signatures(shapes, out_shapes, attrs) -> list:
    """A cast into a floating dtype keeps a partial sum one (autograd clones gradients); into an integer
    dtype it does not: ``int(0.6) + int(0.6) != int(1.2)``."""
    floating = as_dtype(attrs["dtype"], "cast").kind in "fc"
    return elementwise_signatures([(P,)] if floating else ())(shapes, out_shapes, attrs)


# --- backward rules (``pyflow/ops/grad_rules.py`` says what a rule is) --------------------------------------
# g: the gradient of the op's output.  PyTorch's formulas, its choices at ties included.


def _zeros_rule(ctx, g):
    """Piecewise constant (floor, ceil, round, sign): the gradient is 0 almost everywhere."""
    return [g * 0.0]


# A rule reads a saved input or output (ctx.inputs[0], ctx.outputs[0]) only if its formula needs it, as
# PyTorch saves only that: relu, exp, tanh... use their output, so changing the input in place is fine.
_UNARY_RULES = {
    "neg": lambda ctx, g: [-g],
    "abs": lambda ctx, g: [g * ctx.inputs[0].sign()],
    "relu": lambda ctx, g: [where(ctx.outputs[0] > 0, g, 0.0)],
    "sigmoid": lambda ctx, g: [g * ctx.outputs[0] * (1.0 - ctx.outputs[0])],
    "tanh": lambda ctx, g: [g * (1.0 - ctx.outputs[0] * ctx.outputs[0])],
    "exp": lambda ctx, g: [g * ctx.outputs[0]],
    "log": lambda ctx, g: [g / ctx.inputs[0]],
    "sqrt": lambda ctx, g: [g / (2.0 * ctx.outputs[0])],
    "sin": lambda ctx, g: [g * ctx.inputs[0].cos()],
    "cos": lambda ctx, g: [-(g * ctx.inputs[0].sin())],
    "floor": _zeros_rule, "ceil": _zeros_rule, "round": _zeros_rule, "sign": _zeros_rule,
    "isnan": NO_BACKWARD, "isinf": NO_BACKWARD, "logical_not": NO_BACKWARD,   # bool results
    "bitwise_not": NO_BACKWARD,   # integers and bools only
}


def _split_ties(g, mine, theirs, this_loses):
    """max/min: ``g`` where this operand won, half of it at a tie (PyTorch's choice), 0 where it lost."""
    return where(this_loses, 0.0, where(mine == theirs, g * 0.5, g))


def _max_rule(ctx, g):
    a, b = ctx.inputs
    return for_inputs(ctx, lambda: _split_ties(g, a, b, a < b), lambda: _split_ties(g, b, a, b < a))


def _min_rule(ctx, g):
    a, b = ctx.inputs
    return for_inputs(ctx, lambda: _split_ties(g, a, b, a > b), lambda: _split_ties(g, b, a, b > a))


def _pow_rule(ctx, g):
    (a, b), (y,) = ctx.inputs, ctx.outputs

    def base():   # b * a^(b-1); 0 where b == 0 (even at a == 0)
        return where(b == 0, 0.0, g * b * a.pow(b - 1.0))

    def exponent():   # y * log(a); 0 where a == 0 and b >= 0 (the limit PyTorch takes)
        return where((a == 0).logical_and(b >= 0), 0.0, g * y * a.log())
    return for_inputs(ctx, base, exponent)


_BINARY_RULES = {
    "add": lambda ctx, g: for_inputs(ctx, g, g),
    "sub": lambda ctx, g: for_inputs(ctx, g, lambda: -g),
    "mul": lambda ctx, g: for_inputs(ctx, lambda: g * ctx.inputs[1], lambda: g * ctx.inputs[0]),
    "div": lambda ctx, g: for_inputs(ctx, lambda: g / ctx.inputs[1],
                                     lambda: -(g * ctx.inputs[0]) / (ctx.inputs[1] * ctx.inputs[1])),
    "pow": _pow_rule,
    "max": _max_rule,
    "min": _min_rule,
    "remainder": lambda ctx, g: for_inputs(ctx, g, lambda: -(g * ctx.inputs[0].floor_divide(ctx.inputs[1]))),
    "floor_divide": lambda ctx, g: for_inputs(ctx, lambda: g * 0.0, lambda: g * 0.0),
    **dict.fromkeys(("bitwise_and", "bitwise_or", "bitwise_xor"), NO_BACKWARD),   # integers and bools only
    **dict.fromkeys(COMPARISONS + LOGICAL_OPS, NO_BACKWARD),   # bool results
}


def _where_rule(ctx, g):
    condition = ctx.inputs[0]
    return for_inputs(ctx, None, lambda: where(condition, g, 0.0), lambda: where(condition, 0.0, g))


def _clamp_rule(ctx, g):
    """y = min(t, high) with t = max(x, low): ``high`` gets g where it won (t > high), ``low`` where it won
    (x < low) and y was not high's; x the rest (PyTorch's choice at a tie: x)."""
    x, *bounds = ctx.inputs
    at = {kind: k for k, kind in enumerate(ctx.attrs["bounds"], start=1)}   # "min"/"max" -> input number
    grads = [None] * len(ctx.inputs)
    t = x if "min" not in at else x.maximum(ctx.inputs[at["min"]])
    g_t = g
    if "max" in at:
        high_won = t > ctx.inputs[at["max"]]
        g_t = where(high_won, 0.0, g)
        grads[at["max"]] = where(high_won, g, 0.0)
    g_x = g_t
    if "min" in at:
        low_won = x < ctx.inputs[at["min"]]
        g_x = where(low_won, 0.0, g_t)
        grads[at["min"]] = where(low_won, g_t, 0.0)
    grads[0] = g_x
    return for_inputs(ctx, *grads)


def _cast_rule(ctx, g):
    return [g.to(dtype=ctx.input_dtypes[0])]


_RULES = {**_UNARY_RULES, **_BINARY_RULES, "where": _where_rule, "clamp": _clamp_rule, "cast": _cast_rule}


def _signatures(name):
    return elementwise_signatures(_PARTIAL_SUMS.get(name, ()))


for _name in UNARY_OPS:
    register_op(OpDef(_name, _unary(_name), promote_inputs=(0,), floating=_name in FLOAT_UNARY,
                      same_view_in_place=True, sbp_signatures=_signatures(_name), backward=_RULES[_name],
                      doc=f"elementwise {_name}"))
for _name in BINARY_OPS + COMPARISONS:
    register_op(OpDef(_name, _binary(_name), promote_inputs=(0, 1), floating=_name == "div",
                      same_view_in_place=True, sbp_signatures=_signatures(_name), backward=_RULES[_name],
                      doc=f"elementwise {_name}, broadcasting, promoting"))
for _name in LOGICAL_OPS:
    register_op(OpDef(_name, _binary(_name), same_view_in_place=True, sbp_signatures=_signatures(_name),
                      backward=_RULES[_name], doc=f"elementwise {_name} (bool result)"))
register_op(OpDef("where", _infer_where, promote_inputs=(1, 2), same_view_in_place=True,
                  sbp_signatures=_signatures("where"), backward=_where_rule, doc="where(cond, a, b), broadcasting"))
register_op(OpDef("clamp", _infer_clamp, kernel=("max", "min"), launch=_launch_clamp, kernel_attrs=("bounds",),
                  promote_inputs="all", same_view_in_place=True, sbp_signatures=_signatures("clamp"),
                  backward=_clamp_rule,
                  doc="min(max(x, low), high); attrs['bounds'] names the bounds given ('min', 'max')"))
register_op(OpDef("cast", _infer_cast, same_view_in_place=True, sbp_signatures=_cast_signatures,
                  backward=_cast_rule, doc="convert to attrs['dtype']"))
register_op(OpDef("fill", _infer_source("fill"), launch=_launch_fill, kernel_attrs=("value",),
                  sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD,
                  doc="a new tensor of attrs shape/dtype filled with attrs['value'] (a source op)"))
register_op(OpDef("empty", _infer_source("empty"), kernel="", launch=_launch_nothing,
                  sbp_signatures=BROADCAST_ONLY, backward=NO_BACKWARD,
                  doc="a new, uninitialised tensor of attrs shape/dtype (a source op)"))
