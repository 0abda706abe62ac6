"""tessera.pipe (PipelineModule, LayerSpec, TiedLayerSpec, train_batch) against plain PyTorch:
pipeline_worker.py trains a tied-embedding language model cut into stages and checks, on every
rank, each step's loss and global gradient norm (clipping active) and its stage's parameters
against the same layers trained whole in one process — SGD (a wrong gradient scale shows) and
AdamW; 1F1B, GPipe, ZB-H1, interleaved 1F1B and ZB-V (2 chunks per stage); pp 2 and 4; pp 2 x dp 2 with ZeRO 2
and 3 (gathered per batch, and per micro-batch under ZB-H1); pp 2 x tp 2 and pp 2 x dp 2 x tp 2;
activation_checkpoint_interval; and
fp16's overflow decision shared by the stages."""
import math
import re

import pytest

from conftest import check, launch

# Each launch runs the cases of one grid (ranks, stages, tp) one after the other (a process's first
# initialize fixes its process groups' degrees): 5 launches for 20 cases.
# (stages, schedule, ZeRO stage, optimizer, activation_checkpoint_interval, tp) and what each shows.
GRIDS = {
    "pp2": (2, [(2, "1f1b", 0, "SGD", 0, 1, "pp2-1f1b-z0-sgd"), (2, "gpipe", 1, "AdamW", 0, 1, "pp2-gpipe-z1-adamw"),
                (2, "1f1b", 1, "SGD", 2, 1, "pp2-checkpoint-every-2"), (2, "1f1b", 1, "bf16", 0, 1, "pp2-bf16-sgd"),
                (2, "zb_h1", 0, "SGD", 0, 1, "pp2-zbh1-z0-sgd"),
                (2, "interleaved_1f1b", 1, "SGD", 0, 1, "pp2-interleaved-z1-sgd"), (2, "zb_v", 1, "SGD", 0, 1, "pp2-zbv-z1-sgd")]),
    "pp2xdp2": (4, [(2, "1f1b", 2, "AdamW", 0, 1, "pp2xdp2-z2-adamw"),
                    (2, "interleaved_1f1b", 2, "AdamW", 0, 1, "pp2xdp2-interleaved-z2-adamw"),
                    (2, "1f1b", 3, "AdamW", 0, 1, "pp2xdp2-z3-adamw"),
                    (2, "zb_h1", 3, "SGD", 0, 1, "pp2xdp2-zbh1-z3-per-micro-batch-sgd"),
                    (2, "zb_v", 3, "AdamW", 0, 1, "pp2xdp2-zbv-z3-adamw")]),
    "pp4": (4, [(4, "1f1b", 1, "SGD", 0, 1, "pp4-z1-sgd"), (4, "zb_h1", 1, "AdamW", 0, 1, "pp4-zbh1-z1-adamw")]),
    "pp2xtp2": (4, [(2, "1f1b", 1, "SGD", 0, 2, "pp2xtp2-z1-sgd"), (2, "zb_h1", 2, "SGD", 0, 2, "pp2xtp2-zbh1-z2-sgd"),
                    (2, "interleaved_1f1b", 1, "SGD", 0, 2, "pp2xtp2-interleaved-z1-sgd"),
                    (2, "zb_v", 2, "SGD", 0, 2, "pp2xtp2-zbv-z2-sgd")]),
    "pp2xdp2xtp2": (8, [(2, "1f1b", 2, "AdamW", 0, 2, "pp2xdp2xtp2-z2-adamw"),
                        (2, "interleaved_1f1b", 3, "SGD", 0, 2, "pp2xdp2xtp2-interleaved-z3-sgd")]),
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_pipeline_module_matches_plain_pytorch(grid):
    """1F1B, GPipe, ZB-H1, interleaved 1F1B and ZB-V at ZeRO 0-3 with SGD and AdamW (with
    activation_checkpoint_interval 2: every 2 layers recomputed in backward, same results; with tp
    2: each block's MLP split over the tensor group, parameters gathered for the comparison; bf16:
    against the fp32 reference within bf16's rounding, 2% of the loss)"""
    ranks, cases = GRIDS[grid]
    argv = []
    for stages, schedule, zero, optimizer, interval, tp, _ in cases:
        argv += (["+"] if argv else []) + [str(stages), schedule, str(zero), optimizer, str(interval), str(tp)]
    result = check(launch(ranks, ["tests/python/workers/pipeline_worker.py"] + argv))
    for i, case in enumerate(cases):
        for rank in range(ranks):
            assert "pipeline ok on rank %d case %d " % (rank, i) in result.stdout, (case[-1], result.stdout)


def test_fp16_overflow_is_decided_for_the_whole_pipeline(monkeypatch, tmp_path):
    """fp16 from a loss scale of 2^20: the overflowing steps are skipped on every stage alike and
    every stage ends with the same scale and step count. The pipeline engine's monitor events
    (csv_monitor, DeepSpeed's tags) hold every step's loss and halving scale."""
    monkeypatch.setenv("MONITOR_DIR", str(tmp_path))
    result = check(launch(2, ["tests/python/workers/pipeline_worker.py", "2", "1f1b", "1", "fp16"]))
    for rank in range(2):
        assert "pipeline fp16 ok on rank %d" % rank in result.stdout, result.stdout
    rows = {}
    for tag in ("train_loss", "loss_scale", "lr"):
        lines = (tmp_path / "pipe" / ("Train_Samples_%s.csv" % tag)).read_text().splitlines()
        assert lines[0] == "step," + tag
        rows[tag] = [(int(s), float(v)) for s, v in (line.split(",") for line in lines[1:])]
    assert [s for s, _ in rows["train_loss"]] == [(i + 1) * 4 * 2 for i in range(10)]  # global samples: micro 2 x 4
    scales = [v for _, v in rows["loss_scale"]]
    assert scales[0] < 2.0 ** 20 and scales[-1] == scales[-2] and sorted(scales, reverse=True) == scales
    # flops_profiler through the C++ profiler: the first stage's ops (its Python layers), once.
    report = (tmp_path / "flops.txt").read_text()
    assert report.count("Profile Summary at step 3:") == 1 and "model parallel size:" in report, report
    flops = re.search(r"fwd flops per GPU:\s+([0-9.]+) ([KMG]?)", report)
    assert flops and float(flops.group(1)) > 0, report


def test_simulator_and_chunk_partition_from_python():
    """tessera._C.pipeline.simulate gives any schedule's idle fractions and activations (ZB-H1 below
    1F1B at 1F1B's peak; interleaved (p - 1)/(v·m + p - 1)); partition_chunks refuses chunks that do
    not divide the blocks, naming pipeline.virtual_stages and the sizes."""
    import tessera
    pipeline = tessera._C.pipeline
    one = pipeline.simulate("1f1b", 4, 8, 1, 1.0, 2.0, 0.5)
    zb = pipeline.simulate("zb_h1", 4, 8, 1, 1.0, 2.0, 0.5)
    interleaved = pipeline.simulate("interleaved_1f1b", 4, 8, 2, 1.0, 2.0, 0.5)
    assert all(abs(i - 3 / 11) < 1e-9 for i in one["idle_fraction"])
    assert all(abs(i - 3 / 19) < 1e-9 for i in interleaved["idle_fraction"])
    assert all(z < o for z, o in zip(zb["idle_fraction"], one["idle_fraction"]))
    assert max(zb["peak_activations"]) == max(one["peak_activations"]) == 4
    assert abs(zb["makespan"] - (3 * 8 + 3)) < 1e-9
    v = pipeline.simulate("zb_v", 4, 8, 2, 1.0, 2.0, 0.5)  # two half-stage chunks a stage, in a V
    assert v["makespan"] < zb["makespan"] and max(v["peak_activations"]) <= 2 * 4
    blocks = [("Embedding", 10)] + [("Block", 100)] * 12 + [("Head", 10)]
    # 12 chunks of one block each, the embedding with the first and the head with the last
    assert pipeline.partition_chunks(blocks, 4, 3, "type:Block") == [0] + list(range(2, 13)) + [14]
    with pytest.raises(ValueError, match=r"pipeline.virtual_stages 2 x pipeline.stages 4 = 8 model chunks do not "
                                         r"divide the 12 layers matching \"type:Block\""):
        pipeline.partition_chunks(blocks, 4, 2, "type:Block")


def test_measured_costs_replay_and_expected_idle_from_python():
    """measured_costs reads a batch's costs back off its timelines (posting a send among them);
    expected_idle replays the batch exactly and, where its instructions' costs spread, expects more
    idle than the simulation with their means."""
    import tessera
    pipeline = tessera._C.pipeline
    args = ("zb_v", 2, 4, 2)
    plain = pipeline.simulate(*args, 1.0, 2.0, 0.5, send=0.1, receive=[0.05, 0.05], posting=[0.01, 0.02])
    costs = pipeline.measured_costs(*args, plain["timeline"])
    assert costs["posting"] == pytest.approx([0.01, 0.02]) and costs["send"] == pytest.approx(0.1)
    steady = pipeline.expected_idle(*args, plain["timeline"], draws=10)
    assert steady["replayed"] == pytest.approx(plain["idle_fraction"])
    assert steady["mean"] == pytest.approx(plain["idle_fraction"])
    assert steady["measured"] == pytest.approx(plain["idle_fraction"])  # the simulator's own batch, measured
    # Each compute instruction its own cost, spread +-30% along the list.
    own = [[(1.0 if op == "Forward" else 1.5) * (1 + 0.3 * math.sin(1.7 * i + 2.3 * s))
            if op in ("Forward", "Backward", "BackwardWeight") else 0.01
            for i, (op, _, _, _, _) in enumerate(stage)] for s, stage in enumerate(plain["timeline"])]
    ran = pipeline.simulate(*args, send=0.1, receive=[0.05, 0.05], own=own)
    spread = pipeline.expected_idle(*args, ran["timeline"], draws=50, seed=3)
    assert spread["replayed"] == pytest.approx(ran["idle_fraction"])
    mean = pipeline.simulate(*args, **{k: v for k, v in pipeline.measured_costs(*args, ran["timeline"]).items()
                                       if k != "timed_transfers"})
    assert all(e > m for e, m in zip(spread["mean"], mean["idle_fraction"]))
    assert all(lo <= e <= hi for lo, e, hi in zip(spread["low"], spread["mean"], spread["high"]))
    with pytest.raises(ValueError, match="own cost must be given for every stage's list"):
        pipeline.simulate(*args, own=[own[0]])


def test_a_v_placed_module_and_the_schedule_must_agree():
    """PipelineModule(placement="v") cuts 2·num_stages chunks in a V (stage 0 holds the first and the
    last, and needs loss_fn); pipeline.schedule "zb_v" without it, or it without "zb_v", is refused
    naming both."""
    result = check(launch(2, ["tests/python/workers/pipeline_worker.py", "2", "zb_v", "1", "placement"]))
    for rank in range(2):
        assert "pipeline placement ok on rank %d" % rank in result.stdout, result.stdout
