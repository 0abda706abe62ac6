"""Mixture of Experts with expert parallelism (docs/moe.md): `tessera.moe.MoE` has DeepSpeed's
surface (deepspeed.moe.layer.MoE); the routing and dispatch are C++ (parallel/moe/)."""
from .layer import MoE, MOELayer, TopKGate, Experts, expert_group_name
from .utils import is_moe_param, split_params_into_different_moe_groups_for_optimizer

__all__ = ["MoE", "MOELayer", "TopKGate", "Experts", "expert_group_name", "is_moe_param",
           "split_params_into_different_moe_groups_for_optimizer"]
