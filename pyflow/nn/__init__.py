"""``flow.nn``: neural-network building blocks.  For now only ``flow.nn.functional``
(convolution and pooling on tensors); ``Module`` and the layers come in a later issue."""

from pyflow.nn import functional

__all__ = ["functional"]
