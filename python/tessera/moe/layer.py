"""Mixture of Experts with DeepSpeed's surface: `tessera.moe.MoE` is `deepspeed.moe.layer.MoE`.

    from tessera.moe.layer import MoE        # was: from deepspeed.moe.layer import MoE
    self.moe = MoE(hidden_size=512, expert=MLP(512), num_experts=8, ep_size=2, k=2)
    ...
    out, l_aux, exp_counts = self.moe(x)       # l_aux: add coef * l_aux to the loss

The router (top-1 Switch, top-2 GShard, general top-k; capacity and token dropping, or dropless)
and the dispatch over the expert-parallel group are C++ (parallel/moe/gating.h, dispatch.h); the
rules are DeepSpeed's, listed in gating.h. Experts are spread over `ep_size` ranks carved out of the
data axis (make_expert_groups: tessera.comm.split_axis("data", [("ep_size_N_data", -1), ("ep_size_N",
N)]), which tessera.initialize calls for each MoE layer of the model): ranks
that hold different experts exchange tokens (the "ep_size_N" group, adjacent data ranks, as
DeepSpeed's); ranks that hold the same experts average their gradients ("ep_size_N_data").
tessera.initialize puts the experts' parameters in param groups of their own on that group, so
DeepSpeed's split_params_into_different_moe_groups_for_optimizer is unnecessary (it still works:
tessera.moe.utils). docs/moe.md.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _C, comm

__all__ = ["MoE", "MOELayer", "TopKGate", "Experts", "expert_group_name", "make_expert_groups"]

_NOISY = (None, "None", "Jitter", "RSample")


def expert_group_name(ep_size):
    """The expert-parallel group of `ep_size` ranks (DeepSpeed's name); the expert-data group is
    this name + "_data"."""
    return "ep_size_%d" % ep_size


def make_expert_groups(ep_size):
    """The data axis split into the expert-data and expert-parallel groups of `ep_size` (every rank
    together; again for the same size is a no-op): data ranks r and r + 1 ... hold different experts
    and exchange tokens, ranks r and r + ep_size hold the same ones and average their gradients."""
    if ep_size > 1:
        name = expert_group_name(ep_size)
        comm.split_axis("data", [(name + "_data", -1), (name, ep_size)])


def _multiplicative_jitter(x, epsilon=1e-2):
    """DeepSpeed's Jitter policy: x times uniform noise in [1 - eps, 1 + eps] (Switch Transformers §2.4)."""
    return x * torch.empty_like(x).uniform_(1.0 - epsilon, 1.0 + epsilon)


class TopKGate(nn.Module):
    """The router: `wg`, a bias-free linear layer in fp32 from the model dimension to the experts,
    and the routing rules (parallel/moe/gating.h). Its forward returns the routing decision."""

    def __init__(self, model_dim, num_experts, k=1, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=4,
                 noisy_gate_policy=None, drop_tokens=True, use_rts=True, top2_2nd_expert_sampling=True,
                 router_z_loss_coef=0.0):
        super().__init__()
        self.wg = nn.Linear(model_dim, num_experts, bias=False).float()
        self.k, self.capacity_factor, self.eval_capacity_factor = k, capacity_factor, eval_capacity_factor
        self.min_capacity, self.noisy_gate_policy = min_capacity, noisy_gate_policy
        self.drop_tokens, self.use_rts, self.top2_2nd_expert_sampling = drop_tokens, use_rts, top2_2nd_expert_sampling
        self.router_z_loss_coef = router_z_loss_coef

    def forward(self, tokens):
        x = tokens.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = _multiplicative_jitter(x)
        logits = F.linear(x, self.wg.weight.float())
        return _C.moe.route(logits, k=self.k,
                            capacity_factor=self.capacity_factor if self.training else self.eval_capacity_factor,
                            min_capacity=self.min_capacity, drop_tokens=self.drop_tokens, use_rts=self.use_rts,
                            second_expert_sampling=self.top2_2nd_expert_sampling,
                            rsample=self.noisy_gate_policy == "RSample", z_loss_coef=self.router_z_loss_coef,
                            training=self.training)


class Experts(nn.Module):
    """This rank's experts: `num_local_experts` copies of `expert` (deep copies, as DeepSpeed makes
    them), their parameters marked as expert parameters (`allreduce = False`, `group_name`)."""

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for e in self.deepspeed_experts:
            for p in e.parameters():
                p.allreduce = False
                p.group_name = expert_group_name

    def forward(self, inputs):
        outputs = []
        for expert, x in zip(self.deepspeed_experts, inputs):
            out = expert(x)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return outputs


class MOELayer(nn.Module):
    """Route, dispatch to the experts over the expert-parallel group, combine."""

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts):
        super().__init__()
        self.gate, self.experts = gate, experts
        self.ep_group_name, self.ep_size, self.num_local_experts = ep_group_name, ep_size, num_local_experts
        self.l_aux = self.exp_counts = None
        self.tokens_dropped = self.tokens_routed = 0  # choices, in the last forward
        self.rows_received = 0  # rows this rank's experts computed on, in the last forward
        self._groups_made = False

    def forward(self, hidden_states, used_token=None):
        if used_token is not None:
            raise NotImplementedError("tessera.moe: used_token is not supported (route every token, or mask the "
                                      "tokens before the layer)")
        d_model = hidden_states.shape[-1]
        tokens = hidden_states.reshape(-1, d_model)
        routing = self.gate(tokens)
        context = None
        if self.ep_size > 1:
            context = comm.parallel_context()
            if not self._groups_made:  # tessera.initialize made them; a script without it gets them here
                make_expert_groups(self.ep_size)
                self._groups_made = True
        dispatch = _C.moe.Dispatch(tokens, routing, context, self.ep_group_name if self.ep_size > 1 else "")
        inputs = dispatch.expert_inputs
        self.rows_received = sum(x.shape[0] for x in inputs)
        outputs = self.experts(inputs)
        combined = dispatch.combine(outputs)
        self.l_aux, self.exp_counts, self.tokens_dropped = routing.l_aux, routing.exp_counts, routing.dropped
        self.tokens_routed = routing.tokens * routing.k
        return combined.reshape(hidden_states.shape[:-1] + combined.shape[-1:])


class MoE(nn.Module):
    """DeepSpeed's MoE layer: forward(hidden_states) -> (output, l_aux, exp_counts).

    hidden_size        the model dimension (the router's input)
    expert             a torch.nn.Module: each of this rank's num_experts / ep_size experts is a
                       deep copy of it
    num_experts        E, over all ranks
    ep_size            ranks the experts are spread over (divides E and the data-parallel size)
    k                  experts per token (1: Switch, 2: GShard, more: top-k)
    capacity_factor    with drop_tokens: an expert keeps ceil(tokens/E * capacity_factor * k) of
                       its tokens (at least min_capacity); eval_capacity_factor in eval mode
    drop_tokens        False: dropless, every token reaches its k experts (no capacity, no padding)
    use_rts            top-1 with dropping: which tokens an expert keeps is random (DeepSpeed's RTS)
    noisy_gate_policy  None, "Jitter" (noise on the router's input) or "RSample" (Gumbel noise on
                       top-1's choice), in training only
    use_residual       Residual MoE (DeepSpeed-MoE §3.3): the output mixes the MoE's and a dense
                       MLP's (`expert` itself) by a learned 2-way softmax coefficient
    top2_2nd_expert_sampling  top-2's second expert drawn with Gumbel noise (DeepSpeed's default)
    router_z_loss_coef >0: ST-MoE's router z-loss, this times mean(logsumexp(logits)^2), in l_aux
    use_tutel, enable_expert_tensor_parallelism: accepted for DeepSpeed's signature; tutel is not
                       used (the dispatch is index-based already) and experts are replicated
                       across tensor-parallel ranks (True is refused)
    """

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False, noisy_gate_policy=None,
                 drop_tokens=True, use_rts=True, use_tutel=False, enable_expert_tensor_parallelism=False,
                 top2_2nd_expert_sampling=True, router_z_loss_coef=0.0):
        super().__init__()
        for name, value in (("num_experts", num_experts), ("ep_size", ep_size), ("k", k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("tessera.moe.MoE: %s must be a positive int, got %r" % (name, value))
        if num_experts % ep_size != 0:
            raise ValueError("tessera.moe.MoE: num_experts (%d) must be divisible by ep_size (%d): each of the ep_size "
                             "ranks holds num_experts / ep_size experts" % (num_experts, ep_size))
        if k > num_experts:
            raise ValueError("tessera.moe.MoE: k (%d) must not exceed num_experts (%d)" % (k, num_experts))
        if noisy_gate_policy not in _NOISY:
            raise ValueError("tessera.moe.MoE: noisy_gate_policy must be None, 'Jitter' or 'RSample', got %r"
                             % (noisy_gate_policy,))
        if enable_expert_tensor_parallelism:
            raise ValueError("tessera.moe.MoE: enable_expert_tensor_parallelism=True is not supported: experts are "
                             "replicated across the tensor-parallel ranks (docs/moe.md)")
        if not isinstance(expert, nn.Module):
            raise TypeError("tessera.moe.MoE: expert must be a torch.nn.Module, got %s" % type(expert).__name__)
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size, self.num_experts, self.num_local_experts = ep_size, num_experts, num_experts // ep_size
        self.expert_group_name = expert_group_name(ep_size)
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor, min_capacity,
                        None if noisy_gate_policy == "None" else noisy_gate_policy, drop_tokens, use_rts,
                        top2_2nd_expert_sampling, router_z_loss_coef)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size, self.num_local_experts)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)

    def expert_parallel_rank(self):
        """This rank's place in its expert-parallel group (after tessera.initialize, or once the
        groups exist): its experts are [rank * num_local_experts, (rank + 1) * num_local_experts)."""
        return comm.parallel_context().group_rank(self.expert_group_name) if self.ep_size > 1 else 0

    def global_expert_index(self, local):
        """The index among all num_experts of this rank's local expert `local` (for initializing
        experts by their global index, or naming them: checkpoints do)."""
        return self.expert_parallel_rank() * self.num_local_experts + local

    def global_parameter_names(self, prefix=""):
        """{id(parameter): name} for this rank's experts' parameters, named by their global expert
        index ("<prefix>deepspeed_moe.experts.deepspeed_experts.<global index>.<name>"): the names
        checkpoints save them under, so each expert is saved once and loads at any ep_size."""
        first = self.global_expert_index(0)
        out = {}
        for i, expert in enumerate(self.deepspeed_moe.experts.deepspeed_experts):
            for name, p in expert.named_parameters():
                out[id(p)] = "%sdeepspeed_moe.experts.deepspeed_experts.%d.%s" % (prefix, first + i, name)
        return out

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """DeepSpeed creates its process groups here; tessera's exist from the constructor on."""

    def forward(self, hidden_states, used_token=None):
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            output_mlp = self.mlp(hidden_states)
            if isinstance(output_mlp, tuple):
                output_mlp = output_mlp[0]
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + output_mlp * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
