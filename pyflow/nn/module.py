"""``Module``: a tree of layers that owns parameters and buffers (``torch.nn.Module``).

A module is three ordered dicts and a flag:

* ``_parameters`` - name -> ``Parameter`` (trained: ``parameters()`` hands them to an optimizer);
* ``_buffers``    - name -> ``Tensor`` (state that is not trained: BatchNorm's running mean);
* ``_modules``    - name -> child ``Module`` (the tree);
* ``training``    - train or eval mode (``train()`` / ``eval()``: Dropout and BatchNorm read it).

Assigning an attribute registers it (``__setattr__``): a ``Parameter`` goes to
``_parameters``, a ``Module`` to ``_modules``, and a tensor to ``_buffers`` if a
buffer of that name exists.  Reading one back (``self.weight``) looks in the three
dicts (``__getattr__``).  Everything else walks the tree:

* ``named_parameters()`` / ``named_buffers()`` / ``named_modules()`` - dotted names,
  in registration order, each object once;
* ``state_dict()`` - every parameter and persistent buffer by its dotted name
  (PyTorch's keys: ``0.weight``, ``bn.running_mean``), and ``load_state_dict()``
  back, checked before anything is written;
* ``to(device or dtype)``, ``cuda()``, ``cpu()``, ``double()`` and ``to_global(placement, sbp)`` -
  move every parameter and buffer.  A parameter stays the *same object*, pointed at
  the moved data (``param.data = moved``), so an optimizer made before ``.to()``
  keeps working; buffers are replaced by the moved tensors.

>>> import pyflow as flow
>>> class Affine(Module):
...     def __init__(self):
...         super().__init__()
...         self.scale = Parameter(flow.ones(2))
...         self.register_buffer("calls", flow.zeros(()))
...     def forward(self, x):
...         return x * self.scale
>>> m = Affine()
>>> list(m.state_dict()), m(flow.tensor([1.0, 2.0])).tolist()
(['scale', 'calls'], [1.0, 2.0])
>>> m
Affine()
"""

from __future__ import annotations

import collections
import itertools
from typing import Callable, Iterator

import numpy as np

from pyflow.device import Device
from pyflow.autograd import no_grad
from pyflow.errors import ArgumentTypeError, ArgumentValueError, DTypeError, StateDictError
from pyflow.framework.dtypes import as_dtype
from pyflow.framework.tensor import Tensor
from pyflow.nn.parameter import Parameter
from pyflow.nn.state_dict import IncompatibleKeys, check_state_dict

__all__ = ["Module", "StateDictError", "ArgumentValueError", "IncompatibleKeys"]


def _check_name(kind: str, name, owner: "Module", taken: bool) -> None:
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{kind} name must be a string, got {type(name).__name__}")
    if name == "" or "." in name:
        raise ArgumentValueError(f"{kind} name must be non-empty and contain no '.', got {name!r} "
                                 f"(on {type(owner).__name__})")
    if taken:
        raise ArgumentValueError(f"attribute {name!r} already exists on {type(owner).__name__} and is not a "
                                 f"{kind}: pick another name")


class Module:
    """The base class of every layer: subclass it, make the parts in ``__init__``, write ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", collections.OrderedDict())
        object.__setattr__(self, "_buffers", collections.OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", collections.OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # --- registering ------------------------------------------------------------------------------

    def _ready(self) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign to {type(self).__name__} before Module.__init__() "
                                 "(call super().__init__() first)")

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Add a parameter (or None: a slot with no parameter, like ``bias=False``) under ``name``."""
        self._ready()
        _check_name("parameter", name, self, hasattr(self, name) and name not in self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise ArgumentTypeError(f"cannot assign a {type(param).__name__} as parameter {name!r} of "
                                    f"{type(self).__name__} (a flow.nn.Parameter or None is expected)")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Add a buffer: module state that is not trained (``persistent=False``: left out of ``state_dict``)."""
        self._ready()
        _check_name("buffer", name, self, hasattr(self, name) and name not in self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise ArgumentTypeError(f"cannot assign a {type(tensor).__name__} as buffer {name!r} of "
                                    f"{type(self).__name__} (a tensor or None is expected)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        """Add a child module under ``name`` (``self.name = module`` does the same)."""
        self._ready()
        _check_name("module", name, self, hasattr(self, name) and name not in self._modules)
        if module is not None and not isinstance(module, Module):
            raise ArgumentTypeError(f"{type(module).__name__} is not a Module (adding child {name!r} to "
                                    f"{type(self).__name__})")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name: str, value) -> None:
        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            self._ready()
            self._forget(name)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise ArgumentTypeError(f"cannot assign a {type(value).__name__} as parameter {name!r} of "
                                        f"{type(self).__name__} (a flow.nn.Parameter or None is expected)")
            params[name] = None
        elif isinstance(value, Module):
            self._ready()
            self._forget(name)
            self._modules[name] = value
        elif params is not None and name in self._modules:
            if value is not None:
                raise ArgumentTypeError(f"cannot assign a {type(value).__name__} as child module {name!r} "
                                        f"of {type(self).__name__} (a Module or None is expected)")
            self._modules[name] = None
        elif params is not None and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise ArgumentTypeError(f"cannot assign a {type(value).__name__} as buffer {name!r} of "
                                        f"{type(self).__name__} (a tensor or None is expected)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        """Drop ``name`` from wherever it is, before it is registered again as another kind."""
        self.__dict__.pop(name, None)
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        self._non_persistent_buffers.discard(name)

    def __getattr__(self, name: str):
        # Called only when normal lookup fails: a registered parameter, buffer or child.
        state = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in state and name in state[table]:
                return state[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    # --- walking the tree -----------------------------------------------------------------------------

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """``(dotted name, module)`` for this module (name ``prefix``) and every descendant, depth first."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        """``(name, child)`` for the direct children (each once)."""
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, table: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [
            (prefix, self)]
        seen = set()
        for module_prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """``(dotted name, parameter)``: this module's parameters, then (``recurse``) each child's, each
        parameter once (a shared one under its first name)."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def get_submodule(self, target: str) -> "Module":
        """The descendant at dotted path ``target`` (``""``: this module)."""
        module = self
        for part in target.split(".") if target else []:
            if part not in module._modules or module._modules[part] is None:
                raise AttributeError(f"{type(module).__name__} has no submodule {part!r} (looking for {target!r})")
            module = module._modules[part]
        return module

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn`` on every child (recursively), then on this module; returns self (for init schemes)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # --- modes and gradients ---------------------------------------------------------------------------

    def train(self, mode: bool = True) -> "Module":
        """Training mode (``mode=False``: evaluation) for this module and every descendant; returns self."""
        if not isinstance(mode, bool):
            raise ArgumentTypeError(f"train: mode must be a bool, got {mode!r}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode: Dropout passes its input through, BatchNorm uses its running statistics."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for param in self.parameters():
            param.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (``set_to_none=False``: write zeros into it instead)."""
        for param in self.parameters():
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                with no_grad():
                    param.grad = param.grad.detach()
                    param.grad.zero_()

    # --- state dicts ---------------------------------------------------------------------------------------

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False) -> "collections.OrderedDict":
        """Every parameter and persistent buffer by dotted name, this module's first, then each child's.

        Values are detached tensors sharing the module's memory (``keep_vars=True``: the parameters
        themselves); copy them (``{k: v.clone()}``) to keep a snapshot while training goes on.
        """
        if destination is None:
            destination = collections.OrderedDict()
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buffer in self._buffers.items():
            if buffer is not None and name not in self._non_persistent_buffers:
                destination[prefix + name] = buffer if keep_vars else buffer.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(destination, prefix + name + ".", keep_vars)
        return destination

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy ``state_dict``'s values into the parameters and buffers of the same names, in place.

        Everything is checked before anything is written, so a bad dict leaves the module as it was:

        * with ``strict`` (the default), missing and unexpected keys are a ``StateDictError`` (a
          ``KeyError``) listing them; without, they are returned as ``(missing_keys, unexpected_keys)``;
        * a value whose shape differs is a ``ShapeError`` naming the key and both shapes;
        * a tensor on another device than the module's is a ``DeviceError`` naming the key and both
          devices (move the dict, or load on the cpu and then call ``.to()``); a numpy array is
          host data and goes to any device.  Dtypes are converted, as PyTorch does.
        """
        own = self.state_dict(keep_vars=True)
        pairs, result = check_state_dict(type(self).__name__, own, state_dict, strict)
        with no_grad():
            for target, value in pairs:
                target.copy_(value)
        return result

    # --- moving ------------------------------------------------------------------------------------------------

    def _apply(self, fn: Callable[[Tensor], Tensor]) -> "Module":
        """Replace every parameter's data and gradient, and every buffer, by ``fn`` of it (recording nothing).

        Parameters keep their identity (``param.data = ...``): code that holds them sees the new data.
        """
        with no_grad():
            for module in self.modules():
                for param in module._parameters.values():
                    if param is None:
                        continue
                    grad = param.grad
                    param.data = fn(param.detach())
                    if grad is not None:
                        param.grad = fn(grad.detach())
                for name, buffer in module._buffers.items():
                    if buffer is not None:
                        module._buffers[name] = fn(buffer)
        return self

    def to(self, *where, device=None, dtype=None) -> "Module":
        """Move every parameter and buffer to ``device`` and/or cast the floating ones to ``dtype``.

        ``m.to("cuda")``, ``m.to(flow.float64)``, ``m.to("cpu", flow.float32)``, ``m.to(tensor)``
        (its device and dtype).  Returns self; parameters stay the same objects.
        """
        for value in where:
            if isinstance(value, Tensor):
                device, dtype = value.device, value.dtype
            elif isinstance(value, (np.dtype, type)):
                dtype = value
            else:
                device = value
        if dtype is not None:
            dtype = as_dtype(dtype, f"{type(self).__name__}.to")
            if dtype.kind != "f":
                raise DTypeError(f"{type(self).__name__}.to only accepts floating dtypes, got {dtype}")
        if device is not None:
            device = Device(device) if not isinstance(device, Device) else device
        if device is None and dtype is None:
            return self
        return self._apply(lambda t: t.to(device=device, dtype=dtype if t.dtype.kind == "f" else None))

    def cuda(self, device=None) -> "Module":
        return self.to(Device("cuda", device) if not isinstance(device, (str, Device)) else device)

    def cpu(self) -> "Module":
        return self.to("cpu")

    def float(self) -> "Module":   # noqa: A003 - torch's name
        return self.to(dtype=np.float32)

    def double(self) -> "Module":
        return self.to(dtype=np.float64)

    def half(self) -> "Module":
        return self.to(dtype=np.float16)

    def to_global(self, placement=None, sbp=None) -> "Module":
        """Make every parameter and buffer a global tensor on ``placement`` with ``sbp`` (OneFlow's
        ``Module.to_global``); call it on every rank.  A local tensor's value on parallel_id 0 wins
        for a broadcast SBP; a global one is boxed.  Returns self; parameters stay the same objects."""
        return self._apply(lambda t: t.to_global(placement, sbp))

    # --- printing -------------------------------------------------------------------------------------------------

    def extra_repr(self) -> str:
        """The text between the parentheses of this module's repr (its settings); override it."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(child).replace("\n", "\n  ") for name, child in self._modules.items()]
        if len(extra_lines) == 1 and not child_lines:
            return f"{self._get_name()}({extra_lines[0]})"
        if not extra_lines and not child_lines:
            return f"{self._get_name()}()"
        return f"{self._get_name()}(\n  " + "\n  ".join(extra_lines + child_lines) + "\n)"

    def __deepcopy__(self, memo):
        """A module with copies of every parameter and buffer (the same structure, its own memory)."""
        import copy

        with no_grad():
            for t in itertools.chain(self.parameters(), self.buffers()):
                if id(t) not in memo:
                    memo[id(t)] = (Parameter(t.detach().clone(), t.requires_grad) if isinstance(t, Parameter)
                                   else t.clone())
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            object.__setattr__(clone, key, copy.deepcopy(value, memo))
        return clone
