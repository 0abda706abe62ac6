"""The examples' models as plain torch.nn.Modules, the same as the C++ ones (examples/models/).

Gpt: a byte-level GPT-2-style decoder (vocab 256, block 128, 4 layers, 4 heads, 128 dims,
pre-LayerNorm, causal SDPA, GELU-tanh MLP, LM head tied to the token embedding; 842,496
parameters). The parameters are registered in the C++ order and initialized with the same draws
(one torch.Generator: N(0, 0.02) for every weight of dim >= 2, N(0, 0.02/sqrt(2 n_layer)) for the
residual projections, ones for LayerNorm weights, zeros for biases), so the initial parameters are
bit-identical to examples/models/gpt.cpp's.

Cnn: conv 3x3 1->32, ReLU, max-pool 2; conv 3x3 32->64, ReLU, max-pool 2; linear 3136->128, ReLU;
linear 128->10 (421,642 parameters), He initialization, output layer N(0, 0.01).

Nothing here knows about tessera: activations follow the parameters' dtype, which the engine sets
(bf16 under "bf16": {"enabled": true}); losses are computed in fp32.
"""
import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        # Sizes come from the projection's output, not from the config, so the same code runs with
        # the heads split over tensor-parallel ranks (and the sequence gathered by c_attn).
        qkv = self.c_attn(x)
        B, T = qkv.shape[:2]
        q, k, v = qkv.chunk(3, dim=2)
        heads = lambda t: t.view(B, T, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, block_size=128, n_layer=4, n_head=4, n_embd=128, seed=1234, device="cpu",
                 gathered=None):
        """device: where the parameters are made and drawn (a GPU draws other numbers than the CPU
        from the same seed, so only the CPU matches the C++ model). gathered: for a model built
        partitioned (tessera.zero.Init, deepspeed.zero.Init), a function of one parameter giving the
        context in which it may be written, e.g. lambda p: tessera.zero.GatheredParameters(p, modifier_rank=0)."""
        super().__init__()
        self.block_size = block_size
        with torch.device(device):
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                h=nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer)),
                ln_f=nn.LayerNorm(n_embd, eps=1e-5),
            ))
        gen = torch.Generator(device=device).manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2.0 * n_layer)
        whole = gathered or (lambda p: contextlib.nullcontext())
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = residual_std if name.endswith("c_proj.weight") else 0.02
                    values = torch.normal(0.0, std, tuple(p.shape), generator=gen, device=gen.device)
                    with whole(p):
                        p.copy_(values)
                else:
                    with whole(p):
                        p.fill_(1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0)

    def forward(self, idx, targets=None, pos=None, loss_fn=None):
        """Logits [B, T, vocab], or the mean cross-entropy (fp32) when targets are given. pos: the
        tokens' positions (default 0..T-1; under context parallelism each rank's part of the
        sequence has the global ones: tessera.sequence.positions). loss_fn(logits, targets): the
        loss instead of F.cross_entropy's mean (tessera.sequence.cross_entropy: the mean over the
        whole sequence's tokens)."""
        t = self.transformer
        if pos is None:
            pos = torch.arange(idx.size(1), device=idx.device)
        x = t.wte(idx) + t.wpe(pos)
        for block in t.h:
            x = block(x)
        logits = F.linear(t.ln_f(x), t.wte.weight)  # tied LM head
        if targets is None:
            return logits
        if loss_fn is not None:
            return loss_fn(logits, targets)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))

    def param_groups(self, weight_decay):
        """nanoGPT's groups: weight decay on every parameter of dim >= 2, none on biases and LayerNorm."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
                {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


class Cnn(nn.Module):
    def __init__(self, seed=1234):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer, fan_in in ((self.conv1, 9), (self.conv2, 9 * 32), (self.fc1, 64 * 7 * 7)):
                layer.weight.copy_(torch.normal(0.0, math.sqrt(2.0 / fan_in), tuple(layer.weight.shape), generator=gen))
                layer.bias.zero_()
            self.fc2.weight.copy_(torch.normal(0.0, 0.01, tuple(self.fc2.weight.shape), generator=gen))
            self.fc2.bias.zero_()

    def forward(self, images):
        x = images.to(self.conv1.weight.dtype)  # the engine may have made the parameters bf16
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)

    def param_groups(self, weight_decay):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
                {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
