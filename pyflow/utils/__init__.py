"""``flow.utils``: what a course needs around the model (``torch.utils``'s names).

* ``data`` - datasets, samplers and the DataLoader (``pyflow/utils/data/``).
"""

from pyflow.utils import data

__all__ = ["data"]
