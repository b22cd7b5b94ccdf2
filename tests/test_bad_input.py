"""Every bad input is caught at the call: one row per bad input.

Each row is a call that must raise a specific pyflow error *at the call*: the
message names the op, and the shape, dtype and device of every tensor involved
(plus the offending value where there is one); no instruction is issued; and
the VM works afterwards.  Rows run on "cpu" and "cuda".  The operands are made
before the instruction count is taken, so only the bad call itself is measured.

``x`` is float32[2, 3], ``i`` int64[2], ``b`` bool[2, 3] (``x > 0``), ``img``
float32[1, 1, 4, 4], on the device under test; ``other`` is x's twin on the other
device.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import pytest

import pyflow as flow
from pyflow.errors import (ArgumentTypeError, AxisError, DeviceError, DTypeError, IndexOutOfRangeError,
                           PyflowError, ShapeError)
from tests.strategies import TARGETS


@dataclasses.dataclass
class Row:
    name: str
    error: type
    call: Callable            # call(t) with t the namespace of operands below
    op: str                   # text the message must contain (the op's name)
    tensors: tuple = ()       # names of the operands the message must describe
    mentions: tuple = ()      # other text the message must contain
    only: str | None = None   # run on this device only


ROWS = [
    # devices: checked at the call, not at a later sync
    Row("tensor-on-missing-device", DeviceError, lambda t: flow.tensor([1.0], device="cuda:9"), "tensor",
        mentions=("cuda:9",)),
    Row("zeros-on-missing-device", DeviceError, lambda t: flow.zeros(2, device="cuda:9"), "zeros",
        mentions=("cuda:9",)),
    Row("empty-on-missing-device", DeviceError, lambda t: flow.empty(2, device="cuda:9"), "empty",
        mentions=("cuda:9",)),
    Row("arange-on-missing-device", DeviceError, lambda t: flow.arange(3, device="cuda:9"), "arange",
        mentions=("cuda:9",)),
    Row("randn-on-missing-device", DeviceError, lambda t: flow.randn(2, device="cuda:9"), "randn",
        mentions=("cuda:9",)),
    Row("zeros_like-on-missing-device", DeviceError, lambda t: flow.zeros_like(t.x, device="cuda:9"), "zeros_like",
        mentions=("cuda:9",)),
    Row("to-missing-device", DeviceError, lambda t: t.x.to("cuda:9"), "to", ("x",), ("cuda:9",)),
    Row("cuda-missing-index", DeviceError, lambda t: t.x.cuda(9), "to", ("x",), ("cuda:9",)),
    Row("to-unknown-device-type", DeviceError, lambda t: t.x.to("gpu"), "to", ("x",), ("gpu",)),
    Row("mixing-devices", DeviceError, lambda t: t.x + t.other, "add", ("x", "other"), (".to(",)),
    # dtypes
    Row("tensor-of-objects", DTypeError, lambda t: flow.tensor(np.array([1.5, "x", None], dtype=object)),
        "tensor", mentions=("object",)),
    Row("zeros-of-objects", DTypeError, lambda t: flow.zeros(4, dtype=object), "zeros", mentions=("object",)),
    Row("cast-to-object", DTypeError, lambda t: flow.cast(t.x, object), "cast", ("x",), ("object",)),
    Row("to-object", DTypeError, lambda t: t.x.to(object), "to", ("x",), ("object",)),
    Row("to-complex", DTypeError, lambda t: t.x.to(np.complex64), "to", ("x",), ("complex64",)),
    Row("tensor-of-strings", DTypeError, lambda t: flow.tensor(["a", "b"]), "tensor", mentions=("<U1",)),
    Row("tensor-of-complex", DTypeError, lambda t: flow.tensor([1 + 2j]), "tensor", mentions=("complex",)),
    Row("int-add_-float", DTypeError, lambda t: t.i.add_(1.5), "add", ("i",), ("can't be cast", "float32")),
    Row("int-div_", DTypeError, lambda t: t.i.div_(2), "div", ("i",), ("can't be cast",)),
    Row("int8-plus-out-of-range-scalar", DTypeError, lambda t: t.i8 + 1000, "add", ("i8",), ("1000", "int8")),
    Row("bitwise-of-floats", DTypeError, lambda t: t.x & t.x, "bitwise_and", ("x",), ("float32",)),
    Row("invert-of-floats", DTypeError, lambda t: ~t.x, "bitwise_not", ("x",)),
    Row("mean-of-ints", DTypeError, lambda t: t.i.mean(), "mean", ("i",)),
    Row("var-of-ints", DTypeError, lambda t: t.i.var(), "var", ("i",)),
    Row("softmax-of-ints", DTypeError, lambda t: flow.softmax(t.i), "softmax", ("i",)),
    Row("where-float-condition", DTypeError, lambda t: flow.where(t.x, t.x, t.x), "where", ("x",)),
    Row("float-index", DTypeError, lambda t: t.x[t.x[0]], "indexing", ("x",), ("float32",)),
    Row("gather-float-index", DTypeError, lambda t: flow.gather(t.x, 1, t.x), "gather", ("x",)),
    Row("conv2d-mixed-dtypes", DTypeError, lambda t: flow.nn.functional.conv2d(t.img, t.img64), "conv2d",
        ("img",), ("float64",)),
    # sizes
    Row("zeros-negative", ShapeError, lambda t: flow.zeros(-1), "zeros", mentions=("-1",)),
    Row("zeros-float-size", ArgumentTypeError, lambda t: flow.zeros(2.5), "zeros", mentions=("2.5",)),
    Row("zeros-string-size", ArgumentTypeError, lambda t: flow.zeros("3"), "zeros", mentions=("'3'",)),
    Row("zeros-bool-size", ArgumentTypeError, lambda t: flow.zeros(True), "zeros", mentions=("True",)),
    Row("ones-none-in-size", ArgumentTypeError, lambda t: flow.ones((2, None)), "ones", mentions=("None",)),
    Row("empty-negative", ShapeError, lambda t: flow.empty(2, -3), "empty", mentions=("-3",)),
    Row("eye-negative", ShapeError, lambda t: flow.eye(-1), "eye", mentions=("-1",)),
    Row("linspace-negative-steps", ShapeError, lambda t: flow.linspace(0, 1, -2), "linspace", mentions=("-2",)),
    Row("arange-zero-step", ShapeError, lambda t: flow.arange(0, 5, 0), "arange", mentions=("step 0",)),
    Row("randint-empty-range", ShapeError, lambda t: flow.randint(5, 2, (2,)), "randint", mentions=("5", "2")),
    # fill values
    Row("full-string", ArgumentTypeError, lambda t: flow.full((2,), "x"), "full", mentions=("'x'",)),
    Row("full-none", ArgumentTypeError, lambda t: flow.full((2,), None), "full", mentions=("None",)),
    Row("full-overflowing-float16", DTypeError, lambda t: flow.full((2,), 1e6, dtype=flow.float16), "full",
        mentions=("float16",)),
    Row("full-uint8-negative", DTypeError, lambda t: flow.full((2,), -1, dtype=flow.uint8), "full",
        mentions=("uint8", "-1")),
    Row("full-nan-into-int", DTypeError, lambda t: flow.full((2,), float("nan"), dtype=flow.int64), "full",
        mentions=("nan",)),
    Row("fill_-string", ArgumentTypeError, lambda t: t.x.fill_("a"), "fill_", ("x",), ("'a'",)),
    Row("fill_-with-a-vector", ShapeError, lambda t: t.x.fill_(t.x[0]), "fill_", ("x",)),
    Row("setitem-string", ArgumentTypeError, lambda t: t.x.__setitem__(0, "a"), "setitem", ("x",), ("str",)),
    Row("add-string", ArgumentTypeError, lambda t: t.x + "a", "add", ("x",), ("str",)),
    Row("add-two-numbers", ArgumentTypeError, lambda t: flow.add(1, 2), "add"),
    Row("clamp-without-bounds", ArgumentTypeError, lambda t: flow.clamp(t.x), "clamp", ("x",)),
    Row("copy_-a-number", ArgumentTypeError, lambda t: t.x.copy_(1.0), "copy_", mentions=("float",)),
    # dims and axes
    Row("sum-float-dim", ArgumentTypeError, lambda t: t.x.sum(dim=1.0), "sum", ("x",), ("1.0",)),
    Row("sum-string-dim", ArgumentTypeError, lambda t: t.x.sum(dim="x"), "sum", ("x",), ("'x'",)),
    Row("sum-dim-out-of-range", AxisError, lambda t: t.x.sum(dim=5), "sum", ("x",), ("5",)),
    Row("mean-repeated-dim", AxisError, lambda t: t.x.mean(dim=(0, -2)), "mean", ("x",), ("repeated",)),
    Row("max-float-dim", ArgumentTypeError, lambda t: t.x.max(dim=1.5), "max", ("x",), ("1.5",)),
    Row("keepdim-not-bool", ArgumentTypeError, lambda t: t.x.sum(1, keepdim="yes"), "sum", mentions=("'yes'",)),
    Row("cumsum-dim-out-of-range", AxisError, lambda t: t.x.cumsum(2), "cumsum", ("x",)),
    Row("unsqueeze-out-of-range", AxisError, lambda t: t.x.unsqueeze(4), "unsqueeze", ("x",)),
    Row("transpose-out-of-range", AxisError, lambda t: t.x.transpose(0, 2), "transpose", ("x",)),
    Row("permute-not-a-permutation", ShapeError, lambda t: t.x.permute(0, 0), "permute", ("x",)),
    Row("index_select-float-dim", ArgumentTypeError, lambda t: t.x.index_select(1.0, t.i), "index_select",
        ("x",)),
    # shapes
    Row("view-of-a-transpose", ShapeError, lambda t: t.x.T.view(-1), "view", ("x.T",), (".reshape(",)),
    Row("reshape-wrong-size", ShapeError, lambda t: t.x.reshape(4), "reshape", ("x",)),
    Row("reshape-float-size", ArgumentTypeError, lambda t: t.x.reshape(2.5, 2), "reshape", ("x",)),
    Row("reshape-of-a-list", ArgumentTypeError, lambda t: flow.reshape([1, 2], 2), "reshape", mentions=("list",)),
    Row("expand-non-singleton", ShapeError, lambda t: t.x.expand(3, 3), "expand", ("x",)),
    Row("write-to-expanded", ShapeError, lambda t: t.x[0].expand(2, 3).add_(1), "add", ("x",), ("clone",)),
    Row("inplace-broadcast-up", ShapeError, lambda t: t.x[0].add_(t.x), "add", ("x",), ("keeps its shape",)),
    Row("add-shapes", ShapeError, lambda t: t.x + t.x[:, :2], "add", ("x",)),
    Row("matmul-shapes", ShapeError, lambda t: t.x @ t.x, "matmul", ("x",)),
    Row("cat-shapes", ShapeError, lambda t: flow.cat([t.x, t.x.T]), "cat", ("x",)),
    Row("cat-of-a-tensor", ArgumentTypeError, lambda t: flow.cat(t.x), "cat"),
    Row("stack-shapes", ShapeError, lambda t: flow.stack([t.x, t.x[0]]), "stack", ("x",)),
    Row("gather-index-too-big", ShapeError, lambda t: flow.gather(t.x, 0, t.idx4), "gather", ("x", "idx4")),
    Row("index_select-2d-index", ShapeError, lambda t: t.x.index_select(0, t.idx4), "index_select", ("idx4",)),
    Row("narrow-out-of-range", IndexOutOfRangeError, lambda t: t.x.narrow(1, 2, 5), "narrow", ("x",)),
    Row("split-bad-sections", ShapeError, lambda t: t.x.split([1, 2]), "split", ("x",)),
    Row("chunk-zero", ShapeError, lambda t: t.x.chunk(0), "chunk", ("x",)),
    Row("topk-k-too-big", ShapeError, lambda t: t.x.topk(4), "topk", ("x",), ("k=4",)),
    Row("topk-k-beyond-the-cuda-kernel", ShapeError, lambda t: t.long.topk(65), "topk", ("long",), ("65",),
        only="cuda"),
    Row("copy_-shapes", ShapeError, lambda t: t.x.copy_(t.i), "copy_", ("x", "i")),
    Row("setitem-value-shape", ShapeError, lambda t: t.x.__setitem__(0, t.x), "setitem", ("x",)),
    Row("conv2d-channels", ShapeError, lambda t: flow.nn.functional.conv2d(t.img, t.img[:, :, :2, :2].expand(
        1, 2, 2, 2)), "conv2d", ("img",)),
    Row("max_pool2d-3d", ShapeError, lambda t: flow.nn.functional.max_pool2d(t.x, 2), "max_pool2d", ("x",)),
    Row("avg_pool2d-window-too-big", ShapeError, lambda t: flow.nn.functional.avg_pool2d(t.img, 5), "avg_pool2d",
        ("img",)),
    Row("item-of-many", ShapeError, lambda t: t.x.item(), "item", ("x",)),
    Row("tensor-ragged", ShapeError, lambda t: flow.tensor([[1, 2], [3]]), "tensor"),
    # indexing
    Row("index-out-of-range", IndexOutOfRangeError, lambda t: t.x[2], "indexing", ("x",), ("2",)),
    Row("list-index-out-of-range", IndexOutOfRangeError, lambda t: t.x[:, [0, 3]], "indexing", ("x",), ("3",)),
    Row("setitem-list-index-out-of-range", IndexOutOfRangeError, lambda t: t.x.__setitem__([-3], 0.0),
        "indexing", ("x",), ("-3",)),
    Row("too-many-indices", IndexOutOfRangeError, lambda t: t.x[0, 0, 0], "indexing", ("x",)),
    Row("mask-wrong-shape", IndexOutOfRangeError, lambda t: t.x[t.b[0]], "indexing", ("x",), ("mask",)),
    Row("negative-step", ShapeError, lambda t: t.x[::-1], "indexing", ("x",), ("-1",)),
    Row("string-index", ArgumentTypeError, lambda t: t.x["a"], "indexing", ("x",), ("'a'",)),
    Row("mask-beside-an-index", ArgumentTypeError, lambda t: t.x[t.b[:, 0], [1, 2]], "indexing", ("x",),
        ("nonzero",)),
    Row("indices-that-do-not-broadcast", ShapeError, lambda t: t.x[[0, 1], [0, 1, 2]], "indexing", ("x",),
        ("broadcast",)),
    Row("norm-negative-p", ArgumentTypeError, lambda t: t.x.norm(p=-1), "norm", ("x",), ("-1",)),
    Row("from_numpy-of-a-list", ArgumentTypeError, lambda t: flow.from_numpy([1, 2]), "from_numpy",
        mentions=("list",)),
    Row("manual_seed-string", ArgumentTypeError, lambda t: flow.manual_seed("x"), "manual_seed"),
]


class Operands:
    """The tensors the rows use, made before the instruction count is taken."""

    def __init__(self, device):
        self.x = flow.tensor([[1.0, -2.0, 3.0], [4.0, -5.0, 6.0]], device=device)
        self.i = flow.tensor([1, 2], device=device)
        self.i8 = flow.tensor([1, 2], dtype=flow.int8, device=device)
        self.b = self.x > 0
        self.img = flow.zeros(1, 1, 4, 4, device=device)
        self.img64 = flow.zeros(1, 1, 2, 2, dtype=flow.float64, device=device)
        self.idx4 = flow.tensor([[0, 1, 0, 1]], device=device)
        self.long = flow.zeros(70, device=device)
        self.other = flow.zeros(2, 3, device="cpu" if device == "cuda" else "cuda")

    def describe(self, name):
        t = eval(name, {}, vars(self))   # noqa: S307 - a name like "x" or "x.T"
        return t


CASES = [pytest.param(row, device, id=f"{row.name}-{device}") for row in ROWS for device in TARGETS
         if row.only in (None, device)]  # a row with ``only`` is a limit of that device alone


@pytest.mark.parametrize("row, device", CASES)
def test_bad_input_is_rejected_at_the_call(row, device):
    t = Operands(device)
    engine = flow.vm.get_vm().engine
    flow.sync()                                # releases of earlier tensors are issued by now
    before = engine.received
    started = time.monotonic()
    with pytest.raises(row.error) as info:
        row.call(t)
    assert time.monotonic() - started < 5, "the error came late (a wait, not a check at the call)"
    error, message = info.value, str(info.value)
    assert isinstance(error, PyflowError), f"{type(error).__name__} is not a pyflow error"
    assert engine.received == before, f"the rejected call issued {engine.received - before} instruction(s)"
    assert row.op in message, f"the message does not name the op {row.op!r}: {message}"
    for name in row.tensors:
        tensor = t.describe(name)
        assert str(list(tensor.shape)) in message or str(tuple(tensor.shape)) in message, \
            f"the message does not name the shape of {name} {tensor.shape}: {message}"
        assert str(tensor.dtype) in message, f"the message does not name the dtype of {name}: {message}"
        assert str(tensor.device) in message, f"the message does not name the device of {name}: {message}"
    for text in row.mentions:
        assert text in message, f"the message does not mention {text!r}: {message}"
    x = flow.tensor([1.0, -2.0, 3.0], device=device)
    np.testing.assert_array_equal((flow.relu(x) * 2).numpy(), [2.0, 0.0, 6.0])   # the VM still works


def test_the_table_covers_every_error_class():
    covered = {r.error for r in ROWS}
    assert {ArgumentTypeError, AxisError, DeviceError, DTypeError, IndexOutOfRangeError, ShapeError} <= covered
