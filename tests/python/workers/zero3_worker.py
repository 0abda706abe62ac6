"""ZeRO-3 from Python, on every rank of a 2-rank launch (tests/python/zero/test_zero3.py runs it).

Each check prints "ok <name>" on rank 0, or raises. The models are compared with the same model in
plain PyTorch (same seed, same global batch, torch.optim.SGD with momentum: unlike Adam, it keeps
a wrong gradient visible and last-bit differences small) built on every rank.

  memory       the example GPT (tied LM head, 4 layers) at stage 3 with every parameter partitioned
               and units released after use: nothing stays gathered after a step, the most held at
               once is below the whole model, a released parameter cannot be read, and the losses
               and parameters follow torch.
  eval         a torch.no_grad() forward between steps releases what it gathered.
  gathered     GatheredParameters: reading every parameter; modifier_rank=0 writes rank 0's edit
               into every rank's shard and the optimizer continues from it; state_dict() copies.
  twice        a unit called twice in one forward (a block applied twice), against torch.
  reorder      two blocks that swap their order on odd steps (the order is recorded again), against torch.
  order        the two blocks run in different orders on the two ranks: every rank raises, naming it.
  init         the example GPT built under tessera.zero.Init (each rank from another seed; its custom
               initialization through GatheredParameters(modifier_rank=0)) holds no parameter bytes
               after construction, 1/N of them as chunks, and trains as torch does from rank 0's model.
  init_plain   the same GPT built under zero.Init with no help: its root __init__ writes its
               children's weights (copy_, fill_) as a script written for a whole model does, and a
               root writes a child's weight through `.data` and nn.init; the writes take effect
               (rank 0's values) and the GPT trains as torch does from rank 0's model.
  init_memory  (alone in its process) a 128 MiB stack of linear layers built under zero.Init raises
               the peak RSS by its chunks plus a few layers, not by the model; built without it, by
               the whole model.
  peak_stage2, peak_stage3, peak_stage3_init
               (each alone in its processes) a plain script: the 128 MiB stack built whole (or under
               zero.Init), tessera.initialize, three steps of momentum SGD; prints how far the whole
               run raised the process's peak RSS (VmHWM) above its RSS after `import tessera`, the
               engine's accounted bytes and the block cache's capacity (test_zero3.py compares them).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import tessera

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))
from models import Block, Gpt  # noqa: E402
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

VOCAB, BLOCK, EMBD = 64, 16, 32
MICRO = 2


def config(**zero):
    z = {"stage": 3, "reduce_bucket_size": 100000, "stage3_param_persistence_threshold": 0,
         "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 20000, "stage3_max_live_parameters": 40000}
    z.update(zero)
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
            "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}},
            "gradient_clipping": 1.0, "zero_optimization": z}


def batch(step, dp):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (MICRO * dp, BLOCK + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def mine(t, rank):
    return t[rank * MICRO:(rank + 1) * MICRO]


class Reference:
    """The same model in plain PyTorch on the whole global batch."""

    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0)

    def step(self, x, y, *args):
        self.opt.zero_grad()
        loss = self.model(x, y, *args)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.item()


def flat(model):
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def train_against_reference(make, steps, rank, dp, args_of=lambda step: (), make_model=None, **zero):
    model, ref = (make_model or make)(), Reference(make())
    engine, _, _, _ = tessera.initialize(model=model, config=config(**zero))
    for step in range(steps):
        x, y = batch(step, dp)
        loss = engine(mine(x, rank), mine(y, rank), *args_of(step))
        engine.backward(loss)
        engine.step()
        mean = tessera.comm.all_reduce(torch.tensor([loss.item()], dtype=torch.float64), "avg", "data").item()
        want = ref.step(x, y, *args_of(step))
        assert abs(mean - want) <= 1e-5 * max(1.0, abs(want)), (step, mean, want)
        assert engine.memory_report()["gathered_parameters"] == 0, engine.memory_report()
    memory = engine.memory_report()  # before gathering everything below
    with engine.gathered_parameters():
        diff = (flat(model) - flat(ref.model)).abs().max().item()
    assert diff <= 1e-5, diff
    return engine, model, memory


def check_memory(rank, dp):
    make = lambda: Gpt(vocab=VOCAB, block_size=BLOCK, n_layer=4, n_head=2, n_embd=EMBD, seed=3)  # noqa: E731
    engine, model, mem = train_against_reference(make, 3, rank, dp)
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    assert 0 < mem["gathered_parameters_peak"] < 0.75 * whole, (mem, whole)
    assert mem["parameters"] <= whole // dp + 64 * 4 * 20, (mem, whole)  # the shard (+ padding)
    # Outside a forward a released parameter reads as NaN, in its shape (never freed memory).
    weight = model.transformer.h[1].mlp.c_fc.weight
    assert weight.shape == (4 * EMBD, EMBD) and torch.isnan(weight).all(), weight
    return "peak gathered %d of %d bytes" % (mem["gathered_parameters_peak"], whole)


def trained_gpt(rank, dp, layers):
    """The example GPT at ZeRO-3 after one step on batch 0; returns (model, engine, x, y)."""
    model = Gpt(vocab=VOCAB, block_size=BLOCK, n_layer=layers, n_head=2, n_embd=EMBD, seed=3)
    engine, _, _, _ = tessera.initialize(model=model, config=config())
    x, y = batch(0, dp)
    engine.backward(engine(mine(x, rank), mine(y, rank)))
    engine.step()
    return model, engine, x, y


def check_eval(rank, dp):
    model, engine, x, y = trained_gpt(rank, dp, 4)
    with torch.no_grad():
        engine(mine(x, rank), mine(y, rank))
    assert engine.memory_report()["gathered_parameters"] == 0, engine.memory_report()
    engine.backward(engine(mine(x, rank), mine(y, rank)))  # training goes on after it
    engine.step()
    assert engine.memory_report()["gathered_parameters"] == 0, engine.memory_report()
    return ""


def check_gathered(rank, dp):
    model, engine, x, y = trained_gpt(rank, dp, 2)
    weight = model.transformer.h[0].attn.c_attn.weight
    with tessera.zero.GatheredParameters(model.parameters()):
        norm = weight.norm().item()
    top = tessera.comm.broadcast(torch.tensor([norm]), 0, "data").item()
    assert norm == top, (norm, top)
    with tessera.zero.GatheredParameters([weight], modifier_rank=0):
        if rank == 0:
            with torch.no_grad():
                weight.fill_(0.5)
    with engine.gathered_parameters():
        assert torch.all(weight == 0.5), "rank %d did not get rank 0's edit" % rank
    engine.backward(engine(mine(x, rank), mine(y, rank)))
    engine.step()  # one small SGD step from the edited value
    with engine.gathered_parameters():
        moved = (weight - 0.5).abs().max().item()
        assert 0 < moved <= 0.05, moved
    state = engine.state_dict()
    assert state["transformer.h.0.attn.c_attn.weight"].shape == weight.shape
    assert engine.memory_report()["gathered_parameters"] == 0
    return ""


class BlockLm(nn.Module):
    """Embedding, `blocks` (units of their own), LM head; `body` says how the blocks are applied."""

    def __init__(self, seed, blocks):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, EMBD)
        self.blocks = nn.ModuleList(Block(EMBD, 2) for _ in range(blocks))
        self.head = nn.Linear(EMBD, VOCAB)

    def forward(self, idx, targets, *args):
        x = self.body(self.emb(idx), *args)
        return F.cross_entropy(self.head(x).float().reshape(-1, VOCAB), targets.reshape(-1))


class Twice(BlockLm):
    """One block applied twice: a unit that runs twice per forward."""

    def __init__(self):
        super().__init__(5, 1)

    def body(self, x):
        return self.blocks[0](self.blocks[0](x))


class Swapping(BlockLm):
    """Two blocks whose order swaps when asked: the recorded unit order changes between steps."""

    def __init__(self):
        super().__init__(6, 2)

    def body(self, x, swap=False):
        a, b = self.blocks
        return a(b(x)) if swap else b(a(x))


def check_twice(rank, dp):
    train_against_reference(Twice, 3, rank, dp)
    return ""


def check_reorder(rank, dp):
    train_against_reference(Swapping, 4, rank, dp, args_of=lambda step: (step % 2 == 1,))
    return ""


def check_order(rank, dp):
    engine, _, _, _ = tessera.initialize(model=Swapping(), config=config())
    x, y = batch(0, dp)
    try:
        engine.backward(engine(mine(x, rank), mine(y, rank), rank == 1))
    except Exception as e:  # noqa: BLE001
        ran = "blocks.1, blocks.0" if rank == 1 else "blocks.0, blocks.1"
        assert "different orders" in str(e) and ran in str(e), e
        return str(e).split(";")[0]
    raise AssertionError("rank %d: units in different orders on the ranks went unnoticed" % rank)


def check_init(rank, dp):
    gpt = dict(vocab=VOCAB, block_size=BLOCK, n_layer=4, n_head=2, n_embd=EMBD)

    def built_partitioned():
        with tessera.zero.Init(config=config()) as init:
            model = Gpt(seed=3 + rank, gathered=lambda p: tessera.zero.GatheredParameters(p, modifier_rank=0), **gpt)
        whole = sum(p.numel() * p.element_size() for p in model.parameters())
        for name, p in model.named_parameters():
            assert p.untyped_storage().nbytes() <= p.element_size() and torch.isnan(p).all(), name
        held = init._cinit.held_bytes
        assert whole / dp <= held <= whole / dp + 64 * 4 * dp, (held, whole)
        return model

    train_against_reference(lambda: Gpt(seed=3, **gpt), 3, rank, dp, make_model=built_partitioned)
    return ""


class _RootWrites(nn.Module):
    """A root that initializes its child's weights after building it, HF-style (`.data`, nn.init)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 32)
        self.lin.weight.data.fill_(0.25)
        nn.init.constant_(self.lin.bias, -1.5)


def check_init_plain(rank, dp):
    gpt = dict(vocab=VOCAB, block_size=BLOCK, n_layer=4, n_head=2, n_embd=EMBD)

    def built_partitioned():
        with tessera.zero.Init(config=config()):
            model = Gpt(seed=3 + rank, **gpt)
        for name, p in model.named_parameters():
            assert p.untyped_storage().nbytes() <= p.element_size(), name
        return model

    train_against_reference(lambda: Gpt(seed=3, **gpt), 3, rank, dp, make_model=built_partitioned)
    with tessera.zero.Init(config=config()):
        root = _RootWrites()
    with tessera.zero.GatheredParameters(list(root.parameters())):
        assert torch.equal(root.lin.weight, torch.full((32, 64), 0.25)), root.lin.weight
        assert torch.equal(root.lin.bias, torch.full((32,), -1.5)), root.lin.bias
    return ""


def check_init_auto(rank, dp):
    """zero_optimization.stage "auto": Init resolves it with the plan tessera.initialize() gets, and
    partitions when the planner's choice is 3 (fixed to 3 by the request here; to 1, nothing); without
    a plan it says what it needs."""
    cfg = config(stage="auto")
    del cfg["gradient_accumulation_steps"]  # follows from the global batch
    cfg["train_batch_size"] = MICRO * dp
    gpt = dict(vocab=VOCAB, block_size=BLOCK, n_layer=2, n_head=2, n_embd=EMBD)
    model_request = {"layers": 2, "hidden": EMBD, "heads": 2, "vocab": VOCAB, "seq_len": BLOCK, "device": "cpu",
                     "cpu_mem": 16}
    try:
        tessera.zero.Init(config=cfg)
        raise AssertionError("zero.Init accepted stage \"auto\" without a plan")
    except ValueError as e:
        assert "give plan=" in str(e), e
    for stage in (1, 3):
        plan = dict(model_request, zero=stage)
        with tessera.zero.Init(config=cfg, plan=plan):
            model = Gpt(seed=3, **gpt)
        empty = [p.untyped_storage().nbytes() <= p.element_size() for p in model.parameters()]
        assert all(empty) if stage == 3 else not any(empty), (stage, empty)
        engine, _, _, _ = tessera.initialize(model=model, config=cfg, plan=plan)
        assert engine.zero_optimization_stage() == stage, engine.zero_optimization_stage()
        x, y = batch(0, dp)
        engine.backward(engine(mine(x, rank), mine(y, rank)))
        engine.step()
    return ""


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def _restart_peak():
    """Restarts the process's peak RSS (VmHWM) at its RSS now; returns that RSS, KiB."""
    tessera._C.cpu_block_cache_release()  # blocks cached from earlier work would hide new ones
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    return _rss_kib("VmRSS")


def _construction_peak_mib(build):
    """(the model, how far building it raised the process's peak RSS above its RSS before, MiB)."""
    before = _restart_peak()
    model = build()
    return model, (_rss_kib("VmHWM") - before) / 1024.0


class Stack(nn.Module):
    def __init__(self, layers, width):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(layers))

    def forward(self, x, targets):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return F.mse_loss(x, targets)


def check_init_memory(rank, dp):
    layers, width = 32, 1024
    whole_mib = layers * width * width * 4 / 2**20
    cfg = config(reduce_bucket_size=width * width)
    init = tessera.zero.Init(config=cfg)  # joins the process groups before the measurement

    def partitioned():
        with init:
            return Stack(layers, width)

    model, grew = _construction_peak_mib(partitioned)
    limit = whole_mib / dp + 6 * width * width * 4 / 2**20  # the chunks + a few layers in flight
    assert grew < limit, "building under zero.Init raised the peak by %.0f MiB (limit %.0f)" % (grew, limit)
    engine, _, _, _ = tessera.initialize(model=model, config=cfg)
    x, y = torch.randn(MICRO, width), torch.randn(MICRO, width)
    engine.backward(engine(x, y))
    engine.step()
    assert engine.memory_report()["parameters"] <= whole_mib * 2**20 / dp + 4096, engine.memory_report()
    _, grew_whole = _construction_peak_mib(lambda: Stack(layers, width))
    assert grew_whole >= 0.9 * whole_mib, grew_whole  # the measurement sees a whole model
    return "peak +%.0f MiB under zero.Init, +%.0f MiB without, model %.0f MiB" % (grew, grew_whole, whole_mib)


PEAK_LAYERS, PEAK_WIDTH = 32, 1024  # 128 MiB of fp32 weights


def _training_peak(stage, under_init):
    """A user's plain script; returns the rise of the process's peak RSS over the whole run, MiB."""
    before = _restart_peak()
    layer = PEAK_WIDTH * PEAK_WIDTH
    cfg = config(stage=stage, reduce_bucket_size=layer, allgather_bucket_size=layer,
                 stage3_max_live_parameters=2 * layer, stage3_prefetch_bucket_size=layer,
                 stage3_param_persistence_threshold=0)
    if under_init:
        with tessera.zero.Init(config=cfg):
            model = Stack(PEAK_LAYERS, PEAK_WIDTH)
    else:
        model = Stack(PEAK_LAYERS, PEAK_WIDTH)
    engine, _, _, _ = tessera.initialize(model=model, config=cfg)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(MICRO, PEAK_WIDTH, generator=g), torch.randn(MICRO, PEAK_WIDTH, generator=g)
        engine.backward(engine(x, y))
        engine.step()
    grew = (_rss_kib("VmHWM") - before) / 1024.0
    peak = tessera.comm.all_reduce(torch.tensor([grew], dtype=torch.float64), "max", "data").item()
    mem = engine.memory_report()  # what the engine holds: its buffers, the gathered window's pool
    accounted = (mem["total"] + mem["gathered_pool"]) / 2**20
    capacity = tessera._C.cpu_block_cache_stats()["capacity_bytes"] / 2**20
    return "peak_mib=%.1f accounted_mib=%.1f cache_mib=%.1f model_mib=%.1f" % (
        peak, accounted, capacity, PEAK_LAYERS * PEAK_WIDTH * PEAK_WIDTH * 4 / 2**20)


def check_peak_stage2(rank, dp):
    return _training_peak(2, False)


def check_peak_stage3(rank, dp):
    return _training_peak(3, False)


def check_peak_stage3_init(rank, dp):
    return _training_peak(3, True)


def main():
    rank, dp = tessera.comm.get_rank(), tessera.comm.get_world_size()
    for name in sys.argv[1:]:
        detail = globals()["check_" + name](rank, dp)
        if rank == 0:
            print("ok %s %s" % (name, detail), flush=True)


if __name__ == "__main__":
    worker_exit.run(main)
