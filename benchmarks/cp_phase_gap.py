"""Where a context-parallel GPU check's step time went, phase by phase, against today's
prediction: per micro-batch forward and backward, the last backward's tail (the gradient
reduction it waits for), the optimizer step.

Reads the executor's results files inside ``cp_gpu_logs.tar.gz`` (benchmarks/
context_parallel_gpu.py writes it; each rank's ``phase_median_ms`` is the median over the
timed steps of CUDA-event times per phase); a later tarball's layouts replace an earlier
one's of the same name. POST HOC: the measurements were known when the cost model changed.

    python benchmarks/cp_phase_gap.py RUN1/cp_gpu_logs.tar.gz [RUN2/cp_gpu_logs.tar.gz] \
        [--gpu H200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import context_parallel_gpu as cg  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout  # noqa: E402


def results(tarballs: list[str]) -> dict[str, dict]:
    """Layout name -> the executor's results document, later tarballs first."""
    out: dict[str, dict] = {}
    for path in tarballs:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                if m.isfile() and "/results/" in m.name and m.name.endswith(".json"):
                    out[Path(m.name).stem] = json.load(tar.extractfile(m))
    return out


def phases(doc: dict) -> dict[str, float]:
    """Rank 0's forward and backward per micro-batch (medians; the last backward apart),
    the last backward's excess over the others, the optimizer, in seconds (NaN where the
    executor marks only the pipeline's passes)."""
    ph = doc["measured"]["memory_per_rank"][0]["phase_median_ms"]
    fw = [v["device_ms"] / 1e3 for k, v in ph.items() if k.startswith("forward")]
    bw = [v["device_ms"] / 1e3 for k, v in ph.items() if k.startswith("backward")]
    nan = float("nan")
    if not fw or len(bw) < 2:
        return {"forward": nan, "backward": nan, "tail": nan,
                "optimizer": ph.get("optimizer", {}).get("device_ms", nan) / 1e3}
    mid = statistics.median(bw[:-1])
    return {"forward": statistics.median(fw), "backward": mid, "tail": bw[-1] - mid,
            "optimizer": ph["optimizer"]["device_ms"] / 1e3}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tarballs", nargs="+", help="cp_gpu_logs.tar.gz of one run or more")
    p.add_argument("--gpu", default="H200", choices=("H100", "H200"))
    args = p.parse_args(argv)
    cluster = Cluster.preset(f"dgx-{args.gpu.lower()}", nodes=1, gpus_per_node=4)
    print(f"{'layout':30s} {'step':>13s} {'fwd/mb':>13s} {'bwd/mb':>13s} {'tail':>13s} "
          f"{'optimizer':>13s}   (measured / predicted, s)")
    for name, doc in sorted(results(args.tarballs).items()):
        est = estimate(cg.MODEL, cluster, Job(**doc["job"]), Layout(**doc["layout"]))
        m = phases(doc)
        pred = {"forward": est.stage_forward_s[0], "backward": est.stage_backward_s[0],
                "tail": est.time.dp_comm_exposed_s, "optimizer": est.time.optimizer_s}
        cells = " ".join(f"{m[k]:6.3f}/{pred[k]:6.3f}" for k in pred)
        print(f"{name:30s} {doc['measured']['step_time_s']:6.3f}/{est.step_time_s:6.3f} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
