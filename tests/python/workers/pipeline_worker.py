"""One rank of a pipeline-parallel run (tessera launch): a small GPT (examples/python/models.py's
blocks between tied embeddings) as a tessera.pipe.PipelineModule, trained STEPS steps through tessera.initialize / train_batch, against
the same layers trained in plain PyTorch in this process on the same data (every rank computes the
reference whole). Checks each step's loss and global gradient norm, and every parameter of this
rank's stage; prints "pipeline ok on rank R case I". Exits non-zero with the first difference.

    pipeline_worker.py STAGES SCHEDULE ZERO_STAGE OPTIMIZER [CHECKPOINT_INTERVAL [TP]] [+ STAGES ...]
        (OPTIMIZER: SGD, AdamW or bf16 (SGD in bf16); TP > 1 splits each block's MLP over a tensor
        group of TP ranks; SCHEDULE interleaved_1f1b cuts the model into 2 chunks per stage, zb_v into
        2 per stage placed in a V). Cases
        separated by "+" run one after the other by the same ranks, each with its own model and
        engine (one grid: a process's first initialize fixes the degrees of its process groups).
    pipeline_worker.py STAGES SCHEDULE ZERO_STAGE fp16     the loss scaler under a pipeline: an initial
        scale of 2^20 overflows; every stage must skip the same steps and agree on the scale
    pipeline_worker.py STAGES zb_v 1 placement     PipelineModule(placement="v") and its errors
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera
from tessera.pipe import LayerSpec, PipelineModule, TiedLayerSpec

VOCAB, DIM, HEADS, SEQ, MICRO, ACCUMULATION, STEPS, SEED = 32, 16, 2, 8, 2, 4, 4, 1234

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Block  # noqa: E402  the example GPT's transformer block (attention and MLP)
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown


class Embeddings(nn.Module):
    """The GPT's token and position embeddings; the tied head reads wte again on the last stage."""

    def __init__(self, vocab, block_size, dim):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block_size, dim)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))


def head(module, x):
    return F.linear(x, module.wte.weight)  # the tied output projection: logits against the embedding


def loss_fn(logits, labels):
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


TIED = ["wte.weight", "wpe.weight"]  # the whole module is shared (the head leaves wpe's gradient 0)


def specs():
    """The example GPT as a layer list: embeddings, 4 blocks, the final norm, the tied head."""
    return [TiedLayerSpec("embed", Embeddings, VOCAB, SEQ, DIM, tied_weight_attr=TIED),
            *[LayerSpec(Block, DIM, HEADS) for _ in range(4)], LayerSpec(nn.LayerNorm, DIM),
            TiedLayerSpec("embed", Embeddings, VOCAB, SEQ, DIM, forward_fn=head, tied_weight_attr=TIED)]


def micro_batch(step, m, d):
    g = torch.Generator().manual_seed(100000 * step + 100 * m + d)
    ids = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def reference_layers():
    """The layers whole, as PipelineModule(seed_layers=True) builds them; the tied key built once."""
    layers, tied = [], {}
    for i, spec in enumerate(specs()):
        torch.manual_seed(SEED + i)
        if isinstance(spec, TiedLayerSpec):
            if spec.key not in tied:
                tied[spec.key] = spec.build()
            layers.append(tied[spec.key])
        else:
            layers.append(spec.build())
    return layers


def run_reference(layers, optimizer_name, dp):
    params = list({id(p): p for l in layers for p in l.parameters()}.values())
    # Adam's eps at 1e-4: the attention's key bias has a gradient of rounding noise only (softmax
    # ignores a shift shared by all keys), which eps 1e-8 would turn into lr-sized moves that differ
    # with the summation order; 1e-4 keeps them below the tolerance and leaves real gradients alone.
    opt = torch.optim.SGD(params, lr=0.1) if optimizer_name == "SGD" else \
        torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, eps=1e-4)
    losses, norms = [], []
    for step in range(STEPS):
        opt.zero_grad()
        total = 0.0
        for m in range(ACCUMULATION):
            for d in range(dp):
                x, y = micro_batch(step, m, d)
                for i, l in enumerate(layers):
                    x = head(l, x) if i == len(layers) - 1 else l(x)
                loss = loss_fn(x, y) / (ACCUMULATION * dp)
                loss.backward()
                total += loss.item()
        norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0).item())
        opt.step()
        losses.append(total)
    return losses, norms


def check_placement(stages):
    """placement "v": stage 0 holds chunks 0 and 2p - 1 and the loss; the schedule must agree."""
    model = PipelineModule(specs(), num_stages=stages, loss_fn=loss_fn, seed_layers=True, base_seed=SEED, placement="v")
    stage = tessera.comm.parallel_context().group_rank("pipe")
    assert model.virtual_stages == 2 and model.loss_stage == 0 and model.is_loss_stage() == (stage == 0)
    # stage 0 runs the embedding first and the tied head last: one module, not a group tied across stages
    assert model.tied_groups() == [], model.tied_groups()
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATION,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "pipeline": {"stages": stages, "schedule": "1f1b"}}
    try:
        tessera.initialize(model=model, config=config)
        raise AssertionError("a V-placed module ran under 1f1b")
    except ValueError as e:
        assert "pipeline.schedule \"1f1b\" with a PipelineModule placed 'v'" in str(e), e
    try:
        PipelineModule(specs(), num_stages=stages, loss_fn=loss_fn, placement="v", virtual_stages=3)
        raise AssertionError("a V of 3 chunks")
    except ValueError as e:
        assert "placement \"v\" holds 2 chunks a stage; virtual_stages must be 2, got 3" in str(e), e
    print("pipeline placement ok on rank %d" % int(os.environ["RANK"]), flush=True)


def check_fp16(stages, schedule, zero_stage):
    model = PipelineModule(specs(), num_stages=stages, loss_fn=loss_fn, seed_layers=True, base_seed=SEED)
    engine, _, _, _ = tessera.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATION, "steps_per_print": 100,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": zero_stage},
        "fp16": {"enabled": True, "initial_scale_power": 20, "loss_scale_window": 1000, "hysteresis": 1},
        "pipeline": {"stages": stages, "schedule": schedule},
        # The pipeline engine's monitor events (tests/python/pipeline/test_pipeline.py reads them).
        "csv_monitor": {"enabled": "MONITOR_DIR" in os.environ, "output_path": os.environ.get("MONITOR_DIR", ""),
                        "job_name": "pipe"},
        # The C++ profiler counts a Python stage's ops (test_pipeline.py reads rank 0's report).
        "flops_profiler": {"enabled": "MONITOR_DIR" in os.environ, "profile_step": 3,
                           "output_file": os.path.join(os.environ.get("MONITOR_DIR", ""), "flops.txt")}})
    d = tessera.comm.parallel_context().group_rank("data")
    scales, losses = [], []
    for step in range(10):
        it = iter([micro_batch(step, m, d) for m in range(ACCUMULATION)])
        losses.append(engine.train_batch(it))
        scales.append(engine._c.loss_scale)
    # 2^20 overflows fp16 gradients: the first steps are skipped and the scale halves each time, the
    # same on every stage (the overflow is decided over the whole pipeline's gradient norm); then
    # the steps apply and the scale stays
    assert scales[0] < 2.0 ** 20 and scales[-1] == scales[-2], scales
    mine = torch.tensor(scales + [float(engine.global_steps)], dtype=torch.float64)
    lo, hi = mine.clone(), mine.clone()
    tessera.comm.all_reduce(lo, "min")
    tessera.comm.all_reduce(hi, "max")
    assert torch.equal(lo, hi), ("stages disagree on the loss scale", lo.tolist(), hi.tolist())
    assert all(l == l for l in losses), losses  # finite losses
    print("pipeline fp16 ok on rank %d (scales %s)" % (tessera.comm.get_rank(), " ".join("%g" % s for s in scales)),
          flush=True)


def main():
    if sys.argv[4] == "fp16":
        check_fp16(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
    elif sys.argv[4] == "placement":
        check_placement(int(sys.argv[1]))
    else:
        cases = [[]]
        for arg in sys.argv[1:]:
            if arg == "+":
                cases.append([])
            else:
                cases[-1].append(arg)
        for i, case in enumerate(cases):
            run_case(i, int(case[0]), case[1], int(case[2]), case[3], int(case[4]) if len(case) > 4 else 0,
                     int(case[5]) if len(case) > 5 else 1)
    tessera.comm.barrier()  # leave together


def run_case(case, stages, schedule, zero_stage, optimizer_name, interval, tp):
    world = int(os.environ["WORLD_SIZE"])
    dp = world // (stages * tp)
    virtual = 2 if schedule in ("interleaved_1f1b", "zb_v") else 1  # each stage holds 2 model chunks
    # zb_v: the chunks in a V; stage 0 holds the embedding and the tied head (one module for both)
    model = PipelineModule(specs(), num_stages=stages, loss_fn=loss_fn, partition_method="parameters",
                           seed_layers=True, base_seed=SEED, activation_checkpoint_interval=interval,
                           tensor_parallel=tp, virtual_stages=virtual, placement="v" if schedule == "zb_v" else "loop")
    if tp > 1:  # each block's attention (one head per rank) and MLP split over the tensor group
        tessera.tensor_parallel.parallelize(model, {
            "local_layers.*.attn.c_attn": tessera.tensor_parallel.Colwise(fused=3), "local_layers.*.attn.c_proj": "rowwise",
            "local_layers.*.mlp.c_fc": "colwise", "local_layers.*.mlp.c_proj": "rowwise"})
    bf16 = optimizer_name == "bf16"  # SGD in bf16 (fp32 master weights) against the fp32 reference
    if bf16:
        optimizer_name = "SGD"
    opt = {"type": "SGD", "params": {"lr": 0.1}} if optimizer_name == "SGD" else \
        {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}}  # eps: see run_reference
    engine, _, _, _ = tessera.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATION, "steps_per_print": 100,
        "optimizer": opt, "gradient_clipping": 1.0,
        # ZeRO-3: every tensor partitioned (the model is small); gathered per micro-batch under ZB-H1
        "zero_optimization": {"stage": zero_stage, "stage3_param_persistence_threshold": 0},
        "bf16": {"enabled": bf16}, "pipeline": {"stages": stages, "schedule": schedule, "virtual_stages": virtual,
                                           "zero3_gather": "micro_batch" if schedule == "zb_h1" else "step"},
        "tensor_parallel": {"tp_size": tp}})
    # bf16 keeps 8 bits of mantissa in the activations and the compute copy of the weights
    loss_tol, norm_tol, param_tol = (2e-2, 5e-2, 1e-2) if bf16 else (1e-5, 1e-5, 2e-5)
    d = tessera.comm.parallel_context().group_rank("data")
    losses, norms = [], []
    for step in range(STEPS):
        it = iter([micro_batch(step, m, d) for m in range(ACCUMULATION)])
        losses.append(engine.train_batch(it))
        norms.append(engine.get_global_grad_norm())

    ref_layers = reference_layers()
    ref_losses, ref_norms = run_reference(ref_layers, optimizer_name, dp)
    for step in range(STEPS):
        assert abs(losses[step] - ref_losses[step]) < loss_tol * max(1.0, abs(ref_losses[step])), \
            ("loss", step, losses[step], ref_losses[step])
        assert abs(norms[step] - ref_norms[step]) < norm_tol * max(1.0, ref_norms[step]), \
            ("grad norm", step, norms[step], ref_norms[step])
    checked = 0
    if zero_stage == 3:  # between batches each rank holds its shard only: the parameters read NaN
        assert all(torch.isnan(p).all() for p in model.parameters()), "ZeRO-3: a parameter stayed whole"
    whole = tessera.zero.GatheredParameters(list(model.parameters()))  # ZeRO-3's shards made whole
    whole.__enter__()
    for i, layer in model.layers_by_index.items():
        if not isinstance(layer, nn.Module):
            continue
        for (name, p), q in zip(layer.named_parameters(), ref_layers[i].parameters()):
            diff = (tessera.tensor_parallel.full_tensor(p).float() - q.detach()).abs().max().item()
            assert diff < param_tol * max(1.0, q.detach().abs().max().item()), ("layer %d %s differs by %g" % (i, name, diff))
            checked += 1
    assert checked > 0
    whole.__exit__(None, None, None)
    print("pipeline ok on rank %d case %d (stage %d, %d tensors checked, losses %s; reference %s)"
          % (tessera.comm.get_rank(), case, model.stage_id, checked, " ".join("%.5f" % l for l in losses),
             " ".join("%.5f" % l for l in ref_losses)), flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
