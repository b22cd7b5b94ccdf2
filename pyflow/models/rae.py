"""A recursive autoencoder (RAE) over a binary tree as ONE Cocktailer program (seed 001, issue 5).

The RAE benchmark of the Cocktailer paper (``Linear(1024 -> 512) + tanh`` over binary
trees of up to 127 nodes) is its recursion case and its largest speed-up (8.22x): a
host framework walks the tree in Python, reading ``is_leaf``/``left``/``right`` back
from the device at every node and launching two kernels per inner node; Cocktailer
runs the whole walk inside one persistent kernel::

    @ck.function(returns=ck.spec(dim))               # a recursive function uTask
    def rae(node):                                   # node: an int Scalar (device value)
        return ck.cond(is_leaf[node].item(),         # a Branch on a device scalar
                       lambda: inp[node],            # leaf: its input row
                       lambda: flow.tanh(F.linear(flow.cat([rae(left[node].item()),     # two Calls
                                                             rae(right[node].item())]),  # (uTask refs)
                                                   W, b)))

    output = rae(root)

How it maps onto the kernel (``codegen_recursion.py``): each call pushes a frame ``[label,
return slot, node]`` on a stack in shared memory (one copy per block, identical in
all blocks); the tensors of a call (its two children's results, side by side so
``cat`` is free, and its own scratch) live in a frame of the function's stack
buffer in global memory.  A ``while top > 0`` loop dispatches on the label, which is
how a resume point ("after the left child") is reached without ``goto``.  Every
block walks the same tree, so the branch and the calls are grid-uniform and the
``linear`` (``ceil(dim / tile)`` uTasks, one output tile each) and ``tanh``
(``ceil(dim / chunk)`` uTasks) of an inner node are spread over the blocks, with
grid barriers where a call's result crosses blocks.

Counts, for a tree of ``n`` leaves (``n - 1`` inner nodes): the host executor makes
``6n - 2`` launches and ``1 + (2n - 1) + 2(n - 1)`` host syncs (the root, every
node's ``is_leaf``, every inner node's two children: the device-to-host reads that
make the host walk slow); the compiled one makes 1 launch, 0 host syncs, and about
``3`` grid barriers per leaf and ``7`` per inner node (every call and return starts
a new segment with a barrier, and the frame's tensors sit at run-time offsets, so
the barrier plan cannot prove two operators touch disjoint elements).

A tree of depth ``d`` (root at depth 0) needs ``d + 1`` frames; ``stack_depth``
(default 64, twice the artifact's fixed 32) is an option, and a deeper tree raises
``pyflow.errors.StackOverflowError`` when it runs, in either mode.  The tree
(``left``, ``right``, ``is_leaf`` over nodes, ``inp`` (nodes, dim) and ``root``) is
program input, so one trace serves every tree of the same node count; it is
checked on the host before it runs (shapes, child indices in range, no cycles).
With ``pyflow.Tensor`` s among the tree's arrays the root's vector is a tensor on
their device and the call one VM instruction (the tables are read to the host for
the check first; int64 table tensors are then the program's inputs as they are),
the weights uploaded at the first such call only (``device_weights``).

    >>> import numpy as np
    >>> from pyflow.models import RAE
    >>> model = RAE(2, threads=4, chunk=4, tile=4)
    >>> left, right, is_leaf = [1, -1, -1], [2, -1, -1], [0, 1, 1]
    >>> model(left, right, is_leaf, np.ones((3, 2), np.float32), root=0).shape
    (2,)
"""

from __future__ import annotations

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
import pyflow.nn.functional as F
from pyflow.cocktailer.api import MODES
from pyflow.framework.tensor import Tensor
from pyflow.cocktailer.checks import is_int, static_int
from pyflow.cocktailer.profiler import CostModel
from pyflow.errors import DTypeError, IndexOutOfRangeError, ShapeError
from pyflow.models.lstm import DEFAULT_CHUNK, DEFAULT_TILE, check_options
from pyflow.models.device_weights import DeviceWeights, freeze
from pyflow.models.state_dict import as_input, check_state_dict

__all__ = ["RAE", "TreeError"]


class TreeError(ShapeError):
    """A tree the RAE cannot walk: a child index out of range, a cycle, a bad ``is_leaf`` flag."""


class RAE:
    """The recursive autoencoder: leaves give ``inp[node]``, inner nodes ``tanh(W @ [rae(l); rae(r)] + b)``.

    ``model(left, right, is_leaf, inp, root, mode="compiled")`` returns the root's
    vector (dim,).  ``left``/``right``/``is_leaf`` are int arrays over the nodes (a
    leaf's children are ignored), ``inp`` is (nodes, dim).  ``mode``: ``"compiled"``
    (one persistent kernel), ``"host"`` (one launch per operator, the recursion in
    Python) or ``"auto"`` (Algorithm 1 decides, pricing a tree of ``nodes`` calls; it
    also tries recursion unroll 1 to 3 levels deep, which walks the root's subtrees
    at once on groups of blocks, their subtrees on parts of those groups, ...).
    ``chunk``/``tile`` are the trace's uTask sizes; other keywords (``threads``,
    ``blocks``, ``stack_depth``, ``inline``, ...) are ``cocktailer.Options``.
    """

    def __init__(self, dim: int, *, dtype="float32", chunk: int = DEFAULT_CHUNK, tile: int = DEFAULT_TILE,
                 seed: int = 0, **options):
        self.dim = static_int(dim, "RAE: dim", low=1)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype("float32"), np.dtype("float64")):
            raise DTypeError(f"RAE: dtype must be float32 or float64, got {self.dtype}")
        self.chunk, self.tile = chunk, tile
        self.options = check_options("RAE", chunk, tile, options)
        self._compiled: dict = {}       # (nodes, mode) -> Compiled
        self.last_compiled = None
        self.device_weights = DeviceWeights()   # the weights as tensors, per device (calls with tensors)
        rng = np.random.default_rng(seed)  # nn.Linear's init: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
        bound = 1.0 / np.sqrt(2 * self.dim)
        self.load_state_dict({name: rng.uniform(-bound, bound, shape)
                              for name, shape in self.parameter_shapes().items()})

    # ---- parameters ------------------------------------------------------------------
    def parameter_shapes(self) -> dict:
        """The encoder ``nn.Linear(2 * dim, dim)``'s names and shapes."""
        return {"encoder.weight": (self.dim, 2 * self.dim), "encoder.bias": (self.dim,)}

    def load_state_dict(self, state_dict) -> None:
        """Take ``{"encoder.weight": (dim, 2*dim), "encoder.bias": (dim,)}``; raises ``StateDictError``."""
        p = check_state_dict("RAE", state_dict, self.parameter_shapes(), self.dtype)
        self.weight, self.bias = freeze(p["encoder.weight"], p["encoder.bias"])   # read-only (device_weights)

    def state_dict(self) -> dict:
        return {"encoder.weight": self.weight.copy(), "encoder.bias": self.bias.copy()}

    # ---- the program -----------------------------------------------------------------
    def program(self, nodes: int) -> ck.Program:
        """Trace the RAE for trees of ``nodes`` nodes (the tree and the root are inputs)."""
        dim, dtype = self.dim, self.dtype

        def rae_program(left, right, is_leaf, inp, weight, bias, root):
            @ck.function(returns=ck.spec(dim, dtype=dtype))
            def rae(node):
                def leaf():
                    return inp[node]  # a view: cond copies it into its output, no copy op of our own

                def inner():
                    children = flow.cat([rae(left[node].item()), rae(right[node].item())])
                    return flow.tanh(F.linear(children, weight, bias))   # flow ops: cocktailer/lowerings.py

                return ck.cond(is_leaf[node].item(), leaf, inner)

            return rae(root.item())

        index = ck.spec(nodes, dtype="int64")
        return ck.trace(rae_program, index, index, index, ck.spec(nodes, dim, dtype=dtype),
                        ck.spec(dim, 2 * dim, dtype=dtype), ck.spec(dim, dtype=dtype), ck.spec(1, dtype="int64"),
                        chunk=self.chunk, tile=self.tile, name=f"rae_d{dim}_n{nodes}")

    def compiled_for(self, nodes: int, mode: str = "compiled") -> ck.Compiled:
        """The cached ``Compiled`` program for trees of ``nodes`` nodes in ``mode``."""
        if mode not in MODES:
            raise ValueError(f"RAE: mode must be one of {MODES}, got {mode!r}")
        key = (int(nodes), mode)
        if key not in self._compiled:
            # Algorithm 1 prices a recursion by its calls per outside call: a walk visits each node once
            extra = {"cost_model": CostModel(assumed_calls=int(nodes))} if mode == "auto" else {}
            self._compiled[key] = ck.compile(self.program(nodes), mode=mode, **self.options, **extra)
        return self._compiled[key]

    # ---- calling ---------------------------------------------------------------------
    def check_tree(self, left, right, is_leaf, inp, root):
        """The tree as program inputs (int64 tables, ``inp`` in the model's dtype), checked.

        Raises ``ShapeError`` for shapes, ``IndexOutOfRangeError`` for a root out of
        range (``DTypeError`` for one that is not an int) and ``TreeError`` for a child out of range, an ``is_leaf`` other than
        0/1, or a cycle reachable from the root (it would recurse forever).
        """
        tables = []
        for name, table in (("left", left), ("right", right), ("is_leaf", is_leaf)):
            a = table.numpy() if isinstance(table, Tensor) else np.asarray(table)
            if a.ndim != 1 or a.size == 0 or not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
                raise ShapeError(f"RAE: {name} must be a non-empty 1-d int array over the nodes, "
                                 f"got shape {a.shape} dtype {a.dtype}")
            tables.append(a.astype(np.int64))
        left, right, is_leaf = tables
        n = len(is_leaf)
        if len(left) != n or len(right) != n:
            raise ShapeError(f"RAE: left, right and is_leaf must have one entry per node, got lengths "
                             f"{len(left)}, {len(right)}, {n}")
        inp = as_input(inp, self.dtype)   # a pyflow.Tensor stays one
        if tuple(inp.shape) != (n, self.dim):
            raise ShapeError(f"RAE: inp must be (nodes, dim) = ({n}, {self.dim}), got {tuple(inp.shape)}")
        if not is_int(root):
            raise DTypeError(f"RAE: root must be an int node index, got {root!r} ({type(root).__name__})")
        if not 0 <= root < n:
            raise IndexOutOfRangeError(f"RAE: root must be a node index in [0, {n}), got {root!r}")
        bad = np.flatnonzero((is_leaf != 0) & (is_leaf != 1))
        if bad.size:
            raise TreeError(f"RAE: is_leaf must be 0 or 1; node {bad[0]} has {is_leaf[bad[0]]}")
        inner = is_leaf == 0
        for name, child in (("left", left), ("right", right)):
            bad = np.flatnonzero(inner & ((child < 0) | (child >= n)))
            if bad.size:
                raise TreeError(f"RAE: inner node {bad[0]} has {name} child {child[bad[0]]}, outside [0, {n})")
        _check_acyclic(left, right, is_leaf, int(root))
        return left, right, is_leaf, inp, np.array([root], dtype=np.int64)

    def __call__(self, left, right, is_leaf, inp, root: int = 0, mode: str = "compiled"):
        """The root's vector: numpy, or a ``pyflow.Tensor`` on the inputs' device when one of them is a tensor
        (the call is then one VM instruction; the tree tables are read to the host first, to be checked)."""
        given = (left, right, is_leaf)
        left, right, is_leaf, inp, root = self.check_tree(left, right, is_leaf, inp, root)
        # tables given as int64 tensors are the program's inputs as they are (nothing to upload again)
        tables = [g if isinstance(g, Tensor) and g.dtype == np.int64 and g.ndim == 1 else t
                  for g, t in zip(given, (left, right, is_leaf))]
        args = (*tables, inp, self.weight, self.bias, root)
        args = self.device_weights.bind(args, (4, 5, 6))   # with tensors: weights (and an unchanged root) stay
        compiled = self.compiled_for(len(is_leaf), mode)
        out = compiled(*args)
        self.last_compiled = compiled
        return out

    def __repr__(self):
        return f"RAE({self.dim}, dtype={self.dtype}, chunk={self.chunk}, tile={self.tile}, options={self.options})"


def _check_acyclic(left, right, is_leaf, root: int) -> None:
    """Depth-first from ``root`` without recursion (trees may be deep); shared subtrees are fine."""
    state = np.zeros(len(is_leaf), np.int8)      # 0 unseen, 1 on the current path, 2 done
    path = [(root, 0)]                           # (node, children visited)
    state[root] = 1
    while path:
        node, visited = path.pop()
        if is_leaf[node] or visited == 2:
            state[node] = 2
            continue
        path.append((node, visited + 1))
        child = int((left, right)[visited][node])
        if state[child] == 1:
            raise TreeError(f"RAE: the tree has a cycle: node {child} is its own descendant (via node {node})")
        if state[child] == 0:
            state[child] = 1
            path.append((child, 0))
