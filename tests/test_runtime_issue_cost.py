"""What a compiled training call costs the caller's thread beyond its kernels, in counts (never times; issue 31).

Properties: a compiled training call of a depth-8 MLP, and of a two-layer one, makes at most 0.7 times the
Python calls of the same step eager (cProfile, the actors on the caller's thread), with the same values; its
prepared ops are issued at their task's site, with no walk of the stack for the user's line; an act that issues
no instruction (a tick, an input, a variable, a view of a regst that is no view) runs without the timeline's
issuer; a regst message is handled with no call of ``on_arrived``, ``is_read_ready`` or ``is_write_ready`` and
is made once per regst copy and consumer, never per send; the waiting caller asks whether its call is done only
after the runtime notifies, not once per message; an OpCall is made with plain loops; a variable refilled
with the same value before every call (a learning rate) issues its fill without ``fill_``'s checks.
"""

from __future__ import annotations

import cProfile
import pstats

import numpy as np
import pytest

import pyflow as flow
from pyflow import nn
from pyflow.runtime import Runtime
from pyflow.runtime.act import issues_nothing
from pyflow.runtime.pipeline import linear_pipeline_plan

CALLS = 3


def _calls_of(stats: pstats.Stats, file_end: str, name: str) -> int:
    return sum(entry[1] for (file, _, function), entry in stats.stats.items()
               if file.endswith(file_end) and function == name)


def _profiled(step) -> pstats.Stats:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        step()
    profile.disable()
    return pstats.Stats(profile)


def _mlp(features: int, hidden: list, classes: int) -> nn.Module:
    layers = []
    for width in hidden:
        layers += [nn.Linear(features, width), nn.ReLU()]
        features = width
    return nn.Sequential(*layers, nn.Linear(features, classes))


def _training(features: int, hidden: list, classes: int = 3):
    """(graph step, eager step, graph, the two models): one SGD-with-momentum training step of an MLP, compiled
    (``executor = "deterministic"``: cProfile sees all of its work) and eager, from the same weights."""
    flow.manual_seed(0)
    model, eager = _mlp(features, hidden, classes), _mlp(features, hidden, classes)
    eager.load_state_dict(model.state_dict())
    opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    eager_opt = flow.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()
            return loss
    g = Train()
    g.executor = "deterministic"
    rng = np.random.default_rng(3)
    x = flow.tensor(rng.standard_normal((4, features)).astype(np.float32))
    y = flow.tensor(rng.integers(0, classes, size=4).astype(np.int64))

    def eager_step():
        eager_opt.zero_grad()
        loss = loss_fn(eager(x), y)
        loss.backward()
        eager_opt.step()
        return loss.numpy()
    for _ in range(2):   # the first call compiles, the second prepares (each task's first act)
        np.testing.assert_array_equal(g(x, y).numpy(), eager_step())
    return (lambda: g(x, y).numpy()), eager_step, g, (model, eager)


@pytest.mark.parametrize("features, hidden", [(6, [8] * 7), (12, [8])], ids=["depth-8", "two-layer"])
def test_a_compiled_training_call_makes_at_most_0_7_of_eager_python_calls(features, hidden):
    graph_step, eager_step, g, (model, eager) = _training(features, hidden)
    graph, plain = _profiled(graph_step), _profiled(eager_step)
    ratio = graph.total_calls / plain.total_calls
    assert ratio <= 0.7, ratio   # 0.83 (depth 8) and 0.94 (two layers) before
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    per_call = lambda file_end, name: _calls_of(graph, file_end, name) / CALLS   # noqa: E731
    acts = len(g.plan.tasks)
    assert per_call("failure.py", "issue_site") <= 10   # the caller's own (launch, read) and apply's (the output's
    #                                                     clone, the step count's fill); over 100 before
    assert per_call("op_call.py", "<genexpr>") == 0   # (an OpCall's dependences and bytes: plain loops)
    assert per_call("base.py", "on_arrived") == 0   # (the ticks keep their own readiness: two calls of each)
    assert per_call("base.py", "is_read_ready") <= 2 and per_call("base.py", "is_write_ready") <= 2
    assert per_call("thread.py", "take") <= 1
    assert per_call("threading.py", "is_set") <= 20   # the call's done event asked after notifications only, not
    #                                                   after each of the call's 800 messages
    assert per_call("inplace.py", "fill_") <= 1      # the step count's; the learning rate's fill is prepared
    runtime = g.__dict__["_runtime"]
    fed = {name for name, _ in runtime.template.feeds}
    quiet = [t for t in runtime.plan.tasks.values() if issues_nothing(runtime.plan, t, fed)]
    assert quiet and len(quiet) == len(runtime.quiet)
    assert per_call("builder.py", "set_issuer") == 2 * (acts - len(quiet))


def test_a_prepared_op_names_its_task_and_walks_no_stack():
    seen = []
    flow.vm.run(lambda builder: seen.append(builder.site), ("<nn.Graph 'g': task 3, op 'relu_0'>", 0))
    assert seen == [("<nn.Graph 'g': task 3, op 'relu_0'>", 0)]
    flow.vm.run(lambda builder: seen.append(builder.site))
    assert seen[-1][0] == __file__   # no site given: the user's line, found on the stack


def test_a_regst_message_is_made_once_per_copy_and_consumer():
    def zero_cost(plan, task, ins, outs, j, call):
        return outs
    plan = linear_pipeline_plan([f"stage{i}" for i in range(6)], regst_num=2)
    with Runtime(plan, deterministic=True, act_fn=zero_cost, max_calls_in_flight=2, timeline=0) as runtime:
        runtime.launch([]).result()
        sent = {id(msg) for actor in runtime.actors.values() for slot in actor.out_list
                for regst in slot.regsts for msg in regst.sends + list(regst.returns.values())}
        before = runtime.home.enqueued
        stats = _profiled(lambda: [h.result() for h in [runtime.launch([]) for _ in range(4)]])
        messages = runtime.home.enqueued - before
        made = _calls_of(stats, "<string>", "__init__")   # (dataclasses' __init__: ActorMsg's among them)
        assert messages > 4 * CALLS * len(plan.tasks) and made <= 4 * CALLS * 3, (made, messages)   # a launch's
        again = {id(msg) for actor in runtime.actors.values() for slot in actor.out_list
                 for regst in slot.regsts for msg in regst.sends + list(regst.returns.values())}
        assert again == sent
