"""Op definitions (shape/dtype inference, kernel per device, SBP signatures, backward rule), one module per family."""

from pyflow.ops import (copy, elementwise, linalg, movement, nn, optim_update, reduce,  # noqa: F401  (they register)
                        to_global, views)
