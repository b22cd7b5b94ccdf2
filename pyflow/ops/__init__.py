"""Op definitions (shape/dtype inference, kernel per device, SBP signatures, backward rule), one module per family."""

from pyflow.ops import copy, elementwise, linalg, movement, nn, optim_update, reduce, views  # noqa: F401  (they register)
