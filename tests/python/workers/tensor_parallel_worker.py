"""Tensor-parallel crossings and layers against closed forms, on every rank of a tensor group of
t = world size ranks (tessera launch --nproc-per-node t). Every rank can compute every rank's inputs
(they are functions of the rank), so each expected value is written out directly. Exits non-zero
with the first difference; prints "tensor parallel checks passed" on rank 0.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
import tessera.tensor_parallel as tp

TOL = 1e-6  # relative to the largest expected value, when that is above 1


def close(got, want, what):
    if got.shape != want.shape:
        raise AssertionError("%s: shape %s, expected %s" % (what, tuple(got.shape), tuple(want.shape)))
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    if diff > TOL * max(1.0, want.abs().max().item() if want.numel() else 0.0):  # fp32 sums in another order
        raise AssertionError("%s: differs by %g" % (what, diff))


def value(rank, shape, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(shape, generator=g)


def check_regions(t, r):
    # f: identity forward, gradients summed backward
    x = value(r, (2, 3), 1).requires_grad_()
    y = tp.copy_to_tensor_region(x)
    close(y, x.detach(), "copy_to_tensor_region forward")
    y.backward(value(r, (2, 3), 2))
    close(x.grad, sum(value(k, (2, 3), 2) for k in range(t)), "copy_to_tensor_region backward")

    # g: sum forward, identity backward
    x = value(r, (2, 3), 3).requires_grad_()
    y = tp.reduce_from_tensor_region(x)
    close(y, sum(value(k, (2, 3), 3) for k in range(t)), "reduce_from_tensor_region forward")
    y.backward(value(r, (2, 3), 4))
    close(x.grad, value(r, (2, 3), 4), "reduce_from_tensor_region backward")

    s = 2  # each rank's part of the sequence (dim 1)
    mine = slice(r * s, (r + 1) * s)
    # all-gather along the sequence forward, reduce-scatter backward
    x = value(r, (2, s, 3), 5).requires_grad_()
    y = tp.gather_from_sequence_region(x, 1)
    close(y, torch.cat([value(k, (2, s, 3), 5) for k in range(t)], 1), "gather_from_sequence_region forward")
    y.backward(value(r, (2, t * s, 3), 6))
    close(x.grad, sum(value(k, (2, t * s, 3), 6) for k in range(t))[:, mine], "gather_from_sequence_region backward")

    # reduce-scatter forward, all-gather backward
    x = value(r, (2, t * s, 3), 7).requires_grad_()
    y = tp.reduce_scatter_to_sequence_region(x, 1)
    close(y, sum(value(k, (2, t * s, 3), 7) for k in range(t))[:, mine], "reduce_scatter_to_sequence_region forward")
    y.backward(value(r, (2, s, 3), 8))
    close(x.grad, torch.cat([value(k, (2, s, 3), 8) for k in range(t)], 1), "reduce_scatter_to_sequence_region backward")

    # own slice forward, all-gather backward (the input is the same on every rank)
    x = value(0, (2, t * s, 3), 9).requires_grad_()
    y = tp.scatter_to_sequence_region(x, 1)
    close(y, x.detach()[:, mine], "scatter_to_sequence_region forward")
    y.backward(value(r, (2, s, 3), 10))
    close(x.grad, torch.cat([value(k, (2, s, 3), 10) for k in range(t)], 1), "scatter_to_sequence_region backward")

    # all-gather along the last dim forward, own slice backward
    x = value(r, (2, 3, s), 11).requires_grad_()
    y = tp.gather_from_tensor_region(x, -1)
    close(y, torch.cat([value(k, (2, 3, s), 11) for k in range(t)], -1), "gather_from_tensor_region forward")
    y.backward(value(r, (2, 3, t * s), 12))
    close(x.grad, value(r, (2, 3, t * s), 12)[..., mine], "gather_from_tensor_region backward")

    # an uneven sequence is refused with the sizes
    try:
        tp.reduce_scatter_to_sequence_region(torch.zeros(2, t * s + 1, 3), 1)
    except ValueError as e:
        assert "does not divide evenly" in str(e) and str(t * s + 1) in str(e), e
    else:
        raise AssertionError("an uneven reduce-scatter was accepted")


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.down(F.gelu(self.up(self.norm(x))))


def full_grad(p):
    spec = getattr(p, "_tessera_tensor_parallel", None)
    if spec is None:
        return p.grad
    holder = torch.nn.Parameter(p.grad.clone())  # full_tensor reads the slicing spec from the parameter
    holder._tessera_tensor_parallel = spec
    return tp.full_tensor(holder)


def check_layers(t, r):
    # A column- then row-parallel MLP with a LayerNorm before it, with and without sequence parallelism,
    # against the same MLP whole: output, input gradient and every parameter's (gathered) gradient.
    x_full = value(0, (2, 4 * t, 8), 20)
    w_out = value(0, (2, 4 * t, 8), 21)
    ref = Mlp()
    xr = x_full.clone().requires_grad_()
    (ref(xr) * w_out).sum().backward()
    for sp in (False, True):
        model = Mlp()
        plan = {"up": "colwise", "down": "rowwise", "norm": "sequence", "": ["scatter_input", "gather_output"]}
        tp.parallelize(model, plan, sequence_parallel=sp)
        assert model.up.weight.shape == (16 // t, 8) and model.down.weight.shape == (8, 16 // t)
        xp = x_full.clone().requires_grad_()
        y = model(xp)
        close(y, ref(x_full), "MLP forward (sequence_parallel=%s)" % sp)
        (y * w_out).sum().backward()
        close(xp.grad, xr.grad, "MLP input gradient (sequence_parallel=%s)" % sp)
        for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
            close(full_grad(p), q.grad, "MLP %s gradient (sequence_parallel=%s)" % (name, sp))
            close(tp.full_tensor(p), q.detach(), "MLP %s value (sequence_parallel=%s)" % (name, sp))

    # A fused q|k|v projection: each of the three blocks split, reassembled by full_tensor.
    torch.manual_seed(4)
    fused = nn.Linear(4, 3 * 2 * t)
    whole = fused.weight.detach().clone()
    tp.parallelize(nn.ModuleDict({"qkv": fused}), {"qkv": tp.Colwise(fused=3)})
    close(fused.weight.detach(), torch.cat([b.chunk(t)[r] for b in whole.chunk(3)]), "fused colwise slice")
    close(tp.full_tensor(fused.weight), whole, "fused colwise full_tensor")

    # A vocabulary-parallel embedding with a tied head and the vocab-parallel cross-entropy, against
    # nn.Embedding, F.linear and F.cross_entropy whole (some targets ignored).
    vocab = 6 * t
    torch.manual_seed(5)
    emb_ref = nn.Embedding(vocab, 8)
    torch.manual_seed(5)
    emb = tessera.nn.VocabParallelEmbedding(vocab, 8)
    close(emb.weight.detach(), emb_ref.weight.detach()[r * 6:(r + 1) * 6], "VocabParallelEmbedding initial slice")
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, vocab, (3, 2 * t), generator=g)
    targets = torch.randint(0, vocab, (3, 2 * t), generator=g)
    targets[0, 0] = -100
    loss_ref = F.cross_entropy(F.linear(emb_ref(ids) * 1.7, emb_ref.weight).reshape(-1, vocab), targets.reshape(-1))
    loss_ref.backward()
    logits = F.linear(tp.copy_to_tensor_region(emb(ids) * 1.7), emb.weight)  # [3, 2t, vocab/t]
    loss = tessera.nn.vocab_parallel_cross_entropy(logits, targets)
    close(loss, loss_ref.detach(), "vocab-parallel cross-entropy")
    loss.backward()
    close(full_grad(emb.weight), emb_ref.weight.grad, "vocab-parallel embedding + head gradient")

    # with sequence parallelism the embedding's output is reduce-scattered along the sequence
    torch.manual_seed(5)
    emb_sp = tessera.nn.VocabParallelEmbedding(vocab, 8, sequence_parallel=True)
    close(emb_sp(ids), emb_ref(ids).detach()[:, r * 2:(r + 1) * 2], "sequence-parallel embedding forward")

    # A Hugging Face-style tied head (lm_head.weight is wte.weight) through a plan: "vocab" on the
    # embedding and Colwise(gather_output=True) on the head cut the one weight once; the model's own
    # F.cross_entropy sees whole logits. Loss and the tied weight's gradient against the model whole.
    class TiedLm(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(7)
            self.wte = nn.Embedding(vocab, 8)
            self.norm = nn.LayerNorm(8)
            self.lm_head = nn.Linear(8, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, ids, targets):
            logits = self.lm_head(self.norm(self.wte(ids)))
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    lm_ref, lm = TiedLm(), TiedLm()
    lm_ref(ids, targets).backward()
    tp.parallelize(lm, {"wte": "vocab", "lm_head": tp.Colwise(gather_output=True)})
    assert lm.lm_head.weight is lm.wte.weight and lm.wte.weight.shape == (6, 8)
    loss = lm(ids, targets)
    close(loss, lm_ref(ids, targets).detach(), "tied vocab/colwise head: loss")
    loss.backward()
    close(full_grad(lm.wte.weight), lm_ref.wte.weight.grad, "tied vocab/colwise head: gradient")
    close(full_grad(lm.norm.weight), lm_ref.norm.weight.grad, "tied vocab/colwise head: norm gradient")
    try:
        tp.parallelize(TiedLm(), {"wte": "vocab", "lm_head": "rowwise"})
    except ValueError as e:
        assert "lm_head.weight is tied" in str(e) and "dimension 0" in str(e), e
    else:
        raise AssertionError("a tied weight cut two ways was accepted")

    # bad input: sizes that do not divide name the layer and the sizes
    try:
        tp.parallelize(nn.ModuleDict({"odd": nn.Linear(4, 2 * t + 1)}), {"odd": "colwise"})
    except ValueError as e:
        assert "odd.weight" in str(e) and str(2 * t + 1) in str(e) and "tp_size" in str(e), e
    else:
        raise AssertionError("an uneven column split was accepted")

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_head = t + 1
            self.c_attn = nn.Linear(4, 3 * 4 * t)

    try:
        tp.parallelize(nn.ModuleDict({"attn": Attention()}), {"attn.c_attn": tp.Colwise(fused=3)})
    except ValueError as e:
        assert "attn.n_head = %d" % (t + 1) in str(e), e
    else:
        raise AssertionError("heads that do not divide were accepted")


def main():
    t = tessera.comm.get_world_size()
    tessera.comm.init_distributed(backend="gloo", tensor_parallel=t)
    r = tessera.comm.get_rank()
    check_regions(t, r)
    check_layers(t, r)
    if r == 0:
        print("tensor parallel checks passed")
    sys.stdout.flush()
    tessera.comm.barrier()  # leave together, without the interpreter's teardown (activation_memory_worker.py)
    os._exit(0)


if __name__ == "__main__":
    main()  # main ends the process itself, after a barrier
