"""``flow.nn``: neural-network building blocks, with PyTorch's names, weights and semantics.

* ``parameter``  - ``Parameter``: a leaf tensor that a module trains
* ``module``     - ``Module``: registration, ``parameters()``, ``state_dict()``, ``train()``/``eval()``, ``to()``
* ``state_dict`` - the checks ``load_state_dict`` makes before it writes anything
* ``container``  - ``Sequential``, ``ModuleList``
* ``linear``     - ``Linear``, ``Flatten``, ``Identity``
* ``conv``       - ``Conv2d``, ``MaxPool2d``, ``AvgPool2d``
* ``activation`` - ``ReLU``, ``Tanh``, ``Sigmoid``, ``Softmax``, ``LogSoftmax``, ``GELU``, ``LeakyReLU``,
                   ``Softplus``, ``LogSigmoid``
* ``batchnorm``  - ``BatchNorm1d``, ``BatchNorm2d``
* ``normalization`` - ``LayerNorm``
* ``sparse``     - ``Embedding``
* ``rnn``        - ``LSTMCell``, ``LSTM``, ``GRU``
* ``dropout``    - ``Dropout``
* ``loss``       - ``MSELoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``, ``CrossEntropyLoss``, ``NLLLoss``,
                   ``BCELoss``, ``BCEWithLogitsLoss``, ``KLDivLoss``
* ``functional`` - the same computations as functions (``F.linear``, ``F.cross_entropy``...)
* ``init``       - in-place initialisations (``xavier_uniform_``, ``kaiming_uniform_``...)
* ``utils``      - ``clip_grad_norm_``, ``clip_grad_value_``
* ``parallel``   - ``DistributedDataParallel``: data parallel over local replicas, gradients averaged per bucket

``flow.nn.Graph`` (and ``flow.nn.graph``), OneFlow's spelling, is ``pyflow.graph``'s: that
layer sits above nn, so ``import pyflow`` hands it to this package (``pyflow/__init__.py``).

Layers are compositions of the public tensor ops: there is no kernel and no
backward rule in this package; autograd differentiates the ops they are made of.

>>> import pyflow as flow
>>> from pyflow import nn
>>> flow.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
>>> loss = nn.CrossEntropyLoss()(model(flow.randn(5, 4)), flow.tensor([0, 1, 2, 0, 1]))
>>> loss.backward()
>>> [tuple(p.grad.shape) for p in model.parameters()]
[(8, 4), (8,), (3, 8), (3,)]
"""

from pyflow.nn import functional, init, parallel, utils
from pyflow.nn.activation import GELU, LeakyReLU, LogSigmoid, LogSoftmax, ReLU, Sigmoid, Softmax, Softplus, Tanh
from pyflow.nn.batchnorm import BatchNorm1d, BatchNorm2d
from pyflow.nn.container import ModuleList, Sequential
from pyflow.nn.conv import AvgPool2d, Conv2d, MaxPool2d
from pyflow.nn.dropout import Dropout
from pyflow.nn.linear import Flatten, Identity, Linear
from pyflow.nn.loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss,
                            NLLLoss, SmoothL1Loss)
from pyflow.nn.module import Module
from pyflow.nn.normalization import LayerNorm
from pyflow.nn.parameter import Parameter
from pyflow.nn.rnn import GRU, LSTM, LSTMCell
from pyflow.nn.sparse import Embedding

__all__ = ["functional", "init", "parallel", "Parameter", "Module", "Sequential", "ModuleList", "Linear", "Flatten", "Identity",
           "Conv2d", "MaxPool2d", "AvgPool2d", "ReLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "BatchNorm1d",
           "BatchNorm2d", "Embedding", "LSTMCell", "LSTM", "GRU", "Dropout", "MSELoss", "CrossEntropyLoss", "NLLLoss",
           "utils", "GELU", "LeakyReLU", "Softplus", "LogSigmoid", "LayerNorm", "L1Loss", "SmoothL1Loss", "HuberLoss",
           "BCELoss", "BCEWithLogitsLoss", "KLDivLoss"]

