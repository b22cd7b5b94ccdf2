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

import numpy as _np

from pyflow import errors, trace, vm
from pyflow.device import Device, DeviceType, Stream, StreamType
from pyflow.framework.functional import (abs, add, argmax, cast, cat, div, exp, full, log, log_softmax,
                                         manual_seed, matmul, max, maximum, mean, min, minimum, mul, neg,
                                         ones, pow, rand, randn, relu, sigmoid, softmax, sqrt, sub, sum, tanh,
                                         where, zeros)
from pyflow.framework.tensor import Tensor, tensor
from pyflow.kernels.backend import describe as backend_description
from pyflow.kernels.backend import is_gpu, is_simulator
from pyflow.vm import sync

__version__ = "0.1.0"

from pyflow import cocktailer  # noqa: E402 - seed 001, the uTask compiler
from pyflow import device  # the package, callable: flow.device("cuda:0") -> Device, as in OneFlow  # noqa: E402
float32, float64, int32, int64, bool = (_np.dtype(t) for t in ("float32", "float64", "int32", "int64", "bool"))
float, double, long = float32, float64, int64

__all__ = ["tensor", "Tensor", "cocktailer", "device", "Device", "DeviceType", "Stream", "StreamType", "errors", "vm", "trace", "sync",
           "zeros", "ones", "full", "randn", "rand", "manual_seed", "relu", "sigmoid", "tanh", "exp", "log",
           "sqrt", "abs", "neg", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "matmul", "where",
           "softmax", "log_softmax", "cat", "cast", "sum", "mean", "max", "min", "argmax", "float32", "float64",
           "int32", "int64", "bool", "is_gpu", "is_simulator", "backend_description", "__version__"]
