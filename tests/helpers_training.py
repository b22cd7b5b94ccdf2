"""A training step of an MLP as a compiled graph and eagerly, from the same weights, and cProfile counts of it:
what the count tests of the actor runtime (issue 31) measure a compiled call against.

* ``training_steps(features, hidden, classes, seed)`` -> ``(graph_step, eager_step, g, (model, eager))``: one
  SGD-with-momentum step of cross-entropy on a batch of 4 each, the graph run by the deterministic executor
  (the actors on the caller's thread, so cProfile sees all of its work), both already called twice with equal
  losses (the first graph call compiles, the second prepares each task's first act);
* ``profiled(step, calls)`` -> the ``pstats.Stats`` of ``calls`` calls of ``step``;
* ``calls_of(stats, file_end, name)`` -> how many calls of function ``name`` of a file ending in ``file_end``;
* ``assert_trains_like_eager(g, model, eager_model, eager_opt, loss_fn, data)``: ``g``'s loss on each ``(x, y)``
  equals the same step's eagerly, bit for bit, and so do the parameters after the last step.
"""

from __future__ import annotations

import cProfile
import pstats

import numpy as np

import pyflow as flow
from pyflow import nn


def mlp(features: int, hidden: list, classes: int) -> nn.Module:
    layers = []
    for width in hidden:
        layers += [nn.Linear(features, width), nn.ReLU()]
        features = width
    return nn.Sequential(*layers, nn.Linear(features, classes))


def training_steps(features: int, hidden: list, classes: int, seed: int):
    flow.manual_seed(0)
    model, eager = mlp(features, hidden, classes), mlp(features, hidden, classes)
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
    rng = np.random.default_rng(seed)
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


def profiled(step, calls: int) -> pstats.Stats:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        step()
    profile.disable()
    return pstats.Stats(profile)


def calls_of(stats: pstats.Stats, file_end: str, name: str) -> int:
    return sum(entry[1] for (file, _, function), entry in stats.stats.items()
               if file.endswith(file_end) and function == name)


def assert_trains_like_eager(g, model, eager_model, eager_opt, loss_fn, data) -> None:
    for x, y in data:
        got = g(x, y).numpy()
        eager_opt.zero_grad()
        loss = loss_fn(eager_model(x), y)
        loss.backward()
        eager_opt.step()
        np.testing.assert_array_equal(got, loss.numpy())
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())
