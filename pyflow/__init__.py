"""pyflow: OneFlow's runtime and Cocktailer, re-implemented in readable Python.

Device code is numba.cuda kernels (``pyflow.kernels``); they run on a GPU when
there is one and in pyflow's concurrent-grid CUDA simulator when there is not.

What exists so far (see README.md for the map):

>>> import pyflow as flow
>>> flow.device("cuda:1")
device(type='cuda', index=1)

Importing pyflow starts no thread and never needs a GPU.
"""

from pyflow import errors
from pyflow.device import Device, DeviceType, Stream, StreamType
from pyflow.kernels.backend import describe as backend_description
from pyflow.kernels.backend import is_gpu, is_simulator

__version__ = "0.1.0"

device = Device  # flow.device("cuda:0"), as in OneFlow and PyTorch

__all__ = ["device", "Device", "DeviceType", "Stream", "StreamType", "errors",
           "is_gpu", "is_simulator", "backend_description", "__version__"]
