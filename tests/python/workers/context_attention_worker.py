"""Context-parallel attention alone on every rank of the job (tests/python/context_parallel/
test_attention.py): `METHOD CAUSAL KERNEL DTYPE LENGTH HEADS`. Every rank makes the same whole q, k,
v [2, HEADS, LENGTH, 16] and upstream gradient, runs SDPA on the whole sequence as the reference,
then its own part (tessera.sequence.shard, padded first by pad_for_context when LENGTH does not
divide) through tessera.sequence.attention, and compares the output and the q, k, v gradients of
its real positions with the reference's. Ulysses also runs through DistributedAttention in
DeepSpeed's [s, b, h, d] layout around a user's own attention function. Prints "ok" on rank 0."""
import sys

import torch
import torch.nn.functional as F

import tessera
from tessera import comm, sequence

method, causal, kernel, dtype, length, heads = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4], \
    int(sys.argv[5]), int(sys.argv[6])
world = tessera.comm.get_world_size()
comm.parallel_context("gloo", context=world)
torch.manual_seed(0)
dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
tol = {"fp32": 2e-5, "bf16": 2e-2}[dtype]
q, k, v, up = (torch.randn(2, heads, length, 16) for _ in range(4))


def reference():
    leaves = [t.clone().to(dt).requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*(t.float() for t in leaves), is_causal=causal)
    out.backward(up)
    return out.detach(), [t.grad.float() for t in leaves]


ref_out, ref_grads = reference()
# Padding at the end: under a causal mask the real positions never see it; its upstream gradient is 0.
padded = [sequence.pad_for_context(t, dim=2, method=method) for t in (q, k, v, up)]
real = torch.zeros(padded[0].size(2), dtype=torch.bool)
real[:length] = True
parts = [sequence.shard(t, dim=2, method=method).to(dt).requires_grad_() for t in padded[:3]]
if kernel == "math" and method == "ring":
    out = tessera._C.context_parallel.ring_attention(*parts, comm.parallel_context(), "context", causal, None, "math")
else:
    out = sequence.attention(*parts, method=method, is_causal=causal)
out.backward(sequence.shard(padded[3], dim=2, method=method).to(dt))
mine = sequence.shard(real, dim=0, method=method)


def close(name, got, want):
    got = got.float()[:, :, mine]
    want = sequence.shard(sequence.pad_for_context(want, dim=2, method=method), dim=2, method=method)[:, :, mine]
    err = (got - want).abs().max().item() / max(1.0, want.abs().max().item())
    assert err <= tol, "%s: %s off by %g (tolerance %g), rank %d" % (method, name, err, tol, comm.get_rank())


close("output", out.detach(), ref_out)
for name, part, want in zip("qkv", parts, ref_grads):
    close("d" + name, part.grad, want)

if method == "ulysses" and dtype == "fp32":
    # DeepSpeed's layout [s/p, b, h, d] around a user's attention function over [s, b, h/p, d].
    def local_attention(a, b, c):
        x = [t.permute(1, 2, 0, 3) for t in (a, b, c)]  # -> [b, h, s, d]
        scores = x[0] @ x[1].transpose(-2, -1) / x[0].size(-1) ** 0.5
        if causal:
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        return (scores.softmax(-1) @ x[2]).permute(2, 0, 1, 3)

    attn = sequence.DistributedAttention(local_attention, None)
    sbhd = [sequence.shard(t.permute(2, 0, 1, 3), dim=0, method=method).requires_grad_() for t in padded[:3]]
    out2 = attn(*sbhd)
    out2.backward(sequence.shard(padded[3].permute(2, 0, 1, 3), dim=0))
    keep = mine.nonzero().view(-1)
    want = sequence.shard(sequence.pad_for_context(ref_out, dim=2).permute(2, 0, 1, 3), dim=0)
    assert (out2.detach() - want).abs().index_select(0, keep).max() <= tol, "DistributedAttention output"
    for name, part, g in zip("qkv", sbhd, ref_grads):
        want = sequence.shard(sequence.pad_for_context(g, dim=2).permute(2, 0, 1, 3), dim=0)
        assert (part.grad - want).abs().index_select(0, keep).max() <= tol, "DistributedAttention d" + name
    whole = sequence.unshard(sbhd[0].detach(), dim=0)
    assert torch.equal(whole, padded[0].permute(2, 0, 1, 3)), "unshard is not shard's inverse"

if method == "ring":
    whole = sequence.unshard(parts[0].detach().float(), dim=2, method=method)
    assert torch.equal(whole, padded[0].to(dt).float()), "unshard is not shard's inverse"
    pos = sequence.positions(padded[0].size(2), method=method)
    assert torch.equal(pos, sequence.shard(torch.arange(padded[0].size(2)), dim=0, method=method)), "positions"
if comm.get_rank() == 0:
    print("ok %s causal %d %s %s length %d heads %d" % (method, causal, kernel, dtype, length, heads))
