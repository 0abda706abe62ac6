"""What the checkpoint tests share (tests/python/checkpoint/): the runs' configs, running a list of
runs on N ranks through tests/python/workers/checkpoint_worker.py, reading a checkpoint back with
the safetensors package, and chains of runs that each load the one before."""
import json
import os

import torch
from safetensors import safe_open

from conftest import check, launch

TINY = {"model": "tiny", "seed": 7, "global_batch": 8, "micro": 2}
ADAMW = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "betas": [0.9, 0.95]}}


def config(stage=0, optimizer=ADAMW, zero_extra=None, **extra):
    c = {"optimizer": optimizer, "gradient_clipping": 1.0,
         "zero_optimization": {"stage": stage, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0,
                               **(zero_extra or {})}}
    if optimizer is None:  # the run's client optimizer
        del c["optimizer"]
    c.update(extra)
    return c


def run_jobs(tmp_path, nproc, runs, name="runs", expect_ok=True, timeout=240):
    spec, out = tmp_path / (name + ".json"), tmp_path / (name + ".out.json")
    spec.write_text(json.dumps(runs))
    result = launch(nproc, ["tests/python/workers/checkpoint_worker.py", str(spec), str(out)], timeout=timeout)
    if not expect_ok:
        return result
    check(result)
    return json.loads(out.read_text())


def consolidated(path):
    """Every tensor of a checkpoint as its parameters' whole values, per state, read with the
    safetensors package: {"fp32/fc1.weight": tensor, ...}; the other tensors by file."""
    meta = json.load(open(os.path.join(path, "metadata.json")))
    out = {}
    handles = {f: safe_open(os.path.join(path, f), "pt") for f in meta["files"]}
    for p in meta["parameters"]:
        numel = 1
        for d in p["shape"]:
            numel *= d
        for state in meta["layout"]["states"]:
            pieces = [handles[s["file"]].get_tensor("%s/%s" % (state, p["name"])) for s in sorted(p["shards"], key=lambda s: s["begin"])]
            whole = torch.cat(pieces)
            assert whole.numel() == numel
            where = "@stage%d" % p["pipeline_stage"] if meta["layout"]["pipeline_parallel"] > 1 else ""
            out["%s/%s%s" % (state, p["name"], where)] = whole.reshape(p["shape"])
    for f, h in handles.items():
        for k in h.keys():
            if "/" in k and k.split("/")[0] not in meta["layout"]["states"]:
                out.setdefault(k if not k.startswith(("local/", "rng/")) else "%s:%s" % (f, k), h.get_tensor(k))
    return meta, out


def assert_same(a, b, keys=None, where=""):
    keys = keys if keys is not None else sorted(set(a) | set(b))
    for k in keys:
        assert k in a and k in b, "%s: %s missing (%s / %s)" % (where, k, k in a, k in b)
        assert torch.equal(a[k], b[k]), "%s: %s differs by %g" % (where, k, (a[k].double() - b[k].double()).abs().max())


def run_hops(tmp, hops, first, steps_per_hop):
    """hops: [(ranks, run without steps or load)]. The first trains `first` steps and saves under
    tmp/hop0; each later one loads the previous save, saves it again at once (tmp/hop<i>_loaded),
    trains `steps_per_hop` steps and saves under tmp/hop<i>. Returns the results."""
    results, previous = [], None
    for i, (nproc, run) in enumerate(hops):
        run = dict(run, save=str(tmp / ("hop%d" % i)))
        if previous is None:
            run["steps"] = first
        else:
            run.update(steps=steps_per_hop, load={"dir": previous}, save_loaded=str(tmp / ("hop%d_loaded" % i)))
        results.append(run_jobs(tmp, nproc, [run], "hop%d" % i)[0])
        previous = run["save"]
    return results
