"""pyflow: OneFlow's runtime and Cocktailer, re-implemented in readable Python.

Device code is numba.cuda kernels (``pyflow.kernels``); they run on a GPU when
there is one and in pyflow's concurrent-grid CUDA simulator when there is not.

>>> import pyflow as flow
>>> x = flow.tensor([[1.0, -2.0], [3.0, -4.0]], device="cuda")
>>> flow.relu(x).sum().item()
4.0

Every op becomes a VM instruction (seed 002) that a scheduler thread orders by
data dependences and a worker thread runs; ``numpy()``, ``item()`` and
``flow.sync()`` wait.  ``PYFLOW_VM_SYNC=1`` (or ``with flow.vm.sync_mode():``)
runs everything on the caller's thread, for stepping through with pdb;
``with flow.trace.trace() as t:`` records a timeline of every instruction.
Importing pyflow starts no thread and never needs a GPU.
"""

from pyflow import _exit  # noqa: F401, I001 - first: its exit handler must run after every later one

import numpy as _np

from pyflow import errors, trace, vm
from pyflow.device import Device, DeviceType, Stream, StreamType
from pyflow.framework.creation import (arange, empty, empty_like, eye, from_numpy, full, full_like, linspace,
                                       manual_seed, ones, ones_like, rand, rand_like, randint, randn, randn_like,
                                       zeros, zeros_like)
from pyflow.framework.functional import (abs, add, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, cast, ceil,
                                         clamp, clip, cos, div, eq, exp, floor, floor_divide, ge, gt, is_tensor,
                                         isinf, isnan, le, log, log_softmax, logical_and, logical_not, logical_or,
                                         logical_xor, lt, matmul, maximum, minimum, mul, ne, neg, pow, relu,
                                         remainder, round, sigmoid, sign, sin, softmax, sqrt, sub, tanh, where)
from pyflow.framework.movement import (cat, concat, gather, index_add, index_copy, index_select, scatter_add,
                                       stack)
from pyflow.framework.reductions import (all, allclose, any, argmax, argmin, cumsum, max, mean, min, norm,
                                         prod, return_types, std, sum, topk, var)
from pyflow.framework.tensor import Tensor, tensor
from pyflow.framework.views import FUNCTIONS as _VIEW_FUNCTIONS
from pyflow import ops  # noqa: F401 - the op definitions register themselves in framework's registry (below them)
from pyflow.kernels.backend import describe as backend_description
from pyflow.kernels.backend import is_gpu, is_simulator
from pyflow.vm import sync

__version__ = "0.1.0"

from pyflow import cocktailer  # noqa: E402 - seed 001, the uTask compiler
from pyflow import device  # the package, callable: flow.device("cuda:0") -> Device, as in OneFlow  # noqa: E402
from pyflow import distributed, env  # noqa: E402 - flow.distributed.run, flow.env.get_rank()
from pyflow import autograd  # noqa: E402
from pyflow.autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: E402
from pyflow import nn, optim  # noqa: E402
from pyflow import graph  # noqa: E402 - nn.Graph, OneFlow's spelling: the graph layer sits above nn, so it is
nn.Graph, nn.graph = graph.Graph, graph  # handed to nn here (``flow.nn.Graph``, ``from pyflow.nn import Graph``)
from pyflow import cuda  # noqa: E402 - flow.cuda.is_available(), synchronize(), manual_seed()
from pyflow.serialization import load, save  # noqa: E402 - flow.save / flow.load (after nn: a Parameter stays one)
from pyflow.framework.placement import placement  # noqa: E402
from pyflow.framework.sbp import sbp  # noqa: E402
float16, float32, float64 = (_np.dtype(t) for t in ("float16", "float32", "float64"))
uint8, int8, int16, int32, int64, bool = (_np.dtype(t) for t in ("uint8", "int8", "int16", "int32", "int64", "bool"))
half, float, double, short, int, long = float16, float32, float64, int16, int32, int64
reshape, flatten, permute, transpose, unsqueeze, squeeze, narrow, split, chunk, clone = (
    _VIEW_FUNCTIONS[_name] for _name in ("reshape", "flatten", "permute", "transpose", "unsqueeze", "squeeze",
                                         "narrow", "split", "chunk", "clone"))

__all__ = ["tensor", "Tensor", "cocktailer", "device", "Device", "DeviceType", "Stream", "StreamType", "errors",
           "vm", "trace", "sync", "nn", "optim", "env", "distributed", "placement", "sbp",
           "autograd", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled",
           # creation
           "zeros", "ones", "full", "empty", "eye", "arange", "linspace", "zeros_like", "ones_like", "full_like",
           "empty_like", "rand", "randn", "rand_like", "randn_like", "randint", "from_numpy", "manual_seed",
           # elementwise
           "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "sin", "cos", "floor", "ceil", "round",
           "sign", "isnan", "isinf", "logical_not", "bitwise_not", "add", "sub", "mul", "div", "pow", "maximum",
           "minimum", "floor_divide", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and",
           "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "matmul", "where", "clamp", "clip",
           "softmax", "log_softmax", "cast", "is_tensor",
           # shapes, joining, reductions
           "reshape", "flatten", "permute", "transpose", "unsqueeze", "squeeze", "narrow", "split", "chunk", "clone",
           "cat", "concat", "stack", "gather", "index_select", "index_copy", "index_add", "scatter_add",
           "sum", "mean", "max", "min", "argmax", "argmin",
           "var", "std", "norm", "cumsum", "topk", "all", "any", "allclose", "return_types",
           # dtypes
           "float16", "half", "float32", "float", "float64", "double", "uint8", "int8", "int16", "short", "int32",
           "int", "int64", "long", "bool",
           "is_gpu", "is_simulator", "backend_description", "__version__"]
from pyflow.framework.tensor_str import get_printoptions, set_printoptions  # noqa: E402 - how tensors print
__all__ += ["set_printoptions", "get_printoptions"]
from pyflow.framework.random_perm import Generator, randperm  # noqa: E402 - flow.Generator, flow.randperm
from pyflow import utils  # noqa: E402 - flow.utils.data: Dataset, DataLoader, samplers
__all__ += ["Generator", "randperm", "utils"]
__all__ += ["save", "load"]
__all__ += ["cuda"]
from pyflow.framework.composites import (amax, amin, as_tensor, bmm, equal, flip, is_floating_point,  # noqa: E402
                                         logsumexp, masked_fill, mm, normal, outer, roll, t)
from pyflow.framework.composites_sort import argsort, nonzero, sort, unique  # noqa: E402 - host sorts sync
__all__ += ["flip", "roll", "logsumexp", "amax", "amin", "mm", "bmm", "outer", "equal", "masked_fill", "as_tensor",
            "is_floating_point", "normal", "t", "sort", "argsort", "nonzero", "unique"]
from pyflow.framework.einsum import einsum  # noqa: E402
__all__ += ["prod", "einsum"]
