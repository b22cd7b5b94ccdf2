"""BlockDrop (the Cocktailer artifact's ``FlatResNet32`` with a policy) as ONE Cocktailer program (issue 17).

BlockDrop runs a ResNet-32 for CIFAR (three stages of BasicBlocks, ``layers``
(5, 5, 5): 15 residual blocks) and lets a policy network drop blocks per image.
The artifact's benchmark gives the policy's probabilities as an input; its
``forward_real`` then decides, block by block, on the device values::

    policy = (probs >= 0.5)                     # (B, 15), probs < 0.5 -> 0; the artifact's torch.where
    x = relu(bn1(conv1(inputs)))                # the seed: 3 -> 16 channels, 3x3
    for k, block in enumerate(blocks):          # stage s, block i
        residual = ds(x) if i == 0 else x       # DownsampleB: avgpool(2) + zero channels (stages 2, 3)
        if sum(policy[:, k]) > 0:               # ANY sample runs block k: a device reduction, then a branch
            fx = bn2(conv2(relu(bn1(conv1(x)))))
            x = relu(residual + fx) * m + residual * (1 - m)    # m = policy[b, k], per sample
        else:
            x = residual                        # nobody runs it: the whole batch skips its convs
    return fc(avgpool(x).view(B, -1))           # avgpool over the last 8 x 8 map

A host framework reads every ``sum(policy[:, k]) > 0`` back to the host to choose
the branch (15 host syncs, and a launch per operator); Cocktailer tests it inside
the persistent kernel (1 launch, 0 host syncs), each block of the grid reading
the same count after a grid barrier, so both arms are grid-uniform.

uOperators (``cocktailer/conv_ops.py``, device functions in ``kernels/utask/``):

* ``block_policy``: all 15 decisions and their counts at once, before the seed,
  one row uTask per block (``gating.py``): the transposed 0/1 policy (15, B) and
  ``counts`` (15,), a sum over the batch in each block's shared-memory tree.
  Block ``k``'s branch tests ``counts[k] > 0``; its rows are the masks.
* ``conv2d`` and ``batch_norm`` (eval mode, the ReLU fused where one follows):
  ``resnet.py``, ``ceil(n / chunk)`` uTasks each over their ``n`` output elements.
* ``avg_pool2d(x, 2, channels=2C)`` for ``DownsampleB``, and the head's global average pool.
* ``residual_gate``: the per-sample blend (``gating.py``), elementwise.
* ``linear`` (``fc``), and the copies with which each arm of a branch writes the
  branch's output (``control.cond``).

Barriers (``compiled.last_stats.barriers``: what pyflow's plan leaves, where the
artifact puts one after every operator, about 8 per running block):

* one before the first block's branch: its test reads a count ``block_policy``
  wrote, and its ``conv1`` the seed's output (one barrier serves both);
* one before each later stage's ``DownsampleB`` pool (it reads whole windows of
  ``x``); the pool is traced before the branch, so that ``conv1``, reading the
  same ``x``, needs none of its own;
* in a block that runs: one before ``conv2`` (windows of ``conv1``'s output), and
  one before ``conv1`` unless the block opens a stage (the barrier above serves it);
* none for ``batch_norm``, the gate or the branches' copies, all elementwise with
  one chunk, so a skipped block waits at none (the next reader of its copy does);
* three for the head: before its pool, before ``fc``, before the copy of the
  logits into the program's output.

So ``3 + stages + sum over the blocks that run of (1 if it opens a stage else 2)``:
6 to 33 for the artifact's 15 blocks (``block_drop_barriers`` computes it).  The
host executor makes a launch per operator and a host sync per branch.

Parameters carry the artifact's names (``conv1.weight``, ``bn1.running_mean``,
``blocks.0.0.conv1.weight``, ..., ``fc.bias``: ``FlatResNet32.state_dict()``,
BN's ``num_batches_tracked`` included and ignored), and travel to the device as
ONE flat vector: each weight is a view at a static offset (``parameter_views``),
so the program has three inputs, not 159.  ``width`` (16) and
``image_size`` (32) are the artifact's fixed sizes, arguments here so that tests
run tiny; the three stages have ``width``, ``2 * width`` and ``4 * width``
channels and the head pools the last ``image_size / 4`` square map.

    >>> import numpy as np
    >>> from pyflow.models import BlockDrop
    >>> model = BlockDrop((1, 1, 1), 3, width=2, image_size=8, threads=4, chunk=16, tile=4)
    >>> model(np.ones((1, 3, 8, 8), np.float32), np.array([[0.9, 0.1, 0.7]])).shape
    (1, 3)
"""

from __future__ import annotations

import math

import numpy as np

import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.checks import static_int
from pyflow.cocktailer.conv_ops import avg_pool2d, batch_norm, block_policy, parameter_views, residual_gate
from pyflow.errors import DTypeError, ShapeError
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.nasrnn import check_mode
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["BlockDrop", "BN_FIELDS", "bn_shapes", "conv_bn", "check_resnet_state", "pack_parameters",
           "unpack_parameters", "init_resnet_parameters", "block_drop_barriers"]

BN_FIELDS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
BN_EPS = 1e-5   # nn.BatchNorm2d's default, the artifact's
STRIDES = (1, 2, 2)


def bn_shapes(prefix: str, channels: int) -> dict:
    """The state-dict entries of ``nn.BatchNorm2d(channels)`` at ``prefix`` (in PyTorch's order)."""
    return {f"{prefix}.{field}": (() if field == "num_batches_tracked" else (channels,)) for field in BN_FIELDS}


def check_resnet_state(model: str, state_dict, shapes: dict, dtype) -> tuple:
    """``(params, counters)``: ``state_dict`` checked against ``shapes`` (``check_state_dict``), split.

    ``params``: every float entry, as ``dtype``; ``counters``: BN's ``num_batches_tracked``
    (0-d; a 0-d value comes out of ``as_array`` with one axis, so it is checked as (1,))
    as 0-d int64, PyTorch's type, for ``state_dict()`` to give back.
    """
    counter = lambda name: name.endswith(".num_batches_tracked")  # noqa: E731
    checked = check_state_dict(model, state_dict, {k: (1,) if counter(k) else v for k, v in shapes.items()}, dtype)
    params = {k: v for k, v in checked.items() if not counter(k)}
    counters = {k: np.asarray(v.reshape(()), np.int64) for k, v in checked.items() if counter(k)}
    return params, counters


def pack_parameters(params: dict, dtype) -> tuple:
    """``(flat, layout)``: the arrays of ``params`` one after another in a vector; ``layout[name] = (start, shape)``."""
    layout, start = {}, 0
    for name, array in params.items():
        layout[name] = (start, tuple(array.shape))
        start += array.size
    flat = np.empty(start, dtype)
    for name, (begin, shape) in layout.items():
        flat[begin:begin + math.prod(shape)] = params[name].reshape(-1)
    return flat, layout


def unpack_parameters(flat: np.ndarray, layout: dict, counters: dict, order) -> dict:
    """``pack_parameters`` undone (copies), with the ``counters`` put back, in the order of ``order``'s keys."""
    arrays = {name: flat[start:start + math.prod(shape)].reshape(shape).copy()
              for name, (start, shape) in layout.items()}
    return {name: arrays[name] if name in arrays else counters[name].copy() for name in order}


def init_resnet_parameters(shapes: dict, rng: np.random.Generator) -> dict:
    """The artifacts' initialisation: conv weights ``normal(0, sqrt(2 / (k * k * C_out)))``, BN weight 1, bias 0
    (running mean 0, variance 1), ``nn.Linear`` and conv biases uniform in ``+-1 / sqrt(fan_in)``."""
    params = {}
    for name, shape in shapes.items():
        module, field = name.rsplit(".", 1)
        if f"{module}.running_var" in shapes:   # a batch norm's entry
            params[name] = np.ones(shape) if field in ("weight", "running_var") else np.zeros(shape)
        elif len(shape) == 4:   # a conv weight (C_out, C_in, k, k)
            params[name] = rng.normal(0.0, math.sqrt(2.0 / (shape[0] * shape[2] * shape[3])), shape)
        else:                   # a linear layer's weight, or a bias: PyTorch's default, from the weight's fan-in
            weight = shapes[f"{module}.weight"] if field == "bias" else shape
            params[name] = rng.uniform(-1, 1, shape) / math.sqrt(math.prod(weight[1:]))
    return params


def conv_bn(p: dict, x, conv: str, bn: str, *, stride: int = 1, padding: int = 0, relu: bool = False):
    """``bn(conv(x))`` (eval mode), with ``relu`` fused into the batch norm; ``p`` holds the parameter views."""
    y = F.conv2d(x, p[f"{conv}.weight"], stride=stride, padding=padding)
    return batch_norm(y, p[f"{bn}.running_mean"], p[f"{bn}.running_var"], p[f"{bn}.weight"], p[f"{bn}.bias"],
                      eps=BN_EPS, relu=relu)


def block_drop_barriers(layers, executed) -> int:
    """The grid barriers of one compiled call when block ``k`` runs iff ``executed[k]`` (see the module doc)."""
    first = {sum(layers[:stage]) for stage in range(len(layers))}   # the first block of each stage
    return 3 + len(layers) + sum((1 if k in first else 2) for k, run in enumerate(executed) if run)


class BlockDrop:
    """The artifact's BlockDrop forward (``forward_real``) on Cocktailer: ``model(inputs, probs)`` -> logits.

    ``inputs`` (B, 3, image_size, image_size), ``probs`` (B, sum(layers)): the policy
    network's probabilities (block ``k`` runs for sample ``b`` iff ``probs[b, k] >= 0.5``).
    Returns the logits (B, num_classes).  ``mode``: ``"compiled"`` (one persistent
    kernel), ``"host"`` (one launch per operator, the branches in Python) or ``"auto"``;
    None takes the constructor's.  ``width``/``image_size``: the first stage's
    channels (16) and the image side (32, a multiple of 4).  ``dtype``, ``chunk``,
    ``tile``, ``seed`` and the ``cocktailer.Options`` keywords as for ``NASRNN``.
    Weights start as the artifact's (conv ``normal(0, sqrt(2 / n))``, BN 1 and 0).
    """

    def __init__(self, layers=(5, 5, 5), num_classes: int = 10, *, width: int = 16, image_size: int = 32,
                 mode: str = "compiled", dtype="float32", chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE,
                 seed: int = 0, **options):
        if not isinstance(layers, (tuple, list)) or len(layers) != 3:
            raise ShapeError(f"BlockDrop: layers must be three block counts (one per stage), got {layers!r}")
        self.layers = tuple(static_int(n, "BlockDrop: a stage's block count", low=1) for n in layers)
        self.num_classes = static_int(num_classes, "BlockDrop: num_classes", low=1)
        self.width = static_int(width, "BlockDrop: width", low=1)
        self.image_size = static_int(image_size, "BlockDrop: image_size", low=4)
        if self.image_size % 4:
            raise ShapeError(f"BlockDrop: image_size must be a multiple of 4 (two stride-2 stages whose "
                             f"DownsampleB halves exactly), got {image_size}")
        self.num_blocks = sum(self.layers)
        self.mode = check_mode("BlockDrop", mode)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"BlockDrop: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("BlockDrop", chunk, tile, options)
        self._compiled: dict = {}       # (batch, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        self.load_state_dict(init_resnet_parameters(self.parameter_shapes(), np.random.default_rng(seed)))

    # ---- parameters (the artifact's names) -------------------------------------------
    def blocks(self):
        """``(stage, i, in_channels, channels, stride)`` of every residual block, in order."""
        inplanes = self.width
        for stage, count in enumerate(self.layers):
            planes = self.width * 2 ** stage
            for i in range(count):
                yield stage, i, inplanes, planes, STRIDES[stage] if i == 0 else 1
                inplanes = planes

    def parameter_shapes(self) -> dict:
        """``FlatResNet32``'s state dict: the seed, every block's two conv + BN pairs, ``fc``."""
        w = self.width
        shapes = {"conv1.weight": (w, 3, 3, 3), **bn_shapes("bn1", w)}
        for stage, i, inplanes, planes, _ in self.blocks():
            prefix = f"blocks.{stage}.{i}"
            shapes[f"{prefix}.conv1.weight"] = (planes, inplanes, 3, 3)
            shapes.update(bn_shapes(f"{prefix}.bn1", planes))
            shapes[f"{prefix}.conv2.weight"] = (planes, planes, 3, 3)
            shapes.update(bn_shapes(f"{prefix}.bn2", planes))
        shapes.update({"fc.weight": (self.num_classes, 4 * w), "fc.bias": (self.num_classes,)})
        return shapes

    def load_state_dict(self, state_dict) -> None:
        """Take ``FlatResNet32``'s state dict (numpy arrays or torch tensors); raises ``StateDictError``."""
        params, self.counters = check_resnet_state("BlockDrop", state_dict, self.parameter_shapes(), self.dtype)
        self.params, self.layout = pack_parameters(params, self.dtype)
        freeze(self.params)   # read-only (device_weights)

    def state_dict(self) -> dict:
        """The parameters under the artifact's names, in its order (copies; the counters 0-d int64)."""
        return unpack_parameters(self.params, self.layout, self.counters, self.parameter_shapes())

    # ---- the program -----------------------------------------------------------------
    def program(self, batch: int) -> ck.Program:
        """Trace the forward for a batch of ``batch`` images (see the module doc)."""
        S, K, dtype = self.image_size, self.num_blocks, self.dtype

        def blockdrop(inputs, probs, params):
            p = parameter_views(params, self.layout)
            policy, counts = block_policy(probs)                      # (K, B) decisions, (K,) counts
            x = conv_bn(p, inputs, "conv1", "bn1", padding=1, relu=True)
            for k, (stage, i, inplanes, planes, stride) in enumerate(self.blocks()):
                x = self._gated_block(p, x, f"blocks.{stage}.{i}", stride, planes, policy[k], counts[k])
            pooled = F.avg_pool2d(x, S // 4)                           # (B, 4w, 1, 1): the 8 x 8 map's mean
            return F.linear(pooled.reshape(batch, 4 * self.width), p["fc.weight"], p["fc.bias"])

        return ck.trace(blockdrop, ck.spec(batch, 3, S, S, dtype=dtype), ck.spec(batch, K, dtype=dtype),
                        ck.spec(self.params.size, dtype=dtype), chunk=self.chunk, tile=self.tile,
                        name=f"blockdrop_b{batch}")

    @staticmethod
    def _gated_block(p, x, prefix: str, stride: int, planes: int, mask, count):
        """Block ``prefix`` if any sample runs it (``count > 0``), blended per sample by ``mask``; else the residual."""
        # DownsampleB before the branch, as the artifact: the skipped arm returns it
        residual = avg_pool2d(x, stride, channels=planes) if stride != 1 else x

        def run(x, residual):
            h = conv_bn(p, x, f"{prefix}.conv1", f"{prefix}.bn1", stride=stride, padding=1, relu=True)
            fx = conv_bn(p, h, f"{prefix}.conv2", f"{prefix}.bn2", padding=1)
            return residual_gate(fx, residual, mask)

        return ck.cond(count.item() > 0, run, lambda x, residual: residual, x, residual)

    def compiled_for(self, batch: int, mode: str | None = None) -> ck.Compiled:
        """The cached ``Compiled`` program for ``(batch, mode)`` (traced and compiled on first use)."""
        mode = check_mode("BlockDrop", self.mode if mode is None else mode)
        key = (int(batch), mode)
        if key not in self._compiled:
            self._compiled[key] = ck.compile(self.program(batch), mode=mode, **self.options)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def program_inputs(self, inputs, probs) -> tuple:
        """``(inputs, probs, params)``, checked and converted: what the ``Compiled`` program takes."""
        S, K = self.image_size, self.num_blocks
        x, p = as_input(inputs, self.dtype), as_input(probs, self.dtype)   # pyflow.Tensors stay tensors
        if x.ndim != 4 or x.shape[1:] != (3, S, S) or x.shape[0] < 1:
            raise ShapeError(f"BlockDrop: inputs must be (batch, 3, {S}, {S}) with batch >= 1, got {x.shape}")
        if p.shape != (x.shape[0], K):
            raise ShapeError(f"BlockDrop: probs must be (batch, blocks) = {(x.shape[0], K)}, got {p.shape}")
        return x, p, self.params

    def __call__(self, inputs, probs, mode: str | None = None):
        """The logits (batch, classes): a numpy array, or a ``pyflow.Tensor`` on its device when an input is one
        (the call is then one VM instruction, ``cocktailer/launch.py``)."""
        args = self.device_weights.bind(self.program_inputs(inputs, probs), (2,))   # with tensors: stays uploaded
        compiled = self.compiled_for(args[0].shape[0], mode)
        out = compiled(*args)
        self.last_compiled = compiled
        return out

    def __repr__(self):
        return (f"BlockDrop({self.layers}, {self.num_classes}, width={self.width}, image_size={self.image_size}, "
                f"mode={self.mode!r}, dtype={self.dtype}, chunk={self.chunk}, tile={self.tile}, "
                f"options={self.options})")
