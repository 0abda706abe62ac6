"""The comms logger (python/tessera/comms_logger.py) against the communicators' own statistics: a
2-rank ZeRO-2 run (tests/python/workers/comms_logger_worker.py)."""
import json

import pytest

from conftest import check, launch
from tessera.comms_logger import bus_factor


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("comms") / "out.json"
    result = check(launch(2, ["tests/python/workers/comms_logger_worker.py", str(out)]))
    return json.loads(out.read_text()), result.stdout


def test_totals_equal_the_communicators_statistics(run):
    data, _ = run
    for group, by_op in data["stats"].items():
        logged = data["summary"].get(group, {"ops": {}})["ops"]
        for op, (calls, nbytes, seconds, _sent, _blocked) in by_op.items():
            if calls == 0:
                continue
            rows = logged[op].values()
            assert sum(r["count"] for r in rows) == calls, (group, op)
            assert sum(r["msg_size_bytes"] * r["count"] for r in rows) == nbytes, (group, op)
            assert sum(r["total_latency_ms"] for r in rows) == pytest.approx(1000 * seconds, rel=1e-9), (group, op)
    ops = data["summary"]["data"]["ops"]
    assert {"reduce_scatter", "all_gather"} <= set(ops)  # ZeRO 2's


def test_bandwidths_use_the_standard_factors(run):
    data, _ = run
    for group, g in data["summary"].items():
        for op, rows in g["ops"].items():
            for r in rows.values():
                algbw = r["msg_size_bytes"] * 8 / 1e9 / (r["avg_latency_ms"] / 1000)
                assert r["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
                assert r["busbw_gbps"] == pytest.approx(algbw * bus_factor(op, g["size"]), rel=1e-9)
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("reduce_scatter", 4) == bus_factor("all_gather", 4) == 0.75 and bus_factor("broadcast", 4) == 1.0


def test_the_table_and_the_verbose_lines_are_printed_by_rank_0(run):
    data, stdout = run
    assert stdout.count("Comm. Op            Message Size") == 1
    assert "reduce_scatter [data, 2 ranks]" in stdout and "Total straggler(ms)" in stdout
    assert "step 3 | comm op: reduce_scatter [data] x" in stdout
    assert data["straggler"]["reduce_scatter"][1] <= data["straggler"]["reduce_scatter"][0] + 1e-9
