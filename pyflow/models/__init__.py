"""Models written as Cocktailer programs (seed 001, issues 5 and 17): the paper's seven models.

StackedLSTM (the paper's LSTM), RAE, NASRNN, Attention, Seq2seq, BlockDrop and SkipNet.

Each model is a small class that holds its parameters as numpy arrays (loaded under
PyTorch's names with ``load_state_dict``), traces itself into a ``cocktailer``
program the first time it sees an input size, and runs that program with either
executor:

* ``StackedLSTM`` (``lstm.py``): ``nn.LSTM`` semantics; a ``for_loop`` over time with two
  matmuls and a fused cell per layer per step: the paper's loop case.
* ``RAE`` (``rae.py``): a recursive autoencoder over a binary tree; a recursive
  function uTask: the paper's recursion case (its best speed-up, 8.22x).
* ``NASRNN`` (``nasrnn.py``): the artifact's NasRNN cell; a ``for_loop`` over time with
  two matmuls over 8 gates and a fused cell per step.
* ``Attention`` (``attention.py``): decoding with a KV cache; a ``for_loop`` over the
  generation steps whose matmuls write cache rows at a run-time index.
* ``Seq2seq`` (``seq2seq.py``): greedy decoding with an LSTM cell until every row
  says EOS; a while loop whose condition (a row max of the tokens) is computed and
  tested on the device: the paper's while-loop case.
* ``BlockDrop`` (``blockdrop.py``): a ResNet-32 whose policy drops blocks per image;
  a block runs when any sample wants it (a device-side count tested by a ``cond``)
  and each sample blends its output by its own decision: the paper's branch case.
* ``SkipNet`` (``skipnet.py``): a ResNet-101 whose recurrent controller (gate, LSTM
  cell, threshold) decides after each block whether the next one runs: branches
  on values the same kernel just computed.

``mode="compiled"`` runs the whole program as one persistent kernel, ``mode="host"``
one kernel launch per operator with control flow on the host; the two are bitwise
equal.  Called with ``pyflow.Tensor`` s, a model returns tensors and its call is one
VM instruction; its weights are uploaded to that device at the first such call and
kept there (``device_weights.py``: ``model.device_weights``), uploaded again only
when ``load_state_dict`` or an assignment changes them (parameter arrays are
read-only).  ``model.compiled_for(...)`` gives the ``cocktailer.Compiled`` object
(``source``, ``last_stats``) for benchmarks.

``compile_check.py`` hands the models' programs to Cocktailer's PTX check (``PYFLOW_CUDA=gpu
python -m pyflow.models.compile_check``): the models sit above Cocktailer, the check does not import them.
"""

from pyflow.errors import StateDictError
from pyflow.models.attention import Attention
from pyflow.models.blockdrop import BlockDrop
from pyflow.models.lstm import StackedLSTM
from pyflow.models.nasrnn import NASRNN
from pyflow.models.rae import RAE
from pyflow.models.seq2seq import Seq2seq
from pyflow.models.skipnet import SkipNet

__all__ = ["StackedLSTM", "RAE", "NASRNN", "Attention", "Seq2seq", "BlockDrop", "SkipNet", "StateDictError"]
