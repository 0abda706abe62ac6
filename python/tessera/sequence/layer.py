"""Context-parallel attention with DeepSpeed's surface, and the data path that goes with it.

DistributedAttention is deepspeed.sequence.layer.DistributedAttention (Ulysses, Jacobs et al.
2023): q, k, v arrive sequence-split with every head, one all-to-all each makes them whole-sequence
with heads/N heads, the local attention (any function: SDPA, a user's own) runs, and the reverse
all-to-all brings the output back. RingAttention (Liu et al. 2023) keeps the queries and passes the
key/value blocks around the context group, merging by log-sum-exp; it takes any number of heads.

The context group is the grid's "context" axis (pipe x data x context x tensor), made by
tessera.initialize from context_parallel.size (or DeepSpeed's sequence_parallel_size); ranks in it
see the same samples, each a part of every sequence: contiguous for Ulysses, chunks r and 2N-1-r of
2N for ring attention (so a causal mask costs every rank the same). shard() cuts a batch that way,
positions() gives the global positions of this rank's tokens, mean() / cross_entropy() the loss
over the whole sequence (not a mean of the ranks' means). docs/context_parallel.md.
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import _C, comm

__all__ = ["DistributedAttention", "RingAttention", "attention", "parallelize", "is_parallelized", "configure",
           "shard", "unshard", "positions", "pad_for_context", "mean", "cross_entropy", "context_group",
           "context_size", "context_rank", "context_method"]

_METHODS = ("ulysses", "ring")


def context_group(group=None):
    """The name of the context group to use: None -> "context" (the grid's axis); a str names a
    tessera group; a torch.distributed ProcessGroup is accepted when its ranks are the context
    group's (DeepSpeed scripts pass one: mpu.get_sequence_parallel_group())."""
    if group is None or isinstance(group, str):
        return group or "context"
    import torch.distributed as dist
    if isinstance(group, dist.ProcessGroup):
        ranks = list(dist.get_process_group_ranks(group))
        context = comm.parallel_context()
        ours = context.group_ranks("context")
        if sorted(ranks) != list(ours):
            raise ValueError("tessera.sequence: the process group given (ranks %s) is not this rank's context group "
                             "(ranks %s); tessera's context group comes from context_parallel.size (pass None)"
                             % (ranks, list(ours)))
        return "context"
    raise TypeError("tessera.sequence: sequence_process_group must be None, a group name or a "
                    "torch.distributed ProcessGroup, got %s" % type(group).__name__)


def context_size(group=None):
    """The number of ranks each sequence is split over (1 before the groups exist)."""
    if not comm.axes_made():
        return 1
    return comm.parallel_context().group_size(context_group(group))


def context_rank(group=None):
    if not comm.axes_made():
        return 0
    return comm.parallel_context().group_rank(context_group(group))


def context_method(method=None):
    """`method` checked, or the one tessera.initialize configured (context_parallel.method), else "ulysses"."""
    chosen = method or _configured.get("method") or "ulysses"
    if chosen not in _METHODS:
        raise ValueError("tessera.sequence: method must be 'ulysses' or 'ring', got %r" % (chosen,))
    return chosen


_configured = {}  # {"method": ...}: what tessera.initialize read from the config (one job, one method)


def configure(method):
    """The method the helpers use when given none (tessera.initialize sets context_parallel.method)."""
    _configured["method"] = context_method(method)


def shard(x, dim=1, method=None, group=None):
    """This rank's part of `x` along `dim` (the sequence): contiguous for Ulysses, chunks r and
    2N-1-r of 2N for ring attention. A length that does not divide is an error naming it (see
    pad_for_context)."""
    n = context_size(group)
    if n == 1:
        return x
    return _C.context_parallel.shard(x, dim, context_method(method), n, context_rank(group))


def unshard(part, dim=1, method=None, group=None):
    """The inverse of shard(), a collective over the context group (outside autograd): the whole
    sequence on every rank, for evaluation and tests."""
    if context_size(group) == 1:
        return part
    return _C.context_parallel.unshard(part, comm.parallel_context(), context_group(group), dim, context_method(method))


def positions(length, method=None, group=None, device="cpu"):
    """The global positions of this rank's tokens in a sequence of `length` (int64): what a model's
    position embedding or rotary angles take instead of arange(local length)."""
    n = context_size(group)
    if n == 1:
        return torch.arange(length, device=device)
    return _C.context_parallel.positions(length, context_method(method), n, context_rank(group), str(device))


def pad_for_context(x, dim=1, value=0, method=None, group=None):
    """`x` padded at the end of `dim` to a length the context layout divides (2N chunks for ring,
    N for Ulysses). Pad labels with the loss's ignore_index so the padding does not count."""
    n = context_size(group)
    pad = _C.context_parallel.padding(x.size(dim), context_method(method), n) if n > 1 else 0
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_full(shape, value)], dim)


def mean(local_sum, local_count, group=None):
    """Σ local_sum / Σ local_count over the context group (the same value on every rank), with the
    gradient scaled so that the engine's average over data x context gives the global mean's."""
    if context_size(group) == 1:
        return local_sum / local_count
    count = torch.as_tensor(local_count, dtype=torch.float64)  # a tensor stays where it is: one host read, in C++
    return _C.context_parallel.mean(local_sum, count, comm.parallel_context(), context_group(group))


def cross_entropy(logits, targets, ignore_index=-100, group=None):
    """The cross-entropy's mean over every counted token of the global sequence."""
    flat = logits.float().reshape(-1, logits.size(-1))
    labels = targets.reshape(-1)
    total = F.cross_entropy(flat, labels, ignore_index=ignore_index, reduction="sum")
    return mean(total, (labels != ignore_index).sum(), group)


def attention(query, key, value, method=None, is_causal=True, scale=None, group=None, local_attention=None):
    """Context-parallel attention in SDPA's layout: q, k, v [batch, heads, local sequence, head_dim]
    -> [batch, heads, local sequence, head_dim], each rank's tokens as shard() laid them out."""
    chosen = context_method(method)
    if context_size(group) == 1:
        return (local_attention or F.scaled_dot_product_attention)(query, key, value, is_causal=is_causal, scale=scale)
    name = context_group(group)
    context = comm.parallel_context()
    if chosen == "ring":
        if local_attention is not None:
            raise ValueError("tessera.sequence: ring attention computes its blocks itself; a local_attention is for "
                             "Ulysses (method='ulysses')")
        return _C.context_parallel.ring_attention(query, key, value, context, name, is_causal, scale)
    q, k, v = (_C.context_parallel.sequence_to_heads(t, context, name, 2, 1) for t in (query, key, value))
    out = (local_attention or F.scaled_dot_product_attention)(q, k, v, is_causal=is_causal, scale=scale)
    return _C.context_parallel.heads_to_sequence(out, context, name, 2, 1)


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DistributedAttention(nn.Module):
    """deepspeed.sequence.layer.DistributedAttention: Ulysses around any local attention.

    local_attention          a module or function (q, k, v, *args, **kwargs) -> output over the whole
                             sequence for this rank's heads
    sequence_process_group   None (the context group), a tessera group name, or a torch
                             ProcessGroup whose ranks are the context group's
    scatter_idx, gather_idx  the head and sequence dimensions of q, k, v (DeepSpeed's defaults:
                             [s/p, b, h, d], heads 2, sequence 0)
    forward(query, key, value, batch_dim_idx=None, rotary_pos_emb=None, *args, **kwargs): with
    batch_dim_idx 0 the layout is [b, s/p, h, d] (sequence dim 1); rotary_pos_emb = (cos, sin) is
    applied to q and k after the all-to-all (their sequence is then the whole one).
    """

    def __init__(self, local_attention, sequence_process_group=None, scatter_idx=2, gather_idx=0, sp_stream=None):
        super().__init__()
        self.local_attn = local_attention
        self.group = context_group(sequence_process_group)
        self.scatter_idx, self.gather_idx = scatter_idx, gather_idx
        self.sp_stream = sp_stream  # accepted for DeepSpeed's signature; the all-to-alls run on the caller's stream

    def forward(self, query, key, value, batch_dim_idx=None, rotary_pos_emb=None, *args, **kwargs):
        seq_dim = 1 if batch_dim_idx == 0 else self.gather_idx
        head_dim = self.scatter_idx
        if context_size(self.group) == 1:
            q, k, v = query, key, value
        else:
            context = comm.parallel_context()
            _C.context_parallel.check_ulysses_heads(query.size(head_dim), context_size(self.group))
            q, k, v = (_C.context_parallel.sequence_to_heads(t, context, self.group, seq_dim, head_dim)
                       for t in (query, key, value))
        if rotary_pos_emb is not None:
            cos, sin = rotary_pos_emb
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = self.local_attn(q, k, v, *args, **kwargs)
        if isinstance(out, tuple):
            out = out[0]
        if context_size(self.group) == 1:
            return out
        return _C.context_parallel.heads_to_sequence(out, comm.parallel_context(), self.group, seq_dim, head_dim)


class RingAttention(nn.Module):
    """Ring attention over the context group in SDPA's layout ([batch, heads, local sequence, head_dim]):
    exact, any number of heads, causal with the balanced layout (shard(method="ring"))."""

    def __init__(self, sequence_process_group=None, causal=True, scale=None):
        super().__init__()
        self.group = context_group(sequence_process_group)
        self.causal, self.scale = causal, scale

    def forward(self, query, key, value):
        return attention(query, key, value, method="ring", is_causal=self.causal, scale=self.scale, group=self.group)


class _ContextParallelSdpa(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention to the context-parallel attention."""

    def __init__(self, method, group):
        super().__init__()
        self.method, self.group = method, group

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _sdpa(self.method, self.group, *args, **kwargs)
        return func(*args, **kwargs)


def _sdpa(method, group, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if attn_mask is not None:
        raise ValueError("tessera.sequence: context-parallel attention takes is_causal=True or no mask; an explicit "
                         "attn_mask would have to be split with the sequence (give is_causal instead)")
    if dropout_p:
        raise ValueError("tessera.sequence: context-parallel attention has no attention dropout (dropout_p=%g)"
                         % dropout_p)
    if key.size(1) != query.size(1):  # grouped-query attention: every query head its key/value head
        repeat = query.size(1) // key.size(1)
        key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    return attention(query, key, value, method=method, is_causal=is_causal, scale=scale, group=group)


def _calls_sdpa(module):
    code = getattr(type(module).forward, "__code__", None)
    return code is not None and "scaled_dot_product_attention" in code.co_names


def parallelize(model, method=None, group=None, attention_modules=None, require=True):
    """Context parallelism applied to `model` without rewriting it: the F.scaled_dot_product_attention
    calls of its attention modules (those whose forward calls it, or `attention_modules`: a list of
    module classes or qualified names) become Ulysses or ring attention over the context group. The
    model's inputs must then be this rank's part of each sequence (shard()) and its positions the
    global ones (positions()). Returns the modules changed. tessera.initialize calls it when
    context_parallel.size > 1 and the model has no context-parallel attention yet."""
    chosen = context_method(method)
    name = context_group(group)
    if attention_modules is None:
        targets = [(n, m) for n, m in model.named_modules() if _calls_sdpa(m)]
    else:
        classes = tuple(a for a in attention_modules if isinstance(a, type))
        names = {a for a in attention_modules if isinstance(a, str)}
        targets = [(n, m) for n, m in model.named_modules() if (classes and isinstance(m, classes)) or n in names]
    if not targets and require:
        raise ValueError("tessera.sequence.parallelize: no attention module found (none of the model's modules calls "
                         "F.scaled_dot_product_attention in its forward); pass attention_modules=[...] or use "
                         "DistributedAttention / RingAttention in the model")
    for _, module in targets:
        if getattr(module, "_tessera_context_parallel", None):
            continue
        forward = module.forward

        @functools.wraps(forward)
        def wrapped(*args, _forward=forward, **kwargs):
            with _ContextParallelSdpa(chosen, name):
                return _forward(*args, **kwargs)

        module.forward = wrapped
        module._tessera_context_parallel = chosen
    return [m for _, m in targets]


def is_parallelized(model):
    """Whether `model` has context-parallel attention already (parallelize() or the modules here)."""
    return any(getattr(m, "_tessera_context_parallel", None) for m in model.modules()) or \
        any(isinstance(m, (DistributedAttention, RingAttention)) for m in model.modules())

