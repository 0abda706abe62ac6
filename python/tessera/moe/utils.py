"""DeepSpeed's MoE parameter helpers (deepspeed.moe.utils), for scripts written against them.

tessera.initialize splits expert parameters into groups of their own by itself, so none of this is
needed; a script that builds its optimizer's param groups with
split_params_into_different_moe_groups_for_optimizer (as DeepSpeed requires) runs unchanged: a
group with "moe": True is reduced over its experts' expert-data group."""
import torch

__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer",
           "split_params_grads_into_shared_and_expert_params", "ep_size_of"]


def is_moe_param(param):
    """Whether `param` belongs to an expert (tessera.moe.Experts marks them `allreduce = False`)."""
    return hasattr(param, "allreduce") and not param.allreduce


def ep_size_of(param):
    """The ep_size of the MoE layer whose expert `param` is (from its group_name, "ep_size_N")."""
    name = getattr(param, "group_name", None)
    if not isinstance(name, str) or not name.startswith("ep_size_"):
        raise ValueError("tessera.moe: an expert parameter without an ep_size_N group_name (%r)" % (name,))
    return int(name[len("ep_size_"):])


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=None):
    """Each param group's expert parameters moved into groups of their own, one per expert group
    name, with "moe": True and "name" the expert group's ("ep_size_N"); the other settings of the
    group they came from are kept. Takes a dict, or a list or tuple of dicts (torch.optim's
    param_groups); returns a list. max_group_size is accepted for DeepSpeed's signature (tessera
    buckets its flat buffers by itself)."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, (list, tuple)):
        raise TypeError("split_params_into_different_moe_groups_for_optimizer: expected a dict or a list of dicts, "
                        "got %s" % type(param_groups).__name__)
    dense, experts = [], []
    for group in param_groups:
        params = list(group["params"]) if not isinstance(group["params"], torch.Tensor) else [group["params"]]
        by_name = {}
        for p in params:
            if is_moe_param(p):
                by_name.setdefault(p.group_name, []).append(p)
        kept = dict(group, params=[p for p in params if not is_moe_param(p)])
        kept.setdefault("moe", False)
        dense.append(kept)
        for name, ps in by_name.items():
            experts.append(dict(group, params=ps, name=name, moe=True))
    return dense + experts


def split_params_grads_into_shared_and_expert_params(group):
    """([shared gradients], [expert gradients]) of the parameters in `group` that have one."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert
