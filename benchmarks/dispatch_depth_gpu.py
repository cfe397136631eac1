"""Per-layer CPU dispatch of one module by timing mode and stack depth, interleaved (1 GPU).

Is calibrate's per-layer CPU (2-block queued reading, per-call part fitted against a 4-block
queued reading, calibrate/layer_rows.py ``cpu_fixed``) what a deep stack dispatches in steady
state, as a training step does? (docs/benchmarks/host.md, section 6.)

For each setting (compiled bf16 / fp8 at recompute none / selective / full, smallest
micro-batch) one module per depth is built with calibrate's own ``_build`` and timed, in
``--rounds`` round-robin rounds so that host drift hits every (setting, depth) alike:

* ``q2`` / ``q4``: calibrate's queued timing (``layer_timing._measure`` with ``_Queue``) on
  2 and 4 blocks — exactly the readings ``cpu_values`` / ``cpu_fixed`` use;
* ``sD``: steady on ``--deep`` blocks (default: the model's layers): ``--mbs`` micro-batches
  back to back without synchronizing, the first dropped (calibrate's ``steady_cpu``); a
  reading counts only if the GPU waited for the CPU, as calibrate counts it.

Reports per layer (forward / backward ms): q2, q4, sD, calibrate's split (per layer and
per call from q2/q4), the split from q2/sD, and their spread over rounds.

    python benchmarks/dispatch_depth_gpu.py --model benchmarks/sets/fp8h20/m01.json:2048 \
        --settings fp8:none,fp8:full,bf16:none --rounds 5 --out $OUT/dd.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="ModelSpec JSON:SEQ_LEN")
    ap.add_argument("--settings", default="fp8:none,fp8:full,bf16:none",
                    help="precision:recompute,... (compiled)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--deep", type=int, default=0, help="blocks of the steady stack (0: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--iters", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="eager blocks instead of compiled")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: a tiny model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from meshplan.calibrate.layer_build import _build, _layer_amp
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_ranks import _Groups
    from meshplan.calibrate.layer_rows import cpu_fixed, cpu_values
    from meshplan.calibrate.layer_run import STEADY_PACED_MAX, _layer_step
    from meshplan.calibrate.layer_timing import WARMUP, _measure, _Queue, steady_cpu
    from meshplan.spec import ModelSpec

    path, _, seq = args.model.rpartition(":")
    model = ModelSpec.from_dict(json.loads(Path(path).read_text()))
    seq = int(seq)
    if args.tiny:
        model = replace(model, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                        ffn_hidden_size=512, vocab_size=1024, num_layers=8)
        seq = 128
    cuda = torch.cuda.is_available() and not args.tiny
    import torch._dynamo
    # every (setting, depth) module stays compiled side by side for the round-robin: room for
    # their cache entries, so that none falls back to eager (calibrate resets per row instead)
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    deep = args.deep or model.num_layers
    groups = _Groups(1, 0, device.type)
    queue = _Queue(device, agree=lambda v: v) if cuda else None
    from meshplan.executor.measure import host_dispatch_probe_us
    doc = {"model": model.name, "seq_len": seq, "micro_batch": args.micro_batch, "deep": deep,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "torch": torch.__version__, "probe_us": [host_dispatch_probe_us(device)],
           "readings": []}
    # one module per (setting, depth), compiled once (warm-up), then timed round-robin
    cells = []
    for s in args.settings.split(","):
        prec, rc = s.split(":")
        cfg = Config(model=model, seq_len=seq, tp=1, sequence_parallel=False, recompute=rc,
                     micro_batch=args.micro_batch, compile=not args.eager and cuda,
                     precision=prec, fp8_recipe="tensorwise" if prec == "fp8" else "")
        for depth in (2, 4, deep):
            m, _ = _build(cfg, depth, device, groups)
            _, _, reset, forward, backward = _layer_step(cfg, m, device)
            with _layer_amp(cfg, device):
                for _ in range(WARMUP + 1):          # compiles here
                    reset(); y = forward(); backward(y); del y
            if cuda:
                torch.cuda.synchronize()
            cells.append((s, depth, cfg, m, reset, forward, backward))
            print("built", s, depth, flush=True)
    for rnd in range(args.rounds):
        for s, depth, cfg, m, reset, forward, backward in cells:
            with _layer_amp(cfg, device):
                if depth in (2, 4):
                    samples, _ = _measure(forward, backward, reset, device=device,
                                          warmup=WARMUP, iters=args.iters, barrier=lambda: None,
                                          queue=queue)
                    f, b = cpu_values(samples, layers=depth) if cuda else (
                        statistics.median(x.forward_s for x in samples) / depth,
                        statistics.median(x.backward_s for x in samples) / depth)
                    rec = {"mode": f"q{depth}", "f": f, "b": b,
                           "bad": sum(not x.queued_ok for x in samples)}
                else:
                    f, b, ratio = steady_cpu(forward, backward, reset, device=device,
                                             barrier=lambda: None, micro_batches=args.mbs)
                    rec = {"mode": f"s{depth}", "f": f / depth, "b": b / depth,
                           "gpu_over_host": ratio, "paced": ratio <= STEADY_PACED_MAX}
            rec.update(setting=s, round=rnd, t=time.time())
            doc["readings"].append(rec)
            print(json.dumps(rec), flush=True)
    doc["probe_us"].append(host_dispatch_probe_us(device))
    from torch._dynamo.utils import counters
    doc["dynamo"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break")}
    # summary: medians over rounds; calibrate's split (q2, q4) and the deep one (q2, sD)
    summary = {}
    for s in args.settings.split(","):
        med = {}
        for mode in ("q2", "q4", f"s{deep}"):
            rs = [r for r in doc["readings"] if r["setting"] == s and r["mode"] == mode
                  and r.get("paced", True)]
            if rs:
                med[mode] = (statistics.median(r["f"] for r in rs),
                             statistics.median(r["b"] for r in rs),
                             max(r["f"] for r in rs) / min(r["f"] for r in rs) - 1,
                             max(r["b"] for r in rs) / min(r["b"] for r in rs) - 1, len(rs))
        out = {k: {"f_ms": v[0] * 1e3, "b_ms": v[1] * 1e3, "f_spread": v[2],
                   "b_spread": v[3], "n": v[4]} for k, v in med.items()}
        if "q2" in med and "q4" in med:
            per, call = cpu_fixed([(med["q2"][0], med["q2"][1], med["q4"][0], med["q4"][1])],
                                  med["q2"][:2], 2, 4)
            out["calibrate_split"] = {"per_layer_ms": [x * 1e3 for x in per],
                                      "per_call_ms": [x * 1e3 for x in call]}
        if "q2" in med and f"s{deep}" in med:
            per, call = cpu_fixed([(med["q2"][0], med["q2"][1], med[f"s{deep}"][0],
                                    med[f"s{deep}"][1])], med["q2"][:2], 2, deep)
            out["deep_split"] = {"per_layer_ms": [x * 1e3 for x in per],
                                 "per_call_ms": [x * 1e3 for x in call]}
        summary[s] = out
        print("summary", s, json.dumps(out), flush=True)
    doc["summary"] = summary
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
