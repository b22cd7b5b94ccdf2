"""Every method of ``Tensor`` that its class body (``tensor.py``) does not define: one table, attached once.

``METHODS`` maps each name (``x.relu()``, ``x + y``, ``x[i]``, ``x.grad``, ``x.to_global(...)``) to the
function of the framework that implements it; the loop at the end of this module sets them on ``Tensor``,
and nothing else sets an attribute of ``Tensor`` (``tests/test_tensor_methods.py`` checks both).
``pyflow/framework/__init__.py`` imports this module, so importing any part of pyflow gives every
method, whatever the order of the imports.

Most methods are ops or compositions of ops: they call ``interpreter.apply``, which hands a global
tensor to the global interpreter and tells autograd's recorder about the call, so they need nothing
from the layers above.  The few calls that are not one op ask those layers through two hooks, set the
way ``pyflow.autograd`` installs its recorder into the interpreter (``install_recorder``):

* ``install_autograd(api)``: ``pyflow.autograd`` (``autograd/tensor_api.py``) gives the gradient API
  (``set_requires_grad``, ``set_grad``, ``retain_grad``, ``backward``) and records the calls that
  are not run by the interpreter (``check_write``, ``record_call``, ``record_write``): ``x[index]`` and
  ``x[index] = v`` with a tensor, list or mask in the index and ``to_local`` (their backward rules are
  in ``autograd/views.py``), and ``to_global`` (an op, ``pyflow/ops/to_global.py``: its rule is the op's);
* ``install_global_methods(api)``: ``pyflow.distributed`` (``distributed/global_methods.py``) gives
  ``to_global``, ``to_local``, and a global tensor's ``global_to`` (``.to()``), ``getitem`` and
  ``setitem`` with a tensor, list or mask in the index, and ``repeat``.

Without ``pyflow.autograd`` nothing requires grad, so nothing is recorded (``requires_grad_`` says what to
import); without ``pyflow.distributed`` there is no global tensor (``to_global`` says what to import).
``import pyflow`` imports both.

>>> import pyflow as flow
>>> METHODS["relu"] is flow.relu, METHODS["__getitem__"] is Tensor.__getitem__
(True, True)
"""

from __future__ import annotations

import numpy as np

from pyflow.device import DeviceType
from pyflow.errors import AutogradError, DistributedError
from pyflow.framework import (args, composites, composites_sort, functional, indexing, inplace, interpreter, movement,
                              reductions, views)
from pyflow.framework.dtypes import as_dtype
from pyflow.framework.grad_mode import is_grad_enabled, requires_grad
from pyflow.framework.interpreter import apply, describe
from pyflow.framework.tensor import Tensor, as_tensor_like

__all__ = ["METHODS", "install_autograd", "install_global_methods"]

_autograd = None          # pyflow.autograd.tensor_api, installed by pyflow.autograd
_global_methods = None    # pyflow.distributed.global_methods, installed by pyflow.distributed


def install_autograd(api) -> None:
    """``pyflow.autograd`` at import: the functions listed above (its module ``tensor_api``)."""
    global _autograd
    _autograd = api


def install_global_methods(api) -> None:
    """``pyflow.distributed`` at import: the functions listed above (its module ``global_methods``)."""
    global _global_methods
    _global_methods = api


def _autograd_api(what: str):
    if _autograd is None:
        raise AutogradError(f"{what} needs pyflow.autograd: import pyflow (or pyflow.autograd)")
    return _autograd


def _global_api(what: str):
    if _global_methods is None:
        raise DistributedError(f"{what} needs pyflow.distributed: import pyflow (or pyflow.distributed)")
    return _global_methods


def _recording(*tensors) -> bool:
    """Does autograd record a call on ``tensors`` now (grad mode on, one of them requires grad)?"""
    return _autograd is not None and is_grad_enabled() and any(requires_grad(t) for t in tensors)


def _lazy_twin(x: Tensor):
    """Inside ``nn.Graph.build``, an eager tensor's method that is not one op works on its lazy twin (the
    variable the graph reads at run time), so the graph records it; None outside build."""
    tracer = interpreter._lazy_tracer
    if tracer is None or not tracer.active():
        return None
    return tracer.lazy(x)


# --- the methods that are not one op ----------------------------------------------------------------------


def getitem(self: Tensor, index) -> Tensor:
    """``self[index]`` (``indexing.getitem``).  A basic index is the ``slice_view`` op.  One with a tensor,
    list or mask in it is several ops, which autograd records as one call (``"index"``); on a global
    tensor, pyflow.distributed computes it on the broadcast tensor."""
    basic = indexing.is_basic(index)
    lazy = _lazy_twin(self) if self._global is not None else None   # a local one: its ops record themselves
    if lazy is not None:
        result = indexing.getitem(lazy, index)
    elif self._global is None or basic:
        result = indexing.getitem(self, index)
    else:
        result = _global_api("x[index] of a global tensor").getitem(self, index)
    if not basic and _recording(self):
        _autograd.record_call("index", self, result, {"index": index})
    return result


def setitem(self: Tensor, index, value) -> None:
    """``self[index] = value`` (``indexing.setitem``).  A basic index is the ``slice_update`` op.  One
    with a tensor, list or mask in it is several ops, which autograd records as one in-place call
    (``"setitem"``); on a global tensor, pyflow.distributed writes it through the broadcast tensor."""
    if indexing.is_basic(index):
        indexing.setitem(self, index, value)
        return
    recording = _recording(self, value)
    if recording:
        _autograd.check_write("setitem", self)
    if self._global is None:
        indexing.setitem(self, index, value)
    else:
        _global_api("x[index] = v of a global tensor").setitem(self, index, value)
    if recording:
        _autograd.record_write("setitem", [self, value], self, {"index": index})


def repeat(self: Tensor, *repeats) -> Tensor:
    """``movement.repeat``; of a global tensor, pyflow.distributed's (on the broadcast tensor)."""
    if self._global is None:
        return movement.repeat(self, *repeats)
    lazy = _lazy_twin(self)
    if lazy is not None:
        return movement.repeat(lazy, *repeats)
    return _global_api("repeat of a global tensor").repeat(self, *repeats)


def to_global(self: Tensor, placement=None, sbp=None) -> Tensor:
    """This tensor as a global tensor on ``placement`` with ``sbp`` (of a global one: boxed to them): the op
    ``to_global`` (``pyflow/ops/to_global.py``), run by pyflow.distributed's boxing chain, not by ``apply``;
    recorded by autograd with the op's backward (its gradient is boxed back).  Inside nn.Graph.build, of an
    eager tensor local or global: a ``to_global`` op of the graph (OneFlow records it too)."""
    lazy = _lazy_twin(self)
    if lazy is not None:
        result = lazy.to_global(placement, sbp)
    else:
        result = _global_api("to_global").to_global(self, placement, sbp)
    if result is not self and _recording(self):
        _autograd.record_call("to_global", self, result, {"placement": result.placement, "sbp": result.sbp})
    return result


def to_local(self: Tensor) -> Tensor:
    """This rank's piece of a global tensor (a local tensor over the same memory); a local tensor itself."""
    if self._global is None:
        return self
    result = _global_api("to_local").to_local(self)
    if _recording(self):
        _autograd.record_call("to_local", self, result, {})
    return result


def to(self: Tensor, *where, device=None, dtype=None, copy: bool = False, non_blocking: bool = False) -> Tensor:
    """A copy on ``device`` and/or with ``dtype`` (``self`` if nothing changes and not ``copy``).

    ``x.to("cuda")``, ``x.to(flow.float64)``, ``x.to("cpu", flow.int32)``, ``x.to(other)``
    (other's device and dtype).  The device must exist and the dtype be supported:
    both are checked before anything is issued.  ``x.to(flow.Tensor)`` is ``x``: OneFlow's
    graphs hand out proxies of their parameters, and ``.to(flow.Tensor)`` is how a OneFlow
    program gets the eager tensor behind one; a pyflow graph's parameters are the tensors.
    A global tensor's is pyflow.distributed's ``global_to`` (a cast, or the same ranks' devices of
    another type).
    """
    if self._global is not None:
        return _global_api("to() of a global tensor").global_to(self, *where, device=device, dtype=dtype)
    for value in where:
        if isinstance(value, Tensor):
            device, dtype = value.device, value.dtype
        elif value is Tensor:
            continue
        elif isinstance(value, (np.dtype, type)):
            dtype = value
        else:
            device = value
    where = f"to (of {describe(self)})"
    target = args.device(device, where) if device is not None else self.device
    dtype = as_dtype(dtype, where) if dtype is not None else self.dtype
    result = self
    if dtype != self.dtype:
        (result,) = apply("cast", [result], dtype=dtype)
    if target is not self.device:
        if result.device.device_type is not DeviceType.cpu and target.device_type is not DeviceType.cpu:
            result = result.to("cpu")  # between two accelerators: through the host
        if not result.is_contiguous():
            result = result.contiguous()
        (result,) = apply("copy", [result], device=target)
    if copy and result is self:
        result = self.clone()
    return result


# --- autograd's side of a tensor (read here, changed by pyflow.autograd) ------------------------------------


def get_grad(self: Tensor):
    """``x.grad``: the gradient backward accumulated into this tensor (None before)."""
    info = self._autograd
    return None if info is None else info.grad


def grad_fn(self: Tensor):
    """``x.grad_fn``: the autograd node that made this tensor (None for a leaf)."""
    info = self._autograd
    return None if info is None else info.grad_fn


def requires_grad_(self: Tensor, requires_grad: bool = True) -> Tensor:
    """Make this leaf record (or stop recording) the ops that use it; returns it."""
    return _autograd_api("requires_grad_").set_requires_grad(self, requires_grad)


def retain_grad(self: Tensor) -> None:
    """Keep this non-leaf tensor's gradient in ``.grad`` after backward (leaves always keep theirs)."""
    _autograd_api("retain_grad").retain_grad(self)


def register_post_accumulate_grad_hook(self: Tensor, hook):
    """Call ``hook(self)`` after each backward that adds a gradient into this leaf's ``.grad``; returns a handle
    whose ``remove()`` unregisters it."""
    return _autograd_api("register_post_accumulate_grad_hook").register_post_accumulate_grad_hook(self, hook)


def backward(self: Tensor, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
    """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (``gradient``: d(loss)/d(self), needed
    unless ``self`` has one element)."""
    _autograd_api("backward").backward([self], [gradient], retain_graph, create_graph)


# --- the table ------------------------------------------------------------------------------------------

_OPERATORS = (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("pow", "pow"),
              ("floordiv", "floor_divide"), ("mod", "remainder"), ("and", "bitwise_and"), ("or", "bitwise_or"),
              ("xor", "bitwise_xor"))   # x + y (__add__), 2 + x (__radd__), x += y (__iadd__): ("add", op "add")
_IN_PLACE = {f"{name}_": inplace.inplace_method(name, f"{name}_") for _, name in _OPERATORS[2:]}
_IN_PLACE = {"add_": inplace.add_, "sub_": inplace.sub_, **_IN_PLACE}   # add_ and sub_ take alpha=

METHODS = {
    # elementwise functions and operators (functional.py)
    **{name: getattr(functional, name) for name in (
        "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "neg", "sin", "cos", "floor", "ceil", "round",
        "sign", "isnan", "isinf", "logical_not", "bitwise_not", "add", "sub", "mul", "div", "pow", "maximum",
        "minimum", "floor_divide", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and",
        "logical_or", "logical_xor", "eq", "ne", "lt", "le", "gt", "ge", "matmul", "clamp", "clip", "softmax",
        "log_softmax")},
    **{f"__{dunder}__": functional.binary_method(op) for dunder, op in _OPERATORS},
    **{f"__r{dunder}__": functional.binary_method(op, reverse=True) for dunder, op in _OPERATORS},
    **{f"__{op}__": functional.binary_method(op) for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    "__matmul__": lambda self, other: functional.matmul(self, other),
    "__rmatmul__": lambda self, other: functional.matmul(as_tensor_like(other, self), self),
    "__neg__": functional.neg, "__abs__": functional.abs, "__invert__": functional.bitwise_not,
    "float": lambda self: self.to(dtype=np.float32), "double": lambda self: self.to(dtype=np.float64),
    "half": lambda self: self.to(dtype=np.float16), "long": lambda self: self.to(dtype=np.int64),
    "int": lambda self: self.to(dtype=np.int32), "bool": lambda self: self.to(dtype=np.bool_),
    # in place (inplace.py): the op with out=[self]
    **_IN_PLACE,
    **{f"__i{dunder}__": _IN_PLACE[f"{name}_"] for dunder, name in _OPERATORS},
    "copy_": inplace.copy_, "fill_": inplace.fill_, "zero_": inplace.zero_, "clamp_": inplace.clamp_,
    "clip_": inplace.clamp_,
    **{f"{name}_": composites.inplace_unary_method(name) for name in composites.INPLACE_UNARY},
    "masked_fill_": composites.masked_fill_, "uniform_": composites.uniform_, "normal_": composites.normal_,
    "fill_diagonal_": composites.fill_diagonal_,
    # reductions (reductions.py)
    **{name: getattr(reductions, name) for name in (
        "sum", "prod", "mean", "max", "min", "argmax", "argmin", "var", "std", "norm", "cumsum", "topk", "all",
        "any", "allclose")},
    # views (views.py) and indexing (indexing.py, above)
    "view": views.view, "reshape": views.reshape, "flatten": views.flatten, "permute": views.permute,
    "transpose": views.transpose, "unsqueeze": views.unsqueeze, "squeeze": views.squeeze, "expand": views.expand,
    "expand_as": views.expand_as, "narrow": views.narrow, "split": views.split, "chunk": views.chunk,
    "T": property(views.reversed_dims),
    "view_as": lambda self, other: self.view(other.shape),
    "reshape_as": lambda self, other: self.reshape(other.shape),
    "__getitem__": getitem, "__setitem__": setitem,
    # joining, picking, writing at indices (movement.py)
    "repeat": repeat,
    "gather": lambda self, dim, index: movement.gather(self, dim, index),
    "index_select": lambda self, dim, index: movement.index_select(self, dim, index),
    "index_copy_": movement.index_copy_, "index_add_": movement.index_add_, "scatter_add_": movement.scatter_add_,
    "index_copy": movement.index_copy, "index_add": movement.index_add, "scatter_add": movement.scatter_add,
    # compositions of ops (composites.py, composites_sort.py)
    "flip": composites.flip, "roll": composites.roll, "logsumexp": composites.logsumexp, "amax": composites.amax,
    "amin": composites.amin, "masked_fill": composites.masked_fill, "t": composites.t,
    "mm": lambda self, mat2: composites.mm(self, mat2),
    "bmm": lambda self, mat2: composites.bmm(self, mat2),
    "outer": lambda self, vec2: composites.outer(self, vec2),
    "equal": lambda self, other: composites.equal(self, other),
    "is_floating_point": lambda self: composites.is_floating_point(self),
    "new_zeros": composites.new_zeros, "new_ones": composites.new_ones, "new_empty": composites.new_empty,
    "new_full": composites.new_full, "new_tensor": composites.new_tensor,
    "data": property(composites.get_data, composites.set_data),
    "sort": composites_sort.sort, "argsort": composites_sort.argsort, "unique": composites_sort.unique,
    "nonzero": lambda self, *, as_tuple=False: composites_sort.nonzero(self, as_tuple=as_tuple),
    # devices and placements (above: to_global and to_local ask pyflow.distributed)
    "to": to, "to_global": to_global, "to_local": to_local,
    # autograd (above: changes ask pyflow.autograd)
    "requires_grad": property(requires_grad, lambda self, flag: requires_grad_(self, flag)),
    "grad": property(get_grad, lambda self, value: _autograd_api("grad =").set_grad(self, value)),
    "grad_fn": property(grad_fn),
    "is_leaf": property(lambda self: grad_fn(self) is None),
    "requires_grad_": requires_grad_, "retain_grad": retain_grad, "backward": backward,
    "register_post_accumulate_grad_hook": register_post_accumulate_grad_hook,
}

for _name, _method in METHODS.items():
    if _name in vars(Tensor):
        raise TypeError(f"Tensor.{_name} is defined in the class body and in METHODS: one of them must go")
    setattr(Tensor, _name, _method)
