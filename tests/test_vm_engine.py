"""Specification of the VM's engine (seed 002): dependence edges, scheduling, fusion,
barriers and release order, checked without the framework.

* ``LocalDepObject.access`` is driven directly with random access patterns: every
  RAW / WAR / WAW pair is ordered (transitively), reads are never ordered against
  reads, and no instruction waits for itself.
* Random instruction DAGs (fake policies that log their compute) run on a dedicated
  ``VirtualMachine`` with one or several workers, threaded and step-through: every
  conflicting pair runs in program order, every instruction exactly once.
* Fusion, barriers and FIFO release are checked on the engine with fake streams and
  hand-driven "launched" flags, or on a dedicated VM where threads matter.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyflow.device.stream import Stream as StreamSymbol
from pyflow.device.stream import StreamType
from pyflow.vm.dependence import LocalDepObject
from pyflow.vm.engine import VirtualMachineEngine
from pyflow.vm.instruction import Instruction
from pyflow.vm.policies import Barrier, Fuse, InstructionPolicy
from pyflow.vm.virtual_machine import VirtualMachine

HANG_TIMEOUT = 5.0  # a scheduling bug fails the test instead of hanging the suite


# --- random access patterns --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Access:
    """One instruction of a random program: which objects it reads / writes, where it runs."""

    ident: int
    reads: frozenset
    writes: frozenset
    stream: int = 0
    sequential: bool = False  # also writes its stream's stream-sequential dependence
    delay: float = 0.0        # seconds its compute sleeps (shuffles the timing)

    def touches(self) -> frozenset:
        return self.reads | self.writes


def conflict(a: Access, b: Access) -> bool:
    """RAW, WAR or WAW on some object, or both stay in their (common) stream's order."""
    shared = a.touches() & b.touches()
    if any(o in a.writes or o in b.writes for o in shared):
        return True
    return a.sequential and b.sequential and a.stream == b.stream


@st.composite
def programs(draw, max_streams: int = 1, max_len: int = 20, sequential: bool = False, delays: bool = False):
    """A list of Access over 2-4 objects (reads and writes may overlap)."""
    n_objects = draw(st.integers(2, 4))
    n_streams = draw(st.integers(1, max_streams))
    n = draw(st.integers(1, max_len))
    objects = st.sets(st.integers(0, n_objects - 1), max_size=n_objects)
    result = []
    for ident in range(n):
        result.append(Access(
            ident=ident,
            reads=frozenset(draw(objects)),
            writes=frozenset(draw(objects)),
            stream=draw(st.integers(0, n_streams - 1)),
            sequential=draw(st.booleans()) if sequential else False,
            delay=draw(st.sampled_from([0.0, 0.0, 0.0005])) if delays else 0.0,
        ))
    return n_objects, result


class Node:
    """A stand-in for an instruction (LocalDepObject only compares identities)."""

    def __init__(self, ident: int):
        self.ident = ident

    def __repr__(self) -> str:
        return f"i{self.ident}"


def dependence_edges(n_objects: int, program) -> set:
    """Feed ``program`` to LocalDepObjects (reads, then writes, as the engine does): {(src, dst, obj)}."""
    deps = [LocalDepObject(f"o{k}") for k in range(n_objects)]
    nodes = [Node(a.ident) for a in program]
    edges = set()
    for access, node in zip(program, nodes):
        for o in sorted(access.reads):
            edges |= {(src.ident, node.ident, o) for src in deps[o].access(node, write=False)}
        for o in sorted(access.writes):
            edges |= {(src.ident, node.ident, o) for src in deps[o].access(node, write=True)}
    return edges


def reachable(edges, n: int) -> list:
    """reach[i] = every node with a path from i."""
    succ = collections.defaultdict(set)
    for src, dst, *_ in edges:
        succ[src].add(dst)
    reach = []
    for start in range(n):
        seen, stack = set(), [start]
        while stack:
            for nxt in succ[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        reach.append(seen)
    return reach


@given(programs())
def test_dependence_edges_order_every_conflicting_pair(case) -> None:
    n_objects, program = case
    edges = dependence_edges(n_objects, program)
    reach = reachable(edges, len(program))
    for a in program:
        for b in program[a.ident + 1:]:
            if conflict(a, b):
                assert b.ident in reach[a.ident], f"{a} and {b} conflict but no path; edges {sorted(edges)}"


@given(programs())
def test_reads_of_an_object_are_never_ordered_against_each_other(case) -> None:
    # An edge made by object o joins two accesses of o of which at least one writes it:
    # two reads of o (no write between them or not) never get an edge from o.
    n_objects, program = case
    for src, dst, o in dependence_edges(n_objects, program):
        assert o in program[src].writes or o in program[dst].writes, (
            f"edge i{src} -> i{dst} from object {o}, which both only read: {program[src]}, {program[dst]}")


@given(programs())
def test_edges_only_point_forward_never_to_self(case) -> None:
    n_objects, program = case
    for src, dst, o in dependence_edges(n_objects, program):
        assert src < dst, f"edge i{src} -> i{dst} (object {o}) is a self edge or points backwards"


def test_write_after_two_reads_waits_for_the_writer_and_both_readers() -> None:
    dep = LocalDepObject("x")
    w1, r1, r2, w2, r3 = (Node(i) for i in range(5))
    assert dep.access(w1, write=True) == []
    assert dep.access(r1, write=False) == [w1]
    assert dep.access(r2, write=False) == [w1]
    assert set(dep.access(w2, write=True)) == {w1, r1, r2}
    assert dep.access(r3, write=False) == [w2]


# --- fake policies and streams ---------------------------------------------------------------


class LogPolicy(InstructionPolicy):
    """Reads/writes the given dependence objects; compute logs ("start", id) ... ("end", id)."""

    def __init__(self, ident, reads=(), writes=(), sequential=None, log=None, delay=0.0,
                 fuse_type=None, action=None):
        self.ident = ident
        self.name = f"i{ident}"
        self._reads, self._writes, self._sequential = list(reads), list(writes), sequential
        self.fuse_type = fuse_type or ("enable" if sequential is not None else "none")
        self.log = log if log is not None else []
        self.delay = delay
        self.action = action
        self.threads: list = []

    def input_dependences(self) -> list:
        return self._reads

    def output_dependences(self) -> list:
        return self._writes

    @property
    def stream_sequential_dependence(self):
        return self._sequential

    def compute(self, instruction) -> None:
        self.threads.append(threading.current_thread())
        self.log.append(("start", self.ident))
        if self.delay:
            time.sleep(self.delay)
        if self.action is not None:
            self.action()
        self.log.append(("end", self.ident))


class FakeStream:
    """What the engine needs of a vm stream: a running list, a name, a schedule_dep."""

    def __init__(self, name: str):
        self.name = name
        self.running: collections.deque = collections.deque()
        self.schedule_dep = LocalDepObject(f"stream {name}")

    def __repr__(self) -> str:
        return f"<FakeStream {self.name}>"


class FakeEvent:
    def __init__(self):
        self.completed = False

    def query_done(self) -> bool:
        return self.completed


def members(instruction) -> tuple:
    """The idents an (possibly fused) instruction stands for, in order."""
    policy = instruction.policy
    policies = policy.policies if isinstance(policy, Fuse) else [policy]
    return tuple(p.ident for p in policies)


def schedule_all(engine, dispatch) -> None:
    """schedule() until nothing moves; barriers just run their callback."""
    while engine.schedule(dispatch, lambda barrier: barrier.policy.compute(barrier)):
        pass


# --- random DAGs on a real VirtualMachine ------------------------------------------------------


def make_vm(sync_mode: bool) -> VirtualMachine:
    return VirtualMachine(sync_mode=sync_mode, hang_timeout=HANG_TIMEOUT)


def vm_streams(vm, n: int) -> list:
    """n vm streams on n different worker threads (cpu compute, thread_uid 3, 4, ...)."""
    return [vm.get_vm_stream(StreamSymbol.new("cpu", StreamType.compute, thread_uid=3 + k)) for k in range(n)]


def run_and_wait(vm, instructions) -> None:
    """receive(instructions) then a barrier, and wait for it."""
    done = threading.Event()
    barrier = Instruction(vm.get_vm_stream(StreamSymbol.new("cpu", StreamType.barrier)), Barrier(done.set))
    vm.receive(list(instructions))
    vm.receive([barrier])
    vm.wait_until(done.is_set, "the test's barrier", drive=vm.sync_mode)


def run_program(program, n_streams: int, sync_mode: bool, n_objects: int) -> tuple:
    """Run ``program`` (Access list) as LogPolicy instructions; return (log, policies)."""
    vm = make_vm(sync_mode)
    try:
        streams = vm_streams(vm, n_streams)
        deps = [LocalDepObject(f"o{k}") for k in range(n_objects)]
        log: list = []
        policies, instructions = [], []
        for a in program:
            stream = streams[a.stream]
            policy = LogPolicy(a.ident, [deps[o] for o in sorted(a.reads)], [deps[o] for o in sorted(a.writes)],
                               stream.schedule_dep if a.sequential else None, log, a.delay)
            policies.append(policy)
            instructions.append(Instruction(stream, policy))
        run_and_wait(vm, instructions)
        vm.wait_until(vm.engine.empty, "every instruction released", drive=vm.sync_mode)
        return log, policies
    finally:
        vm.shutdown()


@pytest.mark.parametrize("sync_mode", [False, True], ids=["threaded", "sync_mode"])
@given(case=programs(max_streams=3, max_len=20, sequential=True, delays=True))
def test_conflicting_instructions_run_in_program_order(sync_mode, case) -> None:
    n_objects, program = case
    n_streams = max(a.stream for a in program) + 1
    log, _ = run_program(program, n_streams, sync_mode, n_objects)
    position = {entry: index for index, entry in enumerate(log)}
    for a in program:
        for b in program[a.ident + 1:]:
            if conflict(a, b):
                assert position[("end", a.ident)] < position[("start", b.ident)], (
                    f"{b} started before {a} ended; log {log}")


@pytest.mark.parametrize("sync_mode", [False, True], ids=["threaded", "sync_mode"])
@given(case=programs(max_streams=3, max_len=20, sequential=True, delays=True))
def test_every_instruction_runs_exactly_once(sync_mode, case) -> None:
    n_objects, program = case
    n_streams = max(a.stream for a in program) + 1
    log, _ = run_program(program, n_streams, sync_mode, n_objects)
    starts = sorted(ident for what, ident in log if what == "start")
    ends = sorted(ident for what, ident in log if what == "end")
    assert starts == ends == [a.ident for a in program], log


def _dataflow_step(access: Access, state: dict, seen: dict) -> None:
    """Read the objects ``access`` reads, then write a value derived from them (and its id)."""
    inputs = tuple(state.get(o) for o in sorted(access.reads))
    seen[access.ident] = inputs
    for o in sorted(access.writes):
        state[o] = (access.ident, inputs)


@pytest.mark.parametrize("sync_mode", [False, True], ids=["threaded", "sync_mode"])
@given(case=programs(max_streams=3, max_len=20, sequential=True, delays=True))
def test_random_dag_computes_what_sequential_execution_computes(sync_mode, case) -> None:
    # Every read sees the value the sequential program would see, and the final
    # values are the sequential ones.
    n_objects, program = case
    expected_state, expected_seen = {}, {}
    for a in program:
        _dataflow_step(a, expected_state, expected_seen)
    vm = make_vm(sync_mode)
    try:
        streams = vm_streams(vm, max(a.stream for a in program) + 1)
        deps = [LocalDepObject(f"o{k}") for k in range(n_objects)]
        state, seen, instructions = {}, {}, []
        for a in program:
            stream = streams[a.stream]
            policy = LogPolicy(a.ident, [deps[o] for o in sorted(a.reads)], [deps[o] for o in sorted(a.writes)],
                               stream.schedule_dep if a.sequential else None, delay=a.delay,
                               action=lambda a=a: _dataflow_step(a, state, seen))
            instructions.append(Instruction(stream, policy))
        run_and_wait(vm, instructions)
    finally:
        vm.shutdown()
    assert seen == expected_seen
    assert state == expected_state


def test_several_streams_run_on_several_worker_threads() -> None:
    # The DAG tests above are only meaningful if streams with different thread_uid
    # really compute on different threads.
    vm = make_vm(sync_mode=False)
    try:
        streams = vm_streams(vm, 3)
        policies = [LogPolicy(k) for k in range(3)]
        run_and_wait(vm, [Instruction(s, p) for s, p in zip(streams, policies)])
        threads = {p.threads[0] for p in policies}
        assert len(threads) == 3 and threading.current_thread() not in threads
        assert all(t.name.startswith("pyflow-vm-worker") for t in threads)
    finally:
        vm.shutdown()


# --- fusion ------------------------------------------------------------------------------------


def engine_run(specs, streams) -> tuple:
    """Instructions from (ident, stream index, kind) specs on an engine; returns (engine, dispatched)."""
    engine = VirtualMachineEngine()
    instructions = []
    for ident, s, kind in specs:
        stream = streams[s]
        if kind == "plain":
            policy = LogPolicy(ident)
        else:  # "seq" / "tail": share the stream's stream-sequential dependence
            policy = LogPolicy(ident, sequential=stream.schedule_dep,
                               fuse_type="tail_only" if kind == "tail" else "enable")
        instructions.append(Instruction(stream, policy))
    dispatched: list = []
    engine.receive(instructions)
    schedule_all(engine, dispatched.append)
    return engine, dispatched


def expected_groups(specs) -> list:
    """The spec: maximal runs of consecutive seq/tail instructions on one stream; a tail ends a run."""
    groups: list = []
    for ident, s, kind in specs:
        last = groups[-1][-1] if groups else None
        if last is not None and kind != "plain" and last[2] == "seq" and last[1] == s:
            groups[-1].append((ident, s, kind))
        else:
            groups.append([(ident, s, kind)])
    return [tuple(ident for ident, _, _ in g) for g in groups]


@pytest.mark.parametrize("n", [2, 5, 10])
def test_consecutive_stream_sequential_instructions_on_one_stream_fuse(n) -> None:
    engine, dispatched = engine_run([(k, 0, "seq") for k in range(n)], [FakeStream("a")])
    assert engine.fused == n - 1
    assert [members(i) for i in dispatched] == [tuple(range(n))]
    assert isinstance(dispatched[0].policy, Fuse) and dispatched[0].count == n


def test_instructions_without_stream_sequential_dependence_never_fuse() -> None:
    engine, dispatched = engine_run([(k, 0, "plain") for k in range(8)], [FakeStream("a")])
    assert engine.fused == 0
    assert sorted(members(i) for i in dispatched) == [(k,) for k in range(8)]


def test_tail_only_instruction_may_only_end_a_fused_group() -> None:
    kinds = ["tail", "seq", "tail", "seq", "seq", "tail", "tail", "seq"]
    engine, dispatched = engine_run([(k, 0, kind) for k, kind in enumerate(kinds)], [FakeStream("a")])
    assert sorted(members(i) for i in dispatched) == [(0,), (1, 2), (3, 4, 5), (6,), (7,)]
    assert engine.fused == 3


def test_instructions_on_different_streams_do_not_fuse() -> None:
    specs = [(0, 0, "seq"), (1, 1, "seq"), (2, 0, "seq"), (3, 1, "seq")]
    engine, dispatched = engine_run(specs, [FakeStream("a"), FakeStream("b")])
    assert engine.fused == 0 and len(dispatched) == 4


kinds_st = st.sampled_from(["seq", "seq", "tail", "plain"])


@given(st.lists(st.tuples(st.integers(0, 1), kinds_st), min_size=1, max_size=10))
def test_fused_groups_are_the_maximal_runs_the_spec_describes(items) -> None:
    # A window (10) of instructions is handled at once; the spec's groups within it.
    specs = [(ident, s, kind) for ident, (s, kind) in enumerate(items)]
    engine, dispatched = engine_run(specs, [FakeStream("a"), FakeStream("b")])
    groups = expected_groups(specs)
    assert sorted(members(i) for i in dispatched) == sorted(groups)
    assert engine.fused == sum(len(g) - 1 for g in groups)


@pytest.mark.parametrize("sync_mode", [False, True], ids=["threaded", "sync_mode"])
def test_fused_group_computes_every_member_in_order(sync_mode) -> None:
    vm = make_vm(sync_mode)
    try:
        (stream,) = vm_streams(vm, 1)
        log: list = []
        policies = [LogPolicy(k, sequential=stream.schedule_dep, log=log, delay=0.0005 * (k % 2)) for k in range(6)]
        policies.append(LogPolicy(6, sequential=stream.schedule_dep, log=log, fuse_type="tail_only"))
        run_and_wait(vm, [Instruction(stream, p) for p in policies])
        assert vm.engine.fused == 6  # they did fuse ...
        assert [ident for what, ident in log if what == "start"] == list(range(7))  # ... and all ran, in order
        vm.wait_until(vm.engine.empty, "every instruction released", drive=sync_mode)  # counts the members
    finally:
        vm.shutdown()


# --- barriers ----------------------------------------------------------------------------------


@given(st.lists(st.one_of(st.just("barrier"), st.tuples(st.integers(0, 2), st.sampled_from([0.0, 0.001]))),
                min_size=1, max_size=15))
def test_barrier_runs_only_after_every_earlier_instruction_was_released(items) -> None:
    vm = make_vm(sync_mode=False)
    try:
        streams = vm_streams(vm, 3)
        barrier_stream = vm.get_vm_stream(StreamSymbol.new("cpu", StreamType.barrier))
        earlier: list = []
        violations: list = []
        ran: list = []
        instructions = []
        for k, item in enumerate(items):
            if item == "barrier":
                before = list(earlier)

                def check(k=k, before=before):
                    ran.append(k)
                    violations.extend((k, i) for i in before if not i.released)

                instruction = Instruction(barrier_stream, Barrier(check, name=f"barrier{k}"))
            else:
                s, delay = item
                instruction = Instruction(streams[s], LogPolicy(k, delay=delay))
            earlier.append(instruction)
            instructions.append(instruction)
        for instruction in instructions:  # one receive each, as separate PhysicalRuns would do
            vm.receive([instruction])
        run_and_wait(vm, [])
        assert ran == [k for k, item in enumerate(items) if item == "barrier"]
        assert violations == [], f"barriers ran before these earlier instructions were released: {violations}"
    finally:
        vm.shutdown()


def test_instructions_after_a_barrier_are_not_held_back_by_it() -> None:
    # x (stream 0) waits until y (stream 1), issued after the barrier, has run.  If a
    # waiting barrier held later instructions back, x would time out and the barrier
    # would never run.
    vm = make_vm(sync_mode=False)
    try:
        streams = vm_streams(vm, 2)
        y_ran = threading.Event()
        x_saw_y = []
        x = Instruction(streams[0], LogPolicy(0, action=lambda: x_saw_y.append(y_ran.wait(5))))
        barrier_ran = threading.Event()
        barrier = Instruction(vm.get_vm_stream(StreamSymbol.new("cpu", StreamType.barrier)), Barrier(barrier_ran.set))
        y = Instruction(streams[1], LogPolicy(1, action=y_ran.set))
        vm.receive([x])
        vm.receive([barrier])
        vm.receive([y])
        vm.wait_until(barrier_ran.is_set, "the barrier")
        assert x_saw_y == [True]
        assert y.launched
    finally:
        vm.shutdown()


def test_instructions_issued_after_a_barrier_complete() -> None:
    vm = make_vm(sync_mode=False)
    try:
        streams = vm_streams(vm, 2)
        log: list = []
        barrier_stream = vm.get_vm_stream(StreamSymbol.new("cpu", StreamType.barrier))
        vm.receive([Instruction(streams[0], LogPolicy(0, log=log, delay=0.01))])
        vm.receive([Instruction(barrier_stream, Barrier(lambda: log.append(("barrier", None))))])
        after = [Instruction(streams[k % 2], LogPolicy(k, log=log)) for k in range(1, 5)]
        run_and_wait(vm, after)
        assert all(i.released for i in after)
        assert sorted(ident for what, ident in log if what == "end") == [0, 1, 2, 3, 4]
    finally:
        vm.shutdown()


# --- release order -----------------------------------------------------------------------------


@given(st.lists(st.integers(0, 1), min_size=1, max_size=12).flatmap(
    lambda streams: st.tuples(st.just(streams), st.permutations(range(len(streams))))))
def test_running_list_releases_in_fifo_order(case) -> None:
    # Instructions finish ("launch") in a random order; each stream releases only the
    # done prefix of its running list, in dispatch order.
    stream_of, finish_order = case
    streams = [FakeStream("a"), FakeStream("b")]
    released: list = []
    engine = VirtualMachineEngine(on_release=released.append)
    instructions = [Instruction(streams[s], LogPolicy(k)) for k, s in enumerate(stream_of)]
    dispatched: list = []
    engine.receive(instructions)
    schedule_all(engine, dispatched.append)
    assert len(dispatched) == len(instructions)
    for k in finish_order:
        instructions[k].launched = True
        schedule_all(engine, dispatched.append)
        for s, stream in enumerate(streams):
            order = [i for i in dispatched if i.stream is stream]
            done_prefix = []
            for i in order:
                if not i.launched:
                    break
                done_prefix.append(i)
            assert [i for i in released if i.stream is stream] == done_prefix
    assert engine.empty()


def test_instruction_waiting_for_its_event_is_released_only_when_the_event_completes() -> None:
    a, b = FakeStream("a"), FakeStream("b")
    x = LocalDepObject("x")
    released: list = []
    engine = VirtualMachineEngine(on_release=released.append)
    producer = Instruction(a, LogPolicy(0, writes=[x]))
    later_on_a = Instruction(a, LogPolicy(1))
    consumer = Instruction(b, LogPolicy(2, reads=[x]))  # cross-stream: needs producer released
    dispatched: list = []
    engine.receive([producer, later_on_a, consumer])
    schedule_all(engine, dispatched.append)
    assert dispatched == [producer, later_on_a]
    event = FakeEvent()
    producer.event, producer.launched = event, True
    later_on_a.launched = True
    for _ in range(3):
        schedule_all(engine, dispatched.append)
    assert released == [] and consumer not in dispatched  # launched, event pending: not done
    assert not producer.done()
    event.completed = True
    schedule_all(engine, dispatched.append)
    assert released == [producer, later_on_a]
    assert consumer in dispatched
