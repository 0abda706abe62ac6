"""What a DeepSpeed training script hands tessera.initialize besides the model and the config: its
own optimizer, its LR scheduler and its data set. tessera.initialize returns them as DeepSpeed does,
(engine, optimizer, training_dataloader, lr_scheduler):

- a client optimizer (a torch.optim.Adam / AdamW / SGD, or a callable that builds one from the
  parameters) becomes the config's optimizer section, and its param groups the engine's: the engine
  runs its own flat-shard optimizer of the same kind with the same hyper-parameters; any other
  torch optimizer runs as given over the engine's flat shards (tessera/client_optimizer.py);
- the optimizer returned (`EngineOptimizer`) is a torch.optim.Optimizer whose param_groups the
  engine reads at every step: each group's "lr" is that step's learning rate, so a torch LR
  scheduler (or Hugging Face's get_cosine_schedule_with_warmup) built on it, or on the client
  optimizer whose dicts it shares, drives the learning rate as under DeepSpeed;
- a client LR scheduler (an object, or a callable that builds one from the optimizer) is stepped by
  the engine after each applied optimizer step; when the config names a scheduler too, the
  config's wins, with a warning (DeepSpeed's rule);
- training_data (a torch.utils.data.Dataset) gives a DataLoader over the data-parallel ranks.
"""
import collections
import warnings
import weakref

import torch

# torch.optim class -> the config's optimizer type and the settings that carry over.
_MAPPED = {
    torch.optim.Adam: ("Adam", ("lr", "betas", "eps", "weight_decay")),
    torch.optim.AdamW: ("AdamW", ("lr", "betas", "eps", "weight_decay")),
    torch.optim.SGD: ("SGD", ("lr", "momentum", "nesterov", "weight_decay")),
}
# Settings a group may hold that only say how torch computes (not what), or that an LR scheduler
# built before initialize keeps there for itself (OneCycleLR's, CyclicLR's): ignored.
_HOW = {"foreach", "fused", "capturable", "differentiable", "initial_lr", "max_lr", "min_lr", "base_lr",
        "max_momentum", "base_momentum"}
# What the engine takes from the groups at each step is "lr"; these must stay as initialize saw them.
FIXED_AFTER_INITIALIZE = ("betas", "momentum", "weight_decay", "eps")


def _frozen(value):
    return tuple(value) if isinstance(value, list) else value  # betas may be given as a list


def fixed_settings(optimizer):
    """Each group's settings the engine read once, at initialize (FIXED_AFTER_INITIALIZE)."""
    return [{k: _frozen(g[k]) for k in FIXED_AFTER_INITIALIZE if k in g} for g in optimizer.param_groups]


def check_fixed_settings(optimizer, fixed):
    """A scheduler (or the script) that changes a group's betas or momentum after initialize would
    change nothing in the engine's optimizer: say so rather than train with other values."""
    for i, (g, then) in enumerate(zip(optimizer.param_groups, fixed)):
        for key, value in then.items():
            now = _frozen(g.get(key))
            if now != value:
                raise ValueError(
                    "tessera: param group %d's %r changed from %r to %r after initialize (a client LR scheduler that "
                    "cycles momentum, such as OneCycleLR or CyclicLR with cycle_momentum=True?); the engine takes "
                    "only 'lr' from the param groups at each step. Pass cycle_momentum=False, or use the config's "
                    "OneCycle scheduler, which cycles momentum in the engine" % (i, key, value, now))
# Settings tessera's optimizers do not have, with the value that changes nothing.
_NEUTRAL = {"amsgrad": False, "maximize": False, "dampening": 0}
_PER_GROUP = ("lr", "weight_decay")  # may differ between groups (the engine has both per group)


def is_mapped(optimizer):
    """Whether the engine runs its own optimizer for this client optimizer (else it runs as given)."""
    return type(optimizer) in _MAPPED


def group_lr(group):
    """A param group's learning rate as a number (an optimizer such as Adafactor may hold None)."""
    lr = group.get("lr")
    if lr is None:
        return 0.0
    return float(lr.item() if isinstance(lr, torch.Tensor) else lr)


def build_client_optimizer(optimizer, model, model_parameters):
    """A callable optimizer=: built on model_parameters (or the model's trainable parameters)."""
    if isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer):
        return optimizer
    params = model_parameters if model_parameters is not None else [p for p in model.parameters() if p.requires_grad]
    built = optimizer(params)
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError("tessera.initialize: the optimizer callable returned %s, not a torch.optim.Optimizer"
                        % type(built).__name__)
    return built


def optimizer_section(optimizer):
    """(the config's optimizer section, model_parameters as param-group dicts) for a client optimizer."""
    kind, keys = _MAPPED[type(optimizer)]
    groups = optimizer.param_groups
    first = groups[0]
    if kind in ("Adam", "AdamW"):  # torch's Adam(decoupled_weight_decay=True) is AdamW, and AdamW's groups say so
        kind = "AdamW" if first.get("decoupled_weight_decay", kind == "AdamW") else "Adam"
    for i, g in enumerate(groups):
        for key, value in g.items():
            if key == "params" or key in _HOW or key in keys or key in ("name", "communicator", "moe"):
                continue
            if key == "decoupled_weight_decay":
                if bool(value) != (kind == "AdamW"):
                    raise ValueError("tessera.initialize: the client %s's param groups 0 and %d differ in "
                                     "decoupled_weight_decay" % (type(optimizer).__name__, i))
                continue
            if key in _NEUTRAL:
                if value != _NEUTRAL[key]:
                    raise ValueError("tessera.initialize: the client %s has %s=%r in param group %d; the engine's %s has "
                                     "no %s (only %r)" % (type(optimizer).__name__, key, value, i, kind, key, _NEUTRAL[key]))
                continue
            raise ValueError("tessera.initialize: the client %s's param group %d sets %r, which tessera's %s does not "
                             "have" % (type(optimizer).__name__, i, key, kind))
        for key in keys:
            if key not in _PER_GROUP and g.get(key) != first.get(key):
                raise ValueError("tessera.initialize: the client %s's param groups 0 and %d differ in %s (%r, %r); "
                                 "the engine takes per group only %s" % (type(optimizer).__name__, i, key,
                                                                         first.get(key), g.get(key), " and ".join(_PER_GROUP)))
    params = {key: first[key] for key in keys if key in first}
    for key in ("lr", "weight_decay", "eps", "momentum"):
        if isinstance(params.get(key), torch.Tensor):
            params[key] = params[key].item()
    if "betas" in params:
        params["betas"] = [float(b) for b in params["betas"]]
    if kind == "Adam":
        params["adam_w_mode"] = False  # torch's Adam adds weight decay to the gradient (L2), not AdamW's
    model_parameters = [{"params": list(g["params"]), "lr": float(g["lr"]), "weight_decay": float(g["weight_decay"]),
                         "name": g.get("name", "group%d" % i), "communicator": g.get("communicator", ""),
                         "moe": bool(g.get("moe", False))}
                        for i, g in enumerate(groups)]
    return {"type": kind, "params": params}, model_parameters


class EngineOptimizer(torch.optim.Optimizer):
    """The optimizer tessera.initialize returns: the engine's flat-shard optimizer seen through
    torch.optim.Optimizer's interface. param_groups are the client optimizer's own dicts when one
    was given (so a scheduler built on it drives the engine), else one dict per engine group; the
    engine reads each group's "lr" before every optimizer step and writes back the one it used.
    step() and zero_grad() are the engine's (engine.step() is what a training loop calls)."""

    def __init__(self, engine, param_groups, defaults):
        # Not torch.optim.Optimizer.__init__: its first call imports torch._dynamo (about 115 MB of
        # resident memory per rank, measured) for checks that do not apply here. The attributes its
        # methods and the LR schedulers read are set instead.
        self.defaults = dict(defaults)
        self.state = collections.defaultdict(dict)
        self.param_groups = param_groups
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                      "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, collections.OrderedDict())
        # Weak: the engine holds its optimizer, and a cycle would leave the engine (and the hooks it
        # put on the module) to the garbage collector instead of going when the script drops it.
        self._engine_ref = weakref.ref(engine)

    @property
    def _engine(self):
        engine = self._engine_ref()
        if engine is None:
            raise RuntimeError("tessera: this optimizer's engine is gone")
        return engine

    def step(self, closure=None):
        raise RuntimeError("tessera: the optimizer steps inside engine.step() (call that once per micro-batch, after "
                           "engine.backward(loss)); optimizer.step() is not used")

    def zero_grad(self, set_to_none=True):
        self._engine.zero_grad()

    def __repr__(self):
        return "tessera.EngineOptimizer(%s, %d param groups)" % (self._engine.config["optimizer"]["type"],
                                                                len(self.param_groups))


def training_dataloader(engine, training_data, collate_fn):
    """A DataLoader over this data-parallel rank's share of `training_data`: a DistributedSampler
    over the data-parallel ranks, train_micro_batch_size_per_gpu samples per batch."""
    if not isinstance(training_data, torch.utils.data.Dataset):
        raise TypeError("tessera.initialize: training_data must be a torch.utils.data.Dataset, got %s"
                        % type(training_data).__name__)
    sampler = torch.utils.data.distributed.DistributedSampler(
        training_data, num_replicas=engine.dp_world_size, rank=engine.dp_rank, shuffle=True)
    return torch.utils.data.DataLoader(training_data, batch_size=engine.train_micro_batch_size_per_gpu(),
                                       sampler=sampler, collate_fn=collate_fn, drop_last=False)


def attach(engine, client_optimizer, lr_scheduler, config_has_scheduler, runs_as_given=False):
    """Gives the engine its optimizer (EngineOptimizer) and LR scheduler; returns them."""
    if client_optimizer is not None:
        groups = client_optimizer.param_groups
        defaults = client_optimizer.defaults
    else:
        defaults = dict(engine.config["optimizer"]["params"])
        groups = [{"params": list(p), "lr": lr, "weight_decay": defaults.get("weight_decay", 0.0) if wd is None else wd,
                   "name": name} for (p, _, wd, name, _, _), lr in zip(engine._groups, engine.get_lr())]
    optimizer = EngineOptimizer(engine, groups, defaults)
    if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(optimizer)
    if lr_scheduler is not None and config_has_scheduler:
        if engine.global_rank == 0:
            warnings.warn("tessera.initialize: the config names a scheduler and lr_scheduler= was given too; the "
                          "config's scheduler sets the learning rate and the client scheduler is not stepped "
                          "(DeepSpeed's rule)", stacklevel=3)
        lr_scheduler = None
    if lr_scheduler is not None and not hasattr(lr_scheduler, "step"):
        raise TypeError("tessera.initialize: lr_scheduler must have step() (a torch.optim.lr_scheduler) or build one "
                        "from the optimizer, got %s" % type(lr_scheduler).__name__)
    engine._attach_optimizer(optimizer, lr_scheduler, lr_from_groups=not config_has_scheduler,
                             settings_fixed=not runs_as_given)
    return optimizer, lr_scheduler
