"""flow.utils.data: datasets, samplers, default_collate and the DataLoader (torch.utils.data's rules).

Each test states one property.  Worker tests never sleep to make a point: ordering is forced
with events, and thread checks run after ``close()`` / garbage collection, which join the workers.
"""

from __future__ import annotations

import collections
import gc
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow as flow
from pyflow import env
from pyflow.errors import ArgumentTypeError, ArgumentValueError, DTypeError, ShapeError
from pyflow.utils.data import (BatchSampler, ChainDataset, ConcatDataset, DataLoader, DataLoaderTimeoutError,
                               Dataset, IterableDataset, RandomSampler, SequentialSampler, Subset,
                               SubsetRandomSampler, TensorDataset, default_collate, default_convert, get_worker_info,
                               random_split)
from pyflow.utils.data import worker as worker_module

PREFIX = "pyflow-dataloader-worker"
SAFETY_S = 60   # a worker test whose batch never comes fails with DataLoaderTimeoutError instead of hanging


def live_workers() -> list:
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX)]


class Ints(Dataset):
    """Sample i is the int i (collates to an int64 tensor); records which thread read each index."""

    def __init__(self, n: int):
        self.n = n
        self.readers: dict = {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.readers[i] = threading.current_thread().name
        return i


def epoch(loader) -> list:
    return [b.tolist() if isinstance(b, flow.Tensor) else b for b in loader]


loader_cases = st.fixed_dictionaries({
    "n": st.integers(0, 50), "batch_size": st.integers(1, 12), "drop_last": st.booleans(),
    "shuffle": st.booleans(), "seed": st.integers(0, 2**32)})


# --- batches of one epoch ----------------------------------------------------------------------


@given(loader_cases)
def test_every_sample_appears_once_per_epoch_in_batches_of_batch_size(case):
    n, bs, drop_last, shuffle = case["n"], case["batch_size"], case["drop_last"], case["shuffle"]
    loader = DataLoader(Ints(n), batch_size=bs, shuffle=shuffle, drop_last=drop_last,
                        generator=flow.Generator().manual_seed(case["seed"]))
    batches = epoch(loader)
    assert len(batches) == len(loader) == (n // bs if drop_last else -(-n // bs))
    assert all(len(b) == bs for b in batches[:-1])
    if batches:
        assert len(batches[-1]) == (bs if drop_last or n % bs == 0 else n % bs)
    seen = [i for b in batches for i in b]
    assert len(seen) == len(set(seen)) == (n // bs * bs if drop_last else n)
    assert set(seen) <= set(range(n))
    if not shuffle:
        assert seen == list(range(len(seen)))


@given(st.integers(0, 20), st.integers(1, 6), st.integers(1, 3), st.booleans())
def test_tensor_dataset_batches_are_stacked_rows_with_the_batch_along_dim_0(n, bs, width, drop_last):
    x = flow.arange(n * width, dtype=flow.float32).reshape(n, width)
    y = flow.arange(n) * 10
    loader = DataLoader(TensorDataset(x, y), batch_size=bs, drop_last=drop_last)
    start = 0
    for xb, yb in loader:
        rows = xb.shape[0]
        assert xb.shape == (rows, width) and yb.shape == (rows,) and xb.dtype == flow.float32
        assert xb.tolist() == x.numpy()[start:start + rows].tolist()
        assert yb.tolist() == [10 * i for i in range(start, start + rows)]
        start += rows
    assert start == (n // bs * bs if drop_last else n)


def test_batch_size_none_yields_converted_samples_one_by_one():
    data = [np.full(2, i, np.float32) for i in range(3)]
    loader = DataLoader(data, batch_size=None)
    out = list(loader)
    assert len(loader) == 3 and all(isinstance(t, flow.Tensor) and t.shape == (2,) for t in out)
    assert [t.tolist() for t in out] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
    assert [t.tolist() for t in DataLoader(data, batch_size=None, num_workers=2)] == [t.tolist() for t in out]


def test_a_given_sampler_or_batch_sampler_decides_the_indices():
    loader = DataLoader(Ints(10), batch_size=2, sampler=[9, 3, 5])
    assert epoch(loader) == [[9, 3], [5]] and len(loader) == 2
    custom = DataLoader(Ints(10), batch_sampler=[[1, 2, 3], [0]])
    assert epoch(custom) == [[1, 2, 3], [0]] and len(custom) == 2 and custom.batch_size is None
    subset = DataLoader(Ints(10), batch_size=4, sampler=SubsetRandomSampler([2, 4, 6]))
    assert sorted(i for b in epoch(subset) for i in b) == [2, 4, 6]


# --- shuffling and seeds -----------------------------------------------------------------------


@given(st.integers(0, 2**32), st.integers(0, 2**32))
def test_manual_seed_makes_shuffling_reproducible_and_another_seed_changes_it(seed, other):
    def order(s):
        flow.manual_seed(s)
        return [i for b in epoch(DataLoader(Ints(20), batch_size=3, shuffle=True)) for i in b]

    first = order(seed)
    assert first == order(seed) and sorted(first) == list(range(20))
    if other != seed:
        assert order(other) != first


def test_each_epoch_of_a_shuffling_loader_has_a_new_order():
    flow.manual_seed(1)
    loader = DataLoader(Ints(20), batch_size=20, shuffle=True)
    assert epoch(loader) != epoch(loader)


def test_a_loader_generator_fixes_the_order_whatever_else_draws_from_the_global_generator():
    def order():
        return epoch(DataLoader(Ints(15), batch_size=15, shuffle=True, generator=flow.Generator().manual_seed(4)))

    flow.manual_seed(0)
    first = order()
    flow.rand(5)
    flow.manual_seed(123)
    assert order() == first


# --- workers -----------------------------------------------------------------------------------


@settings(max_examples=15)
@given(loader_cases, st.integers(1, 4), st.integers(1, 3), st.booleans())
def test_workers_give_the_batches_of_num_workers_0_in_the_same_order(case, workers, prefetch, global_seed):
    def batches(num_workers):
        kwargs = {"prefetch_factor": prefetch, "timeout": SAFETY_S} if num_workers else {}
        if global_seed:
            flow.manual_seed(case["seed"])
            generator = None
        else:
            generator = flow.Generator().manual_seed(case["seed"])
        loader = DataLoader(Ints(case["n"]), batch_size=case["batch_size"], shuffle=case["shuffle"],
                            drop_last=case["drop_last"], num_workers=num_workers, generator=generator, **kwargs)
        out = epoch(loader)
        assert len(out) == len(loader)
        return out

    assert batches(workers) == batches(0)
    assert live_workers() == []   # an exhausted epoch has joined its workers


def test_batches_finished_out_of_order_are_returned_in_order():
    second_started, done_order = threading.Event(), []

    class Gated(Ints):
        def __getitem__(self, i):
            if i == 0:   # batch 0 (worker 0) waits until batch 1 (worker 1) has started
                second_started.wait(timeout=30)
            if i == 2:
                second_started.set()
            done_order.append(i)
            return super().__getitem__(i)

    out = epoch(DataLoader(Gated(4), batch_size=2, num_workers=2, timeout=SAFETY_S))
    assert out == [[0, 1], [2, 3]]
    assert done_order.index(2) < done_order.index(0)   # batch 1 really was made first


def test_workers_are_threads_named_by_id_and_batches_go_round_robin():
    ds = Ints(12)
    loader = DataLoader(ds, batch_size=2, num_workers=3, timeout=SAFETY_S)
    it = iter(loader)
    assert sorted(t.name for t in live_workers()) == [f"{PREFIX}-{i}" for i in range(3)]
    assert [b.tolist() for b in it] == [[2 * k, 2 * k + 1] for k in range(6)]
    for i in range(12):
        assert ds.readers[i] == f"{PREFIX}-{(i // 2) % 3}"


def test_prefetch_is_bounded_by_prefetch_factor_times_num_workers():
    drawn = []

    class CountingBatches:
        def __iter__(self):
            for k in range(20):
                drawn.append(k)
                yield [k]

        def __len__(self):
            return 20

    it = iter(DataLoader(Ints(20), batch_sampler=CountingBatches(), num_workers=2, prefetch_factor=3, timeout=SAFETY_S))
    assert len(drawn) == 6   # primed: prefetch_factor * num_workers batches in flight
    for consumed in range(1, 21):
        assert next(it).tolist() == [consumed - 1]
        assert len(drawn) <= min(20, consumed + 6)
    with pytest.raises(StopIteration):
        next(it)


def test_breaking_out_of_a_loop_leaves_no_worker_thread():
    loader = DataLoader(Ints(40), batch_size=2, num_workers=3, timeout=SAFETY_S)
    for batch in loader:
        assert len(live_workers()) == 3
        break
    assert batch.tolist() == [0, 1] and live_workers() == []


def test_close_and_garbage_collection_stop_the_workers():
    loader = DataLoader(Ints(40), batch_size=2, num_workers=2, timeout=SAFETY_S)
    it = iter(loader)
    next(it)
    it.close()
    assert live_workers() == [] and list(it) == []
    it = iter(loader)
    next(it)
    assert len(live_workers()) == 2
    del it
    gc.collect()
    assert live_workers() == []


@settings(max_examples=15)
@given(st.integers(1, 30), st.integers(1, 5), st.integers(1, 4), st.data())
def test_a_worker_exception_reaches_the_caller_naming_worker_and_batch(n, bs, workers, data):
    bad = data.draw(st.integers(0, n - 1))

    class Failing(Ints):
        def __getitem__(self, i):
            if i == bad:
                raise ValueError(f"bad sample {i}")
            return super().__getitem__(i)

    got = []
    with pytest.raises(ValueError) as info:
        for b in DataLoader(Failing(n), batch_size=bs, num_workers=workers, timeout=SAFETY_S):
            got.append(b.tolist())
    batch_index = bad // bs
    assert got == [list(range(k * bs, min(n, k * bs + bs))) for k in range(batch_index)]   # earlier batches first
    error = info.value
    assert error.batch_index == batch_index and error.worker_id == batch_index % workers
    message = str(error)
    assert f"DataLoader worker {batch_index % workers}" in message and f"batch {batch_index}" in message
    assert f"{PREFIX}-{batch_index % workers}" in message and "bad sample" in message
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == f"bad sample {bad}"
    assert live_workers() == []


def test_worker_errors_keep_their_type_or_become_runtime_errors():
    class Missing(Ints):
        def __getitem__(self, i):
            raise KeyError(i)

    with pytest.raises(KeyError) as info:
        list(DataLoader(Missing(4), batch_size=2, num_workers=1, timeout=SAFETY_S))
    assert str(info.value).startswith("Caught KeyError in DataLoader worker 0")   # printed as written, not repr

    class NeedsTwoArgs(Exception):
        def __init__(self, a, b):
            super().__init__(a, b)

    class Odd(Ints):
        def __getitem__(self, i):
            raise NeedsTwoArgs(1, 2)

    with pytest.raises(RuntimeError, match="Caught NeedsTwoArgs in DataLoader worker 0") as info:
        list(DataLoader(Odd(4), batch_size=2, num_workers=1, timeout=SAFETY_S))
    assert isinstance(info.value.__cause__, NeedsTwoArgs)
    assert live_workers() == []


def test_worker_init_fn_runs_once_per_worker_and_its_failure_is_raised():
    ids = []
    lock = threading.Lock()

    def init(worker_id):
        with lock:
            ids.append((worker_id, get_worker_info().id))

    loader = DataLoader(Ints(6), batch_size=2, num_workers=3, worker_init_fn=init, timeout=SAFETY_S)
    assert epoch(loader) == [[0, 1], [2, 3], [4, 5]]
    assert sorted(ids) == [(0, 0), (1, 1), (2, 2)]

    def broken(worker_id):
        raise OSError(f"no file for worker {worker_id}")

    with pytest.raises(OSError, match="in worker_init_fn: no file for worker"):
        list(DataLoader(Ints(6), batch_size=2, num_workers=2, worker_init_fn=broken, timeout=SAFETY_S))
    assert live_workers() == []


def test_get_worker_info_in_workers_and_none_elsewhere():
    infos, lock = {}, threading.Lock()

    class Recording(Ints):
        def __getitem__(self, i):
            with lock:
                infos[i] = get_worker_info()
            return i

    ds = Recording(8)
    epoch(DataLoader(ds, batch_size=2, num_workers=2, timeout=SAFETY_S))
    assert get_worker_info() is None
    for i, info in infos.items():
        assert info.id == (i // 2) % 2 and info.num_workers == 2 and info.dataset is ds
    assert infos[2].seed == infos[0].seed + 1
    epoch(DataLoader(ds, batch_size=2))
    assert all(info is None for info in infos.values())


def test_workers_run_in_the_callers_rank_context():
    ranks = []

    class Rank(Ints):
        def __getitem__(self, i):
            ranks.append(env.get_rank())
            return i

    with env.bound(env.RankContext(rank=3, world_size=4)):
        out = list(DataLoader(Rank(4), batch_size=2, num_workers=2, collate_fn=list, timeout=SAFETY_S))
    assert out == [[0, 1], [2, 3]] and ranks == [3, 3, 3, 3]


def test_timeout_raises_when_no_batch_comes_in_time():
    release = threading.Event()

    class Stuck(Ints):
        def __getitem__(self, i):
            release.wait()
            return i

    with pytest.raises(DataLoaderTimeoutError, match="timed out after 0.2 seconds waiting for batch 0") as info:
        next(iter(DataLoader(Stuck(2), batch_size=1, num_workers=1, timeout=0.2)))
    assert isinstance(info.value, RuntimeError)
    release.set()
    for t in live_workers():   # the timed-out iterator did not wait for its stuck worker; it ends once released
        t.join()
    assert live_workers() == []


def test_a_worker_that_vanishes_is_reported_not_awaited(monkeypatch):
    monkeypatch.setattr(worker_module, "_worker_loop", lambda *args: None)
    monkeypatch.setattr(worker_module, "POLL_S", 0.01)
    with pytest.raises(RuntimeError, match="pyflow-dataloader-worker-0 exited unexpectedly"):
        list(DataLoader(Ints(4), batch_size=2, num_workers=1))


# --- iterable datasets -------------------------------------------------------------------------


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class SizedStream(Stream):
    def __len__(self):
        return self.n


@given(st.integers(0, 30), st.integers(1, 8), st.booleans())
def test_iterable_dataset_batches_and_len(n, bs, drop_last):
    loader = DataLoader(SizedStream(n), batch_size=bs, drop_last=drop_last)
    batches = epoch(loader)
    assert len(batches) == len(loader)
    assert [i for b in batches for i in b] == list(range(n // bs * bs if drop_last else n))
    assert epoch(DataLoader(SizedStream(n), batch_size=None)) == list(range(n))


def test_len_of_a_loader_over_an_iterable_dataset_without_len_is_a_type_error():
    loader = DataLoader(Stream(5), batch_size=2)
    assert epoch(loader) == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="defines no __len__"):
        len(loader)


def test_iterable_dataset_refuses_workers_shuffle_and_samplers():
    with pytest.raises(ValueError, match="num_workers > 0 is not supported for an IterableDataset"):
        DataLoader(Stream(4), num_workers=2)
    for kwargs in ({"shuffle": True}, {"sampler": [0, 1]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError, match="expected unspecified"):
            DataLoader(Stream(4), **kwargs)
    assert epoch(DataLoader(Stream(2), shuffle=False)) == [[0], [1]]


def test_chain_and_concat_datasets():
    chained = Stream(2) + SizedStream(3)
    assert isinstance(chained, ChainDataset) and list(chained) == [0, 1, 0, 1, 2]
    assert len(SizedStream(2) + SizedStream(3)) == 5
    with pytest.raises(TypeError):
        len(chained)   # Stream(2) has no len
    with pytest.raises(TypeError, match="it has no dataset"):
        Stream(2)[0]
    concat = Ints(3) + Ints(2)
    assert isinstance(concat, ConcatDataset) and len(concat) == 5
    assert [concat[i] for i in range(5)] == [0, 1, 2, 0, 1] and concat[-5] == 0
    with pytest.raises(IndexError):
        concat[5]
    with pytest.raises(ValueError, match="should not exceed"):
        concat[-6]
    with pytest.raises(TypeError, match="does not support IterableDataset"):
        ConcatDataset([Ints(2), Stream(2)])
    with pytest.raises(ValueError, match="empty iterable"):
        ConcatDataset([])


# --- default_collate ---------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


@st.composite
def schemas(draw, depth=2):
    leaves = st.sampled_from(["int", "float", "bool", "str", "np", "np_scalar", "tensor"])
    if depth == 0:
        return draw(leaves)
    kind = draw(st.sampled_from(["leaf", "dict", "tuple", "list", "namedtuple"]))
    if kind == "leaf":
        return draw(leaves)
    if kind == "namedtuple":
        return ("namedtuple", [draw(schemas(depth - 1)), draw(schemas(depth - 1))])
    children = draw(st.lists(schemas(depth - 1), min_size=1, max_size=3))
    return (kind, children)


def make_sample(schema, rng):
    if schema == "int":
        return int(rng.integers(-5, 5))
    if schema == "float":
        return float(rng.uniform(-5, 5))
    if schema == "bool":
        return bool(rng.integers(0, 2))
    if schema == "str":
        return "s" + str(rng.integers(0, 9))
    if schema == "np":
        return rng.uniform(-1, 1, (2, 1)).astype(np.float32)
    if schema == "np_scalar":
        return np.int32(rng.integers(0, 9))
    if schema == "tensor":
        return flow.tensor(rng.uniform(-1, 1, 3).astype(np.float32))
    kind, children = schema
    values = [make_sample(c, rng) for c in children]
    return {"dict": lambda: {f"k{i}": v for i, v in enumerate(values)}, "tuple": lambda: tuple(values),
            "list": lambda: values, "namedtuple": lambda: Pair(*values)}[kind]()


def check_collated(schema, samples, out):
    expected_dtype = {"int": flow.int64, "float": flow.float64, "bool": flow.bool, "np": np.dtype(np.float32),
                      "np_scalar": np.dtype(np.int32), "tensor": flow.float32}
    if schema == "str":
        assert out == samples
        return
    if isinstance(schema, str):
        assert isinstance(out, flow.Tensor) and out.dtype == expected_dtype[schema] and out.device.type == "cpu"
        want = np.stack([np.asarray(s.numpy() if isinstance(s, flow.Tensor) else s) for s in samples])
        assert out.shape == want.shape and np.array_equal(out.numpy(), want)
        return
    kind, children = schema
    if kind == "dict":
        assert isinstance(out, dict) and list(out) == [f"k{i}" for i in range(len(children))]
        parts = [out[f"k{i}"] for i in range(len(children))]
        columns = [[s[f"k{i}"] for s in samples] for i in range(len(children))]
    else:
        assert type(out) is (Pair if kind == "namedtuple" else list)   # tuples collate to lists (PyTorch)
        parts, columns = list(out), [list(c) for c in zip(*samples)]
    for child, column, part in zip(children, columns, parts):
        check_collated(child, column, part)


@given(schemas(), st.integers(1, 4), st.integers(0, 1000))
def test_default_collate_collates_nested_structures_field_by_field(schema, batch, seed):
    rng = np.random.default_rng(seed)
    samples = [make_sample(schema, rng) for _ in range(batch)]
    check_collated(schema, samples, default_collate(samples))


def test_default_collate_errors_name_the_problem():
    with pytest.raises(ShapeError, match="stack"):
        default_collate([flow.zeros(2), flow.zeros(3)])
    with pytest.raises(ShapeError, match="same shape"):
        default_collate([np.zeros(2), np.zeros(3)])
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="found <class 'object'>"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="found <U1"):
        default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(ShapeError, match="empty"):
        default_collate([])


def test_default_convert_turns_arrays_into_tensors_and_keeps_the_rest():
    out = default_convert({"a": np.arange(3), "b": (np.float32(2.0), "x"), "c": [1, 2.5], "d": Pair(np.ones(1), 7)})
    assert out["a"].tolist() == [0, 1, 2] and out["a"].dtype == flow.int64
    assert isinstance(out["b"], list) and out["b"][0].dtype == flow.float32 and out["b"][1] == "x"
    assert out["c"] == [1, 2.5] and isinstance(out["d"], Pair) and out["d"].a.tolist() == [1.0] and out["d"].b == 7


def test_collated_batches_stay_on_the_samples_device():
    x = flow.tensor(np.arange(8, dtype=np.float32).reshape(4, 2), device="cuda")
    for workers in (0, 2):
        batches = list(DataLoader(TensorDataset(x), batch_size=3, num_workers=workers))
        assert [b[0].device.type for b in batches] == ["cuda", "cuda"]
        assert [b[0].tolist() for b in batches] == [[[0, 1], [2, 3], [4, 5]], [[6, 7]]]


# --- datasets, splits, samplers ----------------------------------------------------------------


def test_tensor_dataset_checks_its_tensors():
    with pytest.raises(ShapeError, match=r"size mismatch.*\(3, 2\) \(3 samples\).*\(4,\) \(4 samples\)"):
        TensorDataset(flow.zeros(3, 2), flow.zeros(4))
    with pytest.raises(ArgumentValueError, match="at least one tensor"):
        TensorDataset()
    with pytest.raises(ArgumentTypeError, match="argument 1 must be a pyflow tensor, got ndarray"):
        TensorDataset(flow.zeros(2), np.zeros(2))
    with pytest.raises(ShapeError, match="0-d"):
        TensorDataset(flow.tensor(1.0))
    ds = TensorDataset(flow.zeros(3, 2), flow.arange(3))
    assert len(ds) == 3 and ds[2][1].item() == 2


@st.composite
def splits(draw):
    n = draw(st.integers(0, 50))
    if draw(st.booleans()):   # integer lengths summing to n
        cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
        bounds = [0] + cuts + [n]
        return n, [b - a for a, b in zip(bounds, bounds[1:])]
    weights = draw(st.lists(st.integers(1, 10), min_size=1, max_size=4))
    return n, [w / sum(weights) for w in weights]


@given(splits(), st.integers(0, 2**32))
def test_random_split_is_disjoint_complete_and_reproducible(split, seed):
    n, lengths = split

    def split_once():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a fraction may round to an empty split (warned; tested below)
            return [list(p) for p in random_split(range(n), lengths, generator=flow.Generator().manual_seed(seed))]

    parts = split_once()
    assert sorted(v for p in parts for v in p) == list(range(n))
    if all(isinstance(x, int) for x in lengths):
        assert [len(p) for p in parts] == lengths
    else:
        floors = [int(np.floor(n * f)) for f in lengths]
        assert all(len(p) in (low, low + 1) for p, low in zip(parts, floors))
    assert split_once() == parts


def test_random_split_follows_manual_seed_and_rejects_bad_lengths():
    flow.manual_seed(3)
    first = [list(p) for p in random_split(range(10), [3, 7])]
    flow.manual_seed(3)
    assert [list(p) for p in random_split(range(10), [3, 7])] == first
    with pytest.raises(ValueError, match=r"sum of input lengths \(9\) does not equal"):
        random_split(range(10), [4, 5])
    with pytest.raises(ValueError, match="fraction at index 0 is not between 0 and 1"):
        random_split(range(10), [1.5, -0.5])
    with pytest.raises(TypeError, match="must be an int or a fraction"):
        random_split(range(10), ["5", 5])
    with pytest.warns(UserWarning, match="length of split at index 1 is 0"):
        random_split(range(2), [0.9, 0.1])


def test_subset_reads_through_its_indices():
    s = Subset(Ints(10), [7, 2, 5])
    assert len(s) == 3 and [s[i] for i in range(3)] == [7, 2, 5]
    assert Subset(np.arange(10) * 10, [7, 2, 5])[[0, 2]].tolist() == [70, 50]   # a list of indices: one read


@given(st.integers(1, 20), st.integers(1, 60), st.integers(0, 2**32))
def test_random_sampler_spreads_samples_and_replacement_draws_num_samples(n, count, seed):
    without = list(RandomSampler(range(n), num_samples=count, generator=flow.Generator().manual_seed(seed)))
    assert len(without) == count
    tallies = collections.Counter(without)
    assert all(tallies[i] in (count // n, count // n + 1) for i in range(n))
    with_replacement = RandomSampler(range(n), replacement=True, num_samples=count,
                                     generator=flow.Generator().manual_seed(seed))
    drawn = list(with_replacement)
    assert len(drawn) == len(with_replacement) == count and all(0 <= i < n for i in drawn)


def test_sampler_argument_errors():
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement should be a boolean"):
        RandomSampler(range(3), replacement=1)
    with pytest.raises(ValueError, match="empty data source"):
        list(RandomSampler([], replacement=True, num_samples=2))
    assert list(RandomSampler([])) == [] and list(SequentialSampler(range(3))) == [0, 1, 2]
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        BatchSampler(range(3), True, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean"):
        BatchSampler(range(3), 2, 0)
    with pytest.raises(TypeError, match="has no len"):
        len(BatchSampler(iter(range(3)), 2, False))
    assert len(BatchSampler(range(7), 3, False)) == 3 and len(BatchSampler(range(7), 3, True)) == 2


def test_dataloader_argument_errors():
    bad = [({"batch_sampler": [[0]], "batch_size": 2}, "mutually exclusive with batch_size"),
           ({"sampler": [0], "shuffle": True}, "sampler option is mutually exclusive with shuffle"),
           ({"batch_size": None, "drop_last": True}, "disables auto-batching"),
           ({"num_workers": -1}, "num_workers option should be a non-negative int"),
           ({"prefetch_factor": 2}, "prefetch_factor option could only be specified"),
           ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor should be a positive int"),
           ({"timeout": 1}, "with num_workers=0 it must be 0"),
           ({"timeout": -1, "num_workers": 1}, "timeout option should be non-negative"),
           ({"batch_size": 0}, "batch_size should be a positive integer value or None"),
           ({"drop_last": 1}, "drop_last should be a boolean")]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            DataLoader(Ints(4), **kwargs)
    with pytest.raises(TypeError, match="generator must be a pyflow.Generator"):
        DataLoader(Ints(4), generator=np.random.default_rng(0))


# --- Generator and randperm --------------------------------------------------------------------


def test_generator_seeds_like_torch():
    g = flow.Generator()
    assert g.initial_seed() == 67280421310721
    assert flow.randperm(10, generator=flow.Generator()).tolist() == flow.randperm(10, generator=g).tolist()
    assert g.manual_seed(-1) is g and g.initial_seed() == -1
    with pytest.raises(ValueError, match="out of range"):
        g.manual_seed(2**64)
    with pytest.raises(TypeError, match="must be an int"):
        g.manual_seed(1.5)
    with pytest.raises(TypeError, match="must be a pyflow.Generator"):
        flow.randperm(3, generator=np.random.default_rng(0))
    fresh = g.seed()
    assert g.initial_seed() == fresh


@given(st.integers(0, 60), st.integers(0, 2**32))
def test_randperm_is_a_reproducible_permutation(n, seed):
    p = flow.randperm(n, generator=flow.Generator().manual_seed(seed))
    assert p.dtype == flow.int64 and p.shape == (n,) and sorted(p.tolist()) == list(range(n))
    flow.manual_seed(seed)
    q = flow.randperm(n).tolist()
    flow.manual_seed(seed)
    assert flow.randperm(n).tolist() == q


def test_randperm_dtypes_and_device():
    p = flow.randperm(5, dtype=flow.float32, device="cuda")
    assert p.device.type == "cuda" and p.dtype == flow.float32 and sorted(p.tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(DTypeError, match="out of range for uint8"):
        flow.randperm(300, dtype=flow.uint8)
    with pytest.raises(DTypeError, match="cannot be bool"):
        flow.randperm(3, dtype=flow.bool)
    with pytest.raises(ShapeError, match="non-negative"):
        flow.randperm(-1)
