"""``flow.utils.data``: datasets, samplers and the DataLoader, with ``torch.utils.data``'s names and rules.

What a course needs around the model: feed it batches.  One concept per module:

* ``dataset``    - ``Dataset`` / ``IterableDataset`` (the two protocols), ``TensorDataset``, ``Subset``,
  ``ConcatDataset``, ``ChainDataset``, ``random_split``;
* ``sampler``    - ``SequentialSampler``, ``RandomSampler``, ``SubsetRandomSampler``, ``BatchSampler``;
* ``collate``    - ``default_collate`` (samples -> one batch), ``default_convert``;
* ``dataloader`` - ``DataLoader``: sampler -> batch sampler -> fetch -> collate, ``len`` as PyTorch;
* ``worker``     - ``num_workers > 0``: worker *threads* (why threads: that module's docstring),
  ``get_worker_info``.

Randomness (shuffle, ``random_split``) comes from ``flow.Generator`` / the global generator that
``flow.manual_seed`` seeds (``pyflow/framework/random_perm.py``).

>>> import pyflow as flow
>>> x, y = flow.arange(8, dtype=flow.float32).reshape(4, 2), flow.tensor([0, 1, 0, 1])
>>> for xb, yb in flow.utils.data.DataLoader(flow.utils.data.TensorDataset(x, y), batch_size=3):
...     print(xb.shape, yb.tolist())
(3, 2) [0, 1, 0]
(1, 2) [1]
"""

from pyflow.utils.data.collate import default_collate, default_convert
from pyflow.utils.data.dataloader import DataLoader
from pyflow.utils.data.dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset,
                                       random_split)
from pyflow.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler
from pyflow.utils.data.worker import DataLoaderTimeoutError, WorkerInfo, get_worker_info

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "Subset", "ConcatDataset", "ChainDataset", "random_split",
           "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler", "BatchSampler",
           "default_collate", "default_convert", "DataLoader", "get_worker_info", "WorkerInfo",
           "DataLoaderTimeoutError"]
