"""Checkpoint runs through tessera.initialize (tests/python/checkpoint/test_checkpoint_resume.py): each run
builds the model (parity_worker's TinyNet or TinyGpt), optionally loads a checkpoint (and saves it
again at once, to compare what was loaded), trains some optimizer steps on the same global batches
whatever the data-parallel size, and optionally saves.

The data position travels in client_state: a run that loads continues at the step it names.

  checkpoint_worker.py RUNS.json OUT.json   (rank 0 writes, per run, the losses and what happened)

A run: {"model": "tiny"|"gpt", "seed", "config" (without batch sizes), "global_batch", "micro",
        "client": {"type": a torch.optim class, its keywords} (the config then has no optimizer),
        "steps", "load": {"dir", "tag", ...load_checkpoint keywords} | null, "save_loaded": DIR,
        "save": DIR, "save_tag", "crash": a TESSERA_CHECKPOINT_CRASH point for the final save,
        "expect_error": a substring: the load must fail with it, leaving the parameters unchanged}
"""
import json
import os
import sys

import torch

import tessera
from parity_worker import TinyGpt, TinyNet, global_batch
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown


def make_model(run):
    if run.get("model") == "gpt":
        return TinyGpt(run["seed"])
    model = TinyNet(run["seed"])
    if run.get("wider"):  # another model: a checkpoint of TinyNet must not load into it
        model.fc2 = torch.nn.Linear(model.fc2.in_features, model.fc2.out_features + 1)
        model.head = torch.nn.Linear(model.fc2.out_features, model.head.out_features)
    if run.get("renamed"):
        model.extra = torch.nn.Linear(2, 2)
    return model


def engine_parameters(engine, model):
    with engine.gathered_parameters():
        return torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])


def pipe_run(run):
    """The pipeline worker's GPT as a tessera.pipe.PipelineModule (tied embeddings on the first and
    last stages): train_batch steps, with the same load and save as one_run."""
    from tessera.pipe import PipelineModule
    import pipeline_worker as pw
    stages = run["stages"]
    model = PipelineModule(pw.specs(), num_stages=stages, loss_fn=pw.loss_fn, seed_layers=True, base_seed=pw.SEED)
    config = dict(run["config"], train_micro_batch_size_per_gpu=pw.MICRO, gradient_accumulation_steps=pw.ACCUMULATION,
                  steps_per_print=1000, pipeline={"stages": stages})
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    d = tessera.comm.parallel_context().group_rank("data")
    result = {"losses": [], "norms": []}
    start = 0
    if run.get("load"):
        kwargs = dict(run["load"])
        path, client_state = engine.load_checkpoint(kwargs.pop("dir"), **kwargs)
        result.update(loaded=path, client_state=client_state)
        start = client_state["next_step"]
        if run.get("save_loaded"):
            engine.save_checkpoint(run["save_loaded"], client_state=client_state)
    result["global_steps_at_start"] = engine.global_steps
    for step in range(start, start + run["steps"]):
        result["losses"].append(engine.train_batch(iter([pw.micro_batch(step, m, d) for m in range(pw.ACCUMULATION)])))
        result["norms"].append(engine.get_global_grad_norm())
    if run.get("save"):
        result["saved"] = engine.save_checkpoint(run["save"], client_state={"next_step": start + run["steps"]})
    return result


def one_run(run):
    if run.get("model") == "pipe":
        return pipe_run(run)
    config = dict(run["config"])
    config["train_batch_size"] = run["global_batch"]
    config["train_micro_batch_size_per_gpu"] = run["micro"]
    config.setdefault("steps_per_print", 1000)
    model = make_model(run)
    optimizer = None
    if run.get("client"):  # a torch optimizer tessera runs as given over its shards (client_optimizer.py)
        kind = dict(run["client"])
        optimizer = getattr(torch.optim, kind.pop("type"))(model.parameters(), **kind)
        config["zero_allow_untested_optimizer"] = True
    engine, _, _, _ = tessera.initialize(model=model, config=config, optimizer=optimizer)
    dp, me, micro = engine.dp_world_size, engine.dp_rank, run["micro"]
    gas = engine.gradient_accumulation_steps()
    result = {"losses": [], "norms": []}
    start = 0
    if run.get("load"):
        kwargs = dict(run["load"])
        load_dir = kwargs.pop("dir")
        if run.get("expect_error"):
            before = engine_parameters(engine, model)
            try:
                engine.load_checkpoint(load_dir, **kwargs)
            except RuntimeError as e:
                result["error"] = str(e)
            else:
                result["error"] = None
            result["unchanged"] = bool(torch.equal(before, engine_parameters(engine, model)))
            result["global_steps"] = engine.global_steps
            return result
        path, client_state = engine.load_checkpoint(load_dir, **kwargs)
        result["loaded"] = path
        result["client_state"] = client_state
        start = (client_state or {}).get("next_step", 0)
        if run.get("save_loaded"):
            engine.save_checkpoint(run["save_loaded"], client_state=client_state)
    result["global_steps_at_start"] = engine.global_steps
    case = {"micro": run["global_batch"], "gas": 1, "dp": 1, "seed": run["seed"], "model": run.get("model")}
    for step in range(start, start + run["steps"]):
        x, y = global_batch(case, step)
        total = 0.0
        for m in range(gas):
            rows = slice((m * dp + me) * micro, (m * dp + me + 1) * micro)
            loss = engine(x[rows], y[rows])
            engine.backward(loss)
            engine.step()
            total += loss.item()
        t = torch.tensor([total / gas], dtype=torch.float64)
        result["losses"].append(tessera.comm.all_reduce(t, "avg", "data").item())
        result["norms"].append(engine.get_global_grad_norm())
    result["loss_scale"] = engine.loss_scale
    result["lr"] = engine.get_lr()
    result["global_steps"] = engine.global_steps
    result["skipped_steps"] = engine.skipped_steps
    if run.get("save_16bit"):
        result["saved_16bit"] = engine.save_16bit_model(run["save_16bit"])
    if run.get("save"):
        if run.get("crash"):
            os.environ["TESSERA_CHECKPOINT_CRASH"] = run["crash"]
        result["saved"] = engine.save_checkpoint(run["save"], tag=run.get("save_tag"),
                                                 client_state={"next_step": start + run["steps"], "note": "data"})
    engine.close()
    return result


def main():
    runs = json.load(open(sys.argv[1]))
    results = [one_run(run) for run in runs]
    if tessera.comm.get_rank() == 0:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    worker_exit.run(main)
