"""Table of benchmarks/torchtitan_device.sh's runs: torchtitan beside the executor and DDP script.

    python benchmarks/torchtitan_summary.py /tmp/titan > summary.md
    python benchmarks/torchtitan_summary.py /tmp/titan --json docs/benchmarks/data/F.json

Executor and DDP-script rows come from ``mfu_summary.row`` (same FLOP count, MFU and
speed-up); torchtitan rows from ``torchtitan_bench.py``'s JSON, whose MFU uses meshplan's FLOP
count of the Llama-shaped model torchtitan built (its own count is the last column). Two
speed-up columns: against the compiled DDP script (gpt3-1.3b) and against compiled torchtitan.
A run that did not write its results gets the last lines of its log (torchtitan's traceback
or the time-out), so a failed torchtitan run still says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

RUNS = ["dp2z2_compiled", "ddp_compiled", "titan_compiled", "dp2z2_llama_compiled",
        "titan_eager"]
TAIL_LINES = 25


def titan_row(name: str, doc: dict) -> dict:
    return {"name": name, "status": "ok", "what": (
        f"torchtitan {doc['torchtitan_version']} FSDP2 dp {doc['world']} "
        f"mb{doc['local_batch_size']} ac={doc['activation_checkpoint']}"
        + (" compiled" if doc["compile"] else "")), "model": doc["model"]["name"],
        "step_s": doc["step_time_s"], "pred_s": None, "tokens_per_s": doc["tokens_per_s"],
        "mfu": doc["mfu"], "mfu_causal": doc["mfu_causal"], "mem": doc["memory_peak_bytes"],
        "mfu_own": doc["torchtitan_mfu"], "doc": doc}


def load_row(name: str, d: Path) -> dict | None:
    from mfu_summary import row
    f = d / f"{name}.json"
    if f.exists():
        doc = json.loads(f.read_text())
        if "torchtitan_version" in doc:
            return titan_row(name, doc)
        r = row(name, d)
        if r["status"] == "ok":
            r["model"] = r["doc"]["model"]["name"]
        return r
    log = d / f"{name}.log"
    if not log.exists():
        return None
    return {"name": name, "status": "no results file",
            "tail": error_tail(log.read_text(errors="replace"))}


def error_tail(text: str) -> list[str]:
    """The last lines the ranks wrote before torchrun's own failure report (which only
    names exit codes), with torchrun's line naming the failed rank."""
    lines = text.splitlines()
    cut = next((i for i, ln in enumerate(lines)
                if "multiprocessing/api.py" in ln and "failed (exitcode" in ln), None)
    if cut is None:                  # no rank failed: a time-out, or it ended by itself
        return lines[-TAIL_LINES:]
    before = [ln for ln in lines[:cut] if "closing signal SIGTERM" not in ln]
    return before[-TAIL_LINES:] + [lines[cut]]


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("runs", nargs="*", default=RUNS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    d = args.dir
    rows = [r for r in (load_row(n, d) for n in args.runs) if r is not None]
    ok = {r["name"]: r for r in rows if r["status"] == "ok"}
    ddp, titan = ok.get("ddp_compiled"), ok.get("titan_compiled")
    print((d / "env.txt").read_text() if (d / "env.txt").exists() else "")
    print("| run | model | layout | step ms | tokens/s | MFU | MFU causal | peak GiB "
          "| vs ddp_compiled | vs titan_compiled | torchtitan's MFU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["status"] != "ok":
            print(f"| {r['name']} | {r['status']} | | | | | | | | | |")
            continue
        mem = f"{r['mem'] / 2**30:.1f}" if r.get("mem") else "-"
        vs = [f"{b['step_s'] / r['step_s']:.3f}×" if b else "-" for b in (ddp, titan)]
        own = f"{100 * r['mfu_own']:.1f} %" if r.get("mfu_own") else "-"
        print(f"| {r['name']} | {r['model']} | `{r['what']}` | {1e3 * r['step_s']:.1f} | "
              f"{r['tokens_per_s']:,.0f} | {100 * r['mfu']:.1f} % | "
              f"{100 * r['mfu_causal']:.1f} % | {mem} | {vs[0]} | {vs[1]} | {own} |")
    for r in rows:
        if "tail" in r:
            print(f"\n{r['name']}: last {len(r['tail'])} lines of its log\n```")
            print("\n".join(r["tail"]))
            print("```")
    if (d / "runs.txt").exists():
        print("\n" + (d / "runs.txt").read_text())
    if args.json:
        keep = ("name", "status", "what", "model", "step_s", "tokens_per_s", "mfu",
                "mfu_causal", "mem", "mfu_own")
        doc = {"schema": "meshplan.torchtitan_runs", "version": 1,
               "env": (d / "env.txt").read_text() if (d / "env.txt").exists() else "",
               "runs_txt": (d / "runs.txt").read_text() if (d / "runs.txt").exists() else "",
               "runs": [{**{k: r[k] for k in keep if k in r},
                         **({"step_times_s": r["doc"].get("step_times_s")
                             or r["doc"].get("measured", {}).get("step_times_s"),
                             "model_spec": r["doc"]["model"], "job": r["doc"]["job"]}
                            if r["status"] == "ok" else {"tail": r.get("tail")})}
                        for r in rows]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
