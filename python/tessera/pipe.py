"""Pipeline parallelism for Python models, with DeepSpeed's API (deepspeed.pipe):

    layers = [TiedLayerSpec("embed", Embedding, vocab, dim),
              *[LayerSpec(Block, dim) for _ in range(12)],
              LayerSpec(torch.nn.LayerNorm, dim),
              TiedLayerSpec("embed", Embedding, vocab, dim, forward_fn=lambda m, x: x @ m.weight.t())]
    model = tessera.pipe.PipelineModule(layers, num_stages=2, loss_fn=loss, partition_method="parameters")
    engine, _, _, _ = tessera.initialize(model=model, config=config)      # pipeline.stages = num_stages
    for step in range(steps):
        loss = engine.train_batch(data_iter)    # gradient_accumulation_steps micro-batches, then the step

A rank builds only its stage's layers (LayerSpec defers construction; the partition counts
parameters on the meta device). The first stage reads the inputs of each (inputs, labels) pair the
iterator yields, the last stage the labels; train_batch returns the batch's mean loss on every rank.
Weights of a TiedLayerSpec key used on several stages start equal (broadcast from the first) and
have their gradients summed between those stages before each step (engine/pipeline_engine.h).
The schedule (pipeline.schedule: "1f1b", "gpipe", "zb_h1", "interleaved_1f1b" or "zb_v"), the executor and
the engines are C++. ZB-H1 splits each backward of a stage's layers into its input's gradient and its
weights' with autograd itself (no change to the modules). Interleaved 1F1B needs the module cut into
num_stages × virtual_stages chunks: PipelineModule(..., virtual_stages=v) with pipeline.virtual_stages
v in the config; stage s then holds chunks s, s + num_stages, ... ZB-V needs PipelineModule(...,
placement="v"): stage s holds chunks s and 2·num_stages − 1 − s, stage 0 reads the labels too.
"""
import functools
import json

import torch
import torch.nn as nn

from . import _C, comm, tensor_parallel
from ._checkpoint_calls import CheckpointCalls

__all__ = ["LayerSpec", "TiedLayerSpec", "PipelineModule", "PipelineEngine"]


class LayerSpec:
    """A layer built later, on the stage that owns it: typename(*module_args, **module_kwargs)."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not callable(typename):
            raise TypeError("tessera.pipe.LayerSpec: typename must be a class, got %s" % type(typename).__name__)
        self.typename, self.module_args, self.module_kwargs = typename, module_args, module_kwargs

    def build(self):
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self):
        return "LayerSpec(%s)" % self.typename.__name__


class TiedLayerSpec(LayerSpec):
    """A layer whose `tied_weight_attr` parameters (names, dotted for submodules: "wte.weight") are
    shared by every occurrence of `key` (the GPT's embedding and output projection);
    `forward_fn(module, x)` replaces module(x) where given."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr="weight", **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key, self.forward_fn = key, forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)

    def __repr__(self):
        return "TiedLayerSpec(%r, %s)" % (self.key, self.typename.__name__)


def _type_name(layer):
    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, nn.Module):
        return type(layer).__name__
    return getattr(layer, "__name__", type(layer).__name__)


def _count_parameters(layer):
    if isinstance(layer, LayerSpec):
        with torch.device("meta"):  # no memory, no random draws taken from the real generator
            return sum(p.numel() for p in layer.build().parameters())
    if isinstance(layer, nn.Module):
        return sum(p.numel() for p in layer.parameters())
    return 0


class PipelineModule(nn.Module):
    """This rank's stage of `layers` (LayerSpec, TiedLayerSpec, nn.Module or plain callables, run in
    order), cut into `num_stages` stages by `partition_method` ("parameters", "uniform" or
    "type:REGEX", as DeepSpeed). `loss_fn(outputs, labels)` runs on the last stage. With
    `seed_layers`, layer i is built after torch.manual_seed(base_seed + i), so its initial values do
    not depend on the partition (a 1-stage module equals any other cut of it). `tensor_parallel` t
    makes the process groups for t x num_stages when none exist; split the stage's layers then with
    tessera.tensor_parallel.parallelize(model, {"local_layers.*.<linear>": "colwise", ...}).
    `virtual_stages` v (pipeline.virtual_stages, for the "interleaved_1f1b" schedule) cuts the layers
    into num_stages·v chunks; this stage holds chunks stage_id, stage_id + num_stages, ... (Megatron's
    virtual pipeline), forward(x) runs its first and forward_chunk(c, x) its c-th. `placement="v"`
    (for the "zb_v" schedule) cuts them into 2·num_stages chunks placed in a V: this stage holds
    chunks stage_id and 2·num_stages − 1 − stage_id, so stage 0 holds both ends of the model and
    computes the loss (loss_fn is needed there)."""

    def __init__(self, layers, num_stages=None, loss_fn=None, partition_method="parameters", seed_layers=False,
                 base_seed=1234, activation_checkpoint_interval=0, tensor_parallel=None, virtual_stages=1,
                 placement="loop"):
        super().__init__()
        if placement not in ("loop", "v"):
            raise ValueError("tessera.pipe.PipelineModule: placement must be \"loop\" or \"v\" (zb_v), got %r" % (placement,))
        self.placement = placement
        if placement == "v" and int(virtual_stages) == 1:
            virtual_stages = 2  # the V: two chunks a stage
        if placement == "v" and int(virtual_stages) != 2:
            raise ValueError("tessera.pipe.PipelineModule: placement \"v\" holds 2 chunks a stage; virtual_stages must "
                             "be 2, got %r" % virtual_stages)
        if int(virtual_stages) < 1:
            raise ValueError("tessera.pipe.PipelineModule: virtual_stages must be >= 1 (pipeline.virtual_stages), got %r"
                             % virtual_stages)
        self.virtual_stages = int(virtual_stages)
        if num_stages is None or int(num_stages) < 1:
            raise ValueError("tessera.pipe.PipelineModule: num_stages must be >= 1 (pipeline.stages), got %r" % num_stages)
        if int(activation_checkpoint_interval) < 0:
            raise ValueError("tessera.pipe.PipelineModule: activation_checkpoint_interval must be >= 0, got %r"
                             % activation_checkpoint_interval)
        self.activation_checkpoint_interval = int(activation_checkpoint_interval)
        layers = list(layers)
        # The process groups: those already made (tessera.comm.init_distributed(tensor_parallel=t,
        # pipeline_stages=p)), else made here with `tensor_parallel` (default 1) x num_stages.
        if comm.axes_made() and tensor_parallel is None:
            ctx = comm.parallel_context()
            if ctx.pipe != int(num_stages):
                raise ValueError("tessera.pipe.PipelineModule: num_stages is %d but the process groups were made for "
                                 "pipeline_stages %d" % (int(num_stages), ctx.pipe))
        else:
            ctx = comm.parallel_context("gloo" if not torch.cuda.is_available() else "auto", int(tensor_parallel or 1),
                                    int(num_stages))
        self.num_stages = ctx.pipe
        self.stage_id = ctx.group_rank("pipe")
        self.loss_fn = loss_fn
        self.partition_method = partition_method
        infos = [(_type_name(l), _count_parameters(l)) for l in layers]
        self.parts = _C.pipeline.partition_chunks(infos, self.num_stages, self.virtual_stages, partition_method)
        if comm.get_rank() == 0:
            print("tessera.pipe: %d stages by %s\n%s" % (
                self.num_stages, partition_method,
                _C.pipeline.describe_partition(infos, self.parts, self.num_stages, placement)), end="", flush=True)
        chunks, p = len(self.parts) - 1, self.num_stages
        # Which stage holds each model chunk, and this stage's chunks (ChunkLayout in C++).
        layout = _C.pipeline.chunk_layout(p, self.virtual_stages, placement)
        self.loss_stage = layout["loss_stage"]
        holder = {i: layout["stage_of"][c] for c in range(chunks) for i in range(self.parts[c], self.parts[c + 1])}
        # Which stages hold each tied key (its weights' gradients are summed over them).
        self._tied_stages = {}
        for i, layer in enumerate(layers):
            if isinstance(layer, TiedLayerSpec):
                self._tied_stages.setdefault(layer.key, set()).add(holder[i])
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs = {}
        self.chunk_funcs = []  # per model chunk this stage holds: its layers' forwards, in order
        self.local_layers = nn.ModuleList()  # the stage's modules, in order, for parameters()
        self._global_index = []  # per local layer: its index in the whole model's layers
        self.layers_by_index = {}  # layer index -> its module (or callable) on this stage
        for chunk in layout["chunks_of"][self.stage_id]:
            funcs = []
            for i in range(self.parts[chunk], self.parts[chunk + 1]):
                funcs.append(self._build(layers[i], i, seed_layers, base_seed))
                self.layers_by_index[i] = self.tied_modules[layers[i].key] if isinstance(layers[i], TiedLayerSpec) \
                    else funcs[-1]
            self.chunk_funcs.append(funcs)
        if self.stage_id == self.loss_stage and loss_fn is None:
            raise ValueError("tessera.pipe.PipelineModule: loss_fn is required (stage %d computes the loss)" % self.loss_stage)
        self._context = ctx
        self._synchronize_tied_weights()

    def _build(self, layer, i, seed_layers, base_seed):
        """Layer i's forward on this stage (built here from its spec)."""
        if seed_layers:
            torch.manual_seed(base_seed + i)
        if isinstance(layer, TiedLayerSpec):
            if layer.key not in self.tied_modules:
                self.tied_modules[layer.key] = layer.build()
                self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
            module, fn = self.tied_modules[layer.key], layer.forward_fn
            return (lambda m, f: (lambda x: f(m, x)) if f else m)(module, fn)
        if isinstance(layer, LayerSpec):
            module = layer.build()
            self.local_layers.append(module)
            self._global_index.append(i)
            return module
        if isinstance(layer, nn.Module):
            self.local_layers.append(layer)
            self._global_index.append(i)
            return layer
        if callable(layer):
            return layer
        raise TypeError("tessera.pipe.PipelineModule: layers[%d] is a %s; expected a LayerSpec, an nn.Module or "
                        "a callable" % (i, type(layer).__name__))

    def parameter_names(self):
        """{id(parameter): name} by the layer's place in the whole model ("layers.<i>.<name>", and
        "tied.<key>.<name>" for a tied module), not by this stage's local list: the names a checkpoint
        finds them by, so that it loads at another number of stages (DeepSpeed names its layer files
        by the global index likewise)."""
        names = {}
        for key, module in self.tied_modules.items():
            names.update((id(p), "tied.%s.%s" % (key, n)) for n, p in module.named_parameters())
        for i, module in zip(self._global_index, self.local_layers):
            names.update((id(p), "layers.%d.%s" % (i, n)) for n, p in module.named_parameters())
        return names

    def tied_groups(self):
        """[(key, [parameters], [stages])] for every tied key this stage holds and shares."""
        out = []
        for key, module in self.tied_modules.items():
            stages = sorted(self._tied_stages[key])
            if len(stages) > 1:
                out.append((key, [functools.reduce(getattr, a.split("."), module) for a in self.tied_weight_attrs[key]],
                            stages))
        return out

    def _synchronize_tied_weights(self):
        # Every holder of a tied key starts from the first holder's values (DeepSpeed does the same).
        for key, params, stages in self.tied_groups():
            for p in params:
                with torch.no_grad():
                    _C.pipeline.broadcast_between_stages(self._context, p.data, stages, stages[0])

    def forward(self, x):
        return self.forward_chunk(0, x)

    def forward_chunk(self, chunk, x):
        """This stage's model chunk `chunk` (0 .. virtual_stages - 1) on x."""
        funcs = self.chunk_funcs[chunk]
        k = self.activation_checkpoint_interval
        if k == 0 or not torch.is_grad_enabled():
            for f in funcs:
                x = f(x)
            return x
        # Every k layers run under tessera.checkpointing.checkpoint: only each segment's input is
        # kept, the segment runs again in backward (DeepSpeed's activation_checkpoint_interval).
        from . import checkpointing
        for start in range(0, len(funcs), k):
            x = checkpointing.checkpoint(self._run_segment(funcs[start:start + k]), x)
        return x

    @staticmethod
    def _run_segment(funcs):
        def run(x):
            for f in funcs:
                x = f(x)
            return x
        return run

    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.num_stages - 1

    def is_loss_stage(self):
        """The stage that computes the loss: the last, or stage 0 with placement "v"."""
        return self.stage_id == self.loss_stage


class _StageModel(_C.pipeline.StageModel):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, input):
        return self.module(input)

    def forward_chunk(self, chunk, input):
        return self.module.forward_chunk(chunk, input)

    def loss(self, output, labels):
        return self.module.loss_fn(output, labels)


class PipelineEngine(CheckpointCalls):
    """What tessera.initialize returns for a PipelineModule (DeepSpeed's PipelineEngine)."""

    def __init__(self, module, cfg, context, groups, tied):
        self.module = module
        self._stage_model = _StageModel(module)
        self._c = _C.pipeline.Engine(cfg, context, self._stage_model, groups, tied)
        self._data_iter = None
        self.config = json.loads(cfg.to_json())
        # DeepSpeed's PipelineEngine writes train_loss, eval_loss, lr and loss_scale (docs/monitoring.md).
        from .comms_logger import CommsLogger
        from .monitor import MonitorMaster
        self.monitor = MonitorMaster(self.config, context.rank)
        self.comms_logger = CommsLogger(context, self.config.get("comms_logger"))
        # ZeRO-3: the stage's parameters are partitioned between batches; tessera.zero.GatheredParameters
        # makes them whole for a while (through this engine).
        from . import zero
        zero.register_engine(self, [p for params, *_ in groups for p in params])

    def set_dataiterator(self, iterator):
        self._data_iter = iterator

    def _source(self, data_iter):
        it = data_iter if data_iter is not None else self._data_iter
        if it is None:
            raise ValueError("tessera.pipe: train_batch/eval_batch need a data iterator (or set_dataiterator)")
        return lambda: tuple(next(it))

    def train_batch(self, data_iter=None):
        """gradient_accumulation_steps micro-batches through the pipeline and the optimizer step;
        the batch's mean loss on every rank (a float)."""
        self.module.train()
        loss = self._c.train_batch(self._source(data_iter))
        events = [("Train/Samples/train_loss", loss), ("Train/Samples/lr", self._c.learning_rate),
                  ("Train/Samples/grad_norm", self._c.grad_norm)]
        if self.config["fp16"]["enabled"]:
            events.append(("Train/Samples/loss_scale", self._c.loss_scale))
        self.monitor.write_events([(tag, value, self.global_samples) for tag, value in events])
        self.comms_logger.after_step(self.global_steps)
        return loss

    def eval_batch(self, data_iter):
        """The same micro-batches forward only, without gradients: the mean loss on every rank."""
        self.module.eval()
        try:
            loss = self._c.eval_batch(self._source(data_iter))
        finally:
            self.module.train()
        self.monitor.write_events([("Train/Samples/eval_loss", loss, self.global_samples)])
        return loss

    def is_first_stage(self):
        return self.module.is_first_stage()

    def is_last_stage(self):
        return self.module.is_last_stage()

    @property
    def global_steps(self):
        return self._c.global_step

    @property
    def global_samples(self):
        """global_steps × train_batch_size (DeepSpeed's count, the monitors' step)."""
        return self.global_steps * self.config["train_batch_size"]

    def close(self):
        """Closes the monitors' files."""
        self.monitor.close()

    def get_global_grad_norm(self):
        return self._c.grad_norm

    def get_lr(self):
        return [self._c.learning_rate]

    def last_report(self):
        """The last batch as the executor ran it: activations held, idle fraction, seconds, losses."""
        return self._c.last_report()


def initialize_pipeline(module, cfg, weight_decay_groups=None):
    """tessera.initialize's path for a PipelineModule: the stage's parameters in one group, each
    shared tied key in a group of its own (listed with its stages)."""
    pipeline = json.loads(cfg.to_json()).get("pipeline", {})
    interval = pipeline.get("activation_checkpoint_interval", 0)
    if interval and not module.activation_checkpoint_interval:
        module.activation_checkpoint_interval = int(interval)  # the config's, where the module set none
    schedule = pipeline.get("schedule", "1f1b")
    if schedule in ("zb_h1", "zb_v") and module.activation_checkpoint_interval:
        raise ValueError("tessera.initialize: activation_checkpoint_interval %d with pipeline.schedule \"%s\": a "
                         "recomputed segment computes its weights' gradients with its input's, which a zero-bubble "
                         "schedule splits; use \"1f1b\" or \"interleaved_1f1b\"" % (module.activation_checkpoint_interval,
                                                                                 schedule))
    if cfg.pipe > 1 and (schedule == "zb_v") != (module.placement == "v"):
        raise ValueError("tessera.initialize: pipeline.schedule \"%s\" with a PipelineModule placed %r; \"zb_v\" runs "
                         "the chunks placed in a V (PipelineModule(..., placement=\"v\")) and the other schedules "
                         "the loop placement" % (schedule, module.placement))
    virtual = pipeline.get("virtual_stages", 1)
    if virtual != module.virtual_stages:
        raise ValueError("tessera.initialize: the config's pipeline.virtual_stages is %d but the PipelineModule was cut "
                         "into %d chunk(s) per stage; pass virtual_stages=%d to PipelineModule" % (
                             virtual, module.virtual_stages, virtual))
    if cfg.pipe != module.num_stages:
        raise ValueError("tessera.initialize: the PipelineModule has %d stages, the config's pipeline.stages is %d"
                         % (module.num_stages, cfg.pipe))
    if cfg.tensor != module._context.tensor:
        raise ValueError("tessera.initialize: the PipelineModule was built for tensor_parallel %d, the config's "
                         "tensor_parallel.tp_size is %d" % (module._context.tensor, cfg.tensor))
    if cfg.tensor > 1 and not any(hasattr(p, "_tessera_tensor_parallel") for p in module.parameters()):
        raise ValueError("tessera.initialize: tensor_parallel.tp_size is %d but no layer of this stage is split; apply "
                         "tessera.tensor_parallel.parallelize(model, plan) to the PipelineModule first (its layers are "
                         "model.local_layers.<i>)" % cfg.tensor)
    names = module.parameter_names()
    tied = module.tied_groups()
    tied_ids = {id(p) for _, params, _ in tied for p in params}
    own = [p for p in module.parameters() if p.requires_grad and id(p) not in tied_ids]

    def sliced(params):  # tensor-parallel slices (tessera.tensor_parallel.parallelize on the stage's layers)
        return [tensor_parallel.split_of(p) for p in params]
    groups = [(own, None, None, "stage", [names.get(id(p), "") for p in own], sliced(own), "", 1.0)] if own else []
    tied_spec = []
    for key, params, stages in tied:
        tied_spec.append((len(groups), stages))
        groups.append((params, None, None, "tied:%s" % key, [names.get(id(p), "") for p in params], sliced(params), "", 1.0))
    return PipelineEngine(module, cfg, module._context, groups, tied_spec)
