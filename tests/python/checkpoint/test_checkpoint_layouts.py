"""Checkpoints at another tensor-parallel or pipeline degree (engine/checkpoint/reshard.h,
docs/checkpoints.md, "Loading, resharding"): a chain of runs, each loading the previous one's
checkpoint at its own layout and saving it again at once; every per-element state read back is
compared bit for bit with what was saved, put together here from the saved slices by their recorded
cut with the safetensors package (independent of tessera's reader), and the losses with an
uninterrupted run."""
import json
import os
import subprocess

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from checkpoint_cases import TINY, assert_same, config, run_hops, run_jobs
from conftest import CLI


def whole_states(path):
    """{"<state>/<name>": the whole parameter} for every state the checkpoint holds per element, put
    together here from the saved pieces by the recorded cut (each tensor rank's slice of every fused
    block, concatenated along the split dimension): independent of tessera's own reader."""
    meta = json.load(open(os.path.join(path, "metadata.json")))
    handles = {f: safe_open(os.path.join(path, f), "pt") for f in meta["files"]}
    ranks = meta["layout"]["tensor_parallel"]
    slices = {}  # (state, name) -> {tensor rank: its slice}, the first stage's where tied copies repeat
    for p in meta["parameters"]:
        for state in meta["layout"]["states"]:
            pieces = [handles[s["file"]].get_tensor("%s/%s" % (state, p["name"])) for s in sorted(p["shards"], key=lambda s: s["begin"])]
            slices.setdefault((state, p["name"]), {}).setdefault(p["tensor_rank"], (torch.cat(pieces).reshape(p["shape"]), p.get("split")))
    out = {}
    for (state, name), by_rank in slices.items():
        if -1 in by_rank:
            out["%s/%s" % (state, name)] = by_rank[-1][0]
            continue
        dim, fused = by_rank[0][1]
        assert sorted(by_rank) == list(range(ranks))
        blocks = [torch.chunk(by_rank[r][0], fused, dim) for r in range(ranks)]
        out["%s/%s" % (state, name)] = torch.cat([blocks[r][f] for f in range(fused) for r in range(ranks)], dim)
    return meta, out


def check_layout_hops(tmp, hops, runs, first, steps_per_hop, loss_rtol):
    """Each hop after the first loaded the previous hop's checkpoint and saved it again at once: the
    weights and every per-element optimizer state read back equal those saved bit for bit; the
    losses of all hops follow the uninterrupted run (runs[-1])."""
    losses = runs[0]["losses"]
    for i in range(1, len(hops)):
        tag = "global_step%d" % (first + steps_per_hop * (i - 1))
        meta_saved, saved = whole_states(str(tmp / ("hop%d" % (i - 1)) / tag))
        meta_loaded, loaded = whole_states(str(tmp / ("hop%d_loaded" % i) / tag))
        assert meta_saved["layout"]["states"] == meta_loaded["layout"]["states"] and len(saved) > 8
        assert_same(saved, loaded, where="hop %d %s" % (i, hops[i]))
        losses = losses + runs[i]["losses"]
    reference = runs[-1]["losses"]
    assert len(losses) == len(reference)
    for got, want in zip(losses, reference):
        assert abs(got - want) <= loss_rtol * max(1.0, abs(want)), (losses, reference)


def test_reshard_across_tensor_parallel_degrees_tp2_dp2_to_1_rank_to_tp2_zero3(tmp_path):
    """The example GPT split by AutoTP (its fused q|k|v, row- and column-parallel weights, the
    vocabulary-parallel embedding): saved at tp 2 x dp 2 (ZeRO 1), loaded on 1 rank, then at tp 2
    with ZeRO 3, the AdamW moments resliced with the weights."""
    hops = [(4, 1, 2), (1, 0, 1), (2, 3, 2)]  # (ranks, ZeRO stage, tp)
    first, per_hop = 3, 2
    runs = run_hops(tmp_path, [(nproc, dict(TINY, model="gpt", config=config(stage, tensor_parallel={"tp_size": tp})))
                               for nproc, stage, tp in hops], first, per_hop)
    whole = dict(TINY, model="gpt", config=config(1, tensor_parallel={"tp_size": 2}), steps=first + per_hop * 2)
    runs.append(run_jobs(tmp_path, 4, [whole], "reference")[0])
    check_layout_hops(tmp_path, hops, runs, first, per_hop, loss_rtol=1e-5)
    # `tessera checkpoint export` puts the tensor-parallel slices together the same way.
    exported = tmp_path / "tp2.safetensors"
    r = subprocess.run([CLI, "checkpoint", "export", str(tmp_path / "hop0"), "-o", str(exported)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _, saved = whole_states(str(tmp_path / "hop0" / "global_step3"))
    weights = load_file(str(exported))
    assert sorted(weights) == sorted(k[len("fp32/"):] for k in saved if k.startswith("fp32/"))
    for name, value in weights.items():
        assert torch.equal(value, saved["fp32/" + name]), name


def test_reshard_across_pipeline_degrees_2_stages_to_1_to_4(tmp_path):
    """tessera.pipe's GPT (embeddings tied between the first and last stages): saved on 2 stages,
    loaded on 1 (the tied weight one parameter there), then on 4; parameters are named by their
    layer's place in the whole model (PipelineModule.parameter_names)."""
    hops = [2, 1, 4]
    first, per_hop = 2, 2
    base = {"model": "pipe", "config": config(1, {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}})}
    runs = run_hops(tmp_path, [(stages, dict(base, stages=stages)) for stages in hops], first, per_hop)
    runs.append(run_jobs(tmp_path, 2, [dict(base, stages=2, steps=first + per_hop * 2)], "reference")[0])
    check_layout_hops(tmp_path, hops, runs, first, per_hop, loss_rtol=1e-5)
