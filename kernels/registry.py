"""The kernel table: (op name, target) -> the function that computes the op there.

Targets are ``"cpu"`` (numpy or ``numba.njit`` twins, taking numpy arrays) and
``"cuda"`` (numba.cuda kernels, taking device arrays, launched on a stream).  The
framework's op registry (issue 4) looks kernels up here by the op's name and the
device's target.  The tests and the PTX compile check walk the same table.

Every registered function writes into a preallocated ``out`` and has the calling
convention of its family (all take ``stream=`` as a keyword; the cpu twins
ignore it):

==============  ==================================================================
elementwise     ``fn(out, *inputs, stream=0)``; ``fill``: ``fn(out, value, stream=0)``
reduce          ``fn(out, x, *, axis=None, keepdims=False, stream=0)`` (reduce_sum, reduce_max,
                reduce_min, reduce_mean, argmax, argmin)
scan            ``cumsum(out, x, *, axis, stream=0)``
sort            ``topk(values, indices, x, *, k, axis=-1, largest=True, stream=0)``
softmax         ``fn(out, x, *, axis=-1, stream=0)`` (softmax, log_softmax)
matmul          ``fn(out, a, b, *, stream=0)``
movement        ``slice(out, x, *, starts, stops, steps)``, ``concat(out, inputs, *, axis)``,
                ``split(outs, x, *, axis)``, ``add_n(out, inputs)``, ``permute(out, x, *, perm)``,
                ``transpose(out, x, *, dim0, dim1)``, ``gather(out, table, indices, *, check=True)``,
                ``index_select(out, x, index, *, axis, check=True)``
indexing        ``dim_gather(out, x, index, *, axis, check=True)``,
                ``index_copy(out, index, source, *, axis, check=True)`` (in place)
index_add       ``index_add`` / ``scatter_add(out, index, source, *, axis, check=True)`` (in place)
conv / pool     ``conv2d(out, x, weight, bias, *, stride=1, padding=0)``,
                ``max_pool2d`` / ``avg_pool2d(out, x, *, kernel_size, stride=None, padding=0)``
conv_backward   ``conv2d_backward_input(grad_x, grad_y, weight, *, stride, padding)``,
                ``conv2d_backward_weight(grad_w, x, grad_y, *, stride, padding)``
pool_backward   ``max_pool2d_backward(grad_x, x, grad_y, *, kernel_size, stride, padding)``,
                ``avg_pool2d_backward(grad_x, grad_y, *, kernel_size, stride, padding)``
optim_update    in place, no output: ``sgd_update(model, model_diff, learning_rate, *, weight_decay, maximize)``,
                ``momentum_update(model, model_diff, momentum_buf, learning_rate, train_step, *, momentum, ...)``,
                ``adam_update(model, model_diff, exp_avg, exp_avg_sq, max_exp_avg_sq, learning_rate,
                train_step, *, beta1, beta2, eps, ...)``
==============  ==================================================================

>>> "add" in kernel_names("cpu") and "add" in kernel_names("cuda")
True
"""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["register", "get_kernel", "kernel_names", "TARGETS", "FAMILIES"]

TARGETS = ("cpu", "cuda")
_table: dict[tuple[str, str], Callable] = {}


def register(name: str, target: str, fn: Callable | None = None):
    """Register ``fn`` as op ``name`` on ``target`` (usable as a decorator)."""
    if target not in TARGETS:
        raise ValueError(f"unknown kernel target {target!r}; expected one of {TARGETS}")

    def add(function: Callable) -> Callable:
        if (name, target) in _table:
            raise ValueError(f"kernel {name!r} for {target!r} is registered twice")
        _table[(name, target)] = function
        return function

    return add(fn) if fn is not None else add


def get_kernel(name: str, target: str) -> Callable:
    """The function for op ``name`` on ``target``; ``KeyError`` listing what exists."""
    _load_families()
    try:
        return _table[(name, target)]
    except KeyError:
        known = ", ".join(kernel_names(target)) or "none"
        raise KeyError(f"no {target!r} kernel for op {name!r}; {target} kernels: {known}") from None


def kernel_names(target: str | None = None) -> list[str]:
    """Sorted op names with a kernel on ``target`` (on any target if None)."""
    _load_families()
    return sorted({n for n, t in _table if target is None or t == target})


FAMILIES = ("elementwise", "reduce", "softmax", "matmul", "movement", "conv", "conv_backward", "pool_backward",
            "scan", "sort", "indexing", "index_add", "optim_update")


_loaded = False


def _load_families() -> None:
    """Import every kernel family (once) so its registrations exist."""
    global _loaded
    if not _loaded:
        for family in FAMILIES:
            importlib.import_module(f"pyflow.kernels.{family}")
        _loaded = True
