"""``Embedding``: a lookup table from integer indices to learned vectors.

``Embedding(num_embeddings, embedding_dim)`` holds ``weight`` (num_embeddings,
embedding_dim), initialised N(0, 1) as in PyTorch.  ``embedding(indices)`` has
shape ``indices.shape + (embedding_dim,)``: row ``i`` of the weight for each
index ``i`` (``index_select``, so the gradient of a row adds up over every use).

``padding_idx``: that row starts at zero and receives no gradient, so it stays
whatever it is (the vector of a padding token).

>>> import pyflow as flow
>>> emb = Embedding(10, 3, padding_idx=0)
>>> emb
Embedding(10, 3, padding_idx=0)
>>> out = emb(flow.tensor([[0, 2], [4, 0]]))
>>> out.shape, out[0, 0].tolist()
((2, 2, 3), [0.0, 0.0, 0.0])
"""

from __future__ import annotations

from pyflow.framework.creation import empty
from pyflow.framework.tensor import Tensor
from pyflow.nn import functional as F
from pyflow.nn import init
from pyflow.nn.module import ArgumentValueError, Module, no_grad
from pyflow.nn.parameter import Parameter

__all__ = ["Embedding"]


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, indexed by integer tensors."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        for value, what in ((num_embeddings, "num_embeddings"), (embedding_dim, "embedding_dim")):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ArgumentValueError(f"Embedding: {what} must be a positive int, got {value!r}")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ArgumentValueError(f"Embedding: padding_idx {padding_idx} must be within the "
                                         f"{num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = Parameter(empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: N(0, 1), and the padding row zero."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}" + (
            f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True, padding_idx: int | None = None) -> "Embedding":
        """An Embedding whose weight is a copy of ``embeddings`` (2-D); ``freeze``: not trained."""
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ArgumentValueError("Embedding.from_pretrained: embeddings must be a 2-D tensor")
        rows, dim = embeddings.shape
        layer = cls(rows, dim, padding_idx, device=embeddings.device, dtype=embeddings.dtype)
        with no_grad():
            layer.weight.copy_(embeddings)
        layer.weight.requires_grad_(not freeze)
        return layer
