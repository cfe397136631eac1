"""``meshplan profiles``: list the built-in models, GPUs and clusters."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("kind", nargs="?", choices=["models", "gpus", "clusters"], default=None,
                   help="list only this kind")


def main(args) -> int:
    from meshplan.spec import ModelSpec
    from meshplan.hardware_profiles import Cluster, builtin_gpu, builtin_gpu_names
    if args.kind in (None, "models"):
        print("models")
        for name in ModelSpec.preset_names():
            m = ModelSpec.preset(name)
            print(f"  {name:15s} {m.num_params() / 1e9:8.2f}B  layers {m.num_layers:3d}  "
                  f"hidden {m.hidden_size:5d}  heads {m.num_heads:3d}/{m.num_kv_heads:<3d} "
                  f"vocab {m.vocab_size:6d}  {m.activation}/{m.norm}"
                  + (f"  experts {m.num_experts} top-{m.experts_per_token}, "
                     f"{m.num_active_params() / 1e9:.2f}B active" if m.is_moe else ""))
    if args.kind in (None, "gpus"):
        print("gpus")
        for name in builtin_gpu_names():
            g = builtin_gpu(name)
            print(f"  {name:16s} {g.peak_flops('bf16') / 1e12:7.0f} TFLOP/s bf16  "
                  f"{g.memory_bytes / 2**30:6.1f} GiB  HBM {g.hbm_gbps:6.0f} GB/s  "
                  f"NVLink {g.nvlink_gbps:4.0f} GB/s")
    if args.kind in (None, "clusters"):
        print("clusters (use --nodes N)")
        for name in Cluster.preset_names():
            c = Cluster.preset(name)
            print(f"  {name:15s} {c.gpus_per_node:2d}× {c.gpu.name:16s} "
                  f"{c.network.nics_per_node}× {c.network.nic_gbps:g} GB/s NICs  "
                  f"${c.price_per_gpu_hour:.2f}/GPU-h")
    return 0
