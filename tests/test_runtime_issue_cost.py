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

import numpy as np
import pytest

import pyflow as flow
from pyflow.runtime import Runtime
from pyflow.runtime.act import issues_nothing
from pyflow.runtime.pipeline import linear_pipeline_plan
from tests.helpers_training import calls_of, profiled, training_steps

CALLS = 3


@pytest.mark.parametrize("features, hidden", [(6, [8] * 7), (12, [8])], ids=["depth-8", "two-layer"])
def test_a_compiled_training_call_makes_at_most_0_7_of_eager_python_calls(features, hidden):
    graph_step, eager_step, g, (model, eager) = training_steps(features, hidden, 3, seed=3)
    graph, plain = profiled(graph_step, CALLS), profiled(eager_step, CALLS)
    ratio = graph.total_calls / plain.total_calls
    assert ratio <= 0.7, ratio   # 0.83 (depth 8) and 0.94 (two layers) before
    for p, q in zip(model.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    per_call = lambda file_end, name: calls_of(graph, file_end, name) / CALLS   # noqa: E731
    acts = len(g.runtime.plan.tasks)   # (its view tasks act inside their readers' acts: ``runtime/fold.py``)
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
        stats = profiled(lambda: [h.result() for h in [runtime.launch([]) for _ in range(4)]], CALLS)
        messages = runtime.home.enqueued - before
        made = calls_of(stats, "<string>", "__init__")   # (dataclasses' __init__: ActorMsg's among them)
        assert messages > 4 * CALLS * len(plan.tasks) and made <= 4 * CALLS * 3, (made, messages)   # a launch's
        again = {id(msg) for actor in runtime.actors.values() for slot in actor.out_list
                 for regst in slot.regsts for msg in regst.sends + list(regst.returns.values())}
        assert again == sent
