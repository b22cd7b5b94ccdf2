"""OneFlow's global-cast tests (``to_global`` / ``to_local`` between layouts), ported to in-process ranks.

Source: ``python/oneflow/test/modules/test_global_cast.py`` of OneFlow at commit 25c8978c (the local
mirror's HEAD), the global-cast half of the global-tensor acceptance criterion.

How they are ported:

* OneFlow's tests are SPMD methods that branch on the rank, launched on 4, 2 or 1 processes
  (``skip_unless_1n4d`` / ``1n2d`` / ``1n1d``).  Here the same body runs once per rank under
  ``flow.distributed.run(body, world_size=4, 2 or 1)``; each rank asserts what OneFlow's process
  asserts (a failing assertion comes back as ``RankError`` with the original as its cause).
  ``int(os.getenv("RANK"))`` -> ``flow.env.get_rank()``.
* ``assertTrue(np.array_equal(a, b))`` -> ``np.testing.assert_array_equal(a, b)``; ``np.allclose``
  -> ``np.testing.assert_allclose`` with its tolerances; ``assertEqual`` -> ``assert``.
* Pairs of OneFlow tests that differ only in the device (``test_cuda_global_to_global_cpu_s2b`` and
  ``test_cuda_global_to_global_s2b``...) are one test parametrized over the device; each id is
  named after its OneFlow test in the docstring.
* Random data (``test_cpu_*_with_random_parameter``, ``test_global_to_global_s*_cpu``) come from
  numpy generators seeded per rank: OneFlow's come from numpy's global generator, different on every
  process, and that the ranks differ is what the tests rely on.

Devices: rank r's local tensors on cuda are on ``cuda:r`` (OneFlow's too), so a test whose ranks make
them needs that many CUDA devices (``cuda_devices``, ``tests/helpers_devices.py``); on a machine with
fewer it is skipped, saying so.  Placements on cuda share the machine's GPUs: the tests that only place
tensors there, and the cases on cpu, run on one GPU.

Not ported: ``TestToGlobalAndLocal.test_to_global_local`` (it needs ``nn.Graph``, ``nn.Linear`` /
``nn.Sequential`` modules with ``Module.to_global`` and ``flow.utils.global_view``, which pyflow
does not have).

"""

from __future__ import annotations

import numpy as np
import pytest

import pyflow as flow
from tests.helpers_devices import cuda_devices, cuda_devices_if

S0, B, P = flow.sbp.split(0), flow.sbp.broadcast, flow.sbp.partial_sum


def run(world_size, body, *args):
    """Run the SPMD ``body(*args)`` as OneFlow's launcher does on 1 node x ``world_size`` devices."""
    return flow.distributed.run(body, world_size=world_size, args=args)


# The two 4x4 arrays most tests start from: rank 0 holds A, every other rank B_ARR.
A = np.array([[4, 6, 5, 20], [6, 2, 5, 7], [3, 7, 5, 4], [6, 8, 9, 4]], dtype=np.float32)
B_ARR = np.array([[2, 10, 10, 7], [3, 9, 10, 5], [4, 6, 6, 9], [6, 8, 6, 4]], dtype=np.float32)
# The four arrays of the XToB tests: rank r holds FOUR[r].
FOUR = np.array([
    [[4, 6, 5, 20], [6, 8, 9, 0], [3, 7, 5, 0], [6, 8, 9, 0]],
    [[2, 10, 10, 7], [3, 9, 10, 5], [4, 6, 6, 9], [6, 8, 6, 4]],
    [[9, 6, 5, 8], [4, 9, 7, 0], [2, 5, 7, 9], [6, 8, 10, 0]],
    [[9, 4, 5, 8], [7, 2, 9, 5], [6, 3, 9, 2], [3, 7, 5, 8]],
], dtype=np.float32)


def a_on_rank_0(device):
    """This rank's input of the two-array tests: A on rank 0, B_ARR elsewhere."""
    return flow.tensor(A if flow.env.get_rank() == 0 else B_ARR, device=flow.device(device), dtype=flow.float32)


def check(y, sbp, placement, shape, dtype):
    """OneFlow's recurring four assertEquals."""
    assert y.sbp == sbp
    assert y.placement == placement
    assert tuple(y.shape) == shape
    assert y.dtype == dtype


# --- TestGlobalCastModule_1n4d -------------------------------------------------------------------------


def _flatten_hierarchy_body(src_device, dst_device):
    x = flow.ones((4, 4), dtype=flow.int32)
    sbp = (flow.sbp.partial_sum,)
    y = x.to_global(placement=flow.placement(src_device, ranks=[[0, 1], [2, 3]]),
                    sbp=(flow.sbp.partial_sum, flow.sbp.partial_sum))
    placement = flow.placement(dst_device, ranks=[0, 1, 2, 3])
    y = y.to_global(placement=placement, sbp=sbp)
    assert y.sbp == sbp
    assert y.placement == placement
    assert tuple(y.shape) == (4, 4)


@pytest.mark.parametrize("src_device, dst_device", [("cpu", "cpu"), ("cpu", "cuda"), ("cuda", "cpu")],
                         ids=["test_to_global_flatten_hierarchy", "test_to_global_flatten_hierarchy_cpu_to_gpu",
                              "test_to_global_flatten_hierarchy_gpu_to_cpu"])
def test_to_global_flatten_hierarchy(src_device, dst_device):
    """OneFlow's three ``test_to_global_flatten_hierarchy*``: (P, P) on [[0, 1], [2, 3]] -> P on [0, 1, 2, 3]."""
    run(4, _flatten_hierarchy_body, src_device, dst_device)


def _broadcast_shape_dtype_1n4d_body():
    if flow.env.get_rank() < 2:
        x = flow.ones((4, 4), dtype=flow.int32)
    else:
        x = flow.zeros((1,), dtype=flow.float)
    placement = flow.placement("cpu", ranks=[0, 1])
    sbp = (flow.sbp.split(0),)
    y = x.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (8, 4), flow.int32)


def test_to_global_broadcast_shape_dtype_1n4d():
    """OneFlow's ``TestGlobalCastModule_1n4d.test_to_global_broadcast_shape_dtype``: ranks outside the
    placement hold a tensor of another shape and dtype, and learn the placement's."""
    run(4, _broadcast_shape_dtype_1n4d_body)


def _local_to_global_2d_sbp_body(then_to_bb):
    x = flow.ones((4, 4), device=flow.device("cuda"), dtype=flow.int32)
    placement = flow.placement("cuda", ranks=[[0, 1], [2, 3]])
    sbp = (flow.sbp.split(0), flow.sbp.partial_sum)
    y = x.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (8, 4), flow.int32)
    if then_to_bb:
        y = y.to_global(sbp=(flow.sbp.broadcast, flow.sbp.broadcast))
        check(y, (flow.sbp.broadcast, flow.sbp.broadcast), placement, (8, 4), flow.int32)
        np.testing.assert_array_equal(y.to_local().numpy(), np.ones((8, 4), dtype=np.int32) * 2)


@cuda_devices(4)
def test_local_to_global_2d_sbp():
    """OneFlow's ``test_local_to_global_2d_sbp``: local -> (S(0), P) on a 2-D placement."""
    run(4, _local_to_global_2d_sbp_body, False)


@cuda_devices(4)
def test_local_to_global_sp_2_bb():
    """OneFlow's ``test_local_to_global_sp_2_bb``: local -> (S(0), P) -> (B, B)."""
    run(4, _local_to_global_2d_sbp_body, True)


def _local_to_global_x_2_s0s0_body(sbp, scale_low, scale_high):
    x = flow.ones((4, 4), device=flow.device("cuda"), dtype=flow.int32)
    x = x * flow.env.get_rank()
    placement = flow.placement("cuda", ranks=[[0, 1], [2, 3]])
    y = x.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (8, 4), flow.int32)
    y = y.to_global(sbp=(flow.sbp.split(0), flow.sbp.split(0)))
    scale = scale_low if flow.env.get_rank() < 2 else scale_high
    np.testing.assert_array_equal(y.to_local().numpy(), np.ones((2, 4), dtype=np.int32) * scale)


@cuda_devices(4)
def test_local_to_global_ps0_2_s0s0():
    """OneFlow's ``test_local_to_global_ps0_2_s0s0``: rank r holds r; (P, S(0)) -> (S(0), S(0))."""
    run(4, _local_to_global_x_2_s0s0_body, (flow.sbp.partial_sum, flow.sbp.split(0)), 2, 4)


@cuda_devices(4)
def test_local_to_global_s0p_2_s0s0():
    """OneFlow's ``test_local_to_global_s0p_2_s0s0``: rank r holds r; (S(0), P) -> (S(0), S(0))."""
    run(4, _local_to_global_x_2_s0s0_body, (flow.sbp.split(0), flow.sbp.partial_sum), 1, 5)


def _loop_broadcast_shape_dtype_body(iterations):
    if flow.env.get_rank() < 2:
        x = flow.ones((4, 4), device=flow.device("cuda"), dtype=flow.int32)
        a = flow.ones((4, 4), device=flow.device("cpu"), dtype=flow.int32)
    else:
        x = flow.zeros((1,), dtype=flow.float)
        a = flow.zeros((4, 4), device=flow.device("cpu"), dtype=flow.int32)
    placement = flow.placement("cuda", ranks=[0, 1])
    sbp = (flow.sbp.split(0),)
    for _ in range(iterations):
        y = x.to_global(placement=placement, sbp=sbp)
        a.to_global(placement=placement, sbp=flow.sbp.broadcast)
    check(y, sbp, placement, (8, 4), flow.int32)


@cuda_devices(2)   # ranks 0 and 1 hold a local tensor on cuda
@pytest.mark.parametrize("iterations", [50, pytest.param(1000, marks=pytest.mark.slow)])
def test_to_global_loop_broadcast_shape_dtype(iterations):
    """OneFlow's ``test_to_global_loop_broadcast_shape_dtype`` (1000 iterations; 50 in the default run)."""
    run(4, _loop_broadcast_shape_dtype_body, iterations)


# --- TestGlobalCastModule_1n2d -------------------------------------------------------------------------


def _broadcast_shape_dtype_1n2d_body():
    if flow.env.get_rank() == 0:
        x = flow.ones((4, 4), dtype=flow.int32)
    else:
        x = flow.zeros((1,), dtype=flow.float)
    placement = flow.placement("cpu", ranks=[0])
    sbp = (flow.sbp.broadcast,)
    y = x.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (4, 4), flow.int32)


def test_to_global_broadcast_shape_dtype_1n2d():
    """OneFlow's ``TestGlobalCastModule_1n2d.test_to_global_broadcast_shape_dtype``: B on [0] only."""
    run(2, _broadcast_shape_dtype_1n2d_body)


def _local_to_global_broadcast_data_body():
    if flow.env.get_rank() == 0:
        x = flow.ones((4, 4), dtype=flow.int32)
    else:
        x = flow.zeros((4, 4), dtype=flow.int32)
    placement = flow.placement("cpu", ranks=[0, 1])
    sbp = (flow.sbp.broadcast,)
    y = x.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (4, 4), flow.int32)
    np.testing.assert_array_equal(y.to_local().numpy(), np.ones((4, 4), dtype=np.int32))


def test_local_to_global_broadcast_data():
    """OneFlow's ``test_local_to_global_broadcast_data``: local -> B takes rank 0's data."""
    run(2, _local_to_global_broadcast_data_body)


def _two_rank_cast_body(device, src_sbp, dst_sbp, shape, expected):
    """ones((4, 4)) on each of 2 ranks -> ``src_sbp`` on [0, 1] -> ``dst_sbp``; rank r's piece is expected[r]."""
    x = flow.ones((4, 4), device=flow.device(device), dtype=flow.int32)
    placement = flow.placement(device, ranks=[0, 1])
    y = x.to_global(placement=placement, sbp=src_sbp)
    sbp = (dst_sbp,)
    y = y.to_global(sbp=sbp)
    check(y, sbp, placement, shape, flow.int32)
    np.testing.assert_array_equal(y.to_local().numpy(), expected[flow.env.get_rank()])


_ONES, _ZEROS = np.ones((4, 4), dtype=np.int32), np.zeros((4, 4), dtype=np.int32)
_TWO_RANK_CASTS = {  # name: (src sbp, dst sbp, logical shape, rank 0's piece, rank 1's piece)
    "s2b": (S0, B, (8, 4), np.ones((8, 4), np.int32), np.ones((8, 4), np.int32)),
    "s2p": (S0, P, (8, 4), np.concatenate((_ONES, _ZEROS)), np.concatenate((_ZEROS, _ONES))),
    "b2p": (B, P, (4, 4), _ONES, _ZEROS),
    "b2s": (B, S0, (4, 4), np.ones((2, 4), np.int32), np.ones((2, 4), np.int32)),
    "p2s": (P, S0, (4, 4), np.ones((2, 4), np.int32) * 2, np.ones((2, 4), np.int32) * 2),
    "p2b": (P, B, (4, 4), _ONES * 2, _ONES * 2),
}
_TWO_RANK_IDS = [  # (OneFlow test, device, cast)
    ("test_cuda_global_to_global_cpu_s2b", "cpu", "s2b"), ("test_cuda_global_to_global_s2b", "cuda", "s2b"),
    ("test_cuda_global_to_global_cpu_s2p", "cpu", "s2p"), ("test_cuda_global_to_global_s2p", "cuda", "s2p"),
    ("test_cuda_global_to_global_b2p", "cuda", "b2p"), ("test_cuda_global_to_global_b2s", "cuda", "b2s"),
    ("test_cuda_global_to_global_cpu_p2s", "cpu", "p2s"), ("test_cuda_global_to_global_p2s", "cuda", "p2s"),
    ("test_cuda_global_to_global_p2b", "cuda", "p2b"),
]


@pytest.mark.parametrize("device, cast", [pytest.param(d, c, id=n, marks=cuda_devices_if(2, d))
                                          for n, d, c in _TWO_RANK_IDS])
def test_cuda_global_to_global(device, cast):
    """OneFlow's ``test_cuda_global_to_global_{cpu_,}{s2b,s2p,b2p,b2s,p2s,p2b}`` (1n2d): each id is one."""
    src, dst, shape, piece0, piece1 = _TWO_RANK_CASTS[cast]
    run(2, _two_rank_cast_body, device, src, dst, shape, (piece0, piece1))


def _h2d_body():
    x = flow.ones((4, 4), device=flow.device("cpu"), dtype=flow.int32)
    placement = flow.placement("cpu", ranks=[0, 1])
    cuda_placement = flow.placement("cuda", ranks=[0, 1])
    y = x.to_global(placement=placement, sbp=flow.sbp.partial_sum)
    y = y.to_global(placement=cuda_placement, sbp=flow.sbp.partial_sum)
    check(y, (flow.sbp.partial_sum,), cuda_placement, (4, 4), flow.int32)
    np.testing.assert_array_equal(y.to_local().numpy(), np.ones((4, 4), dtype=np.int32))


def test_cuda_global_to_global_cuda_h2d():
    """OneFlow's ``test_cuda_global_to_global_cuda_h2d``: P on cpu -> P on cuda keeps every rank's piece."""
    run(2, _h2d_body)


def _cpu_p2b_body():
    x = flow.ones((4, 4), device=flow.device("cpu"), dtype=flow.int32)
    placement = flow.placement("cpu", ranks=[0, 1])
    cuda_placement = flow.placement("cuda", ranks=[0, 1])
    y = x.to_global(placement=placement, sbp=flow.sbp.partial_sum)
    y = y.to_global(placement=cuda_placement, sbp=flow.sbp.partial_sum)
    sbp = (flow.sbp.broadcast,)
    y = y.to_global(placement=cuda_placement, sbp=sbp)
    y = y.to_global(placement=placement, sbp=sbp)
    check(y, sbp, placement, (4, 4), flow.int32)
    np.testing.assert_array_equal(y.to_local().numpy(), np.ones((4, 4), dtype=np.int32) * 2)


def test_cuda_global_to_global_cpu_p2b():
    """OneFlow's ``test_cuda_global_to_global_cpu_p2b``: P cpu -> P cuda -> B cuda -> B cpu."""
    run(2, _cpu_p2b_body)


# --- TestGlobalCastModule_1n1d -------------------------------------------------------------------------


def _to_global_1n1d_body():
    x = flow.ones((4, 4))
    placement = flow.placement("cpu", ranks=[0])
    sbp = (flow.sbp.broadcast,)
    y = x.to_global(placement=placement, sbp=sbp)
    assert y.sbp == sbp
    assert y.placement == placement
    assert tuple(y.shape) == (4, 4)


def test_to_global_1n1d():
    """OneFlow's ``TestGlobalCastModule_1n1d.test_to_global``: a world of one rank."""
    run(1, _to_global_1n1d_body)


# --- TestGlobalCast: local -> global on cuda, and cpu/cuda agreement with random parameters ---------------


def _cpu_local_tensor_to_gpu_placement_body():
    np_arr = np.array([4, 6, 7, 8] if flow.env.get_rank() == 0 else [0, 0, 0, 0], dtype=np.float32)
    tensor = flow.tensor(np_arr, dtype=flow.float32)
    placement = flow.placement("cuda", [0, 1, 2, 3])
    device = flow.device("cuda")
    global_tensor = tensor.to_global(placement, flow.sbp.broadcast)
    assert global_tensor.to_local().device == device
    assert global_tensor.placement == placement
    np.testing.assert_array_equal(global_tensor.to_local().numpy(), np.array([4, 6, 7, 8], dtype=np.float32))


@cuda_devices(4)
def test_cpu_local_tensor_to_gpu_placement():
    """OneFlow's ``test_cpu_local_tensor_to_gpu_placement``: a cpu local tensor -> B on a cuda placement."""
    run(4, _cpu_local_tensor_to_gpu_placement_body)


def _local_to_global_with_wrong_device_body():
    np_arr = np.array([4, 6], dtype=np.float32)
    tensor = flow.tensor(np_arr, device=flow.device("cuda:%d" % ((flow.env.get_rank() + 1) % 4)), dtype=flow.float32)
    placement = flow.placement("cuda", ranks=[0, 1, 2, 3])
    device = flow.device("cuda")
    global_tensor = tensor.to_global(placement, flow.sbp.broadcast)
    local_tensor = global_tensor.to_local()
    assert local_tensor.device == device
    assert global_tensor.placement == placement


@cuda_devices(4)
def test_local_to_global_with_wrong_device():
    """OneFlow's ``test_local_to_global_with_wrong_device``: a piece on another rank's GPU is moved to this
    rank's."""
    run(4, _local_to_global_with_wrong_device_body)


_RANDOM_DTYPES = [flow.uint8, flow.int8, flow.int32, flow.int64, flow.float32, flow.float64, flow.double]


def _random_parameter_body(device_list, src_sbp, dst_sbp, first_dim_times_12):
    """OneFlow's ``_test_cpu_{p2b,s2b,p2s}_with_random_parameter``: 10 random dtypes and shapes, boxed
    on cpu and on cuda, must agree."""
    rank_rng = np.random.default_rng(flow.env.get_rank())  # OneFlow: numpy's global generator
    for _ in range(10):
        seed = flow.tensor(rank_rng.integers(1, 1000, 1))
        seed = seed.to_global(placement=flow.placement.all(seed.device.type), sbp=flow.sbp.broadcast)
        seed = int(seed.to_local().numpy().item())  # rank 0's draw, on every rank
        rng = np.random.default_rng(seed)
        kdtype = rng.integers(low=1, high=len(_RANDOM_DTYPES), size=1)
        ndim = rng.integers(low=1, high=4, size=1)
        if first_dim_times_12:
            shape = list(rng.integers(low=1, high=5, size=1) * 12) + list(rng.integers(low=1, high=10, size=ndim - 1))
        else:
            shape = rng.integers(low=1, high=10, size=ndim)
        if kdtype <= 3:
            np_arr = rank_rng.integers(1, 10, shape)
        else:
            np_arr = rank_rng.random(shape)
        tensor = flow.tensor(np_arr, device="cpu", dtype=_RANDOM_DTYPES[int(kdtype[0])])
        cpu_tensor = tensor.to_global(placement=flow.placement("cpu", device_list), sbp=src_sbp)
        cpu_tensor = cpu_tensor.to_global(sbp=dst_sbp)
        tensor = tensor.to("cuda")
        cuda_tensor = tensor.to_global(placement=flow.placement("cuda", device_list), sbp=src_sbp)
        cuda_tensor = cuda_tensor.to_global(sbp=dst_sbp)
        np.testing.assert_allclose(cpu_tensor.to_local().numpy(), cuda_tensor.to_local().numpy(), rtol=1e-05,
                                   atol=1e-08)


_DEVICE_LISTS = [[0, 1], [1, 2, 3], [0, 1, 2, 3]]
@cuda_devices(4)   # every rank moves its tensor to cuda, whatever the placement
@pytest.mark.parametrize("device_list", _DEVICE_LISTS)
def test_cpu_p2b_with_random_parameter(device_list):
    """OneFlow's ``test_cpu_p2b_with_random_parameter``."""
    run(4, _random_parameter_body, device_list, P, B, False)


@cuda_devices(4)   # every rank moves its tensor to cuda, whatever the placement
@pytest.mark.parametrize("device_list", _DEVICE_LISTS)
def test_cpu_s2b_with_random_parameter(device_list):
    """OneFlow's ``test_cpu_s2b_with_random_parameter``."""
    run(4, _random_parameter_body, device_list, S0, B, False)


@cuda_devices(4)   # every rank moves its tensor to cuda, whatever the placement
@pytest.mark.parametrize("device_list", _DEVICE_LISTS)
def test_cpu_p2s_with_random_parameter(device_list):
    """OneFlow's ``test_cpu_p2s_with_random_parameter`` (the first dim a multiple of 12)."""
    run(4, _random_parameter_body, device_list, P, S0, True)


# --- TestGlobalCast_S2S --------------------------------------------------------------------------------

_S0_TO_S1 = {  # rank: its piece after S(0) -> S(1) of A (rank 0) and B_ARR (rank 1) on cuda [0, 1]
    0: [[4.0, 6.0], [6.0, 2.0], [3.0, 7.0], [6.0, 8.0], [2.0, 10.0], [3.0, 9.0], [4.0, 6.0], [6.0, 8.0]],
    1: [[5.0, 20.0], [5.0, 7.0], [5.0, 4.0], [9.0, 4.0], [10.0, 7.0], [10.0, 5.0], [6.0, 9.0], [6.0, 4.0]],
}
_S1_TO_S0 = {
    0: [[4.0, 6.0, 5.0, 20.0], [6.0, 2.0, 5.0, 7.0], [3.0, 7.0, 5.0, 4.0], [6.0, 8.0, 9.0, 4.0]],
    1: [[2.0, 10.0, 10.0, 7.0], [3.0, 9.0, 10.0, 5.0], [4.0, 6.0, 6.0, 9.0], [6.0, 8.0, 6.0, 4.0]],
}


def _s2s_body(back_to_s0):
    tensor = a_on_rank_0("cuda")
    placement = flow.placement("cuda", ranks=[0, 1])
    y = tensor.to_global(placement, flow.sbp.split(0)).to_global(placement, flow.sbp.split(1))
    expected = _S0_TO_S1
    if back_to_s0:
        y, expected = y.to_global(placement, flow.sbp.split(0)), _S1_TO_S0
    if flow.env.get_rank() in expected:
        np.testing.assert_array_equal(y.to_local().numpy(), np.array(expected[flow.env.get_rank()], np.float32))


@cuda_devices(4)
def test_global_to_global_s0_to_s1():
    """OneFlow's ``TestGlobalCast_S2S.test_global_to_global_s0_to_s1``."""
    run(4, _s2s_body, False)


@cuda_devices(4)
def test_global_to_global_s1_to_s0():
    """OneFlow's ``TestGlobalCast_S2S.test_global_to_global_s1_to_s0``: S(0) -> S(1) -> S(0)."""
    run(4, _s2s_body, True)


def _s2s_cuda_vs_cpu_body(ranks, back_to_s0):
    np_arr = np.random.default_rng(flow.env.get_rank()).standard_normal((4, 12))  # OneFlow: np.random.randn
    results = []
    for device in ("cuda", "cpu"):
        tensor = flow.tensor(np_arr, device=flow.device(device), dtype=flow.float32)
        placement = flow.placement(device, ranks=ranks)
        y = tensor.to_global(placement, flow.sbp.split(0)).to_global(placement, flow.sbp.split(1))
        if back_to_s0:
            y = y.to_global(placement, flow.sbp.split(0))
        results.append(y)
    if flow.env.get_rank() == 0 or flow.env.get_rank() == 1:
        np.testing.assert_array_equal(results[0].to_local().numpy(), results[1].to_local().numpy())


@cuda_devices(4)
def test_global_to_global_s0_to_s1_cpu():
    """OneFlow's ``test_global_to_global_s0_to_s1_cpu``: on [1, 3], cuda and cpu give the same pieces."""
    run(4, _s2s_cuda_vs_cpu_body, [1, 3], False)


@cuda_devices(4)
def test_global_to_global_s1_to_s0_cpu():
    """OneFlow's ``test_global_to_global_s1_to_s0_cpu``: on [0, 1], cuda and cpu give the same pieces."""
    run(4, _s2s_cuda_vs_cpu_body, [0, 1], True)


# --- TestGlobalCast_XToB, _1ToN, _NTo1, _1To1 (all on cuda in OneFlow) --------------------------------------


def _x_to_b_body(src_ranks, src_sbp, dst_ranks, expected, check_ranks):
    tensor = flow.tensor(FOUR[flow.env.get_rank()], device=flow.device("cuda"), dtype=flow.float32)
    global_tensor = tensor.to_global(flow.placement("cuda", ranks=src_ranks), src_sbp)
    new_placement = flow.placement("cuda", ranks=dst_ranks)
    broadcast_tensor = global_tensor.to_global(new_placement, flow.sbp.broadcast)
    assert broadcast_tensor.placement == new_placement
    if flow.env.get_rank() in check_ranks:
        np.testing.assert_array_equal(broadcast_tensor.to_local().numpy(), np.array(expected, dtype=np.float32))


@cuda_devices(4)
def test_global_to_global_btb_gpu_to_gpu():
    """OneFlow's ``test_global_to_global_btb_gpu_to_gpu``: B on [0, 1] -> B on [0, 1, 2]."""
    run(4, _x_to_b_body, [0, 1], B, [0, 1, 2], FOUR[0], [0, 1, 2])


@cuda_devices(4)
def test_global_to_global_stb_gpu_to_gpu():
    """OneFlow's ``test_global_to_global_stb_gpu_to_gpu``: S(0) on [0, 1, 2] -> B on [0, 1, 2, 3]."""
    run(4, _x_to_b_body, [0, 1, 2], S0, [0, 1, 2, 3], np.concatenate(FOUR[:3]), [0, 1, 2, 3])


@cuda_devices(4)
def test_global_to_global_ptb_gpu_to_gpu():
    """OneFlow's ``test_global_to_global_ptb_gpu_to_gpu``: P on [0, 1, 2] -> B on [0, 1, 2, 3]."""
    expected = [[15, 22, 20, 35], [13, 26, 26, 5], [9, 18, 18, 18], [18, 24, 25, 4]]
    run(4, _x_to_b_body, [0, 1, 2], P, [0, 1, 2, 3], expected, [0, 1, 2, 3])


def _cast_and_check_body(src_device, src_ranks, src_sbp, dst_device, dst_ranks, dst_sbp, expected):
    """A on rank 0, B_ARR elsewhere -> ``src_sbp`` on ``src_ranks`` -> ``dst_sbp`` on ``dst_ranks``;
    ``expected``: rank -> its piece (only the ranks OneFlow checks)."""
    tensor = a_on_rank_0(src_device)
    x = tensor.to_global(flow.placement(src_device, ranks=src_ranks), src_sbp)
    new_placement = flow.placement(dst_device, ranks=dst_ranks)
    y = x.to_global(new_placement, dst_sbp)
    assert y.placement == new_placement
    if flow.env.get_rank() in expected:
        np.testing.assert_array_equal(y.to_local().numpy(), np.array(expected[flow.env.get_rank()], np.float32))


@cuda_devices(4)
def test_global_to_global_1tob():
    """OneFlow's ``test_global_to_global_1tob``: S(0) on [0] -> B on [0, 1]."""
    run(4, _cast_and_check_body, "cuda", [0], S0, "cuda", [0, 1], B, {0: A, 1: A})


@cuda_devices(4)
def test_global_to_global_1top():
    """OneFlow's ``test_global_to_global_1top``: S(0) on [0] -> P on [0, 1] (rank 0 keeps it, rank 1 zeros)."""
    run(4, _cast_and_check_body, "cuda", [0], S0, "cuda", [0, 1], P, {0: A, 1: np.zeros((4, 4))})


@cuda_devices(4)
def test_global_to_global_1tos():
    """OneFlow's ``test_global_to_global_1tos``: S(0) on [0] -> S(0) on [0, 1, 2, 3], one row each."""
    run(4, _cast_and_check_body, "cuda", [0], S0, "cuda", [0, 1, 2, 3], S0, {r: A[r:r + 1] for r in range(4)})


@cuda_devices(4)
def test_global_to_global_bt1():
    """OneFlow's ``test_global_to_global_bt1``: B on [0, 1] -> B on [0]."""
    run(4, _cast_and_check_body, "cuda", [0, 1], B, "cuda", [0], B, {0: A})


@cuda_devices(4)
def test_global_to_global_st1():
    """OneFlow's ``test_global_to_global_st1``: S(0) on [0, 1] -> B on [0]."""
    run(4, _cast_and_check_body, "cuda", [0, 1], S0, "cuda", [0], B, {0: np.concatenate((A, B_ARR))})


@cuda_devices(4)
def test_global_to_global_pt1():
    """OneFlow's ``test_global_to_global_pt1``: P on [0, 1] -> B on [0]."""
    expected = [[6, 16, 15, 27], [9, 11, 15, 12], [7, 13, 11, 13], [12, 16, 15, 8]]
    run(4, _cast_and_check_body, "cuda", [0, 1], P, "cuda", [0], B, {0: expected})


_ONE_TO_ONE = [  # OneFlow test, (src device, src rank), (dst device, dst rank); the data is the src rank's
    ("test_global_to_global_1to1_gpu_to_gpu", ("cuda", 3), ("cuda", 2)),
    ("test_global_to_global_1to1_cpu_to_cpu", ("cpu", 0), ("cpu", 2)),
    ("test_global_to_global_1to1_gpu_to_cpu", ("cuda", 0), ("cpu", 3)),
    ("test_global_to_global_1to1_cpu_to_gpu", ("cpu", 1), ("cuda", 3)),
]


@pytest.mark.parametrize("src, dst", [pytest.param(s, d, id=n, marks=cuda_devices_if(4, s[0]))
                                      for n, s, d in _ONE_TO_ONE])
def test_global_to_global_1to1(src, dst):
    """OneFlow's ``TestGlobalCast_1To1``: S(0) on one rank -> B on another (each id is one OneFlow test)."""
    (src_device, src_rank), (dst_device, dst_rank) = src, dst
    data = A if src_rank == 0 else B_ARR
    run(4, _cast_and_check_body, src_device, [src_rank], S0, dst_device, [dst_rank], B, {dst_rank: data})
