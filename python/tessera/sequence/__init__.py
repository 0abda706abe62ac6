"""Context parallelism: every sequence split over the context group's ranks (DeepSpeed calls it
sequence parallelism: `deepspeed.sequence`).

    from tessera.sequence import DistributedAttention     # was: from deepspeed.sequence.layer import ...
    tessera.sequence.parallelize(model, method="ring")     # SDPA calls in the model's attention modules
    ids, labels = (tessera.sequence.shard(t, dim=1) for t in (ids, labels))
    pos = tessera.sequence.positions(ids_whole.size(1))

Ulysses (all-to-all, heads split) and ring attention (key/value blocks around the ring, any number
of heads, causal load balancing) run in C++ (parallel/context_parallel/). docs/context_parallel.md.
"""
from .layer import (DistributedAttention, RingAttention, attention, configure, context_group, context_method,
                    context_rank, context_size, cross_entropy, is_parallelized, mean, pad_for_context, parallelize,
                    positions, shard, unshard)

__all__ = ["DistributedAttention", "RingAttention", "attention", "parallelize", "is_parallelized", "configure",
           "shard", "unshard", "positions", "pad_for_context", "mean", "cross_entropy", "context_group",
           "context_size", "context_rank", "context_method"]
