"""Front-end ops for the paper's BlockDrop and SkipNet (seed 001, issue 17): ResNet layers and gated blocks.

Like ``ops.py`` and ``model_ops.py`` (read them first): each op checks shapes at
trace time, allocates its output and appends one ``UOperator`` whose uTasks call a
device function from ``kernels/utask/``, listing what they read and write and how.
Tensors are NCHW; sizes follow PyTorch (``kernels/conv.py``'s shape rules, reused).
The models write ``F.conv2d`` (no bias), ``F.max_pool2d`` and ``F.avg_pool2d``: the ops' uTask
lowerings (``lowerings.py``) call the builders here.  ``batch_norm`` (eval mode, the ReLU
fused: OneFlow's ``normalization_add_relu``), ``avg_pool2d(channels=)`` (a pool and the zero
channels of a ``cat`` in one uOperator) and the gates stay Cocktailer ops.

The layers (``kernels/utask/resnet.py``), each elementwise over its output with the
trace's chunk, so a conv, its batch norm and a residual gate after them need no
barrier between them (every element stays on one thread); an op that reads whole
windows of its input (pattern None) waits for the op that wrote it:

* ``conv2d(x, weight, stride=1, padding=0)``: square kernel, no bias.
* ``batch_norm(x, mean, var, weight, bias, eps=1e-5, relu=False)``: eval mode, from
  the running statistics; ``relu=True`` fuses the ReLU that follows it.
* ``max_pool2d(x, kernel, stride, padding)``, ``avg_pool2d(x, kernel, stride=None,
  channels=None)``: ``channels`` larger than x's pads zero channels (BlockDrop's
  ``DownsampleB``: an average pool, then ``cat`` with zeros).

The gates (``kernels/utask/gating.py``):

* ``block_policy(probs) -> (policy, counts)``: BlockDrop's decisions, probs (B, K)
  -> policy (K, B) of 0/1 (``probs < 0.5`` is 0) and counts (K,): how many samples
  run each block; ``cond(counts[k].item() > 0, ...)`` runs block ``k`` if any does.
* ``skip_action(h, weight, bias, offset) -> (mask, total)``: SkipNet's controller
  head, h (B, H) -> mask (B,) = ``sigmoid(h @ weight + bias) > 0.5`` and total (1,) =
  ``sum(mask + offset)`` (offset: one element, the artifact's ``cond_control[k]``).
* ``residual_gate(fx, residual, mask)``: ``relu(residual + fx) * m + residual * (1 - m)``
  with ``m = mask[sample]``, elementwise.

And ``parameter_views(flat, layout)``: read-only views into one flat parameter
vector, so a ResNet's hundred weights enter the program as ONE input (a kernel
with a hundred array arguments would pass several KiB of parameters per launch).
"""

from __future__ import annotations

import math

from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.ir import TensorRef
from pyflow.cocktailer.trace import TracedTensor, TraceError, _current, _emit_op, _float, _same_dtype, _tensor
from pyflow.errors import ShapeError
from pyflow.kernels.conv import conv2d_output_shape, pool2d_output_shape
from pyflow.kernels.utask.gating import make_policy_row_utask, make_skip_action_utask, residual_gate_utask
from pyflow.kernels.utask.resnet import make_batch_norm_utask, make_conv2d_utask, make_pool2d_utask
from pyflow.kernels.utask.sizes import ceil_div

__all__ = ["conv2d", "batch_norm", "max_pool2d", "avg_pool2d", "block_policy", "skip_action", "residual_gate",
           "parameter_views"]


def _nchw(op: str, x) -> TensorRef:
    ref = _float(_tensor(x, op), op)
    if len(ref.shape) != 4:
        raise ShapeError(f"{op}: needs an NCHW tensor, got shape {ref.shape}")
    return ref


def conv2d(x, weight, *, stride: int = 1, padding: int = 0) -> TracedTensor:
    """``F.conv2d(x, weight, stride=stride, padding=padding)`` without a bias; square kernels only."""
    op = "conv2d"
    t = _current()
    x, w = _nchw(op, x), _float(_tensor(weight, op), op)
    _same_dtype(op, x, w)
    stride, padding = static_int(stride, f"{op}: stride", low=1), static_int(padding, f"{op}: padding")
    batch, c_out, h_out, w_out = conv2d_output_shape(x.shape, w.shape, stride, padding, op=op)
    if w.shape[2] != w.shape[3]:
        raise ShapeError(f"{op}: needs a square kernel, got weight {w.shape}")
    out = t.new_ref((batch, c_out, h_out, w_out), x.dtype)
    _, c_in, height, width = x.shape
    _emit_op(op, make_conv2d_utask(x.dtype), f"conv2d_utask_{x.dtype}", ceil_div(out.size, t.chunk),
             (out, x, w, batch, c_in, height, width, c_out, w.shape[2], stride, padding, h_out, w_out, t.chunk),
             [(x, None), (w, None)], [(out, ("elementwise", t.chunk))],
             f"{out!r} = conv2d({x!r}, {w!r}, stride={stride}, padding={padding})")
    return TracedTensor(out)


def batch_norm(x, mean, var, weight, bias, *, eps: float = 1e-5, relu: bool = False) -> TracedTensor:
    """``nn.BatchNorm2d`` in eval mode (running ``mean``/``var``, affine ``weight``/``bias``), then ReLU if ``relu``."""
    op = "batch_norm"
    t = _current()
    x = _nchw(op, x)
    stats = [_float(_tensor(v, op), op) for v in (mean, var, weight, bias)]
    _same_dtype(op, x, *stats)
    channels = x.shape[1]
    if any(s.size != channels for s in stats):
        raise ShapeError(f"{op}: {x.shape} has {channels} channels, the statistics have "
                         f"{[s.shape for s in stats]} (need {channels} elements each)")
    out = t.new_ref(x.shape, x.dtype)
    ew = ("elementwise", t.chunk)
    fn = make_batch_norm_utask(eps, bool(relu), x.dtype)
    _emit_op(op, fn, f"batch_norm{'_relu' if relu else ''}_utask_{x.dtype}", ceil_div(x.size, t.chunk),
             (out, x, *stats, channels, x.shape[2] * x.shape[3], x.size, t.chunk),
             [(x, ew)] + [(s, None) for s in stats], [(out, ew)],
             f"{out!r} = {'relu(' if relu else ''}batch_norm({x!r}){')' if relu else ''}")
    return TracedTensor(out)


def _pool(op: str, kind: str, x, kernel, stride, padding, channels) -> TracedTensor:
    t = _current()
    x = _nchw(op, x)
    kernel = static_int(kernel, f"{op}: kernel", low=1)
    stride = kernel if stride is None else static_int(stride, f"{op}: stride", low=1)
    padding = static_int(padding, f"{op}: padding")
    batch, c_in, h_out, w_out = pool2d_output_shape(x.shape, kernel, stride, padding, op=op)
    out_channels = c_in if channels is None else static_int(channels, f"{op}: channels", low=c_in)
    out = t.new_ref((batch, out_channels, h_out, w_out), x.dtype)
    _, _, height, width = x.shape
    _emit_op(op, make_pool2d_utask(kind, x.dtype), f"{kind}_pool2d_utask_{x.dtype}", ceil_div(out.size, t.chunk),
             (out, x, batch, c_in, height, width, out_channels, kernel, stride, padding, h_out, w_out, t.chunk),
             [(x, None)], [(out, ("elementwise", t.chunk))],
             f"{out!r} = {op}({x!r}, {kernel}, stride={stride}, padding={padding})"
             + (f", zero channels to {out_channels}" if out_channels > c_in else ""))
    return TracedTensor(out)


def max_pool2d(x, kernel: int, stride: int | None = None, padding: int = 0) -> TracedTensor:
    """``F.max_pool2d`` (square window; ``stride`` None: the window)."""
    return _pool("max_pool2d", "max", x, kernel, stride, padding, None)


def avg_pool2d(x, kernel: int, stride: int | None = None, *, channels: int | None = None) -> TracedTensor:
    """``F.avg_pool2d`` (no padding), with zero channels appended up to ``channels`` (None: x's)."""
    return _pool("avg_pool2d", "avg", x, kernel, stride, 0, channels)


def block_policy(probs):
    """BlockDrop's decisions: probs (B, K) -> ``(policy (K, B), counts (K,))``, one row uTask per block."""
    op = "block_policy"
    t = _current()
    p = _float(_tensor(probs, op), op)
    if len(p.shape) != 2:
        raise ShapeError(f"{op}: needs probabilities (batch, blocks), got shape {p.shape}")
    batch, blocks = p.shape
    policy, counts = t.new_ref((blocks, batch), p.dtype), t.new_ref((blocks,), p.dtype)
    _emit_op(op, make_policy_row_utask(p.dtype), f"policy_row_utask_{p.dtype}", blocks,
             (policy, counts, p, batch, blocks), [(p, None)], [(policy, None), (counts, None)],
             f"{policy!r}, {counts!r} = (transpose({p!r}) >= 0.5), row sums")
    return TracedTensor(policy), TracedTensor(counts)


def skip_action(h, weight, bias, offset):
    """SkipNet's controller head: h (B, H), weight (H,), one-element bias and offset -> ``(mask (B,), total (1,))``."""
    op = "skip_action"
    t = _current()
    h, w, b, off = (_float(_tensor(v, op), op) for v in (h, weight, bias, offset))
    _same_dtype(op, h, w, b, off)
    if len(h.shape) != 2 or w.size != h.shape[1] or b.size != 1 or off.size != 1:
        raise ShapeError(f"{op}: needs h (B, H), weight (H,), bias and offset of one element; got {h.shape}, "
                         f"{w.shape}, {b.shape}, {off.shape}")
    batch, hidden = h.shape
    mask, total = t.new_ref((batch,), h.dtype), t.new_ref((1,), h.dtype)
    _emit_op(op, make_skip_action_utask(h.dtype), f"skip_action_utask_{h.dtype}", 1,
             (mask, total, h, w, b, off, batch, hidden), [(h, None), (w, None), (b, None), (off, None)],
             [(mask, None), (total, None)],
             f"{mask!r}, {total!r} = sigmoid({h!r} @ {w!r} + {b!r}) > 0.5, sum(mask + {off!r})")
    return TracedTensor(mask), TracedTensor(total)


def residual_gate(fx, residual, mask) -> TracedTensor:
    """``relu(residual + fx) * m + residual * (1 - m)``, ``m = mask[b]`` for sample ``b`` (the first axis)."""
    op = "residual_gate"
    t = _current()
    fx, r, m = (_float(_tensor(v, op), op) for v in (fx, residual, mask))
    _same_dtype(op, fx, r, m)
    if fx.shape != r.shape or not fx.shape or m.shape != (fx.shape[0],):
        raise ShapeError(f"{op}: needs fx and residual of one shape (B, ...) and a mask (B,), got {fx.shape}, "
                         f"{r.shape} and {m.shape}")
    out = t.new_ref(fx.shape, fx.dtype)
    ew = ("elementwise", t.chunk)
    _emit_op(op, residual_gate_utask, "residual_gate_utask", ceil_div(fx.size, t.chunk),
             (out, fx, r, m, fx.size, math.prod(fx.shape[1:]), t.chunk), [(fx, ew), (r, ew), (m, None)],
             [(out, ew)], f"{out!r} = relu({r!r} + {fx!r}) * {m!r} + {r!r} * (1 - {m!r})")
    return TracedTensor(out)


def parameter_views(flat, layout: dict) -> dict:
    """``{name: view}``: for each ``name -> (start, shape)`` of ``layout``, ``flat[start:start + size]`` as ``shape``.

    ``flat`` is a 1-D program input (read-only, so are the views); no copies, no
    uOperators: every view is the input buffer at a static offset.
    """
    op = "parameter_views"
    ref = _float(_tensor(flat, op), op)
    if len(ref.shape) != 1:
        raise ShapeError(f"{op}: needs a flat (1-D) tensor, got shape {ref.shape}")
    views = {}
    for name, (start, shape) in layout.items():
        start, shape = int(start), tuple(int(d) for d in shape)
        if start < 0 or start + math.prod(shape) > ref.size:
            raise TraceError(f"{op}: {name!r} at {start} with shape {shape} does not fit in {ref.size} elements")
        views[name] = TracedTensor(TensorRef(ref.buffer, shape, ref.offset + start, ref.bounds), flat.readonly)
    return views
