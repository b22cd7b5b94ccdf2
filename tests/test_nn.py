"""flow.nn: module mechanics, state dicts, modes, devices, Dropout, init (without PyTorch).

The comparisons with PyTorch's layers are in test_nn_torch.py; here each test states one
property of pyflow's own API: what registers, what a state dict holds, which error a bad
state dict raises and what it names, what train/eval change, what .to() keeps.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import nn
from pyflow.errors import ArgumentTypeError, DeviceError, DTypeError, ShapeError
from pyflow.nn import functional as F
from pyflow.nn.module import ArgumentValueError, StateDictError


class Block(nn.Module):
    """A module with a parameter, a child, a buffer and a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(flow.ones(3))
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
        self.register_buffer("steps", flow.zeros(()))
        self.register_buffer("scratch", flow.zeros(2), persistent=False)
        self.note = flow.zeros(1)   # a plain tensor attribute: not registered

    def forward(self, x):
        return self.bn(self.fc(x * self.scale))


# --- Parameter -----------------------------------------------------------------------------------------


def test_parameter_is_a_leaf_tensor_sharing_the_data_storage():
    data = flow.zeros(2, 2)
    p = nn.Parameter(data)
    assert isinstance(p, flow.Tensor) and p.requires_grad and p.is_leaf
    with flow.no_grad():
        p.add_(1)
    assert data.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_parameter_of_a_computed_tensor_is_a_leaf_without_its_history():
    x = flow.ones(2, requires_grad=True)
    p = nn.Parameter(x * 2)
    assert p.is_leaf and p.grad_fn is None and p.requires_grad


def test_parameter_requires_grad_false_and_repr():
    p = nn.Parameter(flow.ones(2), requires_grad=False)
    assert not p.requires_grad
    assert repr(p).startswith("Parameter containing:") and str(p).startswith("Parameter containing:")


def test_ops_on_a_parameter_return_plain_tensors():
    p = nn.Parameter(flow.ones(2))
    assert type(p * 2) is flow.Tensor and type(p.detach()) is flow.Tensor


def test_parameter_of_a_non_tensor_is_an_argument_type_error():
    with pytest.raises(ArgumentTypeError, match="pyflow tensor"):
        nn.Parameter([1.0, 2.0])


# --- registration ---------------------------------------------------------------------------------------


def test_setattr_registers_parameters_children_and_buffers_but_not_plain_tensors():
    b = Block()
    assert list(b._parameters) == ["scale"]
    assert list(b._modules) == ["fc", "bn"]
    assert list(b._buffers) == ["steps", "scratch"]
    assert "note" not in b._buffers and isinstance(b.note, flow.Tensor)


def test_named_parameters_follow_registration_order_depth_first():
    names = [name for name, _ in Block().named_parameters()]
    assert names == ["scale", "fc.weight", "fc.bias", "bn.weight", "bn.bias"]
    assert [name for name, _ in Block().named_parameters(recurse=False)] == ["scale"]
    assert [name for name, _ in Block().named_parameters(prefix="m")][0] == "m.scale"


def test_a_shared_parameter_is_listed_once():
    layer = nn.Linear(2, 2)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias"]
    assert len(list(model.modules())) == 3   # Sequential, the Linear once, ReLU


def test_named_buffers_children_and_modules():
    b = Block()
    assert [name for name, _ in b.named_buffers()] == ["steps", "scratch", "bn.running_mean", "bn.running_var",
                                                       "bn.num_batches_tracked"]
    assert [name for name, _ in b.named_children()] == ["fc", "bn"]
    assert [name for name, _ in b.named_modules()] == ["", "fc", "bn"]
    assert b.get_submodule("bn") is b.bn


def test_assigning_a_plain_tensor_to_a_parameter_name_is_an_error():
    layer = nn.Linear(2, 2)
    with pytest.raises(ArgumentTypeError, match="parameter 'weight'"):
        layer.weight = flow.zeros(2, 2)
    layer.bias = None   # None is allowed: the slot stays, empty
    assert "bias" in layer._parameters and layer.bias is None
    assert [name for name, _ in layer.named_parameters()] == ["weight"]


def test_bad_names_are_refused():
    m = nn.Module()
    with pytest.raises(ArgumentValueError, match="no '.'"):
        m.register_parameter("a.b", nn.Parameter(flow.ones(1)))
    with pytest.raises(ArgumentTypeError, match="Parameter or None"):
        m.register_parameter("w", flow.ones(1))
    m.plain = 3
    with pytest.raises(ArgumentValueError, match="already exists"):
        m.register_buffer("plain", flow.ones(1))


def test_assigning_before_super_init_names_the_fix():
    class Broken(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(flow.ones(1))

    with pytest.raises(AttributeError, match=r"super\(\)\.__init__\(\)"):
        Broken()


def test_a_missing_attribute_names_the_module_type():
    with pytest.raises(AttributeError, match="'Linear' object has no attribute 'wieght'"):
        _ = nn.Linear(2, 2).wieght


def test_delattr_unregisters():
    layer = nn.Linear(2, 2)
    del layer.bias
    assert "bias" not in layer._parameters


def test_forward_is_required():
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(flow.ones(1))


def test_apply_visits_children_before_the_parent():
    seen = []
    model = nn.Sequential(nn.Linear(1, 1), nn.Sequential(nn.ReLU()))
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["Linear", "ReLU", "Sequential", "Sequential"]


# --- containers -------------------------------------------------------------------------------------------


def test_sequential_indexing_slicing_append_and_delete():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    model.append(nn.Linear(3, 1))
    assert len(model) == 3 and isinstance(model[-1], nn.Linear)
    assert isinstance(model[:2], nn.Sequential) and len(model[:2]) == 2
    del model[1]
    assert list(model._modules) == ["0", "1"]
    assert model(flow.ones(4, 2)).shape == (4, 1)
    with pytest.raises(IndexError, match="out of range"):
        model[5]


def test_module_list_registers_its_modules():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])

    net = Net()
    assert len(list(net.parameters())) == 6
    assert list(net.state_dict())[:2] == ["layers.0.weight", "layers.0.bias"]


def test_repr_is_pytorch_style():
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Sequential(nn.Tanh()))
    assert repr(model) == ("Sequential(\n"
                           "  (0): Linear(in_features=3, out_features=2, bias=True)\n"
                           "  (1): ReLU()\n"
                           "  (2): Sequential(\n"
                           "    (0): Tanh()\n"
                           "  )\n"
                           ")")
    assert repr(nn.Linear(3, 2, bias=False)) == "Linear(in_features=3, out_features=2, bias=False)"


# --- state dicts ----------------------------------------------------------------------------------------------


def test_state_dict_has_pytorch_keys_and_leaves_out_non_persistent_buffers():
    keys = list(Block().state_dict())
    assert keys == ["scale", "steps", "fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.running_mean",
                    "bn.running_var", "bn.num_batches_tracked"]


def test_state_dict_values_are_detached_and_share_memory():
    layer = nn.Linear(2, 2)
    state = layer.state_dict()
    assert not state["weight"].requires_grad and not isinstance(state["weight"], nn.Parameter)
    state["bias"].fill_(5.0)
    assert layer.bias.tolist() == [5.0, 5.0]
    assert layer.state_dict(keep_vars=True)["weight"] is layer.weight


def test_load_state_dict_copies_in_place_into_the_same_parameters():
    a, b = Block(), Block()
    a.bn.running_mean.fill_(3.0)
    weight = b.fc.weight
    result = b.load_state_dict(a.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert b.fc.weight is weight and np.array_equal(b.fc.weight.numpy(), a.fc.weight.numpy())
    assert b.bn.running_mean.tolist() == [3.0, 3.0]


def test_load_state_dict_accepts_numpy_arrays():
    layer = nn.Linear(2, 1)
    layer.load_state_dict({"weight": np.array([[1.0, 2.0]]), "bias": np.array([0.5])})
    assert layer(flow.ones(1, 2)).tolist() == [[3.5]]


def test_missing_keys_are_named():
    state = nn.Linear(2, 2).state_dict()
    del state["bias"]
    with pytest.raises(StateDictError, match=r"missing keys \['bias'\]") as info:
        nn.Linear(2, 2).load_state_dict(state)
    assert isinstance(info.value, KeyError)


def test_unexpected_keys_are_named():
    state = dict(nn.Linear(2, 2).state_dict(), extra=flow.zeros(1))
    with pytest.raises(StateDictError, match=r"unexpected keys \['extra'\]"):
        nn.Linear(2, 2).load_state_dict(state)


def test_strict_false_returns_the_missing_and_unexpected_keys():
    state = {"weight": flow.ones(2, 2), "other": flow.zeros(1)}
    layer = nn.Linear(2, 2)
    result = layer.load_state_dict(state, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["other"]
    assert layer.weight.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_shape_mismatch_names_the_key_and_both_shapes_and_changes_nothing():
    layer = nn.Linear(2, 2)
    before = layer.weight.numpy()
    state = {"weight": flow.ones(2, 2), "bias": flow.zeros(3)}
    with pytest.raises(ShapeError, match=r"'bias'.*\[3\].*\[2\]"):
        layer.load_state_dict(state)
    assert np.array_equal(layer.weight.numpy(), before)   # checked before anything was written


@pytest.mark.parametrize("saved, module", [("cuda", "cpu"), ("cpu", "cuda")])
def test_values_on_another_device_move_to_the_modules_as_pytorch_copies_them(saved, module):
    layer = nn.Linear(2, 1).to(module)
    state = {"weight": flow.tensor([[1.0, 2.0]], device=saved), "bias": flow.tensor([3.0], device=saved)}
    layer.load_state_dict(state)
    assert str(layer.weight.device).startswith(module) and layer.weight.tolist() == [[1.0, 2.0]]
    assert layer(flow.ones(1, 2, device=module)).tolist() == [[6.0]]


def test_a_local_value_for_a_global_parameter_names_the_key_and_both_places():
    def body():
        layer = nn.Linear(1, 1)
        layer.to_global(flow.placement("cpu", [0, 1]), flow.sbp.broadcast)
        with pytest.raises(DeviceError, match=r"'weight' is on cpu:0 .* placement"):
            layer.load_state_dict({"weight": flow.zeros(1, 1), "bias": flow.zeros(1)})
        return True

    assert flow.distributed.run(body, 2) == [True, True]


def test_a_value_that_is_not_a_tensor_is_named():
    with pytest.raises(ArgumentTypeError, match="'bias' is a list"):
        nn.Linear(1, 1).load_state_dict({"weight": flow.zeros(1, 1), "bias": [0.0]})


# --- modes, gradients, dtypes, devices ------------------------------------------------------------------------


def test_train_and_eval_set_every_module():
    model = nn.Sequential(nn.Linear(1, 1), nn.Sequential(nn.Dropout()))
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    with pytest.raises(ArgumentTypeError):
        model.train("no")


def test_zero_grad_sets_to_none_or_zeros():
    layer = nn.Linear(2, 1)
    layer(flow.ones(1, 2)).sum().backward()
    assert layer.weight.grad is not None
    layer.zero_grad(set_to_none=False)
    assert layer.weight.grad.tolist() == [[0.0, 0.0]]
    layer.zero_grad()
    assert layer.weight.grad is None


def test_to_dtype_keeps_the_parameter_objects_and_integer_buffers():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    params = list(model.parameters())
    assert model.double() is model
    assert [p is q for p, q in zip(params, model.parameters())] == [True] * 4
    assert all(p.dtype == flow.float64 and p.requires_grad and p.is_leaf for p in model.parameters())
    assert model[1].running_mean.dtype == flow.float64
    assert model[1].num_batches_tracked.dtype == flow.int64
    with pytest.raises(DTypeError, match="floating"):
        model.to(flow.int32)


def test_to_moves_the_gradient_too():
    layer = nn.Linear(2, 1)
    layer(flow.ones(1, 2)).sum().backward()
    layer.double()
    assert layer.weight.grad.dtype == flow.float64


def test_a_small_model_on_cuda_computes_what_it_computes_on_cpu():
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = flow.randn(2, 3)
    expected = model(x).numpy()
    params = list(model.parameters())
    model.cuda()
    assert all(p is q for p, q in zip(params, model.parameters()))   # an optimizer made before still works
    assert all(p.device.type == "cuda" for p in model.parameters())
    np.testing.assert_allclose(model(x.cuda()).numpy(), expected, rtol=1e-5, atol=1e-6)
    model.cpu()
    assert model[0].weight.device.type == "cpu"


def test_to_global_makes_every_parameter_and_buffer_global_and_computes_the_same():
    def rank():
        flow.manual_seed(0)   # every rank builds the same model
        model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).eval()
        x = flow.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
        expected = model(x).numpy()
        params = list(model.parameters())
        placement = flow.placement("cpu", [0, 1])
        model.to_global(placement, flow.sbp.broadcast)
        same = all(p is q for p, q in zip(params, model.parameters()))
        everything = list(model.parameters()) + list(model.buffers())
        all_global = all(t.is_global and t.placement == placement for t in everything)
        out = model(x.to_global(placement, flow.sbp.broadcast)).numpy()
        return same, all_global, float(np.abs(out - expected).max())

    for same, all_global, diff in flow.distributed.run(rank, world_size=2):
        assert same and all_global and diff < 1e-6


def test_deepcopy_copies_the_weights():
    layer = nn.Linear(2, 2)
    twin = copy.deepcopy(layer)
    assert twin.weight is not layer.weight and isinstance(twin.weight, nn.Parameter)
    with flow.no_grad():
        twin.weight.fill_(0)
    assert layer.weight.abs().sum().item() > 0


# --- layers' own behaviour ---------------------------------------------------------------------------------------


def test_dropout_in_eval_is_the_identity():
    x = flow.randn(10)
    assert nn.Dropout(0.3).eval()(x) is x


@settings(max_examples=5)
@given(p=st.sampled_from([0.1, 0.25, 0.5, 0.8]))
def test_dropout_in_training_zeroes_about_p_and_scales_the_rest(p):
    flow.manual_seed(1)
    y = nn.Dropout(p)(flow.ones(4000)).numpy()
    dropped = np.mean(y == 0)
    assert abs(dropped - p) < 4 * math.sqrt(p * (1 - p) / 4000)   # four standard deviations
    np.testing.assert_allclose(y[y != 0], 1 / (1 - p), rtol=1e-6)


def test_dropout_edges_and_bad_p():
    x = flow.ones(5)
    assert F.dropout(x, 0.0) is x
    assert F.dropout(x, 1.0).tolist() == [0.0] * 5
    with pytest.raises(ArgumentValueError, match=r"\[0, 1\]"):
        nn.Dropout(1.5)


def test_dropout_is_repeatable_with_manual_seed():
    flow.manual_seed(7)
    a = F.dropout(flow.ones(50)).numpy()
    flow.manual_seed(7)
    assert np.array_equal(a, F.dropout(flow.ones(50)).numpy())


def test_batchnorm_training_updates_running_stats_with_the_unbiased_variance():
    bn = nn.BatchNorm1d(2, momentum=0.5)
    data = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 7.0]], np.float32)
    out = bn(flow.tensor(data)).numpy()
    mean, biased, unbiased = data.mean(0), data.var(0), data.var(0, ddof=1)
    np.testing.assert_allclose(out, (data - mean) / np.sqrt(biased + 1e-5), rtol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.5 * mean, rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.5 + 0.5 * unbiased, rtol=1e-6)
    assert bn.num_batches_tracked.item() == 1


def test_batchnorm_eval_uses_the_running_stats_and_changes_nothing():
    bn = nn.BatchNorm2d(1).eval()
    bn.running_mean.fill_(1.0)
    bn.running_var.fill_(4.0)
    out = bn(flow.full((1, 1, 1, 2), 5.0))
    np.testing.assert_allclose(out.numpy(), np.full((1, 1, 1, 2), 4 / math.sqrt(4 + 1e-5)), rtol=1e-6)
    assert bn.num_batches_tracked.item() == 0


def test_batchnorm_momentum_none_is_a_cumulative_average():
    bn = nn.BatchNorm1d(1, momentum=None)
    bn(flow.tensor([[2.0], [4.0]]))
    bn(flow.tensor([[6.0], [8.0]]))
    np.testing.assert_allclose(bn.running_mean.numpy(), [5.0])   # the mean of the batch means 3 and 7


def test_batchnorm_rejects_the_wrong_rank_and_channels():
    with pytest.raises(ArgumentValueError, match="4-d input"):
        nn.BatchNorm2d(3)(flow.ones(2, 3))
    with pytest.raises(ArgumentValueError, match="2 channels"):
        nn.BatchNorm2d(3)(flow.ones(2, 2, 1, 1))


def test_conv2d_refuses_channels_that_groups_do_not_divide():
    with pytest.raises(ArgumentValueError, match="groups"):
        nn.Conv2d(3, 2, 3, groups=2)
    assert nn.Conv2d(1, 1, 3, padding="same")(flow.ones(1, 1, 5, 5)).shape == (1, 1, 5, 5)


def test_linear_names_a_feature_mismatch():
    with pytest.raises(ShapeError, match="in_features"):
        nn.Linear(3, 2)(flow.ones(4, 5))


def test_embedding_padding_row_is_zero_and_gets_no_gradient():
    emb = nn.Embedding(4, 2, padding_idx=1)
    assert emb.weight[1].tolist() == [0.0, 0.0]
    emb(flow.tensor([1, 2, 1, 3])).sum().backward()
    grad = emb.weight.grad.numpy()
    assert grad[1].tolist() == [0.0, 0.0] and grad[2].tolist() == [1.0, 1.0] and grad[0].tolist() == [0.0, 0.0]


def test_embedding_rejects_float_indices():
    with pytest.raises(DTypeError, match="integers"):
        nn.Embedding(3, 2)(flow.tensor([0.0]))


def test_lstm_batch_first_is_the_transposed_layout():
    flow.manual_seed(0)
    seq_major = nn.LSTM(2, 3, num_layers=2)
    batch_major = nn.LSTM(2, 3, num_layers=2, batch_first=True)
    batch_major.load_state_dict(seq_major.state_dict())
    x = flow.randn(4, 2, 2)   # (L, N, I)
    out, (h, c) = seq_major(x)
    out_b, (h_b, c_b) = batch_major(x.transpose(0, 1))
    np.testing.assert_allclose(out_b.transpose(0, 1).numpy(), out.numpy(), rtol=1e-6)
    np.testing.assert_allclose(h_b.numpy(), h.numpy(), rtol=1e-6)
    assert out.shape == (4, 2, 3) and h.shape == c.shape == (2, 2, 3)


def test_lstm_last_output_is_h_n_of_the_last_layer():
    out, (h, _) = nn.LSTM(2, 3, num_layers=2)(flow.randn(5, 1, 2))
    np.testing.assert_allclose(out[-1].numpy(), h[-1].numpy())


def test_lstm_cell_unbatched_and_bad_state_shape():
    cell = nn.LSTMCell(2, 3)
    h, c = cell(flow.ones(2))
    assert h.shape == c.shape == (3,)
    with pytest.raises(ShapeError, match="h must have shape"):
        cell(flow.ones(4, 2), (flow.zeros(3), flow.zeros(3)))


def test_cross_entropy_ignore_index_and_reduction():
    logits = np.array([[1.0, 2.0, 0.5], [0.1, 0.2, 0.3], [2.0, -1.0, 0.0]], np.float32)
    target = np.array([1, -100, 0])
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    picked = -log_probs[[0, 2], [1, 0]]
    x, t = flow.tensor(logits), flow.tensor(target)
    np.testing.assert_allclose(F.cross_entropy(x, t).item(), picked.mean(), rtol=1e-6)
    np.testing.assert_allclose(F.cross_entropy(x, t, reduction="sum").item(), picked.sum(), rtol=1e-6)
    np.testing.assert_allclose(F.cross_entropy(x, t, reduction="none").numpy(), [picked[0], 0, picked[1]],
                               rtol=1e-6)
    with pytest.raises(ArgumentValueError, match="reduction"):
        nn.CrossEntropyLoss(reduction="avg")


def test_mse_loss_refuses_different_shapes():
    with pytest.raises(ShapeError, match="same shape"):
        F.mse_loss(flow.ones(3, 1), flow.ones(3))


# --- init ----------------------------------------------------------------------------------------------------------


@settings(max_examples=8)
@given(a=st.floats(-5, 5), width=st.floats(0.01, 5))
def test_uniform_stays_within_its_bounds(a, width):
    t = nn.init.uniform_(flow.empty(200), a, a + width).numpy()
    assert t.min() >= np.float32(a) and t.max() <= np.float32(a + width)


def test_normal_has_the_asked_mean_and_std():
    flow.manual_seed(0)
    t = nn.init.normal_(flow.empty(20000), mean=2.0, std=3.0).numpy()
    assert abs(t.mean() - 2.0) < 0.1 and abs(t.std() - 3.0) < 0.1


def test_constant_zeros_ones():
    t = flow.empty(3)
    assert nn.init.constant_(t, 2.5) is t and t.tolist() == [2.5] * 3
    assert nn.init.zeros_(t).tolist() == [0.0] * 3 and nn.init.ones_(t).tolist() == [1.0] * 3


@settings(max_examples=8)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple))
def test_xavier_and_kaiming_uniform_bounds_follow_the_fans(shape):
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    xavier = nn.init.xavier_uniform_(flow.empty(*shape), gain=2.0).numpy()
    assert np.abs(xavier).max() <= 2.0 * math.sqrt(6 / (fan_in + fan_out)) + 1e-6
    kaiming = nn.init.kaiming_uniform_(flow.empty(*shape), mode="fan_out", nonlinearity="relu").numpy()
    assert np.abs(kaiming).max() <= math.sqrt(2) * math.sqrt(3 / fan_out) + 1e-6


def test_kaiming_uniform_fills_most_of_its_range():
    bound = math.sqrt(3 / 1000) * math.sqrt(2)
    t = nn.init.kaiming_uniform_(flow.empty(50, 1000), nonlinearity="relu").numpy()
    assert bound * 0.99 < np.abs(t).max() <= bound


def test_calculate_gain_is_pytorchs_table():
    assert nn.init.calculate_gain("linear") == 1 and nn.init.calculate_gain("sigmoid") == 1
    assert nn.init.calculate_gain("tanh") == 5 / 3 and nn.init.calculate_gain("relu") == math.sqrt(2)
    assert nn.init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2 / 1.04)
    with pytest.raises(ArgumentValueError, match="unsupported nonlinearity"):
        nn.init.calculate_gain("swish")


def test_fans_need_two_dims():
    with pytest.raises(ShapeError, match="at least 2 dims"):
        nn.init.xavier_uniform_(flow.empty(3))


def test_init_is_repeatable_with_manual_seed_and_works_on_parameters():
    p = nn.Parameter(flow.empty(3, 3))
    flow.manual_seed(3)
    first = nn.init.xavier_uniform_(p).numpy()
    flow.manual_seed(3)
    assert np.array_equal(first, nn.init.xavier_uniform_(p).numpy())
    assert p.is_leaf and p.grad_fn is None
