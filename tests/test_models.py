"""pyflow.models: the LSTM and RAE benchmarks of Cocktailer (seed 001), as specifications.

* LSTM: PyTorch ``nn.LSTM`` semantics (a numpy reference written here, and torch
  itself when it is installed); the compiled executor (one persistent kernel) is
  bitwise equal to the host executor (one launch per operator).
* RAE: a numpy recursion over random binary trees; recursion deeper than the
  artifact's fixed 32 frames works, deeper than ``stack_depth`` raises
  ``StackOverflowError`` in both modes.
* Bad state dicts and bad trees raise errors that name what is wrong.

Sizes are tiny (threads 4, chunk 4, tile 4): every kernel runs in the simulator.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.errors import IndexOutOfRangeError, ShapeError, StackOverflowError
from pyflow.models import RAE, StackedLSTM, StateDictError
from pyflow.models.rae import TreeError

# host and compiled executors are compared bit for bit: both on one simulator tier (tests/conftest.py)
pytestmark = pytest.mark.sim_tier("threads")

TINY = {"threads": 4, "chunk": 4, "tile": 4}


# ---- references ----------------------------------------------------------------------


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def lstm_reference(x, h0, c0, state_dict, num_layers):
    """``nn.LSTM`` (seq-first, gate order i, f, g, o) in float64 numpy."""
    h, c = h0.astype(np.float64).copy(), c0.astype(np.float64).copy()
    p = {k: v.astype(np.float64) for k, v in state_dict.items()}
    outputs = []
    for x_t in x.astype(np.float64):
        layer_in = x_t
        for k in range(num_layers):
            gates = (layer_in @ p[f"weight_ih_l{k}"].T + p[f"bias_ih_l{k}"]
                     + h[k] @ p[f"weight_hh_l{k}"].T + p[f"bias_hh_l{k}"])
            i, f, g, o = np.split(gates, 4, axis=-1)
            c[k] = _sigmoid(f) * c[k] + _sigmoid(i) * np.tanh(g)
            h[k] = _sigmoid(o) * np.tanh(c[k])
            layer_in = h[k]
        outputs.append(layer_in.copy())
    return np.stack(outputs), h, c


def random_lstm_state(rng, input_size, hidden, num_layers):
    d = {}
    for k in range(num_layers):
        d[f"weight_ih_l{k}"] = rng.standard_normal((4 * hidden, input_size if k == 0 else hidden)) * 0.5
        d[f"weight_hh_l{k}"] = rng.standard_normal((4 * hidden, hidden)) * 0.5
        d[f"bias_ih_l{k}"] = rng.standard_normal(4 * hidden) * 0.5
        d[f"bias_hh_l{k}"] = rng.standard_normal(4 * hidden) * 0.5
    return {k: v.astype(np.float32) for k, v in d.items()}


def rae_reference(left, right, is_leaf, inp, weight, bias, node):
    """The RAE as a plain recursion, in float64."""
    if is_leaf[node]:
        return inp[node].astype(np.float64)
    children = np.concatenate([rae_reference(left, right, is_leaf, inp, weight, bias, left[node]),
                               rae_reference(left, right, is_leaf, inp, weight, bias, right[node])])
    return np.tanh(weight.astype(np.float64) @ children + bias)


def random_tree(rng, n_leaves):
    """A random binary tree with ``n_leaves`` leaves, node ids shuffled; returns (left, right, is_leaf, root)."""
    left, right, is_leaf = [], [], []

    def build(k):
        node = len(is_leaf)
        left.append(-1), right.append(-1), is_leaf.append(1 if k == 1 else 0)
        if k > 1:
            split = int(rng.integers(1, k))
            left[node], right[node] = build(split), build(k - split)
        return node

    build(n_leaves)
    n = len(is_leaf)
    perm = rng.permutation(n)                    # node i is called perm[i]
    new_left, new_right, new_leaf = np.full(n, -1), np.full(n, -1), np.zeros(n, np.int64)
    for i in range(n):
        new_leaf[perm[i]] = is_leaf[i]
        if not is_leaf[i]:
            new_left[perm[i]], new_right[perm[i]] = perm[left[i]], perm[right[i]]
    return new_left, new_right, new_leaf, int(perm[0])


def left_chain(depth):
    """A left-deep tree: inner node k has children k + 1 (inner, or the last leaf) and a leaf."""
    n = 2 * depth + 1
    left, right, is_leaf = np.full(n, -1), np.full(n, -1), np.ones(n, np.int64)
    for k in range(depth):
        is_leaf[k] = 0
        left[k] = min(k + 1, depth)
        right[k] = depth + 1 + k
    return left, right, is_leaf


# ---- StackedLSTM --------------------------------------------------------------------------


@settings(max_examples=5)
@given(seq=st.integers(1, 3), batch=st.integers(1, 2), input_size=st.integers(1, 4), hidden=st.integers(2, 5),
       layers=st.integers(1, 2), blocks=st.integers(1, 4), given_state=st.booleans(), seed=st.integers(0, 2**16))
def test_lstm_matches_nn_lstm_semantics_and_host_equals_compiled(seq, batch, input_size, hidden, layers, blocks,
                                                                 given_state, seed):
    rng = np.random.default_rng(seed)
    model = StackedLSTM(input_size, hidden, layers, blocks=blocks, **TINY)
    state = random_lstm_state(rng, input_size, hidden, layers)
    model.load_state_dict(state)
    x = rng.standard_normal((seq, batch, input_size)).astype(np.float32)
    h0 = rng.standard_normal((layers, batch, hidden)).astype(np.float32) if given_state else None
    c0 = rng.standard_normal((layers, batch, hidden)).astype(np.float32) if given_state else None
    zeros = np.zeros((layers, batch, hidden), np.float32)
    want = lstm_reference(x, zeros if h0 is None else h0, zeros if c0 is None else c0, state, layers)

    out_c, (h_c, c_c) = model(x, h0, c0, mode="compiled")
    out_h, (h_h, c_h) = model(x, h0, c0, mode="host")
    for got, ref in zip((out_c, h_c, c_c), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    for a, b in zip((out_c, h_c, c_c), (out_h, h_h, c_h)):
        assert a.dtype == np.float32 and np.array_equal(a, b)


def test_lstm_compiled_is_one_launch_without_host_syncs():
    seq, layers = 3, 2
    model = StackedLSTM(2, 3, layers, blocks=2, **TINY)
    x = np.ones((seq, 1, 2), np.float32)
    model(x, mode="compiled")
    compiled = model.last_compiled
    assert compiled is model.compiled_for(seq, 1, "compiled")
    assert (compiled.last_stats.launches, compiled.last_stats.host_syncs) == (1, 0)
    # at least: each layer's cell reads other blocks' matmul tiles; at most: what lstm.py documents
    # (2 per layer and step, 1 for the output row, 1 after the loop), well under the artifact's 5 * layers + 1
    assert seq * layers <= compiled.last_stats.barriers <= seq * (2 * layers + 1) + 1
    assert "for i0 in range(3)" in compiled.source        # the time loop lives inside the kernel
    model(x, mode="host")  # the host executor: every operator (3 per layer and step at least) is a launch
    assert model.last_compiled.last_stats.launches >= 3 * seq * layers


def test_one_trace_serves_any_weights_and_is_cached_per_shape():
    rng = np.random.default_rng(3)
    model = StackedLSTM(2, 3, 1, blocks=2, **TINY)
    x = rng.standard_normal((2, 1, 2)).astype(np.float32)
    first, _ = model(x)
    compiled = model.last_compiled
    state = random_lstm_state(rng, 2, 3, 1)
    model.load_state_dict(state)
    second, _ = model(x)
    assert model.last_compiled is compiled        # new weights, same program and kernel
    assert not np.allclose(first, second)
    zeros = np.zeros((1, 1, 3), np.float32)
    np.testing.assert_allclose(second, lstm_reference(x, zeros, zeros, state, 1)[0], rtol=1e-4, atol=1e-5)
    model(x[:1])                                   # another sequence length: another program
    assert model.last_compiled is not compiled


def test_lstm_unbatched_input_is_batch_of_one():
    rng = np.random.default_rng(4)
    model = StackedLSTM(3, 2, 2, blocks=1, **TINY)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    h0 = rng.standard_normal((2, 2)).astype(np.float32)
    out, (h_n, c_n) = model(x, h0=h0)
    out_b, (h_b, c_b) = model(x[:, None], h0=h0[:, None])
    assert out.shape == (2, 2) and h_n.shape == c_n.shape == (2, 2)
    assert np.array_equal(out, out_b[:, 0]) and np.array_equal(h_n, h_b[:, 0]) and np.array_equal(c_n, c_b[:, 0])


def test_lstm_matches_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.LSTM(3, 4, num_layers=2)
    model = StackedLSTM(3, 4, 2, blocks=3, **TINY)
    model.load_state_dict(reference.state_dict())
    x = torch.randn(3, 2, 3)
    h0, c0 = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    with torch.no_grad():
        want, (h_want, c_want) = reference(x, (h0, c0))
    out, (h_n, c_n) = model(x.numpy(), h0.numpy(), c0.numpy())
    for got, ref in ((out, want), (h_n, h_want), (c_n, c_want)):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_lstm_state_dict_round_trips():
    model = StackedLSTM(2, 3, 2, **TINY)
    state = random_lstm_state(np.random.default_rng(5), 2, 3, 2)
    model.load_state_dict(state)
    back = model.state_dict()
    assert back.keys() == state.keys() and all(np.array_equal(back[k], state[k]) for k in state)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("bias_hh_l1"), "missing keys ['bias_hh_l1']"),
    (lambda d: d.update(weight_ih_l2=np.zeros((12, 3))), "unexpected keys ['weight_ih_l2']"),
    (lambda d: d.update(weight_ih_l0=np.zeros((12, 3))), "'weight_ih_l0' has shape (12, 3), expected (12, 2)"),
    (lambda d: d.update(weight_ih_l1=np.zeros((12, 2))), "'weight_ih_l1' has shape (12, 2), expected (12, 3)"),
    (lambda d: d.update(bias_ih_l0=np.zeros((3, 4))), "'bias_ih_l0' has shape (3, 4), expected (12,)"),
])
def test_bad_lstm_state_dict_names_the_problem_and_changes_nothing(change, message):
    model = StackedLSTM(2, 3, 2, **TINY)
    before = model.state_dict()
    state = random_lstm_state(np.random.default_rng(6), 2, 3, 2)
    change(state)
    with pytest.raises(StateDictError, match=r"StackedLSTM\.load_state_dict") as info:
        model.load_state_dict(state)
    assert message in str(info.value)
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_lstm_rejects_bad_inputs_before_running():
    model = StackedLSTM(2, 3, 1, **TINY)
    with pytest.raises(ShapeError, match="input must be"):
        model(np.ones((2, 1, 5), np.float32))
    with pytest.raises(ShapeError, match="h0 must be"):
        model(np.ones((2, 1, 2), np.float32), h0=np.zeros((2, 1, 3), np.float32))
    with pytest.raises(ValueError, match="mode must be one of"):
        model(np.ones((2, 1, 2), np.float32), mode="eager")
    with pytest.raises(ValueError, match="threads"):
        StackedLSTM(2, 3, threads=0)
    with pytest.raises(ValueError, match="tile an int in 1..32"):
        RAE(2, tile=64)


# ---- RAE ----------------------------------------------------------------------------------


def random_rae(rng, dim, **options):
    model = RAE(dim, **options)
    model.load_state_dict({"encoder.weight": (rng.standard_normal((dim, 2 * dim)) * 0.5).astype(np.float32),
                           "encoder.bias": (rng.standard_normal(dim) * 0.5).astype(np.float32)})
    return model


@settings(max_examples=5)
@given(n_leaves=st.integers(1, 6), dim=st.integers(1, 6), blocks=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_rae_matches_numpy_recursion_and_host_equals_compiled(n_leaves, dim, blocks, seed):
    rng = np.random.default_rng(seed)
    # tile 2, chunk 4: a node's tanh chunk reads columns that other blocks' linear tiles wrote
    model = random_rae(rng, dim, blocks=blocks, threads=4, chunk=4, tile=2)
    left, right, is_leaf, root = random_tree(rng, n_leaves)
    inp = rng.standard_normal((len(is_leaf), dim)).astype(np.float32)
    want = rae_reference(left, right, is_leaf, inp, model.weight, model.bias, root)
    compiled = model(left, right, is_leaf, inp, root, mode="compiled")
    host = model(left, right, is_leaf, inp, root, mode="host")
    np.testing.assert_allclose(compiled, want, rtol=1e-4, atol=1e-5)
    assert compiled.shape == (dim,) and np.array_equal(compiled, host)


def test_rae_compiled_walks_the_tree_on_device_host_reads_back_every_node():
    rng = np.random.default_rng(11)
    model = random_rae(rng, 2, blocks=2, **TINY)
    left, right, is_leaf, root = random_tree(rng, 5)
    inp = rng.standard_normal((len(is_leaf), 2)).astype(np.float32)
    model(left, right, is_leaf, inp, root, mode="host")
    inner = int((is_leaf == 0).sum())
    host = model.last_compiled.last_stats
    assert host.host_syncs == 1 + len(is_leaf) + 2 * inner   # root, every is_leaf, every inner node's children
    model(left, right, is_leaf, inp, root, mode="compiled")
    assert (model.last_compiled.last_stats.launches, model.last_compiled.last_stats.host_syncs) == (1, 0)


def test_rae_one_trace_serves_any_root_and_tree_of_that_size():
    rng = np.random.default_rng(7)
    model = random_rae(rng, 3, blocks=2, **TINY)
    left, right, is_leaf, root = random_tree(rng, 4)
    inp = rng.standard_normal((len(is_leaf), 3)).astype(np.float32)
    model(left, right, is_leaf, inp, root)
    compiled = model.last_compiled
    assert (compiled.last_stats.launches, compiled.last_stats.host_syncs) == (1, 0)
    for node in np.flatnonzero(is_leaf == 0):      # every subtree, through the same kernel
        got = model(left, right, is_leaf, inp, int(node))
        np.testing.assert_allclose(got, rae_reference(left, right, is_leaf, inp, model.weight, model.bias, node),
                                   rtol=1e-4, atol=1e-5)
    left2, right2, is_leaf2, root2 = random_tree(rng, 4)
    got = model(left2, right2, is_leaf2, inp, root2)
    assert model.last_compiled is compiled
    np.testing.assert_allclose(got, rae_reference(left2, right2, is_leaf2, inp, model.weight, model.bias, root2),
                               rtol=1e-4, atol=1e-5)


def test_rae_recursion_deeper_than_32_frames():
    """A left-deep chain of depth 40 needs 41 frames: more than the artifact's fixed 32, within the default 64."""
    rng = np.random.default_rng(8)
    model = random_rae(rng, 4, blocks=2, threads=4, chunk=4, tile=2)
    assert model.compiled_for(81).options.stack_depth == 64
    left, right, is_leaf = left_chain(40)
    inp = rng.standard_normal((len(is_leaf), 4)).astype(np.float32)
    got = model(left, right, is_leaf, inp, 0, mode="compiled")
    np.testing.assert_allclose(got, rae_reference(left, right, is_leaf, inp, model.weight, model.bias, 0),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["host", "compiled"])
def test_rae_deeper_than_stack_depth_raises_stack_overflow(mode):
    rng = np.random.default_rng(9)
    model = random_rae(rng, 2, blocks=2, stack_depth=4, **TINY)
    left, right, is_leaf = left_chain(4)               # needs 5 frames
    inp = rng.standard_normal((len(is_leaf), 2)).astype(np.float32)
    with pytest.raises(StackOverflowError, match="stack_depth=4"):
        model(left, right, is_leaf, inp, 0, mode=mode)
    left, right, is_leaf = left_chain(3)               # 4 frames: fits exactly
    got = model(left, right, is_leaf, inp[:7], 0, mode=mode)
    np.testing.assert_allclose(got, rae_reference(left, right, is_leaf, inp, model.weight, model.bias, 0),
                               rtol=1e-4, atol=1e-5)


def test_rae_rejects_bad_trees_before_running():
    model = RAE(2, **TINY)
    left, right, is_leaf = np.array([1, -1, -1]), np.array([2, -1, -1]), np.array([0, 1, 1])
    inp = np.zeros((3, 2), np.float32)
    with pytest.raises(TreeError, match="inner node 0 has right child 3"):
        model(left, np.array([3, -1, -1]), is_leaf, inp, 0)
    with pytest.raises(TreeError, match="cycle"):
        model(np.array([1, 0, -1]), np.array([2, 2, -1]), np.array([0, 0, 1]), inp, 0)  # 0 -> 1 -> 0
    with pytest.raises(TreeError, match="is_leaf must be 0 or 1"):
        model(left, right, np.array([0, 2, 1]), inp, 0)
    with pytest.raises(ShapeError, match="inp must be"):
        model(left, right, is_leaf, np.zeros((3, 3), np.float32), 0)
    with pytest.raises(ShapeError, match="one entry per node"):
        model(left[:2], right, is_leaf, inp, 0)
    with pytest.raises(IndexOutOfRangeError, match="root"):
        model(left, right, is_leaf, inp, 3)
    assert model._compiled == {}                    # nothing was traced for a bad tree


def test_rae_shared_subtrees_are_not_cycles():
    rng = np.random.default_rng(10)
    model = random_rae(rng, 2, blocks=1, **TINY)
    left, right, is_leaf = np.array([1, 2, -1]), np.array([1, 2, -1]), np.array([0, 0, 1])  # a DAG
    inp = rng.standard_normal((3, 2)).astype(np.float32)
    np.testing.assert_allclose(model(left, right, is_leaf, inp, 0),
                               rae_reference(left, right, is_leaf, inp, model.weight, model.bias, 0),
                               rtol=1e-4, atol=1e-5)


def test_bad_rae_state_dict_names_the_problem():
    model = RAE(3, **TINY)
    with pytest.raises(StateDictError, match=r"missing keys \['encoder.bias'\]"):
        model.load_state_dict({"encoder.weight": np.zeros((3, 6))})
    with pytest.raises(StateDictError, match=r"'encoder.weight' has shape \(6, 3\), expected \(3, 6\)"):
        model.load_state_dict({"encoder.weight": np.zeros((6, 3)), "encoder.bias": np.zeros(3)})
    with pytest.raises(StateDictError, match=r"unexpected keys \['decoder.weight'\]"):
        model.load_state_dict({"encoder.weight": np.zeros((3, 6)), "encoder.bias": np.zeros(3),
                               "decoder.weight": np.zeros((6, 3))})
    with pytest.raises(StateDictError, match="expected a dict"):
        model.load_state_dict([np.zeros((3, 6))])
