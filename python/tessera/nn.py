"""Tensor-parallel layers for models written for tensor parallelism (Megatron-LM's), on the tensor
group of the process's parallel context (tessera.comm.init_distributed(tensor_parallel=t) or
tessera.initialize). Each is the torch.nn layer it extends, initialized whole as that layer is (same
random draws) and then cut to this rank's slice, so it equals the single-device layer split:

  ColumnParallelLinear(in, out, bias=True, fused=1, gather_output=False)   rows of the weight split
  RowParallelLinear(in, out, bias=True)        columns split; input split along its features
  VocabParallelEmbedding(num_embeddings, dim)  rows (the vocabulary) split
  vocab_parallel_cross_entropy(logits, targets, ignore_index=-100)
      the mean cross-entropy from logits split along the vocabulary (a ColumnParallelLinear head, or
      F.linear with a VocabParallelEmbedding's weight), never materializing the whole logits.

`sequence_parallel=True` (Megatron-SP): activations outside these layers are split along `seq_dim`.
"""
import torch.nn as nn

from . import tensor_parallel as _tpp

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "vocab_parallel_cross_entropy"]


class ColumnParallelLinear(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, *, fused=1, gather_output=False, sequence_parallel=False,
                 seq_dim=1, context=None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        _tpp._apply_colwise(self, type(self).__name__, _tpp.Colwise(fused, gather_output), context or _tpp._context(),
                            sequence_parallel, seq_dim)


class RowParallelLinear(nn.Linear):
    def __init__(self, in_features, out_features, bias=True, *, sequence_parallel=False, seq_dim=1, context=None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        _tpp._apply_rowwise(self, type(self).__name__, _tpp.Rowwise(), context or _tpp._context(), sequence_parallel,
                            seq_dim)


class VocabParallelEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, *, sequence_parallel=False, seq_dim=1, context=None, device=None,
                 dtype=None):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        _tpp._apply_vocab(self, type(self).__name__, _tpp.Vocab(), context or _tpp._context(), sequence_parallel,
                          seq_dim)


def vocab_parallel_cross_entropy(logits, targets, ignore_index=-100, context=None):
    return _tpp._tp.vocab_parallel_cross_entropy(logits, targets, context or _tpp._context(), int(ignore_index))
