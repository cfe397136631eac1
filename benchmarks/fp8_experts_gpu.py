"""The routed experts' fp8 grouped GEMMs (meshplan.executor.fp8_grouped) on a GPU: does the
kernel agree with the CPU emulation, and what does it buy over the 16-bit grouped GEMM.

For the recipe the grouped kernel takes (rowwise): ``probe_grouped_kernel``'s
largest relative difference kernel vs emulation (or the kernel's refusal). Then, at expert
shapes of models the checks ran (moeh23: 8 experts of 6400 at hidden 2048; moeh18: 64 of 768;
moeh19: 16 of 2816), the experts' forward and backward (fc1, activation, fc2, as
``GroupedExperts`` runs them, rows spread evenly) in bf16 and in fp8 rowwise, eager and
compiled: GPU milliseconds (CUDA events, median of ``--iters`` after warm-ups) and host
milliseconds to enqueue one pass (no sync), and the fp8 / bf16 speed-up. Also fp8 with the
weights cast once a step (``Fp8ExpertWeights``: ``fp8_cached_*``, the pass without weight
casts) and that once-a-step cast itself (``refresh_*``), eager and compiled.

    python benchmarks/fp8_experts_gpu.py --out $OUT          # 1 GPU of compute capability 9.0

Writes ``$OUT/fp8_experts.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (name, experts, hidden, expert width, routed rows per micro-batch)
CASES = (("moeh24-mb4", 8, 2048, 6144, 4 * 1024 * 1),
         ("moeh25-mb2", 8, 2048, 6528, 2 * 4096 * 1),
         ("moeh23-mb8", 8, 2048, 6400, 8 * 4096 * 2),
         ("moeh23-mb4", 8, 2048, 6400, 4 * 4096 * 2),
         ("moeh19-mb4", 16, 2048, 2816, 4 * 2048 * 4),
         ("moeh18-mb4", 64, 2048, 768, 4 * 2048 * 8))


def _experts(torch, experts: int, hidden: int, width: int, fp8: bool, device):
    from meshplan.executor.fp8 import Fp8Plan, recipe
    from meshplan.executor.moe import GroupedExperts
    from meshplan.spec import ModelSpec
    spec = ModelSpec(name="x", num_layers=1, hidden_size=hidden, num_heads=16,
                     vocab_size=32000, max_seq_len=4096, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", bias=False, num_experts=experts,
                     experts_per_token=2, moe_ffn_hidden_size=width)
    ex = GroupedExperts(spec).to(device)
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0, 0.02)
    ex.backend = "grouped"
    if fp8:
        ex.fp8 = Fp8Plan(recipe=recipe("rowwise"), emulate=False)
    return ex


def _syncs(torch, experts, hidden, width, x, counts, dy, device) -> str:
    """The first device-to-host synchronisation of one eager fp8 forward + backward
    (``torch.cuda.set_sync_debug_mode("error")``), or "none"."""
    ex = _experts(torch, experts, hidden, width, True, device)
    with torch.autocast("cuda", dtype=torch.bfloat16):     # warm-up outside the check
        y = ex(x, counts)
    y.backward(dy)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = ex(x, counts)
        y.backward(dy)
        return "none"
    except RuntimeError as exc:
        import traceback
        return " | ".join(traceback.format_exc().splitlines()[-12:])[:1500] or str(exc)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _time(torch, fn, iters: int) -> tuple[float, float]:
    """(GPU ms, host ms) of one ``fn()`` (forward + backward)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)            # the queue filled ahead: GPU time, not host
        a.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        b.record()
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(b))
    return statistics.median(gpu), statistics.median(host)


def _cached(torch, rec, experts, hidden, width, x, counts, dy, device, compiled: bool,
            iters: int) -> None:
    """fp8 experts whose weights are cast once a step: the pass, and the cast."""
    mode = "compiled" if compiled else "eager"
    ex = _experts(torch, experts, hidden, width, True, device)
    casts = ex.cache_fp8_weights(backend="inductor" if compiled else None)
    call = torch.compile(ex) if compiled else ex

    def refresh():
        for c in casts:
            c.refresh()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = call(x, counts)
        y.backward(dy)
    try:
        refresh()
        rec[f"fp8_cached_{mode}_gpu_ms"], rec[f"fp8_cached_{mode}_host_ms"] = _time(
            torch, step, iters)
        rec[f"refresh_{mode}_gpu_ms"], rec[f"refresh_{mode}_host_ms"] = _time(
            torch, refresh, iters)
    except Exception as exc:
        rec[f"fp8_cached_{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(rec["case"], "cached", mode, {k: v for k, v in rec.items()
                                        if k.startswith(("fp8_cached", "refresh"))}, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cases", nargs="*", help="only these cases (default: all)")
    args = ap.parse_args(argv)
    import torch
    from meshplan.errors import ExecutorError
    from meshplan.executor.fp8 import probe_grouped_kernel, recipe
    device = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "probe": {},
           "cases": []}
    for name in ("rowwise",):
        try:
            out["probe"][name] = probe_grouped_kernel(recipe(name), device)
        except ExecutorError as exc:
            out["probe"][name] = str(exc)
        print("probe", name, out["probe"][name], flush=True)
    for case, experts, hidden, width, rows in CASES:
        if args.cases and case not in args.cases:
            continue
        counts = torch.full((experts,), rows // experts, dtype=torch.int64, device=device)
        x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
        rec = {"case": case, "experts": experts, "hidden": hidden, "width": width,
               "rows": rows, "fp8_eager_host_syncs": _syncs(torch, experts, hidden, width,
                                                            x, counts, dy, device)}
        for compiled in (False, True):
            for fp8 in (False, True):
                ex = _experts(torch, experts, hidden, width, fp8, device)
                call = torch.compile(ex) if compiled else ex

                def step(call=call):
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        y = call(x, counts)
                    y.backward(dy)
                key = f"{'fp8' if fp8 else 'bf16'}_{'compiled' if compiled else 'eager'}"
                try:
                    rec[key + "_gpu_ms"], rec[key + "_host_ms"] = _time(torch, step, args.iters)
                except Exception as exc:      # report, go on to the next variant
                    rec[key + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(case, key, {k: v for k, v in rec.items() if k.startswith(key)},
                      flush=True)
                del ex, call
                torch.cuda.empty_cache()
            _cached(torch, rec, experts, hidden, width, x, counts, dy, device, compiled,
                    args.iters)
        for mode in ("eager", "compiled"):
            b, f = rec.get(f"bf16_{mode}_gpu_ms"), rec.get(f"fp8_{mode}_gpu_ms")
            if b and f:
                rec[f"speedup_{mode}"] = b / f
        out["cases"].append(rec)
        args.out.mkdir(parents=True, exist_ok=True)     # after each case: a timeout keeps it
        (args.out / "fp8_experts.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
