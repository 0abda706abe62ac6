"""Hugging Face transformers models under tessera (tests/python/checkpoint/test_hf_models.py), one run
per launch:

    tessera launch --nproc-per-node N -- python hf_worker.py SPEC OUT

The model is built from a transformers config (nothing downloaded) with torch's generator seeded
by spec["seed"], so every run starts from the same weights: "gpt2" (GPT2LMHeadModel: Conv1D layers,
a fused q|k|v, the LM head tied to the token embedding) or "llama" (LlamaForCausalLM: RMSNorm,
rotary positions, grouped-query attention, SwiGLU, an untied head). tessera.initialize trains it
with the spec's ZeRO stage and tensor-parallel degree (AutoTP) on the `fortunes` corpus: for step
s the same global batch everywhere, each data-parallel rank its rows. spec keys:

  steps       training steps (0: none)             load_dir   load this checkpoint first
  save_dir    save a checkpoint after training     export_16bit  save_16bit_model into this directory

Rank 0 writes {"losses": [...], "logits": the model's logits for PROBE (a list), "grad_norms": [...]}.
"""
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 4)[0] + "/examples/python")
from data import FortunesCorpus  # noqa: E402
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

SEQ = 16
PROBE = [[3, 70, 101, 32, 99, 97, 116, 32, 115, 97, 116, 46, 10, 84, 104, 101]]


def build(arch, seed):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig
    if arch == "gpt2":
        config = GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    else:
        config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                             bos_token_id=0, eos_token_id=1, pad_token_id=None)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def main():
    spec = json.load(open(sys.argv[1]))
    import tessera
    model = build(spec["arch"], spec["seed"])
    global_batch = spec["global_batch"]
    config = {"train_batch_size": global_batch, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "betas": [0.9, 0.95]}},
              "zero_optimization": {"stage": spec["stage"], "stage3_param_persistence_threshold": 0,
                                    "reduce_bucket_size": 2000},
              "tensor_parallel": {"tp_size": spec["tp"]}}
    engine, _, _, _ = tessera.initialize(model=model, config=config)
    if spec.get("load_dir"):
        engine.load_checkpoint(spec["load_dir"], load_module_only=spec.get("module_only", False))
    rank, world = tessera.comm.get_rank(), tessera.comm.get_world_size()
    dp_rank, dp = engine.dp_rank, engine.dp_world_size
    micro = global_batch // dp
    corpus = FortunesCorpus()
    losses, norms = [], []
    for step in range(spec.get("steps", 0)):
        x, _ = corpus.sample(global_batch, SEQ, step, seed=spec["seed"])
        x = x[dp_rank * micro:(dp_rank + 1) * micro]
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        t = torch.tensor([loss.item()], dtype=torch.float64)
        tessera.comm.all_reduce(t)
        losses.append(t.item() / world)
        norms.append(float(engine.get_global_grad_norm()))
    if spec.get("save_dir"):
        engine.save_checkpoint(spec["save_dir"])
    engine.eval()
    with torch.no_grad():
        logits = engine(input_ids=torch.tensor(PROBE)).logits.float()
    if spec.get("export_16bit"):
        engine.save_16bit_model(spec["export_16bit"])
    if rank == 0:
        with open(sys.argv[2], "w") as f:
            json.dump({"losses": losses, "grad_norms": norms, "logits": logits.tolist()}, f)
    engine.close()


if __name__ == "__main__":
    worker_exit.run(main)
