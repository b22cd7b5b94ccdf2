"""Seeds 000/002: the eager framework: Tensor, the op registry, the interpreter."""

from pyflow.framework.interpreter import apply, get_default_device
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op, register_op
from pyflow.framework.tensor import Tensor, as_tensor_like, tensor

__all__ = ["Tensor", "tensor", "as_tensor_like", "apply", "get_default_device", "OpDef", "TensorMeta",
           "OP_REGISTRY", "register_op", "get_op"]
