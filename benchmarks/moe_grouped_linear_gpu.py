"""TransformerEngine's ``GroupedLinear`` path imitated at the published MoE rows' expert shapes,
against torch's one-kernel grouped GEMM and the datasheet price; host enqueue time beside GPU
time; the cost of one device-to-host sync a layer (issue 38 item 6: why the published rows
whose ranks run 16 local experts are predicted a third fast).

TransformerEngine (``transformer_engine/common/gemm/cublaslt_gemm.cu``,
``multi_stream_cublas_gemm``; the default of ``nvte_multi_tensor_gemm`` unless
``NVTE_USE_CUTLASS_GROUPED_GEMM`` on Hopper) runs a grouped linear as one cuBLASLt GEMM per
expert, round-robin over 4 side streams fenced by events on the caller's stream; the weight
gradient is accumulated into ``main_grad`` (beta = 1: Megatron's gradient-accumulation
fusion), fp32 unless the run reduces gradients in bf16. The device has no TE, so each
variant below issues the same GEMMs with torch, no autograd (the earlier
``moe_expert_gemm_gpu.py`` loop also timed autograd's slice backward, which allocates a
full-size zero gradient per expert — a cost TE does not have):

* ``grouped``: ``torch._grouped_mm`` / ``F.grouped_mm`` — fc1 and fc2 forward, then
  autograd's input and weight gradients of both (the executor's path);
* ``loop1``: one ``torch.mm(out=...)`` per expert and GEMM on the current stream;
* ``stream4``: the same GEMMs, TE's way: each of the 6 grouped calls fenced by events and
  spread over 4 streams (expert i on stream i mod 4);
* ``stream4_acc_bf16`` / ``stream4_acc_fp32``: ``stream4`` with the weight gradients
  accumulated into a bf16 / fp32 main gradient (``addmm`` with beta = 1; fp32 through
  ``out_dtype``, where this torch has it).

Per variant: GPU seconds (CUDA events, median of ``--iters`` after 3 warm-ups, the host
queue filled ahead by a large GEMM so the GPU time is not the host's) and host seconds to
enqueue the same work (``perf_counter`` around the calls, no sync). Host ≥ GPU means a
rank running that path without CUDA graphs is bound by its CPU at that shape (torch's
Python loop and stream switches here, TE's C++ loop plus its Python ``torch.split`` and
tensor wrappers there: the same order, not the same number). Then
``sync``: the extra seconds one ``tokens_per_expert.tolist()`` adds between two layers'
GEMMs (the drain of the queue and the relaunch after it: Megatron's all-to-all dispatcher
syncs once per MoE layer forward, DeepEP's normal dispatch waits on the host for its
received-token count).

    python benchmarks/moe_grouped_linear_gpu.py --out $OUT          # 1 GPU, ~2 minutes
    python benchmarks/moe_grouped_linear_gpu.py --estimate --out DIR  # the price only, no GPU

Writes ``$OUT/moe_grouped_linear.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_expert_gemm_gpu import CASES as PUBLISHED_CASES  # noqa: E402
from moe_expert_gemm_gpu import case_record, device_cluster  # noqa: E402

# the Model Zoo's Qwen3-235B FSDP row as its table prints it (tp 2, ep 8, mb 4: T = 8192,
# rows = 8·8192·8/128): 16 local experts at 276 TFLOP/s a GPU, the table's fastest
# and Megatron-Bridge's later Qwen3-30B-A3B B200 rows (26.02.01 on: micro-batch 4, 2.8x the
# tokens/s of 26.02's micro-batch 1 at the same ep 8; rows = 8·4·4096·8/128)
CASES = PUBLISHED_CASES + [("qwen3-235b-a22b H100 tp2 ep8 mb4 fsdp", 16, 4096, 4096, 1536),
                           ("qwen3-30b-a3b B200 ep8 mb4 (26.02.01+)", 16, 8192, 2048, 768)]
VARIANTS = ("grouped", "loop1", "stream4", "stream4_acc_bf16", "stream4_acc_fp32")
STREAMS = 4     # TransformerEngine's num_compute_streams


class Case:
    """One layer's expert tensors on the GPU (bf16; weights stored (out, in) like TE's)."""

    def __init__(self, torch, experts: int, rows: int, h: int, f: int, device: str = "cuda"):
        dev, bf = torch.device(device), torch.bfloat16
        self.t, self.e, self.r = torch, experts, rows
        self.x = torch.randn(experts * rows, h, device=dev, dtype=bf)
        self.w1 = torch.randn(experts, 2 * f, h, device=dev, dtype=bf) * 0.02
        self.w2 = torch.randn(experts, h, f, device=dev, dtype=bf) * 0.02
        self.a = torch.empty(experts * rows, 2 * f, device=dev, dtype=bf)
        self.act = torch.randn(experts * rows, f, device=dev, dtype=bf)
        self.y = torch.empty(experts * rows, h, device=dev, dtype=bf)
        self.dy = torch.randn_like(self.y)
        self.da = torch.randn_like(self.a)
        self.dact = torch.empty_like(self.act)
        self.dx = torch.empty_like(self.x)
        self.g1 = {d: torch.zeros(experts, 2 * f, h, device=dev, dtype=d)
                   for d in (bf, torch.float32)}
        self.g2 = {d: torch.zeros(experts, h, f, device=dev, dtype=d)
                   for d in (bf, torch.float32)}
        self.offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * rows
        cuda = dev.type == "cuda"
        self.side = [torch.cuda.Stream() for _ in range(STREAMS)] if cuda else []
        self.big = torch.randn(8192, 8192, device=dev, dtype=bf) if cuda else None
        self.leaves = [v.detach().clone().requires_grad_()
                       for v in (self.x, self.act, self.w1, self.w2)]
        self.calls = {}

    def rows_of(self, t, i):
        return t[i * self.r:(i + 1) * self.r]

    def grouped(self):
        """fc1 and fc2 forward, then autograd's input and weight gradients of both (the
        executor's path; the weights' .grad cleared first so nothing accumulates)."""
        t = self.t
        mm = getattr(t.nn.functional, "grouped_mm", None) or t._grouped_mm
        for leaf in self.leaves:
            leaf.grad = None
        xg, actg, w1g, w2g = self.leaves
        a = mm(xg, w1g.transpose(-2, -1), offs=self.offs)
        y = mm(actg, w2g.transpose(-2, -1), offs=self.offs)
        t.autograd.backward([a, y], [self.da, self.dy])

    def _gemms(self, acc):
        """The 6 grouped calls as lists of per-expert closures (TE's call order), built once."""
        if acc in self.calls:
            return self.calls[acc]
        t, g = self.t, self.rows_of
        calls = self.calls[acc] = [
            [lambda i=i: t.mm(g(self.x, i), self.w1[i].t(), out=g(self.a, i))
             for i in range(self.e)],
            [lambda i=i: t.mm(g(self.act, i), self.w2[i].t(), out=g(self.y, i))
             for i in range(self.e)],
            [lambda i=i: t.mm(g(self.dy, i), self.w2[i], out=g(self.dact, i))
             for i in range(self.e)],
            [self._wgrad(acc, self.g2, self.dy, self.act, i) for i in range(self.e)],
            [lambda i=i: t.mm(g(self.da, i), self.w1[i], out=g(self.dx, i))
             for i in range(self.e)],
            [self._wgrad(acc, self.g1, self.da, self.x, i) for i in range(self.e)],
        ]
        return calls

    def _wgrad(self, acc, grads, dout, inp, i):
        t, g = self.t, self.rows_of
        if acc is None:
            buf = grads[t.bfloat16][i]
            return lambda: t.mm(g(dout, i).t(), g(inp, i), out=buf)
        buf = grads[acc][i]
        if acc == t.bfloat16:
            return lambda: buf.addmm_(g(dout, i).t(), g(inp, i))
        return lambda: t.addmm(buf, g(dout, i).t(), g(inp, i), out_dtype=t.float32, out=buf)

    def looped(self, streams: int, acc=None):
        t = self.t
        for call in self._gemms(acc):
            if streams == 1:
                for gemm in call:
                    gemm()
                continue
            main = t.cuda.current_stream()
            used = self.side[:min(streams, len(call))]
            for s in used:
                s.wait_stream(main)
            for i, gemm in enumerate(call):
                with t.cuda.stream(used[i % len(used)]):
                    gemm()
            for s in used:
                main.wait_stream(s)

    def run(self, variant: str):
        t = self.t
        if variant == "grouped":
            return self.grouped()
        if variant == "loop1":
            return self.looped(1)
        acc = {"stream4": None, "stream4_acc_bf16": t.bfloat16,
               "stream4_acc_fp32": t.float32}[variant]
        return self.looped(STREAMS, acc)

    def timed(self, variant: str, iters: int) -> tuple[float, float]:
        """(median GPU s, median host enqueue s) of one layer's GEMMs."""
        t = self.t
        for _ in range(3):
            self.run(variant)
        t.cuda.synchronize()
        gpu, host = [], []
        for _ in range(iters):
            for _ in range(3):                 # keeps the GPU busy while the host enqueues
                t.mm(self.big, self.big)
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            h0 = time.perf_counter()
            self.run(variant)
            host.append(time.perf_counter() - h0)
            end.record()
            t.cuda.synchronize()
            gpu.append(start.elapsed_time(end) / 1e3)
        return statistics.median(gpu), statistics.median(host)

    def sync_cost(self, iters: int) -> float:
        """Seconds one ``.tolist()`` between two layers' grouped GEMMs adds."""
        t = self.t
        counts = t.full((self.e,), self.r, device="cuda", dtype=t.int64)

        def two_layers(sync: bool) -> float:
            t.cuda.synchronize()
            h0 = time.perf_counter()
            self.grouped()
            if sync:
                counts.tolist()
            self.grouped()
            t.cuda.synchronize()
            return time.perf_counter() - h0
        for _ in range(3):
            two_layers(True)
        with_s = statistics.median(two_layers(True) for _ in range(iters))
        without = statistics.median(two_layers(False) for _ in range(iters))
        return with_s - without


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--estimate", action="store_true", help="the datasheet price only, no GPU")
    ap.add_argument("--preset", default=None, help="cluster preset (default: from the GPU)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    device, cluster = device_cluster(args.estimate, args.preset)
    torch = None
    if not args.estimate:
        import torch
    peak = cluster.gpu.peak_flops("bf16")
    out = []
    for name, experts, rows, h, f in CASES:
        rec = case_record(cluster, name, experts, rows, h, f)
        flops = rec["flops"]
        if torch is not None:
            case = Case(torch, experts, rows, h, f)
            for v in VARIANTS:
                try:
                    g, hst = case.timed(v, args.iters)
                    rec[v] = {"gpu_s": g, "host_s": hst, "share_of_peak": flops / g / peak,
                              "host_bound": hst >= g}
                except Exception as exc:  # noqa: BLE001 - recorded; the others still run
                    rec[v] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            try:
                rec["sync_s"] = case.sync_cost(args.iters)
            except Exception as exc:  # noqa: BLE001
                rec["sync_error"] = f"{type(exc).__name__}: {exc}"[:300]
            del case
            torch.cuda.empty_cache()
        out.append(rec)
        print(json.dumps(rec), flush=True)
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True, exist_ok=True)
        meta = {"device": device, "preset": cluster.name,
                "torch": getattr(torch, "__version__", None), "iters": args.iters}
        (path / "moe_grouped_linear.json").write_text(json.dumps({**meta, "cases": out},
                                                                 indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
