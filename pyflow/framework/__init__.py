"""Seeds 000/002: the eager framework: Tensor, the op registry, the interpreter.

One concept per module:

* ``tensor``       - the Tensor class: attributes, reading values, ``.to()``; ``flow.tensor``
* ``interpreter``  - ``apply``: one op call -> one OpCall instruction (``out=`` for in-place writes)
* ``op_registry``  - ``OpDef``: each op defined once (the definitions are in ``pyflow/ops/``)
* ``dtypes``       - the supported dtypes and PyTorch's type promotion
* ``args``         - checking sizes, dims and devices at the call
* ``creation``     - zeros, ones, full, empty, eye, arange, linspace, *_like, random tensors
* ``views``        - view, reshape, permute, transpose, squeeze, unsqueeze, expand, narrow, split
* ``indexing``     - ``x[index]`` and ``x[index] = value``
* ``functional``   - elementwise functions and operators (``flow.relu``, ``x + y``)
* ``reductions``   - sum, mean, max, min, argmax, argmin, var, std, norm, cumsum, topk
* ``movement``     - cat, stack, gather, index_select, repeat
* ``inplace``      - add_, mul_, copy_, fill_, clamp_, ``+=`` ...
* ``grad_mode``    - the grad-mode flag (``flow.no_grad()`` sets it) and ``requires_grad(t)``: ops ask them too
* ``tensor_methods`` - ``METHODS``: every Tensor method the class body does not define, name -> the function
  above that implements it, set on ``Tensor`` in one loop (the layers above plug in through two hooks there)

Importing this package imports ``tensor_methods``, so ``Tensor`` has every method whatever else is imported.
"""

from pyflow.framework.interpreter import apply, get_default_device
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op, register_op
from pyflow.framework.tensor import Tensor, as_tensor_like, tensor

from pyflow.framework import functional, views, inplace, indexing, reductions, movement, creation  # noqa: E402,I001
from pyflow.framework import tensor_methods  # noqa: E402 - sets every method on Tensor (its table, METHODS)

__all__ = ["Tensor", "tensor", "as_tensor_like", "apply", "get_default_device", "OpDef", "TensorMeta",
           "OP_REGISTRY", "register_op", "get_op", "functional", "views", "inplace", "indexing", "reductions",
           "movement", "creation", "tensor_methods"]
