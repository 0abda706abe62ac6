"""tessera.moe.MoE on one rank (ep_size 1) against a plain PyTorch MoE written here with the same
gating rules (parallel/moe/gating.h): outputs, l_aux, exp_counts and the gradients of the input,
the router and every expert, for top-1, top-2 and top-3, dropless and with dropping; the tokens
dropped per expert against the capacity formula (with random token selection too); the errors a
bad layer gets."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from tessera.moe import MoE, split_params_into_different_moe_groups_for_optimizer, is_moe_param

HIDDEN, EXPERTS = 6, 4


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 10), nn.Linear(10, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def layer(k, drop_tokens, capacity_factor=1.0, min_capacity=0, use_rts=False, experts=EXPERTS, **kw):
    torch.manual_seed(0)
    moe = MoE(HIDDEN, Expert(), num_experts=experts, k=k, capacity_factor=capacity_factor, min_capacity=min_capacity,
              drop_tokens=drop_tokens, use_rts=use_rts, top2_2nd_expert_sampling=False, **kw)
    for i, e in enumerate(moe.deepspeed_moe.experts.deepspeed_experts):  # distinct experts
        torch.manual_seed(10 + i)
        for p in e.parameters():
            nn.init.normal_(p, std=0.5)
    return moe


def reference(moe, x, k, drop_tokens, capacity_factor, min_capacity):
    """The same MoE by explicit loops: each token's k choices, queued first choices before second
    ones in token order, kept while the expert has room."""
    tokens = x.reshape(-1, HIDDEN)
    logits = tokens.float() @ moe.deepspeed_moe.gate.wg.weight.t()
    probs = logits.softmax(1)
    T, E = probs.shape
    if k == 1:
        choices = probs.argmax(1, keepdim=True)
    elif k == 2:
        first = probs.argmax(1, keepdim=True)
        other = logits.detach().clone().scatter(1, first, float("-inf"))
        choices = torch.cat([first, other.argmax(1, keepdim=True)], 1)
    else:
        choices = probs.topk(k, 1).indices
    capacity = max(min_capacity, math.ceil(T / E * capacity_factor * k)) if drop_tokens else T * k
    queued = [0] * E
    kept = torch.zeros(T, k, dtype=torch.bool)
    for j in range(k):
        for t in range(T):
            e = int(choices[t, j])
            kept[t, j] = queued[e] < capacity
            queued[e] += 1
    w = probs.gather(1, choices) * kept
    if k > 1:
        w = w / w.sum(1, keepdim=True).clamp_min(torch.finfo(torch.float32).eps)
    experts = moe.deepspeed_moe.experts.deepspeed_experts
    rows = []
    for t in range(T):
        out = torch.zeros(HIDDEN)
        for j in range(k):
            if kept[t, j]:
                out = out + w[t, j] * experts[int(choices[t, j])](tokens[t:t + 1])[0]
        rows.append(out)
    y = torch.stack(rows).reshape(x.shape)
    hot = F.one_hot(choices, E)
    fraction = (hot[:, 0] if k <= 2 else hot.sum(1)).float().mean(0)
    l_aux = (probs.mean(0) * fraction).sum() * (E if k <= 2 else E / k)
    return y, l_aux, torch.tensor(queued), int((~kept).sum())


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("drop_tokens", [False, True])
def test_the_layer_equals_a_plain_pytorch_moe(k, drop_tokens):
    cf = 0.75 if drop_tokens else 1.0  # with dropping, some tokens are dropped
    moe = layer(k, drop_tokens, capacity_factor=cf)
    ref = layer(k, drop_tokens, capacity_factor=cf)
    torch.manual_seed(1)
    x = torch.randn(3, 8, HIDDEN)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, l_aux, counts = moe(xa)
    want_y, want_l_aux, want_counts, want_dropped = reference(ref, xb, k, drop_tokens, cf, 0)
    assert torch.allclose(y, want_y, atol=1e-5, rtol=1e-5)
    assert torch.allclose(l_aux, want_l_aux, atol=1e-6)
    assert counts.tolist() == want_counts.tolist() and counts.device.type == "cpu"
    assert moe.deepspeed_moe.tokens_dropped == want_dropped
    if drop_tokens:
        assert want_dropped > 0
    else:
        assert want_dropped == 0
    # A loss that reads every output and l_aux: gradients of the input, the router and the experts.
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    ((y * weight).sum() + 0.1 * l_aux).backward()
    ((want_y * weight).sum() + 0.1 * want_l_aux).backward()
    assert torch.allclose(xa.grad, xb.grad, atol=1e-5, rtol=1e-4)
    for (n, p), q in zip(moe.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if p.grad is not None:
            assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize("use_rts", [False, True])
def test_tokens_dropped_per_expert_follow_the_capacity_formula(use_rts):
    for k, cf, min_capacity in ((1, 1.0, 2), (1, 0.5, 0), (2, 1.0, 4), (2, 0.25, 1)):
        moe = layer(k, True, capacity_factor=cf, min_capacity=min_capacity, use_rts=use_rts, experts=3)
        torch.manual_seed(3)
        x = torch.randn(40, HIDDEN) * 3
        routing = moe.deepspeed_moe.gate(x)
        capacity = max(min_capacity, math.ceil(40 / 3 * cf * k))
        assert routing.capacity == capacity
        counts = routing.exp_counts
        kept = torch.zeros(3, dtype=torch.long)
        for e in range(3):
            kept[e] = int(((routing.expert == e) & routing.kept).sum())
        assert kept.tolist() == [min(int(c), capacity) for c in counts]
        assert routing.dropped == sum(max(0, int(c) - capacity) for c in counts)
        # a kept choice's slot is below the capacity and unique within its expert
        for e in range(3):
            slots = routing.slot[(routing.expert == e) & routing.kept].tolist()
            assert sorted(slots) == list(range(len(slots)))


@pytest.mark.parametrize("k,use_rts,cf", [(1, True, 0.75), (1, False, 0.75), (2, False, 1.0)])
def test_an_expert_computes_on_its_kept_rows_only_not_padded_to_the_capacity(k, use_rts, cf):
    """parallel/moe/dispatch.h: no padding rows reach an expert (an expert that got fewer choices
    than its capacity computes on those), and the output still equals the reference's."""
    moe = layer(k, True, capacity_factor=cf, min_capacity=0, use_rts=use_rts)
    rows = []
    for expert in moe.deepspeed_moe.experts.deepspeed_experts:
        expert.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    torch.manual_seed(5)
    x = torch.randn(24, HIDDEN) * 3
    torch.manual_seed(7)  # the same random token selection for the routing seen here and the layer's
    routing = moe.deepspeed_moe.gate(x)
    torch.manual_seed(7)
    y, _, _ = moe(x)
    capacity = routing.capacity
    assert rows == [min(int(c), capacity) for c in routing.exp_counts]
    assert sum(rows) == 24 * k - routing.dropped
    assert 0 < routing.dropped and any(r < capacity for r in rows)  # both cases occur
    if not use_rts:
        ref = reference(moe, x, k, True, cf, 0)
        assert torch.allclose(y, ref[0], atol=1e-5, rtol=1e-4)


def test_bf16_tokens_route_and_combine():
    moe = layer(2, True).to(torch.bfloat16)
    x = torch.randn(16, HIDDEN, dtype=torch.bfloat16)
    y, l_aux, _ = moe(x)
    assert y.dtype == torch.bfloat16 and l_aux.dtype == torch.float32
    ref = layer(2, True)
    with torch.no_grad():
        for p, q in zip(ref.parameters(), moe.parameters()):
            p.copy_(q.float())
    want, _, _ = ref(x.float())
    assert torch.allclose(y.float(), want, atol=0.1, rtol=0.05)


def test_residual_moe_mixes_the_dense_mlp_by_a_learned_coefficient():
    moe = layer(1, False, use_residual=True)
    x = torch.randn(5, HIDDEN)
    y, _, _ = moe(x)
    plain = moe.deepspeed_moe(x)
    coef = F.softmax(moe.coefficient(x), dim=-1)
    assert torch.allclose(y, plain * coef[:, :1] + moe.mlp(x) * coef[:, 1:], atol=1e-6)


def test_z_loss_adds_to_l_aux():
    a = layer(1, False)
    b = layer(1, False, router_z_loss_coef=0.01)
    x = torch.randn(12, HIDDEN)
    _, la, _ = a(x)
    _, lb, _ = b(x)
    logits = x @ a.deepspeed_moe.gate.wg.weight.t()
    assert torch.allclose(lb - la, 0.01 * logits.logsumexp(1).pow(2).mean(), atol=1e-6)


def test_noisy_policies_run_in_training_only():
    for policy in ("Jitter", "RSample"):
        moe = layer(1, False, noisy_gate_policy=policy)
        x = torch.randn(32, HIDDEN)
        moe.eval()
        a, _, _ = moe(x)
        b, _, _ = moe(x)
        assert torch.equal(a, b)
        moe.train()
        moe(x)[0].sum().backward()


def test_expert_parameters_are_marked_and_the_deepspeed_helper_splits_them():
    moe = layer(1, False)
    experts = [p for p in moe.parameters() if is_moe_param(p)]
    assert len(experts) == 4 * EXPERTS and all(p.group_name == "ep_size_1" for p in experts)
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(moe.parameters()), "lr": 0.1,
                                                                   "name": "all"})
    assert [g["name"] for g in groups] == ["all", "ep_size_1"] and groups[1]["moe"] and groups[1]["lr"] == 0.1
    assert len(groups[0]["params"]) == 1 and len(groups[1]["params"]) == len(experts)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_experts=3, ep_size=2), r"num_experts \(3\) must be divisible by ep_size \(2\)"),
    (dict(num_experts=2, k=3), r"k \(3\) must not exceed num_experts \(2\)"),
    (dict(num_experts=2, noisy_gate_policy="Gumbel"), r"noisy_gate_policy must be None, 'Jitter' or 'RSample'"),
    (dict(num_experts=0), r"num_experts must be a positive int"),
])
def test_bad_layers_are_refused_naming_the_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoE(HIDDEN, Expert(), **kwargs)


def test_an_ep_size_that_does_not_divide_the_data_parallel_size_is_refused():
    moe = MoE(HIDDEN, Expert(), num_experts=2, ep_size=2)
    with pytest.raises(ValueError, match=r"ep_size 2, which does not divide the data-parallel size 1"):
        tessera.initialize(model=moe, config={"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD"}})


def test_the_progress_line_and_the_monitor_show_the_auxiliary_loss_and_the_share_dropped(tmp_path, capfd):
    import json

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = layer(1, True, capacity_factor=0.5)

        def forward(self, x):
            y, l_aux, _ = self.moe(x)
            return y.pow(2).mean() + 0.01 * l_aux

    net = Net()
    engine, _, _, _ = tessera.initialize(model=net, config={
        "train_micro_batch_size_per_gpu": 16, "steps_per_print": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "moe"}})
    dropped = []
    for step in range(2):
        engine.backward(engine(torch.randn(16, HIDDEN, generator=torch.Generator().manual_seed(step))))
        engine.step()
        dropped.append(net.moe.deepspeed_moe.tokens_dropped / net.moe.deepspeed_moe.tokens_routed)
    engine.close()
    out = capfd.readouterr().out
    line = [l for l in out.splitlines() if l.startswith("step 2 |")][0]
    assert "| moe aux " in line and "| dropped %.2f%%" % (100 * sum(dropped) / 2) in line, line
    records = [json.loads(l) for l in open(tmp_path / "moe" / "metrics.jsonl")]
    assert abs(records[-1]["moe_dropped_fraction"] - dropped[-1]) < 1e-9 and records[-1]["moe_aux_loss"] > 0



def test_the_automatic_tensor_parallel_plan_leaves_the_experts_whole():
    """AutoTP picks the blocks (not the experts' ModuleList, even when it is longer) and splits the
    dense MLP's layers, never an expert's: experts are replicated over the tensor group."""
    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.ln_1 = nn.LayerNorm(HIDDEN)
            self.c_fc, self.c_proj = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)
            self.moe = MoE(HIDDEN, Expert(), num_experts=8) if moe else None

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.h = nn.ModuleList([Block(True), Block(False)])
            self.ln_f = nn.LayerNorm(HIDDEN)

    plan = tessera.tensor_parallel.auto_plan(Net())
    assert plan["h.*.c_fc"] == "colwise" and plan["h.*.c_proj"] == "rowwise", plan
    assert not any("experts" in k for k in plan), plan
