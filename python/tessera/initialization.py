"""tessera.initialize(): DeepSpeed's entry point. Checks the arguments (model, config, param groups,
units, a client optimizer and scheduler, training data), resolves the config for the world size,
joins the process groups and builds the Engine (tessera/engine.py) that trains the model."""
import collections.abc
import difflib
import json
import os
import sys

import torch

from . import _C, checkpointing, client, comm, sequence, tensor_parallel
from .moe import layer as moe_layer, utils as moe_utils
from ._config import config_dict as _config_dict, config_text as _config_text, type_name as _type_name
from .client_optimizer import ShardOptimizer
from .engine import Engine

__all__ = ["initialize"]

_GROUP_KEYS = {"params", "lr", "weight_decay", "name", "communicator", "moe"}


def _tensor_list(params, where):
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, (str, bytes, collections.abc.Mapping)) or not isinstance(params, collections.abc.Iterable):
        raise TypeError("tessera.initialize: %s must be an iterable of torch.Tensor, got %s" % (where, _type_name(params)))
    out = []
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            raise TypeError("tessera.initialize: %s[%d] must be a torch.Tensor, got %s" % (where, i, _type_name(p)))
        out.append(p)
    return out


def _number(value, where):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("tessera.initialize: %s must be a number, got %s" % (where, _type_name(value)))
    return float(value)


def _param_groups(model, model_parameters):
    """[(params, lr, weight_decay, name, communicator, moe)] from None (every trainable parameter of the
    model), an iterable of tensors (one group) or an iterable of dicts with "params" and optionally
    "lr", "weight_decay", "name" (torch.optim's param groups) and "communicator": the group its
    gradients are averaged over and its shards partitioned over ("" or "data": the data group; a
    factor tessera.comm.split_axis named, such as "expert_data"); "moe": True marks a group of
    expert parameters (DeepSpeed's split_params_into_different_moe_groups_for_optimizer)."""
    if model_parameters is None:
        return [([p for p in model.parameters() if p.requires_grad], None, None, "all", "", False)]
    if isinstance(model_parameters, (torch.Tensor, str, bytes, collections.abc.Mapping)) or \
            not isinstance(model_parameters, collections.abc.Iterable):
        raise TypeError("tessera.initialize: model_parameters must be None, an iterable of tensors or an iterable of "
                        "param-group dicts, got %s" % _type_name(model_parameters))
    items = list(model_parameters)
    if all(isinstance(x, collections.abc.Mapping) for x in items) and items:
        groups = []
        for i, g in enumerate(items):
            unknown = sorted(set(g) - _GROUP_KEYS)
            if unknown:
                raise ValueError("tessera.initialize: model_parameters[%d] has key(s) %s; a param group may set only "
                                 "params, lr, weight_decay, name, communicator and moe (the other optimizer settings come "
                                 "from the config)"
                                 % (i, ", ".join(repr(k) for k in unknown)))
            if "params" not in g:
                raise ValueError("tessera.initialize: model_parameters[%d] has no 'params'" % i)
            name = g.get("name", "group%d" % i)
            if not isinstance(name, str):
                raise TypeError("tessera.initialize: model_parameters[%d]['name'] must be a str, got %s" % (i, _type_name(name)))
            communicator = g.get("communicator", "")
            if not isinstance(communicator, str):
                raise TypeError("tessera.initialize: model_parameters[%d]['communicator'] must be a str (a group name "
                                "such as 'data' or a factor tessera.comm.split_axis named), got %s"
                                % (i, _type_name(communicator)))
            groups.append((_tensor_list(g["params"], "model_parameters[%d]['params']" % i),
                           _number(g.get("lr"), "model_parameters[%d]['lr']" % i),
                           _number(g.get("weight_decay"), "model_parameters[%d]['weight_decay']" % i), name,
                           communicator, bool(g.get("moe", False))))
        return groups
    if any(isinstance(x, collections.abc.Mapping) for x in items):
        raise TypeError("tessera.initialize: model_parameters mixes tensors and param-group dicts")
    return [(_tensor_list(items, "model_parameters"), None, None, "all", "", False)]


def _expert_communicator(ep_size):
    return "" if ep_size == 1 else moe_layer.expert_group_name(ep_size) + "_data"


def _with_expert_groups(groups, from_client):
    """[(params, lr, weight_decay, name, communicator, gradient_scale)]: the experts' parameters
    (tessera.moe) in groups of their own, reduced over their expert-data group and scaled by
    1/ep_size (zero/model.h, ParamGroup::gradient_scale). A group marked "moe" (or holding only
    experts) becomes one such group; another that mixes experts into dense parameters is split in
    two, unless its groups are a client optimizer's, which map one to one to the engine's."""
    out = []
    for params, lr, weight_decay, name, communicator, moe in groups:
        experts = [p for p in params if moe_utils.is_moe_param(p)]
        if moe and len(experts) != len(params):
            raise ValueError("tessera.initialize: param group %r is marked moe but %d of its %d parameters are not "
                             "experts' (tessera.moe.split_params_into_different_moe_groups_for_optimizer makes such "
                             "groups)" % (name, len(params) - len(experts), len(params)))
        if not experts:
            out.append((params, lr, weight_decay, name, communicator, 1.0))
            continue
        sizes = sorted({moe_utils.ep_size_of(p) for p in experts})
        if len(experts) == len(params) and len(sizes) == 1:
            out.append((params, lr, weight_decay, name, communicator or _expert_communicator(sizes[0]), 1.0 / sizes[0]))
            continue
        if from_client:
            raise ValueError("tessera.initialize: the optimizer's param group %r mixes expert parameters (tessera.moe) "
                             "with others; build its param groups with tessera.moe."
                             "split_params_into_different_moe_groups_for_optimizer, as DeepSpeed requires, or give "
                             "the optimizer in the config" % name)
        dense = [p for p in params if not moe_utils.is_moe_param(p)]
        if dense:
            out.append((dense, lr, weight_decay, name, communicator, 1.0))
        for ep in sizes:
            out.append(([p for p in experts if moe_utils.ep_size_of(p) == ep], lr, weight_decay,
                        "%s.%s" % (name, moe_layer.expert_group_name(ep)), _expert_communicator(ep), 1.0 / ep))
    return out


def _moe_layers(model, world_size, tensor, pipe):
    """The model's MoE layers [(name, layer)], each ep_size checked to divide the data-parallel size."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, moe_layer.MoE)]
    data = world_size // (tensor * pipe)
    for n, m in layers:
        if data % m.ep_size != 0:
            raise ValueError("tessera.initialize: the MoE layer %r has ep_size %d, which does not divide the "
                             "data-parallel size %d (world %d / tensor %d / pipe %d)"
                             % (n, m.ep_size, data, world_size, tensor, pipe))
    return layers


def _make_expert_groups(layers, context):
    """Every rank has the same MoE layers with the same sizes (their all-to-alls would otherwise hang
    or mix tensors of other shapes); then each ep_size's groups are made."""
    if context.world_size > 1:
        _check_same_moe_layers(layers, context.device)
    for _, m in layers:
        moe_layer.make_expert_groups(m.ep_size)


def _backend_and_device(params):
    """Gloo for a model on the CPU, else the default; and the model's device when it has one, so that
    under Gloo (init_distributed(dist_backend="gloo")) a CUDA model's collectives are staged through
    host memory (NCCL checks it is this rank's GPU)."""
    devices = {p.device for p in params}
    backend = "gloo" if {d.type for d in devices} <= {"cpu"} else "auto"
    return backend, (next(iter(devices)) if len(devices) == 1 else None)


def _check_same_moe_layers(layers, device):
    """Every rank's (count, then ep_size and num_experts of each layer), compared by its max and its
    min over the world: one max of [x, -x] (on the collectives' device: NCCL takes CUDA tensors
    only), after one max of the lengths."""
    mine = torch.tensor([len(layers)] + [v for _, m in layers for v in (m.ep_size, m.num_experts)],
                        dtype=torch.float64)
    most = torch.tensor([float(mine.numel())], dtype=torch.float64, device=device)
    comm.all_reduce(most, op="max")
    padded = torch.full((int(most.item()),), -1.0, dtype=torch.float64)
    padded[:mine.numel()] = mine
    both = torch.cat([padded, -padded]).to(device)
    comm.all_reduce(both, op="max")
    high, low = both.cpu().chunk(2)
    low = -low
    if not torch.equal(low, high):
        raise ValueError("tessera.initialize: the ranks' MoE layers differ (count, then ep_size and num_experts of "
                         "each): this rank has %s; lowest over the ranks %s, highest %s"
                         % (mine.long().tolist(), low.long().tolist(), high.long().tolist()))


def _default_unit_modules(model):
    """The model's units, in registration order (usually forward order): each top-level child that
    has parameters, where a container (ModuleList, Sequential, ModuleDict) is not a unit itself but
    stands for its entries, recursively (the repeated blocks of a transformer, GPT-2's
    `transformer.h.3`). Names as in named_modules()."""
    units = []

    def visit(prefix, module):
        for name, child in module.named_children():
            if not any(True for _ in child.parameters()):
                continue
            if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)):
                visit(prefix + name + ".", child)
            else:
                units.append((prefix + name, child))

    visit("", model)
    return units


def _units(model, unit_names, trainable):
    """[(name, module)] for the unit modules, and the C++ engine's [(name, [params])]. Parameters
    of the model that no unit covers (the root's own) form one more unit, named "<root>"."""
    if unit_names is None:
        modules = _default_unit_modules(model)
    else:
        if isinstance(unit_names, str) or not isinstance(unit_names, collections.abc.Iterable):
            raise TypeError("tessera.initialize: units must be a list of module names, got %s" % _type_name(unit_names))
        named = dict(model.named_modules())
        modules = []
        for n in unit_names:
            if not isinstance(n, str):
                raise TypeError("tessera.initialize: units must be module names (str), got %s" % _type_name(n))
            if n not in named:
                close = difflib.get_close_matches(n, [k for k in named if k], n=1)
                raise ValueError("tessera.initialize: units: %r is not a module of the model%s"
                                 % (n, " (did you mean %r?)" % close[0] if close else ""))
            modules.append((n, named[n]))
    spec, covered = [], set()
    for name, module in modules:
        params = [p for p in module.parameters() if id(p) in trainable]
        covered.update(id(p) for p in params)
        spec.append((name, params))
    rest = [p for p in trainable.values() if id(p) not in covered]
    if rest:
        spec.append(("<root>", rest))
    return modules, spec


def resolve_auto_layout(config, world_size, plan=None):
    """The config (a path, JSON text or a dict) with its "auto" layout keys chosen by the planner for
    `world_size` ranks (engine/planner/auto_layout.h), as JSON text; rank 0 prints the one line
    that says what was chosen and why. A config without them comes back as it was (as text)."""
    text = _config_text(config)
    resolved, line = _C.resolve_auto_layout(text, world_size, json.dumps(plan or {}))
    if line and comm.get_rank() == 0:
        print(line, flush=True)
    return resolved


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               config_params=None, units=None, plan=None):
    """Builds the engine that trains `model` as `config` says; returns the Engine.

    model:            a torch.nn.Module. Its parameters become views into the engine's flat buffers
                      (the same nn.Parameter objects; in bf16/fp16 when the config asks for it).
    config:           a path to a DeepSpeed-style JSON config, the JSON text, or a dict.
                      (`config_params`, and `args.deepspeed_config`, are accepted as in DeepSpeed.)
    model_parameters: None (every parameter of the model that requires grad), an iterable of
                      tensors, or param-group dicts {"params": [...], "lr": x, "weight_decay": y}.
                      A group's lr is a factor on the schedule: schedule(t) * lr / optimizer.params.lr.

    units:            the model's units (docs/architecture.md), as module names, in forward order;
                      default: each top-level child with parameters, the entries of a ModuleList or
                      Sequential counted one by one. The engine hears when each unit's forward and
                      backward start and end (module hooks); `engine.units()` lists them.

    optimizer:        a torch.optim.Optimizer (or a callable building one from the parameters); the
                      config then has no optimizer section. An Adam/AdamW/SGD: the engine runs its
                      own optimizer of that kind with the same settings and param groups
                      (tessera/client.py). Any other runs as given over each rank's flat fp32 shard
                      (tessera/client_optimizer.py; ZeRO stages 1-3 need the config's
                      "zero_allow_untested_optimizer": true, as in DeepSpeed).
    lr_scheduler:     a torch LR scheduler (or a callable building one from the optimizer), stepped
                      by the engine after each applied step; a scheduler in the config wins over it.
    training_data:    a torch.utils.data.Dataset: a DataLoader over the data-parallel ranks
                      (train_micro_batch_size_per_gpu per batch, `collate_fn`).
    plan:             "auto" layout keys in the config (zero_optimization.stage, tensor_parallel.tp_size,
                      pipeline.stages, the offload devices, the micro-batch): the model and hardware
                      for the layout planner, a dict of `tessera plan`'s keys ({"preset": "gpt2-small"}
                      or the shape, "device", "gpu_mem", rates; docs/planner.md). Every rank resolves
                      it alike; rank 0 prints what was chosen and why.

    Returns (engine, optimizer, training_dataloader, lr_scheduler) as deepspeed.initialize does:
    the optimizer is a torch.optim.Optimizer whose param groups' "lr" the engine reads every step;
    the dataloader is None without training_data; lr_scheduler is the client's (None otherwise).
    Raises tessera.ConfigError (a ValueError) naming the JSON path of every error in the config.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError("tessera.initialize: model must be a torch.nn.Module, got %s" % _type_name(model))
    if mpu is not None:
        raise ValueError("tessera.initialize: mpu= is not supported: the tensor, pipeline and data-parallel groups "
                         "come from the config's tensor_parallel.tp_size and pipeline.stages (docs/python.md)")
    if collate_fn is not None and training_data is None:
        raise ValueError("tessera.initialize: collate_fn= is for training_data=, which was not given")
    if config is not None and config_params is not None:
        raise ValueError("tessera.initialize: give config or config_params, not both")
    if config is None:
        config = config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None) or getattr(args, "tessera_config", None) or \
            getattr(args, "config", None)
    if config is None:
        raise TypeError("tessera.initialize: missing config (a path, JSON text or a dict)")

    client_optimizer = client.build_client_optimizer(optimizer, model, model_parameters)
    runner = None  # a client optimizer of a kind the engine lacks, run as given (tessera/client_optimizer.py)
    if client_optimizer is not None:
        config = _config_dict(config)
        if "optimizer" in config:
            raise ValueError("tessera.initialize: optimizer= was given and the config has an optimizer section too; "
                             "give one of them")
        if client.is_mapped(client_optimizer):
            config["optimizer"], model_parameters = client.optimizer_section(client_optimizer)
        else:
            runner = ShardOptimizer(client_optimizer)
            model_parameters = runner.model_parameters()
    text = _config_text(config)
    world_size = comm.get_world_size()
    text = resolve_auto_layout(text, world_size, plan)
    cfg, warnings = _C.load_config(text, world_size, (runner.type_name, runner.base_lr()) if runner else None)
    effective = json.loads(cfg.to_json())  # every default filled in; optional sections only when given
    if runner is not None and effective["zero_optimization"]["stage"] > 0:
        warnings.append("zero_allow_untested_optimizer: %s runs as given over each rank's flat fp32 shard of each "
                        "param group (an optimizer that reads a parameter's shape or norm sees 1-D pieces of it)"
                        % runner.type_name)
    if effective.get("activation_checkpointing") is not None:
        # the section's options for the checkpoint() calls of model code (the C++ parser checked them)
        checkpointing.configure(None, deepspeed_config=effective)
    from . import pipe
    if cfg.context > 1:
        # context_parallel.size: the groups with their context axis (before AutoTP would make them
        # without it); the model's SDPA calls become Ulysses or ring attention (unless the model
        # brings DistributedAttention / RingAttention itself); its inputs are shard()'s parts
        if not comm.axes_made():
            backend, device = _backend_and_device(model.parameters())
            comm.parallel_context(backend, cfg.tensor, cfg.pipe, device=device, context=cfg.context)
        sequence.configure(cfg.context_method)
        if not sequence.is_parallelized(model):
            sequence.parallelize(model, cfg.context_method, require=not isinstance(model, pipe.PipelineModule))
    if isinstance(model, pipe.PipelineModule):  # a model cut into stages: tessera.pipe.PipelineEngine
        if model_parameters is not None or units is not None:
            raise ValueError("tessera.initialize: a PipelineModule takes neither model_parameters nor units")
        for name, value in (("optimizer", optimizer), ("lr_scheduler", lr_scheduler), ("training_data", training_data)):
            if value is not None:
                raise ValueError("tessera.initialize: %s= with a PipelineModule is not supported yet: give the "
                                 "optimizer and scheduler in the config and feed train_batch() an iterator" % name)
        return pipe.initialize_pipeline(model, cfg), None, None, None
    if cfg.pipe > 1:
        raise ValueError("tessera.initialize: pipeline.stages is %d; cut the model into stages with "
                         "tessera.pipe.PipelineModule (docs/pipeline.md)" % cfg.pipe)
    moe_layers = _moe_layers(model, comm.get_world_size(), cfg.tensor, cfg.pipe)
    if moe_layers and cfg.tensor > 1 and cfg.sequence_parallel:
        raise ValueError("tessera.initialize: the MoE layer %r under tensor_parallel.sequence_parallel is not supported "
                         "from Python yet: each tensor rank would route its own part of the sequence, and the layer's "
                         "gradients would need summing over the tensor group (train_gpt's MoE blocks do it; "
                         "docs/moe.md)" % moe_layers[0][0])
    if cfg.tensor > 1 and not any(hasattr(p, "_tessera_tensor_parallel") for p in model.parameters()):
        # tensor_parallel.tp_size without a plan applied: DeepSpeed's AutoTP (the parameters stay the
        # same objects, so model_parameters given by the caller still name them)
        tensor_parallel.parallelize(model, tp_size=cfg.tensor, sequence_parallel=cfg.sequence_parallel)
    groups = _with_expert_groups(_param_groups(model, model_parameters), from_client=client_optimizer is not None)
    if comm.get_rank() == 0:
        for w in warnings:
            print("tessera: warning: %s" % w, file=sys.stderr, flush=True)

    backend, device = _backend_and_device(p for g in groups for p in g[0])
    context = comm.parallel_context(backend, cfg.tensor, cfg.pipe, device=device, context=cfg.context)
    _make_expert_groups(moe_layers, context)
    names = {id(p): n for n, p in model.named_parameters()}
    for n, m in moe_layers:  # experts by their global index (checkpoints)
        names.update(m.global_parameter_names(n + "." if n else ""))
    trainable = {id(p): p for g in groups for p in g[0]}
    unit_modules, unit_spec = _units(model, units, trainable)
    cgroups = [(params, lr, weight_decay, name, [names.get(id(p), "") for p in params],
                [tensor_parallel.split_of(p) for p in params], communicator, gradient_scale)
               for params, lr, weight_decay, name, communicator, gradient_scale in groups]
    # A model built under tessera.zero.Init: the engine builds its buffers from the chunks.
    inits = {}
    for name, p in model.named_parameters():
        init = getattr(p, "_tessera_init", None)
        if init is None or not init.holds(p):
            continue
        if id(p) not in trainable:
            raise ValueError("tessera.initialize: %s was partitioned by tessera.zero.Init but is not among the "
                             "parameters the engine trains, so it would never be whole again; give it to the engine "
                             "(model_parameters) or build it outside zero.Init" % name)
        inits[id(init)] = init
    try:
        cengine = _C.Engine(cfg, context, cgroups, unit_spec, list(inits.values()), runner)
    except BaseException:
        if runner is not None:
            runner.unbind()  # the client optimizer as the script made it
        raise
    if runner is not None:
        runner.engine_made()
    for p in trainable.values():
        if getattr(p, "_tessera_init", None) is not None:
            del p._tessera_init  # the engine owns its values now (GatheredParameters goes through it)
    engine = Engine(model, cengine, groups, unit_modules)
    optimizer, lr_scheduler = client.attach(engine, client_optimizer, lr_scheduler,
                                            config_has_scheduler=engine.config.get("scheduler") is not None,
                                            runs_as_given=runner is not None)
    engine._finish_auto_resume()  # checkpoint.auto_resume: the client's LR state, now attached
    loader = client.training_dataloader(engine, training_data, collate_fn) if training_data is not None else None
    engine.training_dataloader = loader
    return engine, optimizer, loader, lr_scheduler
