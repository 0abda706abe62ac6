"""DeepSpeed checkpoints into tessera's format, once:

    tessera checkpoint import-deepspeed DS_DIR OUT [--tag global_step400]
    python -m tessera.deepspeed_checkpoint DS_DIR OUT          (the same)
    tessera.deepspeed_checkpoint.import_deepspeed(DS_DIR, OUT)  (from Python; returns OUT/<tag>)

then `engine.load_checkpoint(OUT)` at any layout (docs/checkpoints.md, "From DeepSpeed").

What is read: a checkpoint directory DeepSpeed 0.19 wrote with ZeRO stage 1, 2 or 3, in fp32, bf16
or fp16 (its layout: the model states file(s) with the step counters, the LR scheduler, the
parameters' names and shapes in flattening order, and one `*_optim_states.pt` per data-parallel
rank with that rank's fp32 partition and its optimizer's state). Neither DeepSpeed nor anything in
the files runs: torch.load(weights_only=True) reads them, with DeepSpeed's few pickled classes
(its loss scalers, ZeroStageEnum, fragment_address) read back as plain records.

What is written: a tessera checkpoint (engine/checkpoint/import_writer.h) whose rank files are
DeepSpeed's ranks' partitions as DeepSpeed cut them, each parameter's pieces recorded as element
ranges of the whole parameter:
  ZeRO 1/2  the group's flat partition of rank r holds fragments of parameters at the offsets
            `param_slice_mappings` gives; a parameter's fragments follow each other in rank order
  ZeRO 3    every parameter is cut on its own: rank r holds elements [r·c, r·c + c) (c = ⌈n/W⌉,
            the last piece shorter), one after another in `param_shapes` order, across sub-groups
Every per-element optimizer state (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer) is cut
like the weights. The counters map to tessera's (docs/checkpoints.md): the global step and the
skipped steps as they are, Adam's step count and the scheduler's `last_batch_iteration` as the
applied step they started from, DeepSpeed's loss scaler (scale, iteration, last overflow,
hysteresis) to tessera's, and the top-level keys DeepSpeed merged in from `client_state` (those
JSON can hold) as the client state. Only one rank file is in memory at a time.

Not imported, each said by name: tensor- or pipeline-parallel checkpoints (mp_rank_01..., layer_*
files), MoE expert files, frozen parameters, buffers (tessera's checkpoints hold the trained
parameters; buffers come from the model's construction), the data sampler, RNG states.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

import torch

# DeepSpeed's classes that its checkpoints pickle; read as records (attributes, or the call's args).
_DEEPSPEED_CLASSES = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)

# The keys of DeepSpeed's model states file that are its own (the rest came from client_state).
_DEEPSPEED_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
    "checkpoint_parallel_dimensions", "ds_config", "ds_version", "universal_checkpoint_info",
}


class _Record:
    """One of DeepSpeed's pickled objects: its constructor's args and its attributes."""
    args = ()
    kind = "?"

    def __init__(self, *args):  # an Enum (ZeroStageEnum) is rebuilt by a call with its value
        self.args = args

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})


def _safe_globals():
    return [(type(name.rsplit(".", 1)[1], (_Record,), {"kind": name.rsplit(".", 1)[1]}), name)
            for name in _DEEPSPEED_CLASSES]


def _load(path):
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - the file and torch's reason, whatever it is
        raise ValueError("tessera: %s cannot be read as a DeepSpeed checkpoint file: %s" % (path, e)) from e


def _natural(s):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def resolve(ds_dir, tag=None):
    """(checkpoint directory, tag): ds_dir is DeepSpeed's save_dir (its `latest` or `tag` names the
    checkpoint) or a checkpoint directory itself."""
    if not os.path.isdir(ds_dir):
        raise ValueError("tessera: %s: no such directory" % ds_dir)
    if glob.glob(os.path.join(ds_dir, "*_model_states.pt")) and tag is None:
        return ds_dir, os.path.basename(os.path.normpath(ds_dir))
    if tag is None:
        latest = os.path.join(ds_dir, "latest")
        if not os.path.isfile(latest):
            raise ValueError("tessera: %s holds no DeepSpeed checkpoint: no *_model_states.pt and no `latest` file "
                             "(pass the tag with --tag)" % ds_dir)
        tag = open(latest).read().strip()
    path = os.path.join(ds_dir, tag)
    if not glob.glob(os.path.join(path, "*_model_states.pt")):
        raise ValueError("tessera: %s is not a DeepSpeed checkpoint: no *_model_states.pt in it" % path)
    return path, tag


def _files(path):
    names = sorted(os.listdir(path), key=_natural)
    refused = [n for n in names if n.startswith("layer_") or "expert" in n or re.search(r"mp_rank_(?!00_)\d+", n)]
    if refused:
        raise ValueError("tessera: %s was saved with DeepSpeed's pipeline, tensor (model) or expert parallelism (%s): "
                         "tessera imports ZeRO 1-3 checkpoints of data-parallel runs; DeepSpeed's "
                         "ds_to_universal or zero_to_fp32 gives whole weights that load_module_only can take"
                         % (path, ", ".join(refused[:3])))
    optim = [n for n in names if n.endswith("_optim_states.pt")]
    model = [n for n in names if n.endswith("_model_states.pt")]
    by_rank = {}
    for n in optim:
        m = re.search(r"zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$", n)
        if m:
            by_rank[int(m.group(1))] = os.path.join(path, n)
    return [os.path.join(path, n) for n in model], [by_rank[r] for r in sorted(by_rank)], sorted(by_rank)


def _int(v):
    return int(v.item()) if torch.is_tensor(v) else int(v)


def _zero_stage(osd, ds_config):
    stage = osd.get("zero_stage")
    if stage is None:  # BF16_Optimizer (bf16 with ZeRO 0/1): ZeRO-1's partitions
        return int(ds_config.get("zero_optimization", {}).get("stage", 1)) or 1
    return _int(stage.args[0]) if isinstance(stage, _Record) else _int(stage)


def _per_element(state, numel):
    """The optimizer's per-element states of one flat partition (its tensors of at least `numel`
    elements, as DeepSpeed may keep the alignment padding after them), in the optimizer's order."""
    return [(k, v.reshape(-1)) for k, v in state.items() if torch.is_tensor(v) and v.dim() == 1 and v.numel() >= numel]


def _scaler(osd):
    s = osd.get("loss_scaler")
    if not isinstance(s, _Record):
        return {"type": "none", "scale": 1.0}
    scale = float(getattr(s, "cur_scale", 1.0))
    if s.kind == "DynamicLossScaler" or getattr(s, "dynamic", False):
        return {"type": "dynamic", "scale": scale, "cur_iter": int(getattr(s, "cur_iter", 0)),
                "last_overflow_iter": int(getattr(s, "last_overflow_iter", -1)),
                "cur_hysteresis": int(getattr(s, "cur_hysteresis", getattr(s, "delayed_shift", 1)))}
    return {"type": "none" if scale == 1.0 else "static", "scale": scale}


class _Cutter:
    """Turns one rank's optimizer file into tessera pieces: (name, shape, dtype, begin, states)."""

    def __init__(self, stage, world, param_shapes, dtype):
        self.stage, self.world, self.dtype = stage, world, dtype
        self.groups = [[(name, [int(d) for d in shape]) for name, shape in g.items()] for g in param_shapes]
        self.shapes = {name: shape for g in self.groups for name, shape in g}
        self.consumed = {name: 0 for name in self.shapes}  # ZeRO 1/2: elements handed out so far
        self.states = None  # the per-element state names, in order (the same in every file)
        self.steps = set()

    def _check_states(self, names, where):
        if self.states is None:
            self.states = names
        elif names != self.states:
            raise ValueError("tessera: %s holds optimizer states %s; the other ranks' files hold %s"
                             % (where, names, self.states))

    def _piece(self, name, begin, tensors):
        return (name, self.shapes[name], self.dtype, begin, [(k, t.float().contiguous()) for k, t in tensors])

    def zero12(self, osd, where):
        parts = osd["single_partition_of_fp32_groups"]
        base = osd["base_optimizer_state"]
        if isinstance(base, list):  # elastic_checkpoint: one state per group, the step apart
            group_states = base
            if "base_optimizer_state_step" in osd:
                self.steps.add(_int(osd["base_optimizer_state_step"]))
        else:
            group_states = [base["state"].get(i, {}) for i in range(len(parts))]
        pieces = []
        for i, part in enumerate(parts):
            state = group_states[i]
            if "step" in state:
                self.steps.add(_int(state["step"]))
            per_element = _per_element(state, part.numel())
            self._check_states([k for k, _ in per_element], where)
            for name, fragment in osd["param_slice_mappings"][i].items():
                numel, start = _int(fragment.numel), _int(fragment.start)  # a dataclass's fields
                if name not in self.shapes:
                    raise ValueError("tessera: %s maps %s, which the model states file does not list" % (where, name))
                begin = self.consumed[name]
                self.consumed[name] += numel
                pieces.append(self._piece(name, begin, [("fp32", part[start:start + numel])] +
                                          [(k, v[start:start + numel]) for k, v in per_element]))
        return pieces

    def zero3(self, osd, rank, where):
        flat = torch.cat([t.reshape(-1) for t in osd["fp32_flat_groups"]])
        inner = osd["optimizer_state_dict"]
        sub_states = [inner["state"].get(j, {}) for j in range(len(osd["fp32_flat_groups"]))]
        for s in sub_states:
            if "step" in s:
                self.steps.add(_int(s["step"]))
        per_group = [_per_element(s, t.numel()) for s, t in zip(sub_states, osd["fp32_flat_groups"])]
        self._check_states([k for k, _ in per_group[0]] if per_group else [], where)
        states = {k: torch.cat([dict(g)[k][:t.numel()] for g, t in zip(per_group, osd["fp32_flat_groups"])])
                  for k in self.states}
        pieces, offset = [], 0
        for g in self.groups:
            for name, shape in g:
                numel = math.prod(shape)
                chunk = -(-numel // self.world)
                begin = rank * chunk
                length = max(0, min(chunk, numel - begin))
                if length:
                    pieces.append(self._piece(name, begin, [("fp32", flat[offset:offset + length])] +
                                              [(k, states[k][offset:offset + length]) for k in self.states]))
                offset += chunk
        if offset != flat.numel():
            raise ValueError("tessera: %s holds %d fp32 elements; its parameters' ZeRO-3 partitions (%d ranks) take %d"
                             % (where, flat.numel(), self.world, offset))
        return pieces

    def check_covered(self, path):
        if self.stage == 3:
            return
        short = [n for n, c in self.consumed.items() if c != math.prod(self.shapes[n])]
        if short:
            n = short[0]
            raise ValueError("tessera: the optimizer files of %s hold %d of the %d elements of %s (and %d more "
                             "parameters short): a rank's file is missing or from another save"
                             % (path, self.consumed[n], math.prod(self.shapes[n]), n, len(short) - 1))


def import_deepspeed(ds_dir, out_dir, tag=None, optimizer=None, out_tag=None, verbose=True):
    """Writes the DeepSpeed checkpoint in ds_dir (its `latest`, or `tag`) as the tessera checkpoint
    out_dir/<tag> (`latest` in out_dir names it). optimizer: the tessera optimizer type its state is
    (default: DeepSpeed's config's optimizer.type). Returns the checkpoint's path."""
    from tessera import _C

    path, tag = resolve(ds_dir, tag)
    model_files, optim_files, ranks = _files(path)
    notes = []
    common = _load(model_files[0])
    if "param_shapes" not in common or not optim_files:
        raise ValueError("tessera: %s was saved without ZeRO (no param_shapes, no *_optim_states.pt): tessera imports "
                         "ZeRO 1-3 checkpoints; run DeepSpeed with zero_optimization.stage 1-3 or load the "
                         "module's weights alone" % path)
    ds_config = common.get("ds_config") or {}
    world = int(common.get("dp_world_size") or len(optim_files))
    if ranks != list(range(world)):
        raise ValueError("tessera: %s has optimizer files of data-parallel ranks %s; the run had %d ranks"
                         % (path, ranks, world))
    dtype, compute = "F32", "fp32"
    if ds_config.get("bf16", {}).get("enabled"):
        dtype, compute = "BF16", "bf16"
    elif ds_config.get("fp16", {}).get("enabled"):
        dtype, compute = "F16", "fp16"
    optimizer = optimizer or ds_config.get("optimizer", {}).get("type")
    if not optimizer:
        raise ValueError("tessera: %s: DeepSpeed's config names no optimizer (a client optimizer ran): say which "
                         "tessera optimizer type its state is with --optimizer" % path)

    first = None
    cutter = None
    writer = None
    for rank, f in enumerate(optim_files):
        osd = _load(f)["optimizer_state_dict"]
        if cutter is None:
            first = osd
            stage = _zero_stage(osd, ds_config)
            cutter = _Cutter(stage, world, common["param_shapes"], dtype)
        pieces = cutter.zero3(osd, rank, f) if cutter.stage == 3 else cutter.zero12(osd, f)
        if writer is None:
            layout = {"world_size": world, "data_parallel": world, "zero_stage": cutter.stage, "optimizer": optimizer,
                      "compute_dtype": compute, "states": ["fp32"] + list(cutter.states)}
            writer = _C.checkpoint.ImportWriter(out_dir, out_tag or tag, json.dumps(layout))
        writer.add_file(pieces)
        del osd, pieces
    cutter.check_covered(path)
    if not cutter.states:
        notes.append("no optimizer state (saved before the first step): load it with load_optimizer_states=False")

    global_steps = int(common.get("global_steps", 0))
    skipped = int(common.get("skipped_steps", 0))
    applied = global_steps - skipped
    if len(cutter.steps) > 1:
        raise ValueError("tessera: %s: the parameter groups' optimizers count different steps %s"
                         % (path, sorted(cutter.steps)))
    optimizer_steps = cutter.steps.pop() if cutter.steps else applied
    scheduler = common.get("lr_scheduler") or {}
    schedule_steps = int(scheduler["last_batch_iteration"]) + 1 if "last_batch_iteration" in scheduler else applied
    gas = int(ds_config.get("gradient_accumulation_steps", 1) or 1)
    engine = {"global_step": global_steps, "micro_step": global_steps * gas, "skipped_steps": skipped,
              "optimizer_step_base": max(0, applied - optimizer_steps),
              "schedule_step_base": max(0, applied - schedule_steps),
              "loss_scaler": _scaler(first),
              "lr_scheduler": ds_config.get("scheduler", {}).get("type", "constant")}
    client_state = {}
    for k, v in common.items():
        if k in _DEEPSPEED_KEYS:
            continue
        try:
            json.dumps(v)
            client_state[k] = v
        except TypeError:
            notes.append("client_state key %r is not JSON (%s): left out" % (k, type(v).__name__))
    if common.get("frozen_param_shapes"):
        notes.append("%d frozen parameter(s) left out (their values come from the model)" % len(common["frozen_param_shapes"]))
    if common.get("buffer_names"):
        notes.append("%d buffer(s) left out (their values come from the model)" % len(common["buffer_names"]))
    out = writer.commit(json.dumps(engine), json.dumps(client_state))
    if verbose:
        n = sum(len(g) for g in common["param_shapes"])
        print("[tessera] imported DeepSpeed %s checkpoint %s (ZeRO %d, %d ranks, %s, %s, %d parameters) at step %d "
              "into %s" % (common.get("ds_version", "?"), path, cutter.stage, world, compute, optimizer, n,
                           global_steps, out))
        for note in notes:
            print("[tessera]   %s" % note)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tessera checkpoint import-deepspeed",
                                 description="Writes a DeepSpeed ZeRO 1-3 checkpoint as a tessera checkpoint, which "
                                             "then loads at any layout (docs/checkpoints.md)")
    ap.add_argument("dir", help="DeepSpeed's save directory (its `latest` checkpoint) or a checkpoint directory")
    ap.add_argument("out", help="the tessera save directory to write (OUT/<tag>, OUT/latest)")
    ap.add_argument("--tag", help="the DeepSpeed checkpoint's tag (default: the one `latest` names)")
    ap.add_argument("--optimizer", help="the tessera optimizer type the state is (default: DeepSpeed's config's)")
    args = ap.parse_args(argv)
    try:
        import_deepspeed(args.dir, args.out, tag=args.tag, optimizer=args.optimizer)
    except (ValueError, RuntimeError, OSError) as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
