"""The paper's models in Cocktailer's PTX check: their generated kernels compile for a real GPU (sm_90).

``pyflow/cocktailer/compile_check.py`` compiles programs covering every construct its code
generator emits.  The models sit above Cocktailer (they are its applications), so they
hand their programs to that check rather than the check reaching up for them:

    pip install -e ".[ptx]"
    PYFLOW_CUDA=gpu python -m pyflow.models.compile_check [LABEL ...]

runs Cocktailer's examples and these (the LSTM and RAE programs are Cocktailer's own
``lstm_float64`` and ``recursion`` examples), one line per kernel, exit status 1 if any fails.
"""

from __future__ import annotations

import sys

from pyflow.cocktailer import compile_check
from pyflow.models.attention import Attention
from pyflow.models.blockdrop import BlockDrop
from pyflow.models.nasrnn import NASRNN
from pyflow.models.seq2seq import Seq2seq
from pyflow.models.skipnet import SkipNet

__all__ = ["examples", "run"]


def examples():
    """(label, program, inline) for each model, small sizes (the constructs matter, not the size)."""
    # NASRNN, Attention and Seq2seq: broadcast/strided batched matmuls (several specializations of one
    # shared-memory uTask in one kernel), cache rows at a run-time offset, the scaled softmax; a while loop
    # counting its steps, tokens on the device (embedding gather, row argmax, row max in the state)
    yield "nasrnn", NASRNN(8, 8, tile=4).program(3, 2), True
    yield "attention", Attention(2, 8, 3, tile=4).program(2, 6), True
    yield "seq2seq", Seq2seq(8, 11, max_length=4, tile=4).program(2), True
    # the CNNs: branches on a device-side count (BlockDrop) and on a decision the same kernel's controller
    # just made (SkipNet); conv / batch norm / pooling uTasks, two row-reduction uTasks owning shared memory
    # (the policy rows, the controller head) beside the matmuls' tiles in one kernel
    yield "blockdrop", BlockDrop((1, 2, 1), 5, width=2, image_size=8, tile=4).program(2), True
    yield "skipnet", SkipNet((1, 2, 1, 1), image_size=16, num_classes=5, width=1, tile=4).program(1), True


def run(only=None) -> int:
    """Cocktailer's check over its examples and the models' (or those labelled in ``only``)."""
    return compile_check.run(only, more=examples())


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
