"""Attention, Seq2seq, BlockDrop and SkipNet on ``pyflow.Tensor`` s: tensors in, tensors out (issue 17).

As for ``StackedLSTM`` and ``NASRNN`` (``test_cocktailer_tensors.py``): a model called with
tensors runs its program as one VM instruction (``cocktailer/launch.py``) and returns
tensors on the inputs' device, bitwise equal to the numpy path's arrays, in both
executors and on "cpu" and "cuda" (the simulator).  Numpy in still gives numpy out.
The sizes are the models' own tests' tiny ones.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import pyflow as flow
from pyflow.models import Attention, BlockDrop, Seq2seq, SkipNet

MODES = ("compiled", "host")
DEVICES = ("cpu", "cuda")
TINY = {"threads": 4, "chunk": 4, "tile": 4}
TINY_RESNET = {"threads": 4, "chunk": 16, "tile": 4}   # test_models_blockdrop_skipnet.py's


@pytest.fixture(autouse=True)
def fresh_vm():
    flow.vm.shutdown()
    yield
    flow.vm.shutdown()


# ---- the models and their inputs (numpy), made once: programs are compiled once per mode ------------------------


@functools.lru_cache(maxsize=None)
def attention():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 1, 4)).astype(np.float32)
    k, v = np.zeros((2, 1, 2, 5, 4), np.float32)
    k[:, :, :3], v[:, :, :3] = rng.standard_normal((2, 1, 2, 3, 4))
    return Attention(2, 4, 3, **TINY), (x, k, v), {}


@functools.lru_cache(maxsize=None)
def seq2seq():
    rng = np.random.default_rng(2)
    encoder_output = rng.standard_normal((3, 2, 4)).astype(np.float32)
    std = rng.standard_normal((3, 2, 6)).astype(np.float32)
    h, c = rng.standard_normal((2, 2, 4)).astype(np.float32)
    return Seq2seq(4, 6, 3, **TINY), (encoder_output, std, h, c), {}


@functools.lru_cache(maxsize=None)
def blockdrop():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    probs = rng.random((2, 3)).astype(np.float32)
    return BlockDrop((1, 1, 1), 3, width=2, image_size=8, **TINY_RESNET), (x, probs), {}


@functools.lru_cache(maxsize=None)
def skipnet():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ch, cc = (0.5 * rng.standard_normal((2, 1, 2, 10))).astype(np.float32)
    model = SkipNet((1, 1, 1, 1), image_size=16, num_classes=3, width=1, **TINY_RESNET)
    return model, (x, ch, cc), {"actions": [1, 0, 1]}


MODELS = {"attention": attention, "seq2seq": seq2seq, "blockdrop": blockdrop, "skipnet": skipnet}


@functools.lru_cache(maxsize=None)
def numpy_outputs(name, mode):
    model, args, kwargs = MODELS[name]()
    out = model(*args, **kwargs, mode=mode)
    return out if isinstance(out, tuple) else (out,)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


# ---- the tests ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(MODELS))
def test_tensors_in_give_tensors_out_equal_to_the_numpy_path(name, mode, device):
    model, args, kwargs = MODELS[name]()
    want = numpy_outputs(name, mode)
    assert all(type(w) is np.ndarray for w in want), "numpy in must still give numpy out"
    got = as_tuple(model(*(flow.tensor(a, device=device) for a in args), **kwargs, mode=mode))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, flow.Tensor) and g.device == flow.device(device)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), w)


@pytest.mark.parametrize("mode", MODES)
def test_seq2seq_tokens_are_int64_and_last_steps_is_read_from_the_tensor(mode):
    model, (encoder_output, std, h, c), _ = seq2seq()
    tokens, _ = numpy_outputs("seq2seq", mode)
    model(encoder_output, std, h, c, mode=mode)
    steps = model.last_steps
    assert tokens.dtype == np.int64 and steps >= 1
    got, h_n = model(*(flow.tensor(a, device="cuda") for a in (encoder_output, std, h, c)), mode=mode)
    assert got.dtype == np.int64 and isinstance(h_n, flow.Tensor)
    assert model.last_steps == steps   # read after the call: waits for the tokens
    np.testing.assert_array_equal(got.numpy(), tokens)


def test_a_tensor_encoder_output_alone_takes_the_tensor_path():
    model, (encoder_output, std, h, c), _ = seq2seq()
    want = numpy_outputs("seq2seq", "compiled")
    got = model(flow.tensor(encoder_output, device="cuda"), std, h, c, mode="compiled")
    for g, w in zip(got, want):
        assert isinstance(g, flow.Tensor) and g.device == flow.device("cuda")
        np.testing.assert_array_equal(g.numpy(), w)


def test_mixed_tensor_and_numpy_inputs_and_the_one_instruction_path():
    model, (x, k, v), _ = attention()
    want = numpy_outputs("attention", "compiled")
    got = model(flow.tensor(x, device="cuda"), k, v, mode="compiled")
    for g, w in zip(got, want):
        assert isinstance(g, flow.Tensor)
        np.testing.assert_array_equal(g.numpy(), w)
    assert model.last_compiled.last_stats.launches == 1   # the persistent kernel, once, inside the instruction
