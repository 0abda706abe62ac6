"""The Engine tessera.initialize() returns (tessera/initialization.py): DeepSpeed's training loop over the C++ engine."""
import collections.abc
import json
import os
import time

import torch

from . import client, zero
from ._checkpoint_calls import CheckpointCalls
from ._config import type_name as _type_name
from .comms_logger import CommsLogger
from .flops_profiler import EngineProfiler
from .monitor import MonitorMaster

__all__ = ["Engine"]


# Attributes of DeepSpeed's engine that training scripts use and tessera's Engine does not have:
# reading one raises an AttributeError that says so (the others are plain AttributeErrors).
_DEEPSPEED_ENGINE_NAMES = frozenset({
    "amp_enabled", "autotuning_enabled", "bfloat16_enabled_for_comm", "checkpoint_tag_validation_enabled",
    "communication_data_type", "compression_training", "curriculum_learning_enabled", "data_efficiency_enabled",
    "dump_state", "dynamic_loss_scale", "eigenvalue_enabled", "flops_profiler_enabled",
    "get_mom", "get_pld_theta", "get_sequence_parallel_group", "get_type", "is_map_style_dataset",
    "load_moe_state_dict", "memory_breakdown", "module_state_dict", "load_module_state_dict", "moe_enabled",
    "offload_states", "reload_states", "pld_enabled", "quantize_training", "random_ltd_enabled",
    "set_data_post_process_func", "set_custom_curriculum_learning_schedule", "set_train_batch_size",
    "sparse_gradients_enabled", "tput_timer", "wall_clock_breakdown_enabled", "zero_cpu_offload",
    "zero_optimization_partition_gradients", "zero_optimization_partition_weights", "is_compiled",
    "no_sync", "set_gradient_accumulation_boundary", "get_data_types", "empty_partition_cache",
})


class _UnitEnter:
    def __init__(self, cengine, index):
        self._c, self._index = cengine, index

    def __call__(self, module, inputs):
        self._c.unit_forward_begin(self._index)


class _UnitLeave:
    """Ends the unit's forward, and watches its first output that requires grad: the unit's
    backward begins when that output's gradient arrives."""

    def __init__(self, cengine, index):
        self._c, self._index = cengine, index

    def __call__(self, module, inputs, output):
        first = next(_tensors_of(output), None)
        if first is not None and first.requires_grad:
            self._c.unit_output(self._index, first)
        self._c.unit_forward_end(self._index)


def _to_half(x):
    """x with every floating-point tensor in it (nested in tuples, lists and dicts) cast to fp16."""
    if isinstance(x, torch.Tensor):
        return x.half() if x.is_floating_point() else x
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return type(x)(*(_to_half(v) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_to_half(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_half(v) for k, v in x.items()}
    return x


def _tensors_of(output):
    """The tensors of a forward's output: a tensor, or nested tuples/lists/dicts of them."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for x in output:
            yield from _tensors_of(x)
    elif isinstance(output, collections.abc.Mapping):
        for x in output.values():
            yield from _tensors_of(x)


class _WaitForParameters:
    def __init__(self, cengine):
        self._c = cengine

    def __call__(self, *args, **kwargs):
        self._c.wait_for_parameters()


class Engine(CheckpointCalls):
    """Trains one torch.nn.Module: engine(*args) runs its forward, engine.backward(loss) and
    engine.step() do the rest. Attributes the module has and the engine lacks are the module's."""

    def __init__(self, module, cengine, groups, unit_modules=()):
        self._module = module
        self._c = cengine
        self._unit_hooks = []
        for index, (_, unit) in enumerate(unit_modules):
            self._unit_hooks.append(unit.register_forward_pre_hook(_UnitEnter(cengine, index)))
            self._unit_hooks.append(unit.register_forward_hook(_UnitLeave(cengine, index)))
        # The parameters no unit covers ("<root>", the last unit) are read anywhere in the forward:
        # the whole module's forward enters that unit first.
        if any(u["name"] == "<root>" for u in cengine.units()):
            root = len(unit_modules)
            self._unit_hooks.append(module.register_forward_pre_hook(_UnitEnter(cengine, root)))
            self._unit_hooks.append(module.register_forward_hook(_UnitLeave(cengine, root)))
        # Saving the module's state reads every parameter: the allgathers still in flight finish first.
        self._unit_hooks.append(module.register_state_dict_pre_hook(_WaitForParameters(cengine)))
        self.config = json.loads(cengine.config_json())  # the effective config, every default filled in
        # ZeRO-3: parameters read outside their units are gathered on access (tessera/zero.py).
        self._zero3 = self.config["zero_optimization"]["stage"] == 3
        self._auto_cast = self.config["fp16"]["enabled"] and self.config["fp16"]["auto_cast"]
        self._fetching = zero.install_fetching(module, cengine) if self._zero3 else None
        self._partitioned = [p for g in groups for p in g[0]] if self._zero3 else []
        zero.register_engine(self, self._partitioned)
        self._base_lr = self.config["optimizer"]["params"]["lr"]
        self._groups = groups
        self._group_lrs = [g[1] for g in groups]
        # What initialize hands back with the engine (tessera/client.py): set by _attach_optimizer.
        self.optimizer = None
        self.lr_scheduler = None
        self.training_dataloader = None
        self._lr_from_groups = False
        self._step_applied = False
        context = cengine.context
        self.global_rank = context.rank
        self.world_size = context.world_size
        self.local_rank = context.local_rank
        self.dp_rank = context.group_rank("data")
        self.dp_world_size = context.group_size("data")
        first = next(p for g in groups for p in g[0])
        self.device = first.device
        self.compute_dtype = first.dtype  # after the engine took the parameters over: bf16/fp16/fp32
        self._micro = self.config["train_micro_batch_size_per_gpu"]
        from .moe.layer import MOELayer  # the layers whose auxiliary loss and drops the progress line shows
        self._moe_layers = [m for m in module.modules() if isinstance(m, MOELayer)]
        self._step_moe = [0.0, 0, 0, 0]  # this step's l_aux sum, choices routed and dropped, forwards
        self._recorded = False  # record_batch() called since the last backward
        self._backward_called = False  # engine.backward() in this micro-step (else the script's loss.backward())
        self._step_losses = []  # this step's micro-batch losses, as tensors: read from the device only when needed
        self._last_step_loss = None
        self._step_samples = 0
        self._step_tokens = 0
        self._step_start = time.perf_counter()
        self._start = self._step_start
        self._times_at_last_step = None
        # DeepSpeed's engine.monitor: the writers the config enables (tessera/monitor/), on rank 0.
        self.monitor = MonitorMaster(self.config, self.global_rank)
        # DeepSpeed's comms logger over every communicator's statistics (tessera/comms_logger.py).
        self.comms_logger = CommsLogger(self._c.context, self.config.get("comms_logger"))
        # DeepSpeed's flops profiler: one step's forwards on rank 0 (tessera/flops_profiler.py).
        self.flops_profiler = EngineProfiler(self, self.config.get("flops_profiler"))

    def __del__(self):
        # The module may outlive the engine: take the unit hooks off it (they hold the C++ engine).
        for handle in self.__dict__.get("_unit_hooks", ()):
            handle.remove()
        zero.restore_fetching(self.__dict__.get("_fetching"))
        zero.unregister_engine(self.__dict__.get("_partitioned", ()))

    # --- the module -------------------------------------------------------------------------------
    @property
    def module(self):
        """The model being trained (its parameters are views into the engine's buffers). With
        overlap_comm at ZeRO 1-2, the parameters' allgather may still be in flight after step():
        the next forward waits unit by unit; reading them otherwise, call wait_for_parameters()
        (engine.module, state_dict(), parameters() and eval() do)."""
        self._c.wait_for_parameters()
        return self._module

    def wait_for_parameters(self):
        """Finishes the allgather of the updated parameters still in flight (overlap_comm, ZeRO 1-2)."""
        self._c.wait_for_parameters()

    def __call__(self, *args, **kwargs):
        self._c.discard_unfinished_backward()  # after a loss.backward() that raised inside autograd
        if args and isinstance(args[0], torch.Tensor) and torch.is_grad_enabled() and self._module.training and \
                not self._recorded and args[0].dim() >= 2 and not args[0].is_floating_point():
            # token ids (batch, sequence, ...): the progress line counts samples and tokens from them
            self.record_batch(int(args[0].shape[0]), int(args[0].numel()))
        if self._auto_cast:  # fp16.auto_cast: floating-point inputs in fp16, as DeepSpeed's forward casts them
            args, kwargs = _to_half(args), _to_half(kwargs)
        if self._module.training:
            self.flops_profiler.before_forward()
        out = self._module(*args, **kwargs)
        if self._zero3:
            self._c.end_of_forward()  # without grad (evaluation), nothing it gathered stays
        if self._moe_layers and torch.is_grad_enabled() and self._module.training:
            self._record_moe()
        if torch.is_grad_enabled():  # a loss.backward() of the script's own begins the engine's backward
            for t in _tensors_of(out):
                if t.requires_grad:
                    self._c.watch_model_output(t)
        return out

    def _record_moe(self):
        """The progress line's MoE figures: the layers' auxiliary losses and the choices they
        routed and dropped in this forward (tessera.moe.MOELayer keeps them)."""
        ran = [layer for layer in self._moe_layers if layer.l_aux is not None]
        if not ran:
            return
        aux = float(sum(layer.l_aux.detach() for layer in ran))  # one read from the device per forward
        routed = sum(layer.tokens_routed for layer in ran)
        dropped = sum(layer.tokens_dropped for layer in ran)
        self._c.record_moe(aux, routed, dropped)
        self._step_moe = [a + b for a, b in zip(self._step_moe, (aux, routed, dropped, 1))]

    def gathered_parameters(self, modifier_rank=None):
        """ZeRO-3: a context in which every parameter is whole (tessera.zero.GatheredParameters)."""
        return zero.GatheredParameters(self._partitioned, modifier_rank=modifier_rank)

    def set_parameters(self, values, src=0):
        """The module's parameters take `values` (one flat tensor, the parameters in module order)
        as data-parallel rank `src` gives them: broadcast to every data rank, each rank's fp32 master
        shard rewritten from them (what zero.GatheredParameters(modifier_rank=src) does at ZeRO-3,
        at every stage). Collective over the data group; `values` is read on rank `src` only."""
        self._c.gather_all_parameters()
        try:
            if self.dp_rank == src:
                offset = 0
                with torch.no_grad():
                    for p in self._module.parameters():
                        if p.requires_grad:
                            p.copy_(values[offset:offset + p.numel()].view_as(p))
                            offset += p.numel()
            with torch.no_grad():
                self._c.write_back_parameters(src)
        finally:
            self._c.release_all_parameters()

    forward = __call__

    def train(self, mode=True):
        self._module.train(mode)
        return self

    def eval(self):
        self._c.wait_for_parameters()
        self._module.eval()
        return self

    def __getattr__(self, name):
        # Only reached for names the engine lacks: delegate to the module, as DeepSpeed's engine does;
        # a name of DeepSpeed's engine that tessera does not have says so.
        module, cengine = self.__dict__.get("_module"), self.__dict__.get("_c")
        if module is None or cengine is None:
            raise AttributeError(name)
        cengine.wait_for_parameters()
        try:
            return getattr(module, name)
        except AttributeError:
            if name in _DEEPSPEED_ENGINE_NAMES:
                raise AttributeError("tessera.Engine has no %r: DeepSpeed's engine has it, tessera does not implement "
                                     "it (docs/python.md lists what the engine has)" % name) from None
            raise

    def parameters(self, recurse=True):
        self._c.wait_for_parameters()
        return self._module.parameters(recurse)

    def named_parameters(self, *args, **kwargs):
        self._c.wait_for_parameters()
        return self._module.named_parameters(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        if self._zero3:  # gathered for the copy: the parameters' own storage goes when released
            with self.gathered_parameters():
                return {k: v.clone() if isinstance(v, torch.Tensor) else v
                        for k, v in self._module.state_dict(*args, **kwargs).items()}
        return self._module.state_dict(*args, **kwargs)  # its pre-hook waits for the parameters

    # --- units ------------------------------------------------------------------------------------
    def units(self):
        """The model's units in forward order: name, parameter names (and the shared ones an earlier
        unit owns), elements owned, and forward/backward counts and seconds so far."""
        return self._c.units()

    def record_unit_events(self, on=True):
        """Starts (or stops) recording unit events; unit_events() returns and clears them."""
        self._c.record_unit_trace(on)

    def unit_events(self):
        """[(unit index, "forward_begin" | "forward_end" | "backward_begin" | "backward_end")] since the last call."""
        return self._c.unit_trace()

    # --- training ---------------------------------------------------------------------------------
    def record_batch(self, samples, tokens=0):
        """Tells the progress line (and the metrics) how many samples and tokens this rank's micro-batch
        had. Rarely needed: engine(token_ids, ...) counts them from an integer input of shape
        (batch, sequence), and otherwise each micro-batch counts train_micro_batch_size_per_gpu samples."""
        if isinstance(samples, bool) or not isinstance(samples, int) or isinstance(tokens, bool) or not isinstance(tokens, int):
            raise TypeError("Engine.record_batch: samples and tokens must be ints")
        self._c.record_batch(samples, tokens)
        self._step_samples += samples
        self._step_tokens += tokens
        self._recorded = True

    def backward(self, loss, output_grads=None):
        """Scales the loss by 1/gradient_accumulation_steps (and the fp16 loss scale) and runs autograd;
        gradients go into the engine's fp32 buffers (a parameter's .grad stays None). Returns loss.

        backward(outputs, output_grads): the backward of a model part whose outputs feed something
        else (a pipeline stage): autograd from the tensors `outputs` with `output_grads` as their
        gradients, used as given (the part that owns the loss scaled them). Records no loss."""
        if output_grads is not None:
            outputs = [loss] if isinstance(loss, torch.Tensor) else list(loss)
            grads = [output_grads] if isinstance(output_grads, torch.Tensor) else list(output_grads)
            if not all(isinstance(t, torch.Tensor) for t in outputs + grads):
                raise TypeError("Engine.backward: outputs and output_grads must be tensors")
            if len(outputs) != len(grads):
                raise ValueError("Engine.backward: %d outputs but %d output_grads" % (len(outputs), len(grads)))
            if not self._recorded:
                self.record_batch(self._micro)
            self._c.backward_outputs(outputs, grads)
            self._recorded = False
            self._backward_called = True
            return loss
        if not isinstance(loss, torch.Tensor):
            raise TypeError("Engine.backward: loss must be a torch.Tensor, got %s" % _type_name(loss))
        if loss.numel() != 1:
            raise ValueError("Engine.backward: loss must have one element, got shape %s" % (tuple(loss.shape),))
        if not loss.requires_grad:
            raise RuntimeError("Engine.backward: loss does not require grad (computed under torch.no_grad()?)")
        if not self._recorded:
            self.record_batch(self._micro)
        self._c.backward(loss)
        self._step_losses.append(loss.detach().reshape(()))
        self._recorded = False
        self._backward_called = True
        return loss

    def step(self):
        """Counts a micro-step (after engine.backward(loss), or the script's own loss.backward():
        then the gradients hold the micro-batches' sum and the step divides it by
        gradient_accumulation_steps; refused under fp16, whose loss must be scaled); at a gradient-accumulation boundary also unscales, clips, applies the
        optimizer and advances the LR schedule (on every rank: call it on every rank). Without a
        scheduler in the config, the learning rate of each group is optimizer.param_groups[i]["lr"]
        (which a client LR scheduler, stepped here after each applied step, sets)."""
        if not self._backward_called:  # the script ran loss.backward(): the micro-batch is counted here
            if not self._recorded:
                self.record_batch(self._micro)
            self._recorded = False
        self._backward_called = False
        boundary = self._c.is_gradient_accumulation_boundary()
        if boundary and self._lr_from_groups:
            if self._fixed_settings is not None:
                client.check_fixed_settings(self.optimizer, self._fixed_settings)
            self._c.set_group_learning_rates([client.group_lr(g) for g in self.optimizer.param_groups])
        skipped = self._c.skipped_steps
        self._c.step()
        if boundary:
            self._step_applied = self._c.skipped_steps == skipped
            if self._step_applied and self.lr_scheduler is not None:
                # torch's schedulers warn unless optimizer.step() ran first: the engine's step did
                setattr(getattr(self.lr_scheduler, "optimizer", self.optimizer), "_opt_called", True)
                self.lr_scheduler.step()
            if not self._lr_from_groups and self.optimizer is not None:
                for g, lr in zip(self.optimizer.param_groups, self.get_lr()):  # what the next step uses
                    g["lr"] = lr
            self._end_of_step()

    def _attach_optimizer(self, optimizer, lr_scheduler, lr_from_groups, settings_fixed=True):
        """settings_fixed: the engine read the groups' betas/momentum/eps once (a mapped client
        optimizer); False when the client optimizer itself steps and reads its groups every time."""
        self.optimizer, self.lr_scheduler, self._lr_from_groups = optimizer, lr_scheduler, lr_from_groups
        self._fixed_settings = client.fixed_settings(optimizer) if lr_from_groups and settings_fixed else None

    def was_step_applied(self):
        """Whether the last optimizer step was applied (False after an fp16 overflow skipped it)."""
        return self._step_applied

    def _end_of_step(self):
        now = time.perf_counter()
        seconds = max(now - self._step_start, 1e-9)
        losses, samples, tokens = self._step_losses, self._step_samples, self._step_tokens
        self._step_losses, self._step_samples, self._step_tokens = [], 0, 0
        self._step_start = now
        self._last_step_loss = torch.stack(losses).double().mean() if losses else None
        moe, self._step_moe = self._step_moe, [0.0, 0, 0, 0]
        self.comms_logger.after_step(self.global_steps)
        self.flops_profiler.after_step()
        if not self.monitor.enabled:
            return
        # The MoE layers' mean l_aux and share of choices dropped (every rank runs the same layers).
        moe = torch.tensor([moe[0] / max(moe[3], 1), moe[1], moe[2]], dtype=torch.float64) if self._moe_layers else None
        if self._last_step_loss is None:  # the script's loss.backward(): no loss was given to the engine
            loss = None
        elif self.dp_world_size > 1:  # every rank joins: the step's loss averaged over the data-parallel ranks,
            # on the device the data group's collectives take (CPU for Gloo, this rank's GPU for NCCL)
            t = self._last_step_loss.reshape(1).to(self._c.context.device)
            if moe is not None:
                t = torch.cat([t, moe.to(t.device)])
            self._c.context.all_reduce(t, "avg", "data")
            loss = t[0].item()
            if moe is not None:
                moe = t[1:].cpu()
        else:
            loss = self.last_step_loss
        record = {
            "step": self.global_steps,
            "loss": loss,
            "lr": self._c.learning_rate,
            "loss_scale": self._c.loss_scale,
            "grad_norm": self._c.last_grad_norm,
            "samples_per_s": samples * self.dp_world_size / seconds,
        }
        if tokens:
            record["tokens_per_s"] = tokens * self.dp_world_size / seconds
        if moe is not None:
            record["moe_aux_loss"] = moe[0].item()
            record["moe_dropped_fraction"] = moe[2].item() / moe[1].item() if moe[1].item() > 0 else 0.0
        record["step_ms"] = 1000 * seconds
        record["skipped_steps"] = self._c.skipped_steps
        record["time_s"] = now - self._start
        self.monitor.write(record)
        self.monitor.write_events(self._step_events(record))

    def _step_events(self, record):
        """The step's events for the monitors (tessera/monitor/__init__.py names them), at the global
        sample count."""
        at = self.global_samples
        events = [("Train/Samples/train_loss", record["loss"], at), ("Train/Samples/lr", record["lr"], at)]
        if self.config["fp16"]["enabled"]:
            events.append(("Train/Samples/loss_scale", record["loss_scale"], at))
        events += [("Train/Samples/grad_norm", record["grad_norm"], at),
                   ("Train/Samples/samples_per_sec", record["samples_per_s"], at)]
        if "tokens_per_s" in record:
            events.append(("Train/Samples/tokens_per_sec", record["tokens_per_s"], at))
        if self.config["wall_clock_breakdown"]:
            now, last = self._c.wall_clock_breakdown(), self._times_at_last_step
            self._times_at_last_step = now
            last = last or {k: 0.0 for k in now}
            for tag, key in (("forward", "forward_s"), ("backward", "backward_s"),
                             ("backward_allreduce", "reduce_wait_s"), ("step", "optimizer_s"),
                             ("allgather", "allgather_wait_s")):
                events.append(("Train/Samples/elapsed_time_ms_" + tag, 1000 * (now[key] - last[key]), at))
        return events

    def zero_grad(self):
        """Zeroes the engine's gradient buffers (step() already does at each boundary)."""
        self._c.zero_grad()

    def is_gradient_accumulation_boundary(self):
        """Whether the next step() applies the optimizer."""
        return self._c.is_gradient_accumulation_boundary()

    # --- state ------------------------------------------------------------------------------------
    @property
    def last_step_loss(self):
        """The last optimizer step's loss on this rank (mean of its micro-steps); None before the first."""
        if self._last_step_loss is None:
            return None
        return self._last_step_loss.item()

    @property
    def global_steps(self):
        """Optimizer steps taken (skipped fp16 overflow steps included, as in DeepSpeed)."""
        return self._c.global_step

    @property
    def global_samples(self):
        """Samples trained on, over every data-parallel rank: global_steps × train_batch_size (DeepSpeed's
        count, the step of the monitors' events)."""
        return self.global_steps * self.config["train_batch_size"]

    @property
    def micro_steps(self):
        return self._c.micro_step

    @property
    def skipped_steps(self):
        return self._c.skipped_steps

    @property
    def loss_scale(self):
        """The current loss scale (1 without fp16)."""
        return self._c.loss_scale

    def get_lr(self):
        """The learning rate of each param group for the next step, as a list (DeepSpeed's get_lr)."""
        if self._lr_from_groups:
            return [float(g["lr"]) for g in self.optimizer.param_groups]
        lr = self._c.learning_rate
        return [lr if g is None else lr * g / self._base_lr for g in self._group_lrs]

    def get_global_grad_norm(self):
        """The global gradient norm of the last applied step (before clipping)."""
        return self._c.last_grad_norm

    @property
    def optimizer_phase(self):
        """The 1-bit optimizers' phase of the last step: "warm-up" (gradients averaged in full
        precision), "compressed" (state averaged 1-bit compressed) or "local" (0/1 Adam's steps that
        send nothing); "" for the other optimizers."""
        return self._c.optimizer_phase

    def optimizer_state(self):
        """The optimizer's state on this rank by name, "<group>.<name>" (exp_avg, exp_avg_sq, and the
        1-bit optimizers' worker_error, server_error, exp_avg_sq_fresh, ...): flat fp32 tensors laid
        out like this rank's shard, shared with the engine (a checkpoint saves and loads them)."""
        return self._c.optimizer_state()

    def gradient_accumulation_steps(self):
        return self.config["gradient_accumulation_steps"]

    def fp16_enabled(self):
        return bool(self.config["fp16"]["enabled"])

    def bfloat16_enabled(self):
        return bool(self.config["bf16"]["enabled"])

    def zero_optimization_stage(self):
        return self.config["zero_optimization"]["stage"]

    def train_micro_batch_size_per_gpu(self):
        return self.config["train_micro_batch_size_per_gpu"]

    def train_batch_size(self):
        return self.config["train_batch_size"]

    def elasticity_enabled(self):
        """DeepSpeed's: whether the config's elasticity section chose the batch layout (docs/config.md)."""
        return bool((self.config.get("elasticity") or {}).get("enabled", False))

    def optimizer_name(self):
        """The config's optimizer type as DeepSpeed names it (lower case: "adam", "onebitlamb"), or
        the client optimizer's class name."""
        section = self.config.get("optimizer") or {}
        return str(section.get("type", type(self.optimizer).__name__)).lower()

    def steps_per_print(self):
        return self.config["steps_per_print"]

    def wall_clock_breakdown(self):
        """Seconds this rank spent in each part of the step since the engine was built, summed:
        forward_s (the caller's code between backward calls: data and forward), backward_s
        (autograd, buckets reduced as they fill), reduce_wait_s (reductions still in flight after
        autograd), optimizer_s (norm, update, launching the allgathers), allgather_wait_s (waiting
        for updated parameters, in the next forward's units with overlap_comm; at ZeRO-3 the gathers
        a unit's forward or backward waits for), and
        optimizer_steps. Disjoint parts; the difference of two readings times an interval."""
        return self._c.wall_clock_breakdown()

    def memory_report(self):
        """Bytes this rank's engine buffers hold: parameters, master_parameters, gradients,
        optimizer_states, buckets, total."""
        return self._c.memory()

    def speculation_counts(self):
        """offload_optimizer.super_offload: {"kept", "restored", "chunks"}: the optimizer steps whose
        chunks, stepped on the host during the backward, were kept, those restored and redone
        (clipping took effect, a skipped step), and the chunks stepped during backwards; zeros
        without it (docs/offload.md)."""
        return self._c.speculation_counts()

    def group_memory(self):
        """Per ZeRO group on this rank: first_parameter, communicator (the group it is reduced and
        partitioned over: "data", or an MoE layer's "ep_size_N_data"), ranks, numel, shard_numel
        and state_bytes (the optimizer state this rank holds for it)."""
        return self._c.group_memory()

    def close(self):
        """Finishes the parameters' allgather and an asynchronous save (raising its error) and
        closes the metrics file (also done when the engine is garbage-collected)."""
        self._c.wait_for_parameters()
        self._c.wait_for_checkpoint()
        self.monitor.close()

    def destroy(self):
        """DeepSpeed's engine.destroy(): close(); the buffers go with the engine object."""
        self.close()

    def __repr__(self):
        return "tessera.Engine(%s, %s, global_steps=%d)" % (type(self._module).__name__, self._c.context.describe(),
                                                           self.global_steps)
