"""A script's own torch optimizer, run by the engine over its flat fp32 shards.

tessera.initialize(optimizer=...) maps a torch.optim Adam, AdamW or SGD onto the engine's own
optimizers (tessera/client.py). Any other torch optimizer (Adagrad, RMSprop, Hugging Face's
Adafactor, one of the script's own) runs as given, the way DeepSpeed runs an "untested" optimizer
under ZeRO (zero_allow_untested_optimizer): each param group's "params" become this rank's fp32
shard of the group, one 1-D tensor per bucket (views into the engine's buffers), and each engine
step is one optimizer.step() on them, after the engine reduced, unscaled and clipped the gradients.

What that means for the optimizer's arithmetic: an elementwise optimizer (Adagrad, RMSprop, Adam's
relatives) computes exactly what it computes on the whole parameters; one that looks at a
parameter's shape or norm (Adafactor's factored moments, LAMB-style trust ratios) sees 1-D pieces
of the flattened parameters instead, as under DeepSpeed's ZeRO.

Checkpoints: the optimizer's state is kept in place in shard-shaped buffers, so it saves and
reshards like the engine's own: a state tensor shaped like its parameter ("exp_avg", "sum") is laid
out like the shard and loads at another data-parallel size or ZeRO stage; a scalar every parameter
shares ("step") is saved once (FlatOptimizer::StateLayout::Uniform); any other value is this rank's
own (it loads at the same layout only).
"""
import torch

_SHARD, _UNIFORM, _LOCAL = "shard", "uniform", "local"


def type_name(optimizer):
    """"torch.optim.Adagrad" for torch's own, else the class's module and name."""
    cls = type(optimizer)
    if getattr(torch.optim, cls.__name__, None) is cls:
        return "torch.optim." + cls.__name__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Bound:
    """One ZeRO group of the engine: its segments (this rank's chunk of each bucket)."""

    def __init__(self, source, params, grads, computes, offsets, shard_numel):
        self.source = source
        self.params = params      # fp32 1-D views the optimizer updates in place
        self.grads = grads        # the engine's reduced gradients for the same elements
        self.computes = computes  # bf16/fp16 copies to refresh after the step (None in fp32)
        self.offsets = offsets    # where each segment starts in the rank's local shard
        self.shard_numel = shard_numel
        self.shard_states = {}    # state name -> shard-long tensor the segments' state views live in
        self.scalars = {}         # state name -> float64 0-dim mirror of a value every segment shares
        self.segment_scalars = {}  # "name/segment" -> float64 0-dim mirror of a segment's own value
        self.written = {}         # mirror name -> the value last written into it from the state
        self.local = {}           # "name/segment" -> the segment's own state tensor


class ShardOptimizer:
    """Holds the client optimizer and steps it; the engine's C++ side (python/csrc/client_optimizer.h)
    calls bind() once per ZeRO group while the engine is built, then step(), named_state() and
    materialize_state() per group."""

    def __init__(self, optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("tessera.initialize: optimizer= must be a torch.optim.Optimizer (or a callable building "
                            "one from the parameters), got %s" % type(optimizer).__name__)
        self.optimizer = optimizer
        self.type_name = type_name(optimizer)
        # State the optimizer made at construction (Adagrad's "sum"): made again over the shards before
        # the first step. State from steps already taken cannot follow the parameters into the shards.
        self._made_at_construction = bool(optimizer.state)
        for state in optimizer.state.values():
            step = state.get("step", 0)
            if float(step.item() if isinstance(step, torch.Tensor) else step) > 0:
                raise ValueError("tessera.initialize: the client %s has stepped already (its state has step %s); pass "
                                 "one that has not (a checkpoint's optimizer state loads through "
                                 "engine.load_checkpoint)" % (self.type_name, float(step)))
        self._bound = {}           # ZeRO group -> _Bound
        self._pending = set()      # groups whose step() came in this engine step
        self._stepped = False      # the optimizer has made its state
        self._materialized = False  # ... by materialize_state(), for a checkpoint to load into
        # What bind() changes in the client optimizer, put back by unbind() if the engine is not made.
        self._before_bind = ([g["params"] for g in optimizer.param_groups], dict(optimizer.state))

    # -- what initialize gives the engine ---------------------------------------------------------

    def model_parameters(self):
        """The client's param groups as initialize's model_parameters (lr and weight decay kept for
        the engine's schedule and progress line)."""
        out = []
        for i, g in enumerate(self.optimizer.param_groups):
            group = {"params": list(g["params"]), "name": g.get("name", "group%d" % i),
                     "communicator": g.get("communicator", ""),  # a group reduced over its own ranks
                     "moe": bool(g.get("moe", False))}
            lr = g.get("lr")
            if isinstance(lr, torch.Tensor):
                lr = lr.item()
            if _number(lr):
                group["lr"] = float(lr)
            if _number(g.get("weight_decay")):
                group["weight_decay"] = float(g["weight_decay"])
            out.append(group)
        return out

    def engine_made(self):
        """The engine exists: what unbind() would have put back is not needed any more."""
        self._before_bind = None

    def unbind(self):
        """The engine was not made: the client optimizer gets back its parameters and state."""
        if self._before_bind is None:
            return
        params, state = self._before_bind
        for g, p in zip(self.optimizer.param_groups, params):
            g["params"] = p
        self.optimizer.state.clear()
        self.optimizer.state.update(state)
        self._bound, self._before_bind = {}, None

    def base_lr(self):
        lr = self.optimizer.param_groups[0].get("lr")
        return float(lr.item() if isinstance(lr, torch.Tensor) else lr) if lr is not None else 0.0

    # -- the engine's calls ------------------------------------------------------------------------

    def bind(self, group, source, params, grads, computes, offsets, shard_numel):
        """ZeRO group `group` (made of param group `source`) is these segments on this rank: the
        client's group `source` now lists them instead of the model's parameters."""
        groups = self.optimizer.param_groups
        if not 0 <= source < len(groups):
            raise ValueError("tessera: engine group %d comes from param group %d; the client optimizer has %d"
                             % (group, source, len(groups)))
        if not self._bound:
            self.optimizer.state.clear()  # keyed by the model's parameters, which the optimizer no longer steps
        if not any(b.source == source for b in self._bound.values()):
            groups[source]["params"] = []  # the model's parameters (now the engine's views) go
        groups[source]["params"].extend(params)
        self._bound[group] = _Bound(source, list(params), list(grads), list(computes), list(offsets), shard_numel)

    def step(self, group, params, lr, grad_scale, beta1, beta2):
        """Engine group `group`'s part of the engine's optimizer step; the client optimizer steps once
        every group has come in. lr: the engine's for this group (the client's group or the config's
        schedule decided it); grad_scale: 1/loss scale times the clipping coefficient."""
        b = self._bound[group]
        if [p.data_ptr() for p in params] != [p.data_ptr() for p in b.params]:
            raise RuntimeError("tessera: the engine stepped group %d over other buffers than it bound; a client "
                               "optimizer steps the shards where they are in memory" % group)
        if group in self._pending:
            raise RuntimeError("tessera: engine group %d stepped twice in one optimizer step" % group)
        self._pending.add(group)
        try:
            g = self.optimizer.param_groups[b.source]
            if _number(g.get("lr")):
                g["lr"] = lr
            elif isinstance(g.get("lr"), torch.Tensor):
                g["lr"].fill_(lr)
            # The config's OneCycle cycles momentum as DeepSpeed's does: an optimizer's betas, when
            # it has them (not SGD-style momentum).
            if beta1 is not None and "betas" in g:
                g["betas"] = (beta1, beta2 if beta2 is not None else g["betas"][1])
            for p, grad in zip(b.params, b.grads):
                if grad.dtype != p.dtype:  # data_types.grad_accum_dtype bf16: the optimizer gets fp32
                    grad = grad.to(p.dtype)
                if grad_scale != 1.0:
                    grad.mul_(grad_scale)  # the engine zeroes its gradients after the step
                p.grad = grad
            if len(self._pending) < len(self._bound):
                return
            self._start_state()
            self._load_scalars()
            self.optimizer.step()
        except BaseException:
            self._end_step()  # a failed step: the next one starts afresh
            raise
        self._end_step()
        self._stepped, self._materialized = True, False
        self._keep_state()
        for bound in self._bound.values():
            for p, compute in zip(bound.params, bound.computes):
                if compute is not None:
                    compute.copy_(p)

    def _end_step(self):
        self._pending.clear()
        for bound in self._bound.values():
            for p in bound.params:
                p.grad = None

    def state_bytes(self, group):
        b = self._bound[group]
        total = 0
        for p in b.params:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    total += value.numel() * value.element_size()
        return total

    def named_state(self, group):
        """[(name, tensor, layout)]: the tensors a checkpoint saves from and loads into, in place."""
        b = self._bound[group]
        out = [(name, t, _SHARD) for name, t in sorted(b.shard_states.items())]
        out += [(name, t, _UNIFORM) for name, t in sorted(b.scalars.items())]
        out += [(name, t, _LOCAL) for name, t in sorted(b.segment_scalars.items())]
        out += [(name, t, _LOCAL) for name, t in sorted(b.local.items())]
        return out

    def materialize_state(self):
        """A checkpoint saved after some steps loads into state the optimizer makes at its first step:
        one step with zero gradients makes it, the parameters are put back, and the load overwrites
        every value. Nothing to do once the optimizer has stepped. Returns whether it made state."""
        if self._stepped:
            return False
        params = [p for b in self._bound.values() for p in b.params]
        saved = [p.detach().clone() for p in params]
        self._pending.clear()
        self._start_state()
        try:
            for p in params:
                p.grad = torch.zeros_like(p)
            self.optimizer.step()
        finally:
            for p, value in zip(params, saved):
                p.grad = None
                p.copy_(value)
        self._stepped, self._materialized = True, True
        self._keep_state()
        return True

    def discard_materialized_state(self):
        """The load failed: the state made for it goes, and the first step makes it afresh."""
        if not self._materialized:
            return
        for b in self._bound.values():
            for p in b.params:
                self.optimizer.state.pop(p, None)
            b.shard_states, b.scalars, b.segment_scalars, b.written, b.local = {}, {}, {}, {}, {}
        self._stepped = self._materialized = False

    # -- state kept in place -----------------------------------------------------------------------

    def _start_state(self):
        """Before the first step: an optimizer that makes its state at construction gets it made over
        the shards, by a second instance of its class built on the same param groups."""
        if not self._made_at_construction or self._stepped:
            return
        groups = [dict(g) for g in self.optimizer.param_groups]
        try:
            fresh = type(self.optimizer)(groups)
        except Exception as e:
            raise TypeError("tessera: the client %s makes its state at construction, and building it again over the "
                            "shards as %s(param_groups) failed (%s: %s)" % (self.type_name, type(self.optimizer).__name__,
                                                                            type(e).__name__, e)) from e
        for b in self._bound.values():
            for p in b.params:
                if p in fresh.state and p not in self.optimizer.state:
                    self.optimizer.state[p] = fresh.state[p]

    def _keep_state(self):
        """After a step: each state tensor shaped like its segment lives in the group's shard-long
        buffer (moved there once; again only if the optimizer replaced it), scalars are mirrored into
        0-dim tensors, and other tensors are named per segment."""
        state = self.optimizer.state
        for b in self._bound.values():
            names = sorted({k for p in b.params for k in state.get(p, {})})
            for name in names:
                values = [state.get(p, {}).get(name) for p in b.params]
                if all(isinstance(v, torch.Tensor) and v.shape == p.shape and v.dtype == torch.float32
                       for v, p in zip(values, b.params)):
                    self._keep_in_shard(b, name, values)
                elif all(_number(v) or (isinstance(v, torch.Tensor) and v.dim() == 0) for v in values):
                    numbers = [float(v.item() if isinstance(v, torch.Tensor) else v) for v in values]
                    if all(x == numbers[0] for x in numbers):  # a step count: one value for the group
                        self._mirror(b, b.scalars, name, numbers[0])
                    else:
                        for i, x in enumerate(numbers):
                            self._mirror(b, b.segment_scalars, "%s/%d" % (name, i), x)
                else:
                    for i, v in enumerate(values):
                        if isinstance(v, torch.Tensor):
                            b.local["%s/%d" % (name, i)] = v

    def _keep_in_shard(self, b, name, values):
        buf = b.shard_states.get(name)
        if buf is None:
            buf = b.shard_states[name] = torch.zeros(b.shard_numel, dtype=torch.float32, device=b.params[0].device)
        for p, offset, v in zip(b.params, b.offsets, values):
            view = buf.narrow(0, offset, p.numel())
            if v.data_ptr() != view.data_ptr() or v.numel() == 0:
                view.copy_(v)
                self.optimizer.state[p][name] = view

    @staticmethod
    def _mirror(b, mirrors, key, value):
        if key not in mirrors:
            mirrors[key] = torch.zeros((), dtype=torch.float64)
        mirrors[key].fill_(value)
        b.written[key] = mirrors[key].item()

    def _load_scalars(self):
        """Scalars a checkpoint loaded into the 0-dim mirrors (changed since _keep_state wrote them)
        go back into the state."""
        for b in self._bound.values():
            for name, mirror in b.scalars.items():
                if mirror.item() != b.written.get(name):
                    for p in b.params:
                        self._set_scalar(p, name, mirror.item())
            for key, mirror in b.segment_scalars.items():
                if mirror.item() != b.written.get(key):
                    name, i = key.rsplit("/", 1)
                    self._set_scalar(b.params[int(i)], name, mirror.item())

    def _set_scalar(self, p, name, value):
        s = self.optimizer.state.get(p)
        if s is None or name not in s:
            return
        old = s[name]
        if isinstance(old, torch.Tensor):
            old.fill_(value)
        else:
            s[name] = type(old)(value)
