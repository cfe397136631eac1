"""torchtitan's own trainer on the 1.3 B comparison, timed as ``baseline_ddp.py`` times its steps.

torchtitan (v0.2.2, the release built against the PyTorch of February 2026, i.e. torch 2.10 /
2.11) is not installed on the device: ``benchmarks/torchtitan_device.sh`` installs its wheel and
the few packages it needs that the device lacks (tyro and its dependencies, torchdata) from a
carried folder. This script then runs torchtitan's unmodified ``Trainer`` (its Llama 3 model,
FSDP2 ``fully_shard`` per block, per-block ``torch.compile``, fused AdamW, its loss, its
gradient clipping and learning-rate schedule) with three additions, all outside torchtitan's
code:

* a model flavor ``gpt3-1.3b-shape``: the Llama 3 architecture (RMSNorm, SwiGLU, RoPE, untied
  output) at GPT-3 XL's size — 24 layers, hidden 2048, 16 heads, vocabulary 51200, SwiGLU
  width 5632 (torchtitan's rounding of 8/3 · 2048 up to a multiple of 256); 1.443 B parameters
  against gpt3-1.3b's 1.318 B (no tied embeddings, a 3-matrix MLP);
* synthetic tokens instead of its Hugging Face text loader (the executor and the DDP script
  train on random tokens too; torchtitan's test set ``c4_test`` is not in its wheel), two
  fixed batches per rank drawn once, so the data path costs as little as in the other runs;
* a step timer: CUDA events around ``Trainer.train_step`` (the median of the steps after
  ``--warmup``), peak ``max_memory_allocated`` after the warm-up, and on rank 0 a JSON file.
  torchtitan's metrics logger resets the peak counters after every step it logs, the last
  one included; the peak of the timed steps is kept across those resets (before 2026-11-29
  it was not, and the 1.3 B JSON's ``memory_peak_bytes`` is the memory held after the last
  step: the sharded weights, gradients and Adam states, without activations).

torchtitan's own flavors run as they are: ``benchmarks/torchtitan_llama3_8b.toml`` takes its
``8B`` (meshplan's llama3-8b preset, vocabulary 128256: ``--preset llama3-8b`` checks the
built model field by field into the JSON's ``preset_check``).

torchtitan's ``llama3`` module imports Hugging Face ``datasets`` (for the loader replaced
here) and its metrics module ``torch.utils.tensorboard`` (logging to TensorBoard is off); where
either cannot be imported, a placeholder module that raises on use stands in, and the JSON
says so (``stand_ins``).

MFU uses meshplan's FLOP count of the same shape (``meshplan.costmodel.flops``: Narayanan et al.
2021 eq. 3 generalised to SwiGLU and an untied head; "causal" halves the attention core), the
step median and 989 TFLOP/s per GPU, as ``mfu_summary.py`` does for the other runs; torchtitan's
own count (``get_nparams_and_flops``: 6·N + 12·l·h·s per token, embedding excluded) is in
the JSON too.

    torchrun --standalone --nproc-per-node 2 benchmarks/torchtitan_bench.py --out tt.json \\
        --job.config_file benchmarks/torchtitan_gpt3_1.3b.toml --compile.enable
    torchrun --standalone --nproc-per-node 2 benchmarks/torchtitan_bench.py --cpu-check \\
        --out t.json --job.config_file benchmarks/torchtitan_gpt3_1.3b.toml \\
        --model.flavor tiny --training.seq_len 64 --training.steps 3   # CPU, gloo

Every option that is not this script's (``--out``, ``--warmup``, ``--peak-tflops``,
``--preset``, ``--cpu-check``) goes to torchtitan's own config parser. ``--cpu-check`` makes
torchtitan run on the CPU with gloo (it assumes a GPU otherwise) and stands in for its MoE
Triton kernel module (the dense model never calls it): a check of this harness, not a
measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FLAVOR = "gpt3-1.3b-shape"
SPEC_NAME = "llama3_synthetic"


def llama_shape_spec(*, num_layers=24, hidden_size=2048, num_heads=16, vocab_size=51200,
                     ffn_hidden_size=5632, num_kv_heads=None, name="gpt3-1.3b-llama-shape"):
    """meshplan's ModelSpec of the torchtitan flavor (the executor runs the same shape);
    ``num_kv_heads`` None is multi-head attention (grouped-query where fewer)."""
    from meshplan.spec import ModelSpec
    return ModelSpec(name=name, num_layers=num_layers, hidden_size=hidden_size,
                     num_heads=num_heads, num_kv_heads=num_kv_heads, vocab_size=vocab_size,
                     ffn_hidden_size=ffn_hidden_size,
                     max_seq_len=2048, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", tied_embeddings=False, bias=False)


def _stand_in(name: str, why: str, **attrs) -> None:
    """A module that imports but raises on use (for a code path this benchmark does not take)."""
    def refuse(*_a, **_k):
        raise RuntimeError(f"{name} is a stand-in in torchtitan_bench.py ({why})")
    def getattr_(attr: str):
        if attr.startswith("__"):    # what importers and inspect probe for
            raise AttributeError(attr)
        return refuse
    mod = types.ModuleType(name)
    mod.__getattr__ = getattr_
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod


def install_stand_ins(cpu_check: bool) -> list[str]:
    """Placeholders for what the dense synthetic-data run imports but never calls."""
    done = []
    try:
        import datasets  # noqa: F401
    except Exception as e:  # noqa: BLE001 (a missing or broken install alike)
        _stand_in("datasets", f"not importable: {e!r}")
        _stand_in("datasets.distributed", "see datasets")
        done.append(f"datasets ({type(e).__name__})")
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except Exception as e:  # noqa: BLE001
        _stand_in("torch.utils.tensorboard", f"not importable: {e!r}")
        done.append(f"torch.utils.tensorboard ({type(e).__name__})")
    if cpu_check:
        try:
            import triton  # noqa: F401
        except ImportError:
            _stand_in("torchtitan.models.moe.kernels", "no triton on this CPU machine")
            done.append("torchtitan.models.moe.kernels (no triton)")
    return done


def synthetic_dataloader_builder(model_args: dict):
    """torchtitan's ``build_dataloader_fn`` signature; two fixed random batches per rank."""
    import torch
    from torchtitan.components.dataloader import BaseDataLoader

    class SyntheticTokens(BaseDataLoader):
        def __init__(self, vocab: int, batch: int, seq_len: int, seed: int):
            g = torch.Generator().manual_seed(seed)
            self.batches = [torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
                            for _ in range(2)]
            if torch.cuda.is_available():
                self.batches = [b.pin_memory() for b in self.batches]
            self.i = 0

        def __iter__(self):
            while True:
                b = self.batches[self.i % 2]
                self.i += 1
                yield {"input": b[:, :-1]}, b[:, 1:]

        def state_dict(self):
            return {"i": self.i}

        def load_state_dict(self, state_dict):
            self.i = state_dict["i"]

    def build(*, dp_world_size, dp_rank, tokenizer, job_config, **_):
        args = model_args[job_config.model.flavor]
        return SyntheticTokens(args.vocab_size, job_config.training.local_batch_size,
                               job_config.training.seq_len, 1234 + dp_rank)
    return build


def register_spec() -> None:
    import dataclasses

    from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec
    from torchtitan.protocols.train_spec import register_train_spec

    spec = get_train_spec()
    shape = llama_shape_spec()
    model_args = dict(spec.model_args)
    model_args[FLAVOR] = TransformerModelArgs(
        dim=shape.hidden_size, n_layers=shape.num_layers, n_heads=shape.num_heads,
        vocab_size=shape.vocab_size, multiple_of=256, rope_theta=500000)
    model_args["tiny"] = TransformerModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=256,
                                              multiple_of=32, rope_theta=500000)
    register_train_spec(SPEC_NAME, dataclasses.replace(
        spec, model_args=model_args, build_tokenizer_fn=None, build_validator_fn=None,
        build_dataloader_fn=synthetic_dataloader_builder(model_args)))


def shape_of(model_args, model, flavor: str) -> object:
    """meshplan's ModelSpec of what torchtitan built (the SwiGLU width read off the model,
    the KV heads from the flavor: torchtitan's 8B has 8)."""
    w1 = model.layers["0"].feed_forward.w1.weight
    return llama_shape_spec(num_layers=model_args.n_layers, hidden_size=model_args.dim,
                            num_heads=model_args.n_heads, vocab_size=model_args.vocab_size,
                            ffn_hidden_size=int(w1.shape[0]),
                            num_kv_heads=getattr(model_args, "n_kv_heads", None),
                            name=f"torchtitan-llama3-{flavor}")


# the fields of a ModelSpec that set its size and FLOPs (not its name or max_seq_len)
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                "ffn_hidden_size", "vocab_size", "activation", "norm", "position_embedding",
                "tied_embeddings", "bias", "num_experts")


def preset_check(spec, preset: str) -> dict:
    """Whether the model torchtitan built has meshplan preset ``preset``'s shape, field by
    field, and both parameter counts."""
    from meshplan.spec import ModelSpec
    ref = ModelSpec.preset(preset)
    diff = {f: [getattr(spec, f), getattr(ref, f)] for f in SHAPE_FIELDS
            if getattr(spec, f) != getattr(ref, f)}
    return {"preset": preset, "same_shape": not diff, "differences [built, preset]": diff,
            "params": spec.num_params(), "preset_params": ref.num_params()}


def timed_trainer_class(ours: argparse.Namespace, stand_ins: list[str]):
    import torch
    import torch.distributed as dist
    from torchtitan.train import Trainer

    class TimedTrainer(Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            self.step_times_s: list[float] = []
            self.host_times_s: list[float] = []
            self.cuda = self.device.type == "cuda"
            # torchtitan's MetricsProcessor.log resets the peak memory counters after each
            # step it logs (1 and every log_freq-th, the last step included): keep the
            # timed steps' peak across those resets
            self.peak_seen = 0
            monitor = self.metrics_processor.device_memory_monitor
            reset = monitor.reset_peak_stats

            def reset_keeping_peak():
                if self.cuda and self.step > ours.warmup:
                    self.peak_seen = max(self.peak_seen,
                                         torch.cuda.max_memory_allocated(self.device))
                reset()
            monitor.reset_peak_stats = reset_keeping_peak

        def train_step(self, data_iterator):
            t0 = time.perf_counter()
            if self.cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
            super().train_step(data_iterator)
            if self.cuda:
                b.record()
                b.synchronize()
                dt = a.elapsed_time(b) / 1e3
            else:
                dt = time.perf_counter() - t0
            if self.step > ours.warmup:
                self.step_times_s.append(dt)
                self.host_times_s.append(time.perf_counter() - t0)
            elif self.step == ours.warmup and self.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(self.device)

        def train(self):
            super().train()
            self.write_results()

        def write_results(self):
            from meshplan.costmodel.flops import model_flops_per_step
            from meshplan.spec import Job

            from baseline_ddp import causal_flops_per_step
            jc = self.job_config
            world = dist.get_world_size()
            peak_mem = (float(max(self.peak_seen, torch.cuda.max_memory_allocated(self.device)))
                        if self.cuda else None)
            mems = [None] * world
            dist.all_gather_object(mems, peak_mem)
            if dist.get_rank() != 0:
                return
            spec = shape_of(self.model_args, self.model_parts[0], jc.model.flavor)
            gb = jc.training.global_batch_size
            if gb < 0:
                gb = jc.training.local_batch_size * world
            job = Job(global_batch=gb, seq_len=jc.training.seq_len, precision="bf16",
                      runtime="torch")
            if not self.step_times_s:
                raise SystemExit(f"no step after the {ours.warmup} warm-up steps was timed "
                                 f"(--training.steps {jc.training.steps})")
            step = statistics.median(self.step_times_s)
            full = model_flops_per_step(spec, job.global_batch, job.seq_len)
            causal = causal_flops_per_step(spec, job.global_batch, job.seq_len)
            peak = ours.peak_tflops * 1e12
            import torchtitan
            doc = {
                "name": "torchtitan-fsdp2" + ("-compiled" if jc.compile.enable else ""),
                "torchtitan_version": torchtitan.__version__,
                "model": spec.to_dict(), "job": job.to_dict(), "world": world,
                "local_batch_size": jc.training.local_batch_size,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "compile": jc.compile.enable, "compile_components": list(jc.compile.components),
                "activation_checkpoint": jc.activation_checkpoint.mode,
                "fsdp_reshard_after_forward": jc.parallelism.fsdp_reshard_after_forward,
                "max_norm": jc.training.max_norm,
                "step_time_s": step, "step_times_s": self.step_times_s,
                "host_step_median_s": statistics.median(self.host_times_s),
                "warmup_steps": ours.warmup,
                "tokens_per_s": job.tokens_per_step / step,
                "flops_per_step": full, "causal_flops_per_step": causal,
                "mfu": full / step / world / peak, "mfu_causal": causal / step / world / peak,
                "torchtitan_flops_per_token": self.metrics_processor.num_flops_per_token,
                "torchtitan_mfu": (self.metrics_processor.num_flops_per_token
                                   * job.tokens_per_step / step / world / peak),
                "peak_tflops_per_gpu": ours.peak_tflops,
                "memory_peak_bytes": max((m for m in mems if m is not None), default=None),
                "memory_per_rank_bytes": mems, "memory_peak_what": (
                    "max_memory_allocated over the timed steps (torchtitan's per-log resets "
                    "bridged)"),
                "preset_check": preset_check(spec, ours.preset) if ours.preset else None,
                "stand_ins": stand_ins,
                "environment": {"torch": torch.__version__,
                                "cuda": torch.version.cuda if self.cuda else None,
                                "gpu": torch.cuda.get_device_name(self.device)
                                if self.cuda else "cpu",
                                "command": " ".join(sys.argv)},
            }
            Path(ours.out).write_text(json.dumps(doc, indent=1) + "\n")
    return TimedTrainer


def use_cpu() -> None:
    """torchtitan picks "cuda" when no accelerator is found: point it at the CPU (gloo), with a
    device module that answers its memory-monitor and barrier calls."""
    import torch
    import torchtitan.tools.utils as tu
    cpu = types.SimpleNamespace(
        set_device=lambda *_: None, current_device=lambda: 0, synchronize=lambda *_: None,
        get_device_name=lambda *_: "cpu", empty_cache=lambda: None, memory_stats=lambda *_: {},
        reset_peak_memory_stats=lambda *_: None, set_stream=lambda *_: None,
        get_device_properties=lambda *_: types.SimpleNamespace(total_memory=1 << 34))
    for name, mod in list(sys.modules.items()):
        if name.startswith("torchtitan.") and getattr(mod, "device_type", None) == "cuda":
            mod.device_type = "cpu"
            if hasattr(mod, "device_module"):
                mod.device_module = cpu
    tu.device_type, tu.device_module = "cpu", cpu
    torch.distributed.barrier = _barrier_without_device_ids(torch.distributed.barrier)
    # torchtitan divides gradients itself (FSDP factor 1.0, a PREMUL_SUM that gloo lacks):
    # a plain SUM is the same reduction
    import torchtitan.models.llama3.infra.parallelize as tp_llama
    no_division = tp_llama.disable_fsdp_gradient_division

    def sum_reduction(model):
        no_division(model)
        for m in model.modules():
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)
    tp_llama.disable_fsdp_gradient_division = sum_reduction


def _barrier_without_device_ids(barrier):
    def cpu_barrier(*args, device_ids=None, **kwargs):   # gloo takes no device ids
        return barrier(*args, **kwargs)
    return cpu_barrier


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", required=True, help="results JSON (rank 0)")
    p.add_argument("--warmup", type=int, default=5, help="steps not timed [5]")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="dense bf16 peak per GPU for MFU [989: H100 / H200 SXM datasheet]")
    p.add_argument("--preset", default=None,
                   help="a meshplan model preset the built model should match (llama3-8b); "
                        "the JSON's preset_check says field by field")
    p.add_argument("--cpu-check", action="store_true",
                   help="run torchtitan on the CPU with gloo (a harness check)")
    ours, rest = p.parse_known_args(argv)
    stand_ins = install_stand_ins(ours.cpu_check)
    # torchtitan's parser reads sys.argv[1:] as bound when its module is imported
    sys.argv = [sys.argv[0], *rest]
    import torchtitan.train as tt_train
    if ours.cpu_check:
        use_cpu()
    register_spec()
    tt_train.main(timed_trainer_class(ours, stand_ins))


if __name__ == "__main__":
    main()
    from meshplan.executor.run import flush_and_exit
    flush_and_exit(0)   # no interpreter teardown once the work is done and written
