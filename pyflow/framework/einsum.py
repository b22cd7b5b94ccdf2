"""``flow.einsum``: Einstein summation, composed of ``mul``, ``sum``, ``permute``, ``reshape`` and ``matmul``.

It is a composition, as PyTorch's ``einsum`` is (``at::einsum`` contracts its operands pair by pair with
``bmm``), so autograd, nn.Graph and global tensors need nothing of their own.  The steps:

1. parse the equation: one term of labels per operand; ``...`` stands for the dims no letter names
   (broadcast together across the operands, right-aligned); without ``->`` the output is the ellipsis
   dims then every letter used once, in alphabetical order (PyTorch's implicit mode);
2. a letter repeated in one term takes that term's diagonal (``ii->i``; ``ii->`` is the trace);
3. a letter no other term and not the output names is summed at once;
4. the operands are contracted left to right, two at a time: the letters both have and still needed
   (by the output or a later operand) are the batch, those both have and no longer needed are summed
   by the product, the rest stay: one batched ``matmul`` of ``(batch, left, summed)`` by
   ``(batch, summed, right)``;
5. the result is permuted into the output's order.  Ellipsis dims an explicit output leaves out are
   summed, as in PyTorch.

>>> import pyflow as flow
>>> a, b = flow.tensor([[1.0, 2.0], [3.0, 4.0]]), flow.tensor([[1.0, 0.0], [1.0, 1.0]])
>>> einsum("ij,jk->ik", a, b).tolist(), einsum("ii", a).item(), einsum("ij->j", a).tolist()
([[3.0, 2.0], [7.0, 4.0]], 5.0, [4.0, 6.0])
"""

from __future__ import annotations

import math

from pyflow.errors import ArgumentTypeError, ArgumentValueError, ShapeError
from pyflow.framework import args, creation
from pyflow.framework.args import describe
from pyflow.framework.composites import place_of
from pyflow.framework.functional import matmul
from pyflow.framework.tensor import Tensor

__all__ = ["einsum"]

_ELLIPSIS = "."   # an ellipsis dim's label is "." and its number counted from the right: ".0" is the last


def _split_term(term: str, x: Tensor, k: int, equation: str) -> list:
    """One operand's labels: its letters, and ``.n`` labels for the dims its ``...`` covers."""
    if term.count("...") > 1 or term.replace("...", "").count("."):
        raise ArgumentValueError(f"einsum: operand {k}'s subscripts {term!r} in {equation!r} have more than one "
                                 "ellipsis, or a '.' that is not part of one")
    head, dots, tail = term.partition("...")
    for c in head + tail:
        if not c.isalpha():
            raise ArgumentValueError(f"einsum: invalid subscript {c!r} in {equation!r} (letters a-z, A-Z only)")
    covered = x.ndim - len(head) - len(tail)
    if covered < 0 or (covered and not dots):
        raise ShapeError(f"einsum: operand {k}'s subscripts {term!r} in {equation!r} name {len(head) + len(tail)} "
                         f"dims, but it is {describe(x)}")
    return list(head) + [f"{_ELLIPSIS}{n}" for n in reversed(range(covered))] + list(tail)


def _parse(equation: str, operands: list) -> tuple:
    """(labels of each operand, labels of the output)."""
    if not isinstance(equation, str):
        raise ArgumentTypeError(f"einsum: the equation must be a string, got {type(equation).__name__}")
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ArgumentValueError(f"einsum: {equation!r} has {len(terms)} operand term(s), "
                                 f"{len(operands)} operand(s) given")
    labels = [_split_term(term, x, k, equation) for k, (term, x) in enumerate(zip(terms, operands))]
    ellipsis = sorted({lab for term in labels for lab in term if lab[0] == _ELLIPSIS}, reverse=True,
                      key=lambda lab: int(lab[1:]))
    if not arrow:
        letters = [lab for term in labels for lab in term if lab[0] != _ELLIPSIS]
        return labels, ellipsis + sorted(c for c in set(letters) if letters.count(c) == 1)
    out = _split_out(output, ellipsis, labels, equation)
    return labels, out


def _split_out(output: str, ellipsis: list, labels: list, equation: str) -> list:
    """An explicit output's labels: each letter at most once and used by some operand."""
    head, dots, tail = output.partition("...")
    used = {lab for term in labels for lab in term}
    for c in head + tail:
        if not c.isalpha() or c not in used or (head + tail).count(c) > 1:
            raise ArgumentValueError(f"einsum: output subscript {c!r} in {equation!r} is not a letter, appears "
                                     "more than once, or is in no operand's subscripts")
    return list(head) + (ellipsis if dots else []) + list(tail)


def _sizes(labels: list, operands: list, equation: str) -> dict:
    """Each label's size: its dims must agree, or be 1 (broadcast), as in PyTorch."""
    sizes = {}
    for term, x in zip(labels, operands):
        for lab, n in zip(term, x.shape):
            if n != 1 and sizes.get(lab, 1) not in (1, n):
                name = "..." if lab[0] == _ELLIPSIS else repr(lab)
                raise ShapeError(f"einsum: {equation!r}: subscript {name} has sizes {sizes[lab]} and {n}, which "
                                 "do not broadcast")
            sizes[lab] = n if sizes.get(lab, 1) == 1 else sizes[lab]
    return sizes


def _diagonal(x: Tensor, term: list) -> tuple:
    """Take the diagonal of each letter repeated in ``term`` (``x`` times an identity mask, summed)."""
    while len(set(term)) < len(term):
        p = next(i for i, lab in enumerate(term) if term.index(lab) != i)   # the second place of a label
        q = term.index(term[p])
        n = x.shape[q]
        if x.shape[p] != n:
            raise ShapeError(f"einsum: subscript {term[p]!r} is repeated in one operand over dims of sizes "
                             f"{n} and {x.shape[p]}: a diagonal needs equal sizes")
        mask = creation.eye(n, dtype=x.dtype, **place_of(x))
        shape = [n if d in (p, q) else 1 for d in range(x.ndim)]
        x = (x * mask.reshape(shape)).sum(dim=p)
        term = term[:p] + term[p + 1:]
    return x, term


def _sum_out(x: Tensor, term: list, keep: set) -> tuple:
    """Sum the dims whose labels are not in ``keep``."""
    gone = tuple(d for d, lab in enumerate(term) if lab not in keep)
    if not gone:
        return x, term
    return x.sum(dim=gone), [lab for lab in term if lab in keep]


def _contract(a: Tensor, la: list, b: Tensor, lb: list, keep: set, sizes: dict) -> tuple:
    """``a`` and ``b`` multiplied and summed over the labels they share that ``keep`` lacks: one batched
    matmul of ``(batch, left, summed)`` by ``(batch, summed, right)``."""
    batch = [lab for lab in la if lab in lb and lab in keep]
    summed = [lab for lab in la if lab in lb and lab not in keep]
    left = [lab for lab in la if lab not in lb]
    right = [lab for lab in lb if lab not in la]

    def arrange(x, term, order, shared):
        x = x.permute([term.index(lab) for lab in order])
        full = [sizes[lab] if lab in shared else x.shape[i] for i, lab in enumerate(order)]
        return x.expand(full), full

    a, a_shape = arrange(a, la, batch + left + summed, batch + summed)
    b, b_shape = arrange(b, lb, batch + summed + right, batch + summed)
    nb, ns = len(batch), len(summed)
    m, k = math.prod(a_shape[nb:len(a_shape) - ns]), math.prod(a_shape[len(a_shape) - ns:])
    n = math.prod(b_shape[nb + ns:])
    batch_shape = a_shape[:nb]
    product = matmul(a.reshape(math.prod(batch_shape), m, k), b.reshape(math.prod(batch_shape), k, n))
    shape = batch_shape + a_shape[nb:len(a_shape) - ns] + b_shape[nb + ns:]
    return product.reshape(shape), batch + left + right


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation over ``operands`` as ``equation`` says (PyTorch's ``torch.einsum``): e.g.
    ``"ij,jk->ik"`` (a matrix product), ``"bij,bjk->bik"``, ``"i,i->"`` (a dot product), ``"ii->i"`` (the
    diagonal), ``"...ij->...ji"``.  The operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ArgumentValueError("einsum: needs at least one operand")
    operands = [args.tensor(x, "einsum") for x in operands]
    labels, output = _parse(equation, operands)
    sizes = _sizes(labels, operands, equation)
    pieces = [_diagonal(x, list(term)) for x, term in zip(operands, labels)]
    x, term = pieces[0]
    for k in range(1, len(pieces) + 1):
        later = {lab for _, t in pieces[k:] for lab in t} | set(output)
        x, term = _sum_out(x, term, later | (set(pieces[k][1]) if k < len(pieces) else set()))
        if k == len(pieces):
            break
        y, other = _sum_out(*pieces[k], later | set(term))
        x, term = _contract(x, term, y, other, later, sizes)
    return x.permute([term.index(lab) for lab in output]) if term != output else x
