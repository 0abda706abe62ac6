"""The monitors (python/tessera/monitor/): a 2-rank run with csv_monitor, tensorboard, wandb and comet
enabled at once (wandb and comet offline: no API key here), each read back through its own files
with its own package's reader where it has one: the same train_loss, lr and grad_norm series as
tessera's metrics.jsonl (the progress figures: the loss averaged over the data-parallel ranks), at
DeepSpeed's step (global samples), written by rank 0 alone."""
import glob
import json
import os
import subprocess
import sys
import zipfile

import pytest

from checkpoint_cases import TINY, config, run_jobs
from conftest import CLI, child_env

STEPS = 4
GLOBAL_BATCH = TINY["global_batch"]


def wandb_records(path):
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
    LevelDB's log format (32 KiB blocks; each record a 7-byte header: CRC, length, type FULL=1,
    FIRST=2, MIDDLE=3, LAST=4)."""
    from wandb.proto import wandb_internal_pb2
    data, pos, block, records, pending = open(path, "rb").read(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            r = wandb_internal_pb2.Record()
            r.ParseFromString(pending + chunk)
            records.append(r)
            pending = b""
        elif kind in (2, 3):
            pending += chunk
    return records


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitors")
    env = {"WANDB_DIR": str(tmp), "COMET_OFFLINE_DIRECTORY": str(tmp / "comet")}
    saved = {k: os.environ.get(k) for k in list(env) + ["WANDB_API_KEY", "COMET_API_KEY", "WANDB_MODE"]}
    os.environ.update(env)
    for k in ("WANDB_API_KEY", "COMET_API_KEY", "WANDB_MODE"):
        os.environ.pop(k, None)
    try:
        section = {"enabled": True, "output_path": str(tmp), "job_name": "job"}
        c = config(stage=1, csv_monitor=section, tensorboard=section, wall_clock_breakdown=True,
                   wandb={"enabled": True, "project": "tessera-test"},
                   comet={"enabled": True, "project": "tessera-test", "samples_log_interval": 1})
        run_jobs(tmp, 2, [dict(TINY, config=c, steps=STEPS)])
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    records = [json.loads(line) for line in open(tmp / "job" / "metrics.jsonl")]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # What every monitor must hold: tag -> [(global samples, value)].
    expected = {"Train/Samples/%s" % tag: [(r["step"] * GLOBAL_BATCH, r[key]) for r in records]
                for tag, key in (("train_loss", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm"))}
    return tmp, expected


def assert_series(found, expected, where):
    for tag, series in expected.items():
        got = found.get(tag)
        assert got is not None, "%s has no %s (it has %s)" % (where, tag, sorted(found))
        assert [s for s, _ in got] == [s for s, _ in series], (where, tag)
        assert [v for _, v in got] == pytest.approx([v for _, v in series], rel=1e-6), (where, tag)


def test_tensorboard_event_files_hold_the_series(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tmp, expected = run
    assert len(glob.glob(str(tmp / "job" / "events.out.tfevents.*"))) == 1  # rank 0 alone
    events = EventAccumulator(str(tmp / "job"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert_series({t: [(e.step, e.value) for e in events.Scalars(t)] for t in tags}, expected, "tensorboard")
    assert {"Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
            "Train/Samples/elapsed_time_ms_step", "Train/Samples/samples_per_sec"} <= set(tags)
    assert "Train/Samples/loss_scale" not in tags  # fp16 only, as DeepSpeed


def test_csv_files_in_deepspeeds_layout(run):
    tmp, expected = run
    found = {}
    for tag in expected:
        path = tmp / "job" / (tag.replace("/", "_") + ".csv")
        lines = path.read_text().splitlines()
        assert lines[0] == "step," + tag.rsplit("/", 1)[-1]
        found[tag] = [(int(s), float(v)) for s, v in (line.split(",") for line in lines[1:])]
    assert_series(found, expected, "csv")


def test_tessera_plot_draws_the_csv_files(run):
    tmp, _ = run
    r = subprocess.run([CLI, "plot", str(tmp / "job"), "-o", str(tmp / "csv.png")], env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "%d steps -> " % STEPS in r.stdout and (tmp / "csv.png").stat().st_size > 10000


def test_wandb_offline_run_holds_the_series(run):
    tmp, expected = run
    runs = glob.glob(str(tmp / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1, runs  # offline (no API key), one run: rank 0's
    found = {}
    for r in wandb_records(runs[0]):
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for tag, value in items.items():
                if tag.startswith("Train/"):
                    found.setdefault(tag, []).append((items["_step"], value))
    assert_series(found, expected, "wandb")


def test_comet_offline_archive_holds_the_series(run):
    tmp, expected = run
    archives = glob.glob(str(tmp / "comet" / "*.zip"))
    assert len(archives) == 1, archives
    found = {}
    with zipfile.ZipFile(archives[0]) as z:
        for line in z.read("messages.json").decode().splitlines():
            m = json.loads(line)
            if m.get("type") == "metric_msg":
                metric = m["payload"]["metric"]
                found.setdefault(metric["metricName"], []).append((metric["step"], metric["metricValue"]))
    assert_series(found, expected, "comet")


@pytest.mark.parametrize("section,package", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("comet", "comet_ml")])
def test_a_monitor_without_its_package_names_the_package(section, package, monkeypatch, tmp_path):
    from tessera.monitor import MonitorMaster
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if it were not installed
    if package == "tensorboard":
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match="needs the `%s` package" % package):
        MonitorMaster({section: {"enabled": True, "output_path": str(tmp_path)}}, rank=0)
    assert MonitorMaster({section: {"enabled": True}}, rank=1).writers == []  # the other ranks never import it


def test_write_events_from_a_script(tmp_path):
    from tessera.monitor import MonitorMaster
    m = MonitorMaster({"csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "mine"}})
    m.write_events([("Eval/accuracy", 0.5, 100), ("Eval/accuracy", 0.75, 200), ("Eval/skipped", None, 200)])
    m.close()
    assert (tmp_path / "mine" / "Eval_accuracy.csv").read_text() == "step,accuracy\n100,0.5\n200,0.75\n"
    assert not (tmp_path / "mine" / "Eval_skipped.csv").exists()
