"""benchmarks/cp_phase_gap.py reads the executor's per-phase times out of a cp GPU check's
log tarball: later tarballs replace earlier layouts, the last backward's excess is apart."""

from __future__ import annotations

import io
import json
import math
import tarfile


def _doc(forward_ms, backward_ms, optimizer_ms=5.0):
    ph = {f"forward {i}": {"device_ms": f, "host_ms": 0.0} for i, f in enumerate(forward_ms)}
    ph |= {f"backward {i}": {"device_ms": b, "host_ms": 0.0} for i, b in enumerate(backward_ms)}
    ph["optimizer"] = {"device_ms": optimizer_ms, "host_ms": 0.0}
    return {"measured": {"step_time_s": 1.0, "memory_per_rank": [{"phase_median_ms": ph}]}}


def _tar(path, docs):
    with tarfile.open(path, "w:gz") as tar:
        for name, doc in docs.items():
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(f"cp_gpu/results/{name}.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_phases_and_later_runs_replace_earlier(load_benchmark, tmp_path):
    pg = load_benchmark("cp_phase_gap")
    a, b = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    _tar(a, {"x": _doc([100, 110, 90], [200, 220, 260]), "y": _doc([1], [2, 3])})
    _tar(b, {"y": _doc([10, 10], [20, 50])})
    docs = pg.results([str(a), str(b)])
    assert sorted(docs) == ["x", "y"]
    x = pg.phases(docs["x"])
    assert math.isclose(x["forward"], 0.1) and math.isclose(x["backward"], 0.21)
    assert math.isclose(x["tail"], 0.05) and math.isclose(x["optimizer"], 0.005)
    assert math.isclose(pg.phases(docs["y"])["tail"], 0.03)        # the later run's row
    pipelined = {"measured": {"memory_per_rank": [{"phase_median_ms": {
        "passes": {"device_ms": 9.0}, "optimizer": {"device_ms": 2.0}}}]}}
    p = pg.phases(pipelined)
    assert math.isnan(p["forward"]) and math.isclose(p["optimizer"], 0.002)
