"""Autograd: recording ops on tensors that require grad, and running their backward rules.

* ``mode``       - ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``is_grad_enabled``, over the
                   framework's flag (``pyflow/framework/grad_mode.py``)
* ``graph``      - ``AutogradMeta``, ``Node`` (one recorded op), ``AccumulateGrad``, saved tensors
* ``record``     - the interpreter's hook: make Nodes, check in-place writes
* ``engine``     - backward: the nodes in dependency order, gradients into the leaves
* ``views``      - gradients of the methods that are not one op: advanced indexing, ``x[i] = v``,
                   ``to_local``; and the recording of ``to_global``, an op whose runner is the boxing chain
* ``tensor_api`` - what Tensor's methods (``requires_grad_()``, ``backward()``...) ask autograd; ``grad()``

Each op's backward rule is next to the op (``OpDef.backward`` in ``pyflow/ops/``),
written with the public ops, so backward runs as ordinary VM instructions.
Importing this package installs its two hooks: the recorder into the interpreter, and
``tensor_api`` into the Tensor methods (``pyflow/framework/tensor_methods.py``).
"""

from pyflow.autograd import tensor_api
from pyflow.autograd.mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from pyflow.autograd.record import Recorder
from pyflow.autograd.tensor_api import backward, grad
from pyflow.framework.interpreter import install_recorder
from pyflow.framework.tensor_methods import install_autograd

install_recorder(Recorder())
install_autograd(tensor_api)

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled"]
