"""Printing a tensor as PyTorch prints it: ``repr(t)``, ``str(t)``, ``format(t, spec)``.

This module turns a tensor's values into text and nothing else: it reads the
values once (``t.numpy()``, which waits for the ops that produce them), its
shape, dtype, device or placement and SBP, and its autograd meta; it issues no op.
``Tensor.__repr__``, ``__str__`` and ``__format__`` call it; PyTorch's
``torch/_tensor_str.py`` is the model, and the rules below are its rules.

>>> import pyflow as flow
>>> flow.tensor([[1.0, 2.5], [3.0, 4.0]])
tensor([[1.0000, 2.5000],
        [3.0000, 4.0000]])
>>> flow.tensor([1.0, 2.0]), flow.tensor([1, 2, 3]), flow.tensor(3.5), flow.tensor([True, False])
(tensor([1., 2.]), tensor([1, 2, 3]), tensor(3.5000), tensor([ True, False]))
>>> flow.tensor([1e-5, 1.0]), flow.tensor([1, 2], dtype=flow.int32), flow.zeros(0, 3)
(tensor([1.0000e-05, 1.0000e+00]), tensor([1, 2], dtype=flow.int32), tensor([], size=(0, 3)))
>>> f"{flow.tensor(2.0) / 3:.3f}"
'0.667'

**One format for the whole tensor.**  ``_Formatter`` looks at every value that
will be shown (only the edges of a summarised tensor) and picks one mode and one
column width, so the columns line up:

* integers and bools: ``str(value)``;
* floats that are all integers: ``1.``, ``2.`` (the dot says "float");
* other floats: fixed point with ``precision`` decimals (4), unless the nonzero
  finite magnitudes need scientific notation: ``max / min > 1000``, ``max > 1e8``
  or ``min < 1e-4`` (for integer-valued floats only the first two);
* ``nan``, ``inf``, ``-inf`` as Python writes them; zeros and non-finite values
  do not choose the mode or the width.

**Summarising.**  A tensor of more than ``threshold`` (1000) elements shows the
first and last ``edgeitems`` (3) entries of every longer dimension, with ``...``
between them.  A row is wrapped so a line holds ``linewidth`` (80) characters.

**Suffixes**, as PyTorch appends them: ``device='cuda:0'`` unless on the CPU
(a global tensor: ``placement=`` and ``sbp=`` instead); ``size=`` for an empty
tensor that is not 1-D (and when ``edgeitems`` is 0); ``dtype=flow.int32`` unless
the dtype is a default one (float32, int64, bool; an empty tensor shows every
dtype but float32, since no value shows its kind); ``grad_fn=<...>`` or
``requires_grad=True``.

**Global tensors.**  Their values are the logical tensor, which every rank reads
together (a collective): so *every* rank must print a global tensor (``repr``
included), as every rank must call its ``numpy()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from pyflow.device import DeviceType
from pyflow.errors import ArgumentTypeError, ArgumentValueError
from pyflow.framework.dtypes import BOOL, DEFAULT_FLOAT, DEFAULT_INT

__all__ = ["PrintOptions", "set_printoptions", "get_printoptions", "printoptions", "tensor_str", "format_tensor"]

# How a dtype is named in a suffix: the name a user writes after ``import pyflow as flow`` (torch: ``torch.int32``).
DTYPE_PREFIX = "flow."


@dataclasses.dataclass
class PrintOptions:
    """The knobs of ``set_printoptions`` (PyTorch's defaults)."""

    precision: int = 4          # digits after the point (fixed or scientific)
    threshold: float = 1000     # more elements than this: summarise
    edgeitems: int = 3          # entries kept at each end of a summarised dimension
    linewidth: int = 80         # characters per line, before a row wraps
    sci_mode: bool | None = None  # None: decide from the values; True/False: always/never scientific


PRINT_OPTS = PrintOptions()
PROFILES = {"default": PrintOptions(), "short": PrintOptions(precision=2, edgeitems=2),
            "full": PrintOptions(threshold=math.inf)}


def set_printoptions(precision: int | None = None, threshold: float | None = None, edgeitems: int | None = None,
                     linewidth: int | None = None, profile: str | None = None, sci_mode: bool | None = None) -> None:
    """Set how tensors print, as ``torch.set_printoptions``.

    ``profile`` ("default", "short", "full") first sets every knob; the other
    arguments then override it; an argument left ``None`` keeps its value -
    except ``sci_mode``, which is always set (so ``sci_mode=None`` goes back to
    deciding from the values), exactly as PyTorch does.

    >>> set_printoptions(precision=2); get_printoptions()["precision"]
    2
    >>> set_printoptions(profile="default"); get_printoptions()["precision"]
    4
    """
    if profile is not None:
        if profile not in PROFILES:
            raise ArgumentValueError(f"set_printoptions: unknown profile {profile!r}; choose one of "
                                     f"{', '.join(PROFILES)}")
        for field in dataclasses.fields(PrintOptions):
            setattr(PRINT_OPTS, field.name, getattr(PROFILES[profile], field.name))
    for name, value in (("precision", precision), ("edgeitems", edgeitems), ("linewidth", linewidth)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ArgumentTypeError(f"set_printoptions: {name} must be an int >= 0, got {value!r}")
            setattr(PRINT_OPTS, name, int(value))
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.number)):
            raise ArgumentTypeError(f"set_printoptions: threshold must be a number, got {threshold!r}")
        PRINT_OPTS.threshold = threshold
    if sci_mode is not None and not isinstance(sci_mode, (bool, np.bool_)):
        raise ArgumentTypeError(f"set_printoptions: sci_mode must be True, False or None, got {sci_mode!r}")
    PRINT_OPTS.sci_mode = None if sci_mode is None else bool(sci_mode)


def get_printoptions() -> dict:
    """The current options, a dict with the names of ``set_printoptions``'s arguments (``torch.get_printoptions``)."""
    return dataclasses.asdict(PRINT_OPTS)


@contextlib.contextmanager
def printoptions(**options):
    """``with printoptions(precision=2): ...``: set options for a block, then restore the old ones."""
    saved = get_printoptions()
    set_printoptions(**options)
    try:
        yield
    finally:
        set_printoptions(**saved)


class _Formatter:
    """One mode and one width for all the values a tensor shows (so its columns line up).

    ``values`` is what will be printed: the whole tensor, or its edges when it
    is summarised (a value that is not shown must not widen the columns).
    """

    def __init__(self, values: np.ndarray):
        self.floating = values.dtype.kind == "f"
        self.int_mode, self.sci_mode, self.width = True, False, 1
        self.span = None   # the widest entry, where it differs from the column width (``_vector_str`` wraps by it)
        if not self.floating:   # ints and bools: Python's own text
            self.width = max((len(str(v)) for v in values.ravel().tolist()), default=1)
            return
        flat = values.ravel().astype(np.float64)   # float16/32 values are exact in float64
        chosen = flat[np.isfinite(flat) & (flat != 0)].tolist()   # only these choose mode and width
        if not chosen:   # zeros, nan, inf only: "0.", "nan" (even with sci_mode=True, as PyTorch), unpadded,
            self.span = max((len(self._text(v)) for v in flat.tolist()), default=1)   # but wrapped by their width
            return
        magnitudes = [abs(v) for v in chosen]
        low, high = min(magnitudes), max(magnitudes)
        self.int_mode = all(v == math.ceil(v) for v in chosen)
        needs_sci = high / low > 1000.0 or high > 1.0e8 or (not self.int_mode and low < 1.0e-4)
        self.sci_mode = needs_sci if PRINT_OPTS.sci_mode is None else PRINT_OPTS.sci_mode
        # PyTorch measures the width in the automatic mode even when sci_mode forces the other one, which can
        # misalign the columns; here the width is measured in the mode that is printed.
        self.width = max(len(self._text(v)) for v in chosen)

    def _text(self, value) -> str:
        """``value`` in this formatter's mode, not padded."""
        if not self.floating:
            return str(value)
        if self.sci_mode:
            return f"{value:.{PRINT_OPTS.precision}e}"
        if self.int_mode:   # "2." says "a float"; "nan" and "inf" need no dot
            return f"{value:.0f}" + ("." if math.isfinite(value) else "")
        return f"{value:.{PRINT_OPTS.precision}f}"

    def format(self, value) -> str:
        """``value`` (a Python number) right-aligned in the column width."""
        return self._text(value).rjust(self.width)


def _edges(values: np.ndarray) -> np.ndarray:
    """The values a summarised tensor shows: the first and last ``edgeitems`` of every longer dimension."""
    edge = PRINT_OPTS.edgeitems
    if edge == 0:
        return values[(slice(0, 0),) * values.ndim]
    for axis, size in enumerate(values.shape):
        if size > 2 * edge:
            keep = np.r_[0:edge, size - edge:size]
            values = np.take(values, keep, axis=axis)
    return values


def _vector_str(values: np.ndarray, indent: int, summarize: bool, formatter: _Formatter) -> str:
    """A 1-D row: ``[a, b, c]``, wrapped after as many entries as fit in ``linewidth`` (at least one)."""
    edge = PRINT_OPTS.edgeitems
    per_line = max(1, (PRINT_OPTS.linewidth - indent) // ((formatter.span or formatter.width) + 2))   # + ", "
    if summarize and not edge:
        entries = ["..."]
    elif summarize and len(values) > 2 * edge:
        entries = ([formatter.format(v) for v in values[:edge].tolist()] + [" ..."]
                   + [formatter.format(v) for v in values[-edge:].tolist()])
    else:
        entries = [formatter.format(v) for v in values.tolist()]
    lines = [", ".join(entries[i:i + per_line]) for i in range(0, len(entries), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(values: np.ndarray, indent: int, summarize: bool, formatter: _Formatter) -> str:
    """The body of a tensor of any rank: rows inside brackets, one line per row of the last two dimensions.

    ``indent`` is the column of this level's ``[``, so its children start one
    further right; between two children of an n-d tensor there are n-1 newlines
    (a blank line between matrices).
    """
    if values.ndim == 0:
        return formatter.format(values.item())
    if values.ndim == 1:
        return _vector_str(values, indent, summarize, formatter)
    edge, size = PRINT_OPTS.edgeitems, values.shape[0]
    if summarize and size > 2 * edge:
        rows = ([_nested_str(values[i], indent + 1, summarize, formatter) for i in range(edge)] + ["..."]
                + [_nested_str(values[i], indent + 1, summarize, formatter) for i in range(size - edge, size)])
    else:
        rows = [_nested_str(row, indent + 1, summarize, formatter) for row in values]
    return "[" + ("," + "\n" * (values.ndim - 1) + " " * (indent + 1)).join(rows) + "]"


def _add_suffixes(text: str, suffixes: list, indent: int) -> str:
    """``text`` + ``, suffix`` for each suffix + ``)``; a suffix that would pass ``linewidth`` starts a new line.

    The length of the last line is counted as PyTorch counts it (two more than
    it is), so the wrapping matches PyTorch's.
    """
    parts = [text]
    last_line = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line + len(suffix) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line += len(suffix) + 2
    return "".join(parts) + ")"


def _autograd_suffix(t) -> str | None:
    """``grad_fn=<MulBackward0 #3>`` (a result autograd recorded), ``requires_grad=True`` (a leaf), or None."""
    info = getattr(t, "_autograd", None)
    if info is None or not info.requires_grad:
        return None
    return f"grad_fn={info.grad_fn!r}" if info.grad_fn is not None else "requires_grad=True"


def tensor_str(t) -> str:
    """The text of ``repr(t)`` and ``str(t)``: ``tensor(<values>, <suffixes>)``.

    Reads the values (waits for them; a global tensor's: every rank must call it).
    """
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.is_global:
        suffixes += [f"placement={t.placement}", f"sbp={t.sbp}"]
    elif t.device.device_type is not DeviceType.cpu:
        suffixes.append(f"device='{t.device}'")
    values = t.numpy()
    dtype, shape = values.dtype, tuple(t.shape)
    if values.size == 0:
        if len(shape) != 1:
            suffixes.append(f"size={shape}")
        if dtype != DEFAULT_FLOAT:    # no value shows whether it holds ints or floats
            suffixes.append(f"dtype={DTYPE_PREFIX}{dtype}")
        body = "[]"
    else:
        if not PRINT_OPTS.edgeitems:
            suffixes.append(f"size={shape}")
        if dtype not in (DEFAULT_FLOAT, DEFAULT_INT, BOOL):
            suffixes.append(f"dtype={DTYPE_PREFIX}{dtype}")
        summarize = values.size > PRINT_OPTS.threshold
        formatter = _Formatter(_edges(values) if summarize else values)
        body = _nested_str(values, indent, summarize, formatter)
    autograd = _autograd_suffix(t)
    if autograd is not None:
        suffixes.append(autograd)
    return _add_suffixes(prefix + body, suffixes, indent)


def format_tensor(t, spec: str) -> str:
    """``format(t, spec)`` / ``f"{t:.3f}"``: a 0-d tensor formats its value (``t.item()``), as in PyTorch.

    Any other tensor takes only the empty spec (``f"{t}"`` is ``str(t)``); a
    spec raises ``TypeError``, as ``object.__format__`` does for PyTorch.
    PyTorch formats the value only for exactly ``torch.Tensor``; here any 0-d
    tensor does (a 0-d ``Parameter`` too).
    """
    if t.ndim == 0:
        return format(t.item(), spec)
    return object.__format__(t, spec)
