"""How tensors print (``pyflow/framework/tensor_str.py``): as PyTorch prints them.

The expected strings are PyTorch's outputs for the same tensors, written by hand
from PyTorch's rules (``torch/_tensor_str.py``), with ``torch.`` spelled ``flow.``.
The properties: printed numbers read back to the values within the printed
precision; a summarised dimension shows exactly ``2 * edgeitems`` entries; a
printed row fits in ``linewidth``; ``set_printoptions`` can always be undone.
"""

from __future__ import annotations

import ast
import math
import re
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pyflow as flow
from pyflow.errors import ArgumentTypeError, ArgumentValueError
from pyflow.framework.tensor_str import PrintOptions, printoptions

DEFAULTS = {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80, "sci_mode": None}


@pytest.fixture(autouse=True)
def _restore_print_options():
    saved = flow.get_printoptions()
    yield
    flow.set_printoptions(**saved)


# --- values, as PyTorch prints them ---------------------------------------------------------------------------

@pytest.mark.parametrize("data, kwargs, expected", [
    ([[1.0, 2.5], [3.0, 4.0]], {}, "tensor([[1.0000, 2.5000],\n        [3.0000, 4.0000]])"),
    ([[0.1, 1.2], [2.2, 3.1], [4.9, 5.2]], {},
     "tensor([[0.1000, 1.2000],\n        [2.2000, 3.1000],\n        [4.9000, 5.2000]])"),
    ([1, 2, 3], {}, "tensor([1, 2, 3])"),
    ([-10, 5], {}, "tensor([-10,   5])"),
    ([True, False], {}, "tensor([ True, False])"),   # the column is as wide as "False"
    (3.5, {}, "tensor(3.5000)"),
    (3.14159, {}, "tensor(3.1416)"),
    (7, {}, "tensor(7)"),
    (True, {}, "tensor(True)"),
    (-0.0, {}, "tensor(-0.)"),
], ids=["2x2", "3x2", "ints", "negative-ints", "bools", "0d", "0d-rounded", "0d-int", "0d-bool", "negative-zero"])
def test_values_print_as_pytorch_prints_them(data, kwargs, expected):
    assert repr(flow.tensor(data, **kwargs)) == expected


@pytest.mark.parametrize("data, expected", [
    ([1.0, 2.0], "tensor([1., 2.])"),
    ([[1.0, -1.0], [1.0, -1.0]], "tensor([[ 1., -1.],\n        [ 1., -1.]])"),
    ([0.0, 0.0], "tensor([0., 0.])"),
], ids=["1d", "2d-signed", "zeros"])
def test_integer_valued_floats_print_with_a_trailing_dot(data, expected):
    assert repr(flow.tensor(data)) == expected


@pytest.mark.parametrize("data, expected", [
    ([1e-5, 1.0], "tensor([1.0000e-05, 1.0000e+00])"),              # min < 1e-4
    ([1.0, 2000.0], "tensor([1.0000e+00, 2.0000e+03])"),            # max / min > 1000
    ([1.5, 2000.0], "tensor([1.5000e+00, 2.0000e+03])"),
    ([1e9], "tensor([1.0000e+09])"),                                 # max > 1e8
    ([1e-5, 0.0], "tensor([1.0000e-05, 0.0000e+00])"),               # a zero does not choose, but follows
    ([1.0, 1000.0], "tensor([   1., 1000.])"),                       # a ratio of exactly 1000: still fixed
    ([1e-4, 0.5], "tensor([1.0000e-04, 5.0000e-01])"),               # 1e-4 in float32 is just below 1e-4
], ids=["small", "ratio", "ratio-non-integer", "large", "with-zero", "ratio-1000", "float32-1e-4"])
def test_scientific_notation_when_the_magnitudes_need_it(data, expected):
    assert repr(flow.tensor(data)) == expected


@pytest.mark.parametrize("data, expected", [
    ([float("nan"), 1.5, float("inf")], "tensor([   nan, 1.5000,    inf])"),
    ([float("nan"), float("inf"), -float("inf")], "tensor([nan, inf, -inf])"),   # no width from them
    ([0.0, 1.0, float("nan")], "tensor([0., 1., nan])"),
    (float("nan"), "tensor(nan)"),
], ids=["fixed", "only-non-finite", "integer-valued", "0d"])
def test_nan_and_inf_print_as_python_writes_them(data, expected):
    assert repr(flow.tensor(data)) == expected


@pytest.mark.parametrize("make, expected", [
    (lambda: flow.tensor([]), "tensor([])"),
    (lambda: flow.zeros(0, 3), "tensor([], size=(0, 3))"),
    (lambda: flow.tensor([], dtype=flow.int64), "tensor([], dtype=flow.int64)"),   # no value shows "ints"
    (lambda: flow.zeros(2, 0, dtype=flow.bool), "tensor([], size=(2, 0), dtype=flow.bool)"),
], ids=["1d", "2d", "int64", "bool-2d"])
def test_empty_tensors_print_their_size_unless_1d_and_any_dtype_but_float32(make, expected):
    assert repr(make()) == expected


def test_a_3d_tensor_has_a_blank_line_between_its_matrices():
    assert repr(flow.zeros(2, 1, 2)) == "tensor([[[0., 0.]],\n\n        [[0., 0.]]])"


def test_a_long_row_wraps_at_the_linewidth():
    expected = ("tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,\n"
                "        3.0000, 3.3333, 3.6667])")
    assert repr(flow.tensor(np.arange(12, dtype=np.float32) / 3)) == expected


def test_a_suffix_that_would_pass_the_linewidth_starts_a_new_line():
    expected = ("tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667],\n"
                "       dtype=flow.float64)")
    assert repr(flow.tensor(np.arange(9) / 3)) == expected


# --- summarising --------------------------------------------------------------------------------------------

def test_more_than_threshold_elements_show_their_edges():
    assert repr(flow.arange(2000)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"
    assert repr(flow.arange(10000.0)) == ("tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.9970e+03, 9.9980e+03,\n"
                                          "        9.9990e+03])")   # only the shown values choose the format


def test_a_summarised_matrix_shows_edge_rows_and_columns():
    lines = repr(flow.arange(2000).reshape(40, 50)).split("\n")
    assert lines[0] == "tensor([[   0,    1,    2,  ...,   47,   48,   49],"
    assert lines[3] == "        ...,"
    assert lines[-1] == "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])"
    assert len(lines) == 7


def test_set_printoptions_examples_from_pytorchs_documentation():
    flow.set_printoptions(precision=2)
    assert repr(flow.tensor([1.12345])) == "tensor([1.12])"
    flow.set_printoptions(threshold=5)
    assert repr(flow.arange(10)) == "tensor([0, 1, 2,  ..., 7, 8, 9])"
    flow.set_printoptions(profile="default")
    assert repr(flow.tensor([1.12345])) == "tensor([1.1235])"
    assert repr(flow.arange(10)) == "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])"


def test_small_thresholds_and_edgeitems():
    flow.set_printoptions(threshold=10, edgeitems=1)
    assert repr(flow.arange(24).reshape(4, 6)) == "tensor([[ 0,  ...,  5],\n        ...,\n        [18,  ..., 23]])"


def test_edgeitems_0_shows_only_dots_and_the_size():
    flow.set_printoptions(edgeitems=0)
    assert repr(flow.arange(2000)) == "tensor([...], size=(2000,))"
    assert repr(flow.arange(4).reshape(2, 2)) == "tensor([[0, 1],\n        [2, 3]], size=(2, 2))"


def test_profiles_set_every_option():
    flow.set_printoptions(profile="short")
    assert flow.get_printoptions() == dict(DEFAULTS, precision=2, edgeitems=2)
    assert repr(flow.tensor([1 / 3])) == "tensor([0.33])"
    flow.set_printoptions(profile="full")
    assert flow.get_printoptions() == dict(DEFAULTS, threshold=math.inf)
    assert "..." not in repr(flow.arange(2000)) and repr(flow.arange(2000)).count(",") == 1999
    flow.set_printoptions(profile="default")
    assert flow.get_printoptions() == DEFAULTS


def test_sci_mode_forces_or_forbids_scientific_notation():
    flow.set_printoptions(sci_mode=True)
    assert repr(flow.tensor([1.5, 2.25])) == "tensor([1.5000e+00, 2.2500e+00])"
    assert repr(flow.tensor([-1.5, 2.25])) == "tensor([-1.5000e+00,  2.2500e+00])"   # aligned (PyTorch: not)
    assert repr(flow.zeros(2)) == "tensor([0., 0.])"   # nothing to scale: as PyTorch, no exponent
    flow.set_printoptions(sci_mode=False)
    assert repr(flow.tensor([1e-5, 1.0])) == "tensor([0.0000, 1.0000])"
    flow.set_printoptions(precision=4)   # as PyTorch: every call sets sci_mode, None when not given
    assert flow.get_printoptions()["sci_mode"] is None


def test_bad_options_are_refused():
    with pytest.raises(ArgumentValueError, match="profile 'long'.*default, short, full"):
        flow.set_printoptions(profile="long")
    with pytest.raises(ArgumentTypeError, match="precision"):
        flow.set_printoptions(precision=2.5)
    with pytest.raises(ArgumentTypeError, match="sci_mode"):
        flow.set_printoptions(sci_mode="yes")
    assert flow.get_printoptions() == DEFAULTS


# --- suffixes --------------------------------------------------------------------------------------------------

def test_the_device_is_printed_only_when_it_is_not_the_cpu():
    assert repr(flow.tensor([1.0, 2.0], device="cuda")) == "tensor([1., 2.], device='cuda:0')"
    assert repr(flow.tensor([1, 2], device="cuda:1")) == "tensor([1, 2], device='cuda:1')"
    assert repr(flow.tensor(0.5, device="cuda", dtype=flow.float16)) == \
        "tensor(0.5000, device='cuda:0', dtype=flow.float16)"


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                                   "float64"])
def test_the_dtype_is_printed_unless_it_is_a_default_one(dtype):
    text = repr(flow.tensor([1, 0], dtype=np.dtype(dtype)))
    shown = dtype not in ("float32", "int64", "bool")
    assert (f", dtype=flow.{dtype})" in text) == shown, text
    empty = repr(flow.zeros(0, dtype=np.dtype(dtype)))   # no value shows the kind: only float32 goes unsaid
    assert empty == ("tensor([])" if dtype == "float32" else f"tensor([], dtype=flow.{dtype})")


def test_requires_grad_and_grad_fn_suffixes():
    x = flow.ones(2, requires_grad=True)
    assert repr(x) == "tensor([1., 1.], requires_grad=True)"
    assert re.fullmatch(r"tensor\(\[2\., 2\.\], grad_fn=<MulBackward0 #\d+>\)", repr(x * 2))
    assert repr(x.detach()) == "tensor([1., 1.])"
    p = flow.nn.Parameter(flow.zeros(2, device="cuda"))
    assert repr(p) == "Parameter containing:\ntensor([0., 0.], device='cuda:0', requires_grad=True)"


def test_a_global_tensor_prints_its_placement_and_sbp_on_every_rank():
    def body():
        x = flow.tensor([[0.0, 1.0], [2.0, 3.0]], placement=flow.placement("cpu", [0, 1]), sbp=flow.sbp.split(0))
        return repr(x), str(x)

    expected = ('tensor([[0., 1.],\n        [2., 3.]], placement=placement(type="cpu", ranks=[0, 1]),\n'
                "       sbp=(sbp.split(dim=0),))")
    assert flow.distributed.run(body, world_size=2) == [(expected, expected)] * 2


# --- format specs ----------------------------------------------------------------------------------------------

def test_a_format_spec_formats_a_0d_tensors_value():
    third = flow.tensor(2.0) / 3
    assert f"{third:.3f}" == "0.667" and format(third, ".2e") == "6.67e-01"
    assert f"{flow.tensor(7):>4}" == "   7" and f"{flow.tensor(7, device='cuda'):03d}" == "007"
    assert f"{flow.tensor(2.5)}" == "2.5"   # the value's own format, as PyTorch (not str(t))


def test_other_tensors_take_only_the_empty_spec():
    t = flow.tensor([1.0, 2.0])
    assert f"{t}" == str(t) == "tensor([1., 2.])"
    with pytest.raises(TypeError, match="unsupported format string"):
        format(t, ".2f")


# --- properties ------------------------------------------------------------------------------------------------

NUMBER = re.compile(r"-?inf|nan|-?\d+(?:\.\d*)?(?:e[+-]\d+)?")


def _body(text: str) -> str:
    """The values part of ``tensor(<values>, <suffixes>)``."""
    inside = text[len("tensor("):]
    return inside[:inside.rindex("]") + 1] if inside.startswith("[") else inside.split(",")[0].rstrip(")")


def _tolerance(token: str) -> Decimal:
    """Half a unit in the last printed digit of ``token`` (exact: ``Decimal``, so 1e-320 does not underflow)."""
    mantissa, _, exponent = token.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return Decimal(5).scaleb(int(exponent or 0) - decimals - 1)


@st.composite
def float_arrays(draw):
    """Float16/32/64 arrays (0-d and empty too) of any values, or of values in one moderate range."""
    dtype = np.dtype(draw(st.sampled_from(["float16", "float32", "float64"])))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    moderate = st.floats(-100, 100, width=8 * dtype.itemsize)
    return draw(hnp.arrays(dtype, shape, elements=draw(st.sampled_from([hnp.from_dtype(dtype), moderate]))))


@given(values=float_arrays(), precision=st.integers(0, 8))
def test_printed_numbers_read_back_within_the_printed_precision(values, precision):
    with printoptions(precision=precision):
        text = repr(flow.tensor(values))
    tokens = NUMBER.findall(_body(text))
    assert len(tokens) == values.size, text
    for token, value in zip(tokens, values.ravel().astype(np.float64).tolist()):
        if math.isnan(value) or math.isinf(value):
            assert token == repr(value), (token, value, text)
        else:
            assert abs(Decimal(token) - Decimal(value)) <= _tolerance(token), (token, value, text)


@given(values=hnp.arrays(st.sampled_from([np.int64, np.int32, np.int8, np.uint8, np.bool_]),
                         hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
def test_integers_and_bools_print_exactly(values):
    shown = re.findall(r"True|False|-?\d+", _body(repr(flow.tensor(values))))
    assert shown == [str(v) for v in values.ravel().tolist()]


def _read_summary(body: str):
    """A printed int tensor as nested lists, ``...`` as None."""
    return ast.literal_eval(body.replace("...", "None"))


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=9), edgeitems=st.integers(1, 3),
       threshold=st.integers(0, 30))
def test_a_summarised_dimension_shows_exactly_2_edgeitems_entries(shape, edgeitems, threshold):
    values = np.arange(math.prod(shape)).reshape(shape)
    with printoptions(edgeitems=edgeitems, threshold=threshold):
        printed = _read_summary(_body(repr(flow.tensor(values))))
    summarised = values.size > threshold

    def check(node, part):   # node: the printed list for the numpy array part
        size = part.shape[0]
        if summarised and size > 2 * edgeitems:
            assert len(node) == 2 * edgeitems + 1 and node[edgeitems] is None, (node, part.shape)
            kept = list(range(edgeitems)) + list(range(size - edgeitems, size))
            node = node[:edgeitems] + node[edgeitems + 1:]
        else:
            assert len(node) == size, (node, part.shape)
            kept = range(size)
        for child, i in zip(node, kept):
            if part.ndim > 1:
                check(child, part[i])
            else:
                assert child == part[i]

    check(printed, values)


@given(ints=hnp.arrays(np.int64, st.integers(1, 200), elements=st.integers(-10**6, 10**6)),
       kind=st.sampled_from(["ints", 1, 3, 1e-3]), linewidth=st.integers(40, 160))
def test_a_printed_row_fits_in_the_linewidth(ints, kind, linewidth):
    """Every line fits; PyTorch lets only the closing parenthesis of the last line pass by one."""
    values = ints if kind == "ints" else (ints / kind).astype(np.float32)
    with printoptions(linewidth=linewidth):
        lines = repr(flow.tensor(values)).split("\n")
    for line in lines[:-1]:
        assert len(line) <= linewidth, lines
    assert len(lines[-1].removesuffix(")")) <= linewidth, lines


@given(precision=st.integers(0, 10), threshold=st.integers(0, 5000), edgeitems=st.integers(0, 5),
       linewidth=st.integers(1, 200), sci_mode=st.sampled_from([None, True, False]),
       profile=st.sampled_from([None, "default", "short", "full"]))
def test_set_printoptions_is_undone_by_the_default_profile_and_by_printoptions(precision, threshold, edgeitems,
                                                                             linewidth, sci_mode, profile):
    t = flow.tensor([[1 / 3, 2.0], [1e-5, 3.0]])
    before = repr(t)
    with printoptions(precision=precision, threshold=threshold, edgeitems=edgeitems, linewidth=linewidth,
                      sci_mode=sci_mode, profile=profile):
        assert flow.get_printoptions() == dict(precision=precision, threshold=threshold, edgeitems=edgeitems,
                                               linewidth=linewidth, sci_mode=sci_mode)   # they beat the profile
        repr(t)
    assert flow.get_printoptions() == DEFAULTS and repr(t) == before
    flow.set_printoptions(precision=precision, edgeitems=edgeitems, sci_mode=sci_mode)
    flow.set_printoptions(profile="default")
    assert flow.get_printoptions() == DEFAULTS and repr(t) == before


def test_repr_and_str_agree_and_the_defaults_are_pytorchs():
    assert flow.get_printoptions() == DEFAULTS == PrintOptions().__dict__
    for t in (flow.tensor(1.5), flow.arange(3), flow.zeros(0, 2), flow.tensor([True])):
        assert repr(t) == str(t)


@pytest.mark.parametrize("values", [np.zeros(12, np.float32), np.array([np.nan, np.inf, -np.inf] * 5, np.float32)])
def test_rows_of_only_zeros_or_non_finite_values_wrap_by_their_own_width(values):
    """No nonzero finite value chooses the column width (it stays 1, unpadded, as PyTorch); the row is still
    wrapped by the entries' real width (found by the hypothesis test above: 'tensor([0., 0., ...' past 40)."""
    with printoptions(linewidth=40):
        lines = repr(flow.tensor(values)).split("\n")
    assert len(lines) > 1 and all(len(line) <= 40 for line in lines[:-1]), lines
