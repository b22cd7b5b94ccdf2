"""SkipNet (the Cocktailer artifact's ``RecurrentGatedRLResNet``, ``forward_fix``) as ONE Cocktailer program.

SkipNet (issue 17; the paper's second CNN) is a ResNet-101 (Bottleneck blocks,
``layers`` (3, 4, 23, 3): 33 blocks in four groups) whose blocks a recurrent
controller may skip.  After each block a *gate* (a global average pool and a 1x1
conv to 10 channels) feeds an LSTM cell (10 -> 10, its state ``ch``, ``cc`` carried
from gate to gate), whose ``proj`` (a 1x1 conv to 1), sigmoid and threshold say
whether the NEXT block runs.  The artifact's benchmark (``forward_fix``, batch 1)
also takes ``cond_control``: one number per gated block added to the decision
before the test, +-5e5 (``actions * 1e6 - 5e5``), which forces the branch::

    x = maxpool(relu(bn1(conv1(x))))                      # 7x7 stride 2, then 3x3 stride 2
    x = block_0(x)                                        # group 1 layer 0: never skipped
    mask, ch, cc = control(gate_0(x), ch, cc)             # mask (B,): sigmoid(proj(h)) > 0.5
    for j in 1 .. 32:                                     # block j, gated by the previous gate
        residual = ds_j(x) if j opens a group else x      # conv1x1 (stride) + BN
        if sum(mask + cond_control[j - 1]) > 0:           # a device value decides: a branch
            x = relu(body_j(x) + residual) * m + residual * (1 - m)    # m = mask[b], per sample
        else:
            x = residual
        if j < 32: mask, ch, cc = control(gate_j(x), ch, cc)
    return fc(avgpool(x).view(B, -1)), ch, cc

A host framework runs the controller, reads the sum back to the host and picks the
branch: 32 host syncs per image.  Cocktailer keeps the whole forward, controller
and tests included, in one persistent kernel (1 launch, 0 host syncs).

uOperators (``cocktailer/conv_ops.py`` and ``model_ops.py``; device functions in ``kernels/utask/``):

* the stem, each block's body ``bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))))``
  (3x3 ``conv2`` with the group's stride) and its downsample: ``conv2d`` and
  ``batch_norm`` (``resnet.py``, ReLU fused), ``max_pool2d``;
* a gate: ``avg_pool2d`` over the whole map, ``linear`` (the 1x1 conv on 1x1 maps);
* the controller's LSTM cell, the artifact's own (weights ``(4, 10, 10)`` per gate,
  biases added to each matmul first): two ``batched_matmul`` and ``gate_lstm_cell``,
  the uOperators of Seq2seq's decoder;
* ``skip_action`` (``gating.py``): ``proj``, sigmoid, threshold and the sum over the
  batch of ``mask + cond_control[j - 1]``, in one uTask; the branch tests the sum;
* ``residual_gate`` for a block that runs (the blend, elementwise), the branch's
  copies, and the head's ``avg_pool2d`` and ``linear`` (``fc``).

Barriers (``compiled.last_stats.barriers``; the artifact puts one after every operator):

* per controller 6: before the gate's pool (it reads whole windows of ``x``), its
  ``linear``, the ``ih`` matmul, the cell, ``skip_action`` and the branch's test,
  each reading what other blocks wrote.  ``hh`` (``h @ W_hh``), traced first, reads
  only ``h``, written a whole controller earlier: it needs none;
* per block that runs 2: before ``conv2`` and ``conv3`` (windows of the previous
  conv's output).  ``conv1`` and the downsample's conv read ``x``, written before the
  controller's first barrier: they need none; nor do ``batch_norm``, the gate and
  the branches' copies (elementwise with one chunk), so a skipped block waits at none;
* the stem and the first block 4 (before ``maxpool``, the first ``conv1``, ``conv2``,
  ``conv3``), the head 3 (before its pool, ``fc`` and the copy of the logits into the
  program's output).

So ``7 + 6 * (blocks - 1) + 2 * (blocks that run)``: 199 to 263 for the artifact's
33 blocks (``skipnet_barriers``).  The host executor makes a launch per operator
and a host sync per test.

Parameters carry the artifact's names (``conv1.weight``, ``group2_layer0.conv2.weight``,
``group2_ds0.0.weight`` and the same module again as ``group2_layer0.downsample.0.weight``,
``group1_gate0.1.weight``, ``control.rnn.weight_ih_l0_t``, ``control.proj.weight``,
``fc.bias``, ...: ``RecurrentGatedRLResNet.state_dict()``) and travel as ONE flat
vector (``parameter_views``, as in ``blockdrop.py``).  The controller computes with
the ``*_t`` copies of its LSTM weights, as the artifact's forward does
(``update_param`` fills them from ``weight_ih_l0`` etc., which are kept, unused).
``width`` (64: groups of 64, 128, 256, 512 planes, times 4 out) and ``image_size``
(224) are the artifact's fixed sizes, arguments here so that tests run tiny; the
gates' and the head's average pools cover the whole map (the artifact's 56, 28, 14,
7 at 224), ``pool_sizes`` lists them.

    >>> import numpy as np
    >>> from pyflow.models import SkipNet
    >>> model = SkipNet((1, 1, 1, 1), image_size=16, num_classes=3, width=1, threads=4, chunk=16, tile=4)
    >>> logits, ch, cc = model(np.ones((1, 3, 16, 16), np.float32), np.zeros((1, 1, 10)), np.zeros((1, 1, 10)),
    ...                        actions=[1, 0, 1])
    >>> logits.shape, ch.shape, cc.shape
    ((1, 3), (1, 1, 10), (1, 1, 10))
"""

from __future__ import annotations

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.conv_ops import parameter_views, residual_gate, skip_action
from pyflow.cocktailer.model_ops import gate_lstm_cell
from pyflow.errors import DTypeError, ShapeError, StateDictError
from pyflow.models.blockdrop import (bn_shapes, check_resnet_state, conv_bn, init_resnet_parameters,
                                     pack_parameters, unpack_parameters)
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.nasrnn import check_mode
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input

__all__ = ["SkipNet", "EXPANSION", "FORCE", "cond_control", "skipnet_barriers"]

EXPANSION = 4       # a Bottleneck's output channels: 4 x its planes
FORCE = 1e6         # cond_control = actions * FORCE - FORCE / 2, as the artifact's benchmark builds it
GATES = 4           # the controller's LSTM gates


def cond_control(actions) -> np.ndarray:
    """The artifact's ``cond_control`` from 0/1 ``actions``: ``actions * 1e6 - 5e5`` (float32)."""
    a = np.asarray(actions, np.float64)
    if a.ndim != 1 or not np.all((a == 0) | (a == 1)):
        raise ValueError(f"SkipNet: actions must be a vector of 0/1 (one per gated block), got {actions!r}")
    return (a * FORCE - FORCE / 2).astype(np.float32)


def _window(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


class SkipNet:
    """The artifact's SkipNet (``forward_fix``) on Cocktailer: ``model(x, ch, cc, actions)`` -> ``(logits, ch, cc)``.

    ``x`` (B, 3, image_size, image_size) (the artifact: B = 1), ``ch``, ``cc`` the
    controller's state (1, B, hidden_dim) (or (B, hidden_dim)), ``actions`` one 0/1
    per gated block (``sum(layers) - 1``): 1 runs block ``j`` (blended per sample by the
    controller's own mask), 0 skips it.  Returns the logits (B, num_classes) and the
    final ``ch``, ``cc`` (1, B, hidden_dim).  ``mode``, ``dtype``, ``chunk``, ``tile``,
    ``seed`` and the ``cocktailer.Options`` keywords as for ``BlockDrop``.
    """

    def __init__(self, layers=(3, 4, 23, 3), image_size: int = 224, num_classes: int = 1000, *, width: int = 64,
                 hidden_dim: int = 10, mode: str = "compiled", dtype="float32", chunk: int = DEFAULT_CHUNK,
                 tile: int = DEFAULT_TILE, seed: int = 0, **options):
        if not isinstance(layers, (tuple, list)) or len(layers) != 4:
            raise ShapeError(f"SkipNet: layers must be four block counts (one per group), got {layers!r}")
        self.layers = tuple(static_int(n, "SkipNet: a group's block count", low=1) for n in layers)
        self.image_size = static_int(image_size, "SkipNet: image_size", low=1)
        self.num_classes = static_int(num_classes, "SkipNet: num_classes", low=1)
        self.width = static_int(width, "SkipNet: width", low=1)
        self.hidden_dim = static_int(hidden_dim, "SkipNet: hidden_dim", low=1)
        self.num_blocks = sum(self.layers)
        self.mode = check_mode("SkipNet", mode)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"SkipNet: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("SkipNet", chunk, tile, options)
        # the map side after the stem (conv 7x7 stride 2, maxpool 3 stride 2), then per group
        side = _window(_window(self.image_size, 7, 2, 3), 3, 2, 1)
        self.pool_sizes = []
        for group in range(4):
            side = side if group == 0 else _window(side, 3, 2, 1)
            self.pool_sizes.append(side)
        self._compiled: dict = {}       # (batch, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        self.load_state_dict(self._initial_parameters(np.random.default_rng(seed)))

    # ---- parameters (the artifact's names) -------------------------------------------
    def blocks(self):
        """``(group, i, in_channels, planes, stride, has_downsample)`` of every block, in order (groups from 1)."""
        inplanes = self.width
        for group, count in enumerate(self.layers, 1):
            planes = self.width * 2 ** (group - 1)
            for i in range(count):
                stride = 2 if group > 1 and i == 0 else 1
                yield group, i, inplanes, planes, stride, stride != 1 or inplanes != planes * EXPANSION
                inplanes = planes * EXPANSION

    def parameter_shapes(self) -> dict:
        """``RecurrentGatedRLResNet``'s state dict, in its order (a shared downsample appears twice)."""
        w, H = self.width, self.hidden_dim
        shapes = {"conv1.weight": (w, 3, 7, 7), **bn_shapes("bn1", w)}
        for group, i, inplanes, planes, _, has_ds in self.blocks():
            out = planes * EXPANSION
            ds = {"0.weight": (out, inplanes, 1, 1), **{f"1.{k.split('.', 1)[1]}": v
                                                          for k, v in bn_shapes("x", out).items()}}
            if has_ds:
                shapes.update({f"group{group}_ds{i}.{k}": v for k, v in ds.items()})
            layer = f"group{group}_layer{i}"
            shapes[f"{layer}.conv1.weight"] = (planes, inplanes, 1, 1)
            shapes.update(bn_shapes(f"{layer}.bn1", planes))
            shapes[f"{layer}.conv2.weight"] = (planes, planes, 3, 3)
            shapes.update(bn_shapes(f"{layer}.bn2", planes))
            shapes[f"{layer}.conv3.weight"] = (out, planes, 1, 1)
            shapes.update(bn_shapes(f"{layer}.bn3", out))
            if has_ds:
                shapes.update({f"{layer}.downsample.{k}": v for k, v in ds.items()})
            shapes[f"group{group}_gate{i}.1.weight"] = (H, out, 1, 1)
            shapes[f"group{group}_gate{i}.1.bias"] = (H,)
        rnn = "control.rnn"
        shapes.update({f"{rnn}.weight_ih_l0": (GATES * H, H), f"{rnn}.weight_hh_l0": (GATES * H, H),
                       f"{rnn}.bias_ih_l0": (GATES * H,), f"{rnn}.bias_hh_l0": (GATES * H,),
                       f"{rnn}.weight_ih_l0_t": (GATES, H, H), f"{rnn}.weight_hh_l0_t": (GATES, H, H),
                       f"{rnn}.bias_ih_l0_t": (GATES, 1, H), f"{rnn}.bias_hh_l0_t": (GATES, 1, H),
                       "control.proj.weight": (1, H, 1, 1), "control.proj.bias": (1,),
                       "fc.weight": (self.num_classes, 8 * w * EXPANSION), "fc.bias": (self.num_classes,)})
        return shapes

    def _initial_parameters(self, rng) -> dict:
        """The artifact's init (``init_resnet_parameters``; ``fc`` normal(0, sqrt(2 / (out * in))), bias 0) and
        its controller: the LSTM weights standard normal, their ``*_t`` copies made as ``update_param`` does."""
        params = init_resnet_parameters(self.parameter_shapes(), rng)
        for name in params:
            if self._is_shared(name):   # one module, two names: one value
                params[self._shared_name(name)] = params[name]
        out, inp = params["fc.weight"].shape
        params["fc.weight"] = rng.normal(0.0, np.sqrt(2.0 / (out * inp)), (out, inp))
        params["fc.bias"] = np.zeros(out)
        H, rnn = self.hidden_dim, "control.rnn"
        for kind in ("ih", "hh"):
            weight, bias = rng.standard_normal((GATES * H, H)), rng.standard_normal(GATES * H)
            params[f"{rnn}.weight_{kind}_l0"], params[f"{rnn}.bias_{kind}_l0"] = weight, bias
            params[f"{rnn}.weight_{kind}_l0_t"] = weight.reshape(GATES, H, H).transpose(0, 2, 1)
            params[f"{rnn}.bias_{kind}_l0_t"] = bias.reshape(GATES, 1, H)
        return params

    def load_state_dict(self, state_dict) -> None:
        """Take ``RecurrentGatedRLResNet``'s state dict (numpy or torch); raises ``StateDictError``.

        A group's downsample is one module under two names (``group{g}_ds0`` and
        ``group{g}_layer0.downsample``); both must hold the same values.
        """
        params, counters = check_resnet_state("SkipNet", state_dict, self.parameter_shapes(), self.dtype)
        differ = sorted(name for name in params
                        if self._is_shared(name) and not np.array_equal(params[name], params[self._shared_name(name)]))
        if differ:
            raise StateDictError(f"SkipNet.load_state_dict: {differ} differ from their twins under "
                                 f"group*_layer0.downsample (the artifact shares one module under both names)")
        self.counters = counters
        self.params, self.layout = pack_parameters(params, self.dtype)
        freeze(self.params)   # read-only (device_weights)

    @staticmethod
    def _is_shared(name: str) -> bool:
        """Is ``name`` a ``group{g}_ds{i}`` entry (whose module is also ``group{g}_layer{i}.downsample``)?"""
        return "_ds" in name.split(".")[0]

    @staticmethod
    def _shared_name(ds_name: str) -> str:
        """``group2_ds0.1.weight`` -> ``group2_layer0.downsample.1.weight``."""
        head, rest = ds_name.split(".", 1)
        group, index = head.split("_ds")
        return f"{group}_layer{index}.downsample.{rest}"

    def state_dict(self) -> dict:
        """The parameters under the artifact's names, in its order (copies; the counters 0-d int64)."""
        return unpack_parameters(self.params, self.layout, self.counters, self.parameter_shapes())

    # ---- the program -----------------------------------------------------------------
    def program(self, batch: int) -> ck.Program:
        """Trace ``forward_fix`` for a batch of ``batch`` images (see the module doc)."""
        S, H, dtype = self.image_size, self.hidden_dim, self.dtype
        blocks = list(self.blocks())

        def skipnet(x, ch, cc, cond_control, params):
            p = parameter_views(params, self.layout)
            x = conv_bn(p, x, "conv1", "bn1", stride=2, padding=3, relu=True)
            x = F.max_pool2d(x, 3, 2, 1)
            h, c = ch.reshape(batch, H), cc.reshape(batch, H)
            mask = total = None
            for j, (group, i, _, _, stride, has_ds) in enumerate(blocks):
                layer = f"group{group}_layer{i}"
                residual = conv_bn(p, x, f"{layer}.downsample.0", f"{layer}.downsample.1", stride=stride) \
                    if has_ds else x
                if j == 0:   # never skipped: relu(body(x) + residual)
                    x = flow.relu(self._body(p, x, layer, stride) + residual)   # flow ops: cocktailer/lowerings.py
                else:
                    x = self._gated(p, x, residual, layer, stride, mask, total)
                if j + 1 < len(blocks):
                    mask, total, h, c = self._control(p, x, f"group{group}_gate{i}", h, c, cond_control[j], batch)
            pooled = F.avg_pool2d(x, self.pool_sizes[-1]).reshape(batch, x.shape[1])
            logits = F.linear(pooled, p["fc.weight"], p["fc.bias"])
            return logits, h.reshape(1, batch, H), c.reshape(1, batch, H)

        return ck.trace(skipnet, ck.spec(batch, 3, S, S, dtype=dtype), ck.spec(1, batch, H, dtype=dtype),
                        ck.spec(1, batch, H, dtype=dtype), ck.spec(self.num_blocks - 1, dtype=dtype),
                        ck.spec(self.params.size, dtype=dtype), chunk=self.chunk, tile=self.tile,
                        name=f"skipnet_b{batch}")

    @staticmethod
    def _body(p, x, layer: str, stride: int):
        """A Bottleneck's body without its residual: ``bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))))``."""
        y = conv_bn(p, x, f"{layer}.conv1", f"{layer}.bn1", relu=True)
        y = conv_bn(p, y, f"{layer}.conv2", f"{layer}.bn2", stride=stride, padding=1, relu=True)
        return conv_bn(p, y, f"{layer}.conv3", f"{layer}.bn3")

    def _gated(self, p, x, residual, layer: str, stride: int, mask, total):
        """The block if ``total > 0`` (blended per sample by ``mask``), else the residual."""
        def run(x, residual):
            return residual_gate(self._body(p, x, layer, stride), residual, mask)

        return ck.cond(total.item() > 0, run, lambda x, residual: residual, x, residual)

    def _control(self, p, x, gate: str, h, c, offset, batch: int):
        """Gate ``gate`` on ``x``, the LSTM cell, the decision: ``(mask, total, h, c)``."""
        H, rnn = self.hidden_dim, "control.rnn"
        hh = h @ p[f"{rnn}.weight_hh_l0_t"]                               # (4, B, H); first: no barrier of its own
        channels = x.shape[1]
        feature = F.avg_pool2d(x, x.shape[2]).reshape(batch, channels)    # the gate's AvgPool2d: the whole map
        embedded = F.linear(feature, p[f"{gate}.1.weight"].reshape(H, channels), p[f"{gate}.1.bias"])
        ih = embedded @ p[f"{rnn}.weight_ih_l0_t"]                         # (4, B, H)
        h, c = gate_lstm_cell(ih, hh, p[f"{rnn}.bias_ih_l0_t"].reshape(GATES, H),
                              p[f"{rnn}.bias_hh_l0_t"].reshape(GATES, H), c)
        mask, total = skip_action(h, p["control.proj.weight"].reshape(H), p["control.proj.bias"], offset)
        return mask, total, h, c

    def compiled_for(self, batch: int, mode: str | None = None) -> ck.Compiled:
        """The cached ``Compiled`` program for ``(batch, mode)`` (traced and compiled on first use)."""
        mode = check_mode("SkipNet", self.mode if mode is None else mode)
        key = (int(batch), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(batch), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, x, ch, cc, actions) -> tuple:
        """``(x, ch, cc, cond_control, params)``, checked and converted: what the ``Compiled`` program takes."""
        S, H = self.image_size, self.hidden_dim
        x = as_input(x, self.dtype)   # pyflow.Tensors stay tensors: tensors in, tensors out
        if x.ndim != 4 or x.shape[1:] != (3, S, S) or x.shape[0] < 1:
            raise ShapeError(f"SkipNet: x must be (batch, 3, {S}, {S}) with batch >= 1, got {x.shape}")
        B = x.shape[0]
        states = []
        for name, state in (("ch", ch), ("cc", cc)):
            state = as_input(state, self.dtype)
            if state.shape == (B, H):
                state = state.reshape(1, B, H)
            if state.shape != (1, B, H):
                raise ShapeError(f"SkipNet: {name} must be (1, batch, hidden_dim) = {(1, B, H)} (or {(B, H)}), "
                                 f"got {state.shape}")
            states.append(state)
        control = cond_control(actions)
        if control.shape != (self.num_blocks - 1,):
            raise ShapeError(f"SkipNet: actions must have one 0/1 per gated block ({self.num_blocks - 1}), "
                             f"got {control.shape[0]}")
        return (x, *states, control.astype(self.dtype), self.params)

    def __call__(self, x, ch, cc, actions, mode: str | None = None):
        """``(logits, ch, cc)``: numpy arrays, or ``pyflow.Tensor`` s on their device when ``x``, ``ch`` or ``cc``
        is one (the call is then one VM instruction, ``cocktailer/launch.py``)."""
        # with tensors the parameters stay uploaded; the actions' control vector is uploaded when it changes
        args = self.device_weights.bind(self.program_inputs(x, ch, cc, actions), (3, 4))
        compiled = self.compiled_for(args[0].shape[0], mode)
        logits, ch_n, cc_n = compiled(*args)
        self.last_compiled = compiled
        return logits, ch_n, cc_n

    def __repr__(self):
        return (f"SkipNet({self.layers}, image_size={self.image_size}, num_classes={self.num_classes}, "
                f"width={self.width}, hidden_dim={self.hidden_dim}, mode={self.mode!r}, dtype={self.dtype}, "
                f"chunk={self.chunk}, tile={self.tile}, options={self.options})")


def skipnet_barriers(layers, actions) -> int:
    """The grid barriers of one compiled call of ``SkipNet(layers)`` with ``actions`` (see the module doc).

    A forced action decides the branch: ``sum(mask + cond_control[j])`` is the batch's
    mask count (at most B) plus ``B * (+-5e5)``.
    """
    return 7 + 6 * (sum(layers) - 1) + 2 * int(np.sum(actions))
