"""Expert GEMMs of published MoE runs, timed on one GPU against the cost model's datasheet
price (issue 38 item 6: what holds GPT-OSS-120B at ~23 % of the BF16 peak).

For each case — the local experts and rows per expert one rank computes in a published run
(docs/benchmarks/published.md) — times the routed experts' GEMMs as one grouped GEMM
(``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm``, bf16) and as a loop of one
``torch.mm`` per expert: forward fc1 (h → 2f, gated) and fc2 (f → h), backward by autograd
(input and weight gradients); CUDA events, median of 20 after 5 warm-up. Beside each: the
cost model's price of the same GEMMs (``moe_layer.expert_gemm_s`` on the datasheet profile of
the GPU's DGX preset: forward, and 2x for the backward), and the achieved share of the peak.
No activation, permutation or communication: the GEMMs alone. The loop's backward also
runs autograd's slice backward of each expert's rows, which writes a zero gradient of the
whole input per expert (E full-size writes): its time is that loop's, not a per-expert GEMM
sequence's; ``moe_grouped_linear_gpu.py`` times TransformerEngine's sequence without it.

    python benchmarks/moe_expert_gemm_gpu.py --out $OUT          # 1 GPU, under a minute
    python benchmarks/moe_expert_gemm_gpu.py --estimate          # the predictions only

Writes $OUT/moe_expert_gemm.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.costmodel.moe_layer import expert_gemm_s  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402

# (name, local experts, rows per expert, hidden h, expert width f): balanced routing,
# rows = k·T·ep / E per expert with T the rank's tokens per micro-batch
CASES = [
    ("gpt-oss-120b H100 ep8 mb1", 16, 4 * 4096 * 8 // 128, 2880, 2880),
    ("gpt-oss-120b B200 ep8 mb4", 16, 4 * 16384 * 8 // 128, 2880, 2880),
    ("gpt-oss-120b B200 ep64 mb4", 2, 4 * 16384 * 64 // 128, 2880, 2880),
    ("mixtral-8x7b H100 ep8 mb1", 1, 2 * 4096 * 8 // 8, 4096, 14336),
    ("qwen3-30b-a3b ep8 mb1", 16, 8 * 4096 * 8 // 128, 2048, 768),
    # the Model Zoo's Qwen3-235B-A22B H100 rows: tp 4 ep 8 (T = 4096/4) and tp 2 ep 32
    ("qwen3-235b-a22b H100 tp4 ep8 mb1", 16, 8 * 1024 * 8 // 128, 4096, 1536),
    ("qwen3-235b-a22b H100 tp2 ep32 mb1", 4, 8 * 2048 * 32 // 128, 4096, 1536),
]
PRESETS = {"H100": "dgx-h100", "H200": "dgx-h200", "B200": "dgx-b200"}


def predicted_s(cluster: Cluster, experts: int, rows: int, h: int, f: int) -> float:
    """Forward + backward of the cases' expert GEMMs as ``moe_layer.routed_mlp`` prices
    them (backward = 2x forward)."""
    peak = cluster.gpu.peak_flops("bf16")
    fwd = (expert_gemm_s(cluster, peak, experts, rows, h, 2 * f)
           + expert_gemm_s(cluster, peak, experts, rows, f, h))
    return 3 * fwd


def time_case(experts: int, rows: int, h: int, f: int, backend: str) -> float:
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda")
    x = torch.randn(experts * rows, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(experts, 2 * f, h, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    w2 = (torch.randn(experts, h, f, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * rows
    mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)

    def step():
        if backend == "grouped":
            a = mm(x, w1.transpose(-2, -1), offs=offs)
            y = mm(a[:, :f].contiguous(), w2.transpose(-2, -1), offs=offs)
        else:
            outs = []
            for e in range(experts):
                xe = x[e * rows:(e + 1) * rows]
                outs.append(torch.mm(torch.mm(xe, w1[e].t())[:, :f], w2[e].t()))
            y = torch.cat(outs)
        y.backward(torch.ones_like(y))

    for _ in range(5):
        step()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def gemm_flops(experts: int, rows: int, h: int, f: int) -> float:
    """fc1 (h → 2f, gated) and fc2 (f → h): forward, input and weight gradients."""
    return 3 * experts * (2.0 * rows * h * 2 * f + 2.0 * rows * f * h)


def device_cluster(estimate: bool, preset: str | None) -> tuple[str, Cluster]:
    """The GPU's name ("none" with ``estimate``) and the cluster preset priced: ``preset``,
    else the DGX preset of the GPU found, else dgx-h100."""
    device, name = "none", preset or "dgx-h100"
    if not estimate:
        import torch
        device = torch.cuda.get_device_name(0)
        name = preset or next((p for k, p in PRESETS.items() if k in device), "dgx-h100")
    return device, Cluster.preset(name)


def case_record(cluster: Cluster, name: str, experts: int, rows: int, h: int, f: int) -> dict:
    """A case's shape, FLOPs and datasheet price (seconds and share of the bf16 peak)."""
    flops = gemm_flops(experts, rows, h, f)
    pred = predicted_s(cluster, experts, rows, h, f)
    return {"case": name, "experts": experts, "rows_per_expert": rows, "h": h, "f": f,
            "flops": flops, "predicted_s": pred,
            "predicted_share_of_peak": flops / pred / cluster.gpu.peak_flops("bf16")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--estimate", action="store_true", help="predictions only, no GPU")
    ap.add_argument("--preset", default=None, help="cluster preset (default: from the GPU)")
    args = ap.parse_args(argv)
    device, cluster = device_cluster(args.estimate, args.preset)
    preset = cluster.name
    peak = cluster.gpu.peak_flops("bf16")
    rows_out = []
    for name, experts, rows, h, f in CASES:
        rec = case_record(cluster, name, experts, rows, h, f)
        flops = rec["flops"]
        if not args.estimate:
            for backend in ("grouped", "loop"):
                try:
                    t = time_case(experts, rows, h, f, backend)
                    rec[f"{backend}_s"] = t
                    rec[f"{backend}_share_of_peak"] = flops / t / peak
                except Exception as exc:  # noqa: BLE001 - recorded, the other cases still run
                    rec[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows_out.append(rec)
        print(json.dumps(rec))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "moe_expert_gemm.json").write_text(json.dumps(
            {"device": device, "preset": preset, "cases": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
