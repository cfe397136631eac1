"""Where a compiled tensor-parallel + sequence-parallel block spends its forward and backward.

Why: the compiled tp 2 + SP gpt3-1.3b rows of the 2026-11-28 calibration on 4 × H200 read
forward 3.043 ms, backward 0.295 ms a layer (eager 1.464 / 2.485; compiled without SP
1.139 / 2.066), and the executor's compiled tp 2 + SP run marked 155 ms of forward and
19.5 ms of backward a step. On CPU the compiled block's gradients equal the eager ones
(tests/distributed/test_compile_sp_world2.py) and its backward graph runs inside the
backward call (one compiled graph per block; profiled with gloo), so the question left is
the GPU's timeline. This times two blocks, eager and compiled, with and without SP, three
ways: CUDA events on the current stream queued back to back (as the executor's step marks),
the same with a device-wide synchronize after each pass (host wall clock), and a profiler
pass listing each pass's kernel time per CUDA stream.

    torchrun --standalone --nproc-per-node 2 benchmarks/compile_sp_probe.py --out probe.json
    torchrun --standalone --nproc-per-node 2 benchmarks/compile_sp_probe.py --tiny --out t.json  # CPU

Rank 0 writes ``--out`` (JSON) and prints one line per setting (ms per layer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchrun_group import init_torchrun_group  # noqa: E402

from meshplan.spec import ModelSpec  # noqa: E402

GPT_1_3B = ModelSpec(name="gpt3-1.3b", num_layers=2, hidden_size=2048, num_heads=16,
                     vocab_size=51200, max_seq_len=2048)
TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                 max_seq_len=64)


def build(spec, sp: bool, compile_: bool, group, device):
    import torch

    from meshplan.executor.model import Transformer
    from meshplan.executor.tensor_parallel import apply_tensor_parallel
    with torch.device("meta"):
        m = Transformer(spec)
    m.keep_part(0, spec.num_layers, embeds_input=False, computes_logits=False)
    m.to_empty(device=device)
    m.init_weights(0)
    apply_tensor_parallel(m, group, sequence_parallel=sp)
    m.activation_dtype = torch.bfloat16 if device.type == "cuda" else None
    if compile_:
        for block in m.layers.values():
            block.compile()
    return m


def probe(m, x, cuda: bool, iters: int) -> dict:
    import torch
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if cuda
           else torch.autocast("cpu", enabled=False))
    g = None
    queued, synced = [], []
    with amp:
        for i in range(3 + iters):
            sync()
            # queued: events only, the host runs on (the executor's marks)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else None
            t0 = time.perf_counter()
            if cuda:
                ev[0].record()
            y = m(x)
            if cuda:
                ev[1].record()
            t1 = time.perf_counter()
            g = torch.randn_like(y) if g is None else g
            y.backward(g)
            if cuda:
                ev[2].record()
            sync()
            t2 = time.perf_counter()
            if i >= 3:
                queued.append(((ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])) if cuda
                               else ((t1 - t0) * 1e3, (t2 - t1) * 1e3)))
            # synchronized: each pass alone on an idle device, host wall clock
            sync()
            t0 = time.perf_counter()
            y = m(x)
            sync()
            t1 = time.perf_counter()
            y.backward(g)
            sync()
            t2 = time.perf_counter()
            if i >= 3:
                synced.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
        streams = profile_streams(m, x, g, cuda) if cuda else {}
    med = lambda v, k: statistics.median(a[k] for a in v)  # noqa: E731
    return {"queued_fwd_ms": med(queued, 0), "queued_bwd_ms": med(queued, 1),
            "synced_fwd_ms": med(synced, 0), "synced_bwd_ms": med(synced, 1),
            "kernel_ms_by_pass_and_stream": streams}


def profile_streams(m, x, g, cuda: bool) -> dict:
    """{pass: {stream id: kernel ms}} of one forward and one backward, each pass's kernels
    found by the profiler's correlation to the ops launched inside it."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("PROBE_forward"):
            y = m(x)
        torch.cuda.synchronize()
        with record_function("PROBE_backward"):
            y.backward(g)
        torch.cuda.synchronize()
    out: dict = {}
    events = prof.events()
    ranges = {e.name: e.time_range for e in events if e.name.startswith("PROBE_")}
    for e in events:
        if e.device_type.name != "CUDA":
            continue
        for name, r in ranges.items():
            # a kernel belongs to the pass whose host range launched it; on an idle device
            # (synchronized between the passes) its run also starts in or after that range
            if r.start <= e.time_range.start <= r.end + 1e6:
                s = out.setdefault(name, {})
                key = str(getattr(e, "device_resource_id", getattr(e, "stream", "?")))
                s[key] = s.get(key, 0.0) + e.time_range.elapsed_us() / 1e3
                break
    return out


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny fp32 model on CPU (a check)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = init_torchrun_group(cuda)
    spec = TINY if args.tiny else GPT_1_3B
    tp = dist.get_world_size()
    spec = replace(spec, vocab_size=-(-spec.vocab_size // tp) * tp)
    group = dist.group.WORLD
    results = []
    for sp in (False, True):
        for compile_ in (False, True):
            import torch._dynamo
            torch._dynamo.reset()
            m = build(spec, sp, compile_, group, device)
            s = spec.max_seq_len // tp if sp else spec.max_seq_len
            x = torch.randn(args.micro_batch, s, spec.hidden_size, device=device,
                            dtype=torch.bfloat16 if cuda else torch.float32,
                            requires_grad=True)
            r = probe(m, x, cuda, args.iters)
            per_layer = {k: v / spec.num_layers for k, v in r.items() if k.endswith("_ms")}
            row = {"tp": tp, "sequence_parallel": sp, "compile": compile_,
                   "micro_batch": args.micro_batch, "layers": spec.num_layers,
                   "per_layer_ms": per_layer,
                   "kernel_ms_by_pass_and_stream": r["kernel_ms_by_pass_and_stream"]}
            results.append(row)
            if dist.get_rank() == 0:
                print(f"tp{tp} sp={sp} compile={compile_}: " + ", ".join(
                    f"{k} {v:.3f}" for k, v in per_layer.items())
                      + f"; kernels by pass/stream (ms, 2 layers): "
                      f"{r['kernel_ms_by_pass_and_stream']}", flush=True)
            del m, x
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                              "model": spec.to_dict(), "rows": results},
                                             indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
