"""Optimizers (``SGD``, ``Adam``, ``AdamW``, ``RMSprop``, ``Adagrad``) and learning-rate schedulers (``lr_scheduler``).

* ``optimizer``    - ``Optimizer``: param groups, per-parameter state, ``zero_grad``, ``step``,
                     ``state_dict`` / ``load_state_dict`` (PyTorch's format), ``OptimizerError``
* ``sgd``          - ``SGD``: momentum, dampening, Nesterov, weight decay
* ``adam``         - ``Adam`` and ``AdamW``: bias-corrected moving averages, amsgrad
* ``rmsprop``      - ``RMSprop``: a running RMS of the gradient, momentum, centered
* ``adagrad``      - ``Adagrad``: a per-element lr from the sum of squared gradients
* ``lr_scheduler`` - ``LRScheduler``, ``StepLR``, ``MultiStepLR``, ``ExponentialLR``, ``CosineAnnealingLR``

An optimizer's step is tensor ops, not a kernel of its own (RMSprop and Adagrad: plain
in-place ops; SGD and Adam: one fused update op per parameter): every update runs under
``flow.no_grad()`` as in-place ops on the parameter (``p.add_(buf, alpha=-lr)``), so it
is a VM instruction on the parameter's device and stream, ordered after the backward
instructions that wrote ``p.grad``.  The formulas are PyTorch's, to the rounding.

A training step:

>>> import pyflow as flow
>>> w = flow.tensor([3.0, -1.0], requires_grad=True)
>>> opt = flow.optim.SGD([w], lr=0.25)
>>> for _ in range(3):
...     opt.zero_grad()
...     w.grad = w.detach() * 2          # the gradient of (w * w).sum(), what loss.backward() would give
...     opt.step()                       # w -= 0.25 * 2w: halves w
>>> w.tolist()
[0.375, -0.125]
"""

from pyflow.optim import lr_scheduler
from pyflow.optim.adagrad import Adagrad
from pyflow.optim.adam import Adam, AdamW
from pyflow.optim.optimizer import Optimizer, OptimizerError
from pyflow.optim.rmsprop import RMSprop
from pyflow.optim.sgd import SGD

__all__ = ["Optimizer", "OptimizerError", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "lr_scheduler"]
