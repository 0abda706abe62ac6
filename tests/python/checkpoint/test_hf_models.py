"""Hugging Face transformers models under tessera (tests/python/workers/hf_worker.py): GPT-2
(Conv1D layers, a fused q|k|v, the head tied to the embedding) and Llama (RMSNorm, rotary
positions, grouped-query attention, SwiGLU) built from their configs, nothing downloaded.

For each: 4 steps at tensor 2 × data 2 with ZeRO 3 (AutoTP cuts the model's own layers) follow the
single-process run (losses and gradient norms within 2e-6 relative); the checkpoint records the
slices' cuts and the model's config; `tessera checkpoint export --hf` writes a directory
`from_pretrained` loads with the engine's logits; the checkpoint loads on 1 rank (another layout),
where save_16bit_model writes a directory from_pretrained loads with that engine's logits exactly."""
import json
import os
import subprocess

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import CLI, check, child_env, launch

PROBE = [[3, 70, 101, 32, 99, 97, 116, 32, 115, 97, 116, 46, 10, 84, 104, 101]]
# A slice's cut in the checkpoint ([dim, fused]): GPT-2's Conv1D weights are [in, out].
CUTS = {"gpt2": {"transformer.h.0.attn.c_attn.weight": [1, 3], "transformer.h.0.attn.c_proj.weight": [0, 1],
                 "transformer.h.0.mlp.c_fc.bias": [0, 1]},
        "llama": {"model.layers.0.self_attn.k_proj.weight": [0, 1], "model.layers.0.mlp.down_proj.weight": [1, 1]}}


def run(tmp_path, name, nproc, **spec):
    spec_path, out = tmp_path / (name + ".json"), tmp_path / (name + ".out.json")
    spec_path.write_text(json.dumps(dict({"seed": 3, "global_batch": 4}, **spec)))
    check(launch(nproc, ["tests/python/workers/hf_worker.py", str(spec_path), str(out)], timeout=300))
    return json.loads(out.read_text())


def logits_of(directory):
    model = AutoModelForCausalLM.from_pretrained(directory)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(PROBE)).logits


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_model_at_tensor_2_zero_3_follows_one_rank_and_exports_for_from_pretrained(arch, tmp_path):
    reference = run(tmp_path, "reference", 1, arch=arch, stage=0, tp=1, steps=4)
    ckpt = tmp_path / "ckpt"
    parallel = run(tmp_path, "parallel", 4, arch=arch, stage=3, tp=2, steps=4, save_dir=str(ckpt))
    for key in ("losses", "grad_norms"):
        assert parallel[key] == pytest.approx(reference[key], rel=2e-6), key

    meta = json.load(open(ckpt / "global_step4" / "metadata.json"))
    assert meta["layout"]["tensor_parallel"] == 2 and meta["layout"]["zero_stage"] == 3
    cuts = {p["name"]: p.get("split") for p in meta["parameters"] if p["tensor_rank"] == 0}
    for name, cut in CUTS[arch].items():
        assert cuts[name] == cut, name
    assert meta["hf_config"]["model_type"] == arch

    exported = tmp_path / "hf"
    check(subprocess.run([CLI, "checkpoint", "export", "--hf", str(ckpt), "-o", str(exported)], env=child_env(),
                         capture_output=True, text=True, timeout=120))
    assert sorted(os.listdir(exported)) == ["config.json", "model.safetensors"]
    engine_logits = torch.tensor(parallel["logits"])
    torch.testing.assert_close(logits_of(exported), engine_logits, rtol=0, atol=1e-5)

    # Another layout: 1 rank at ZeRO 3 loads it; save_16bit_model gives the same model.
    sixteen = tmp_path / "sixteen"
    one = run(tmp_path, "one", 1, arch=arch, stage=3, tp=1, load_dir=str(ckpt), export_16bit=str(sixteen))
    assert json.load(open(sixteen / "config.json"))["architectures"] == [
        {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[arch]]
    torch.testing.assert_close(logits_of(sixteen), torch.tensor(one["logits"]), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(one["logits"]), engine_logits, rtol=0, atol=1e-5)


def test_export_hf_needs_a_transformers_model(tmp_path):
    """A checkpoint of a plain torch module has no config for from_pretrained: --hf says so."""
    from checkpoint_cases import TINY, config, run_jobs
    run_jobs(tmp_path, 1, [dict(TINY, config=config(stage=0), steps=1, save=str(tmp_path / "ckpt"))])
    r = subprocess.run([CLI, "checkpoint", "export", "--hf", str(tmp_path / "ckpt"), "-o", str(tmp_path / "hf")],
                       env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "records no Hugging Face config" in r.stderr
