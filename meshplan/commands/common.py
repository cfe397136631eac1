"""Arguments shared by several subcommands: model, cluster, job, layout."""

from __future__ import annotations

import argparse

from meshplan.spec import RECOMPUTE, SCHEDULES, Job, Layout, ModelSpec
from meshplan.spec.choices import CP_STYLES, FP8_RECIPES, PRECISIONS
from meshplan.spec.resolve import load_model
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.resolve import load_cluster


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _number(text: str, ok, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"{text!r} must be {what}")
    return v


def positive_float(text: str) -> float:
    return _number(text, lambda v: v > 0, "> 0")


def non_negative_float(text: str) -> float:
    return _number(text, lambda v: 0 <= v < float("inf"), "a number >= 0")


def add_model_cluster_args(p: argparse.ArgumentParser, *, model_default: str | None = None,
                           cluster_default: str | None = None) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument("--model", default=model_default, required=model_default is None,
                   help="model preset name (see `meshplan profiles`), a Hugging Face "
                        "config.json or a directory holding one, or a ModelSpec JSON file")
    g.add_argument("--cluster", default=cluster_default, required=cluster_default is None,
                   help="cluster preset name or path to a cluster TOML file (FILE.toml:NAME "
                        "picks one of a file's several clusters)")
    g.add_argument("--nodes", type=positive_int, default=None, help="number of nodes")
    g.add_argument("--profile", default=None,
                   help="calibrated GPU profile TOML (from `meshplan calibrate`) to use")
    g.add_argument("--profile-override", action="store_true",
                   help="use --profile even if it was measured on another GPU type")


def add_job_args(p: argparse.ArgumentParser, *, global_batch: int | None = None,
                 seq_len: int | None = None, runtime: str = "megatron") -> None:
    """Job options; ``runtime`` is the default of ``--runtime`` ("torch" where the command
    runs meshplan's executor, so that its predictions describe what runs)."""
    g = p.add_argument_group("job")
    g.add_argument("--global-batch", type=positive_int, default=global_batch,
                   required=global_batch is None, help="sequences per optimizer step")
    g.add_argument("--seq-len", type=positive_int, default=seq_len, required=seq_len is None,
                   help="tokens per sequence")
    g.add_argument("--precision", default="bf16", choices=PRECISIONS,
                   help="training precision; fp8 runs the transformer linears' GEMMs in fp8 "
                        "(docs/fp8.md) [bf16]")
    g.add_argument("--fp8-recipe", default=None, choices=FP8_RECIPES,
                   help="how fp8 operands are scaled (with --precision fp8) [tensorwise]")
    g.add_argument("--fp8-param-gather", action="store_true",
                   help="keep and all-gather the linears' weights in fp8 (Megatron-LM's "
                        "--fp8-param-gather; with --precision fp8, runtime megatron)")
    g.add_argument("--cuda-graphs", action="store_true",
                   help="the run captures CUDA graphs (Megatron-LM's --cuda-graph-impl): no "
                        "host work per MoE layer on the step's path (runtime megatron)")
    g.add_argument("--moe-a2a-overlap", action="store_true",
                   help="Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): "
                        "one micro-batch's expert all-to-alls beside another's compute "
                        "(runtime megatron; ep > 1, interleaved schedule when pp > 1)")
    g.add_argument("--recompute-modules", default=None,
                   help="what a layout's selective recompute re-runs, comma-separated: "
                        "core_attn, layernorm, moe_act, mla_up_proj (Megatron-Core's "
                        "--recompute-modules; runtime megatron) [core_attn]")
    g.add_argument("--tokens", type=positive_float, default=None,
                   help="tokens of the whole training run (for time-to-train and cost)")
    g.add_argument("--no-flash-attention", action="store_true",
                   help="model unfused attention (s² activations)")
    g.add_argument("--no-overlap-dp", action="store_true",
                   help="gradient reduction after backward, not overlapped with it")
    g.add_argument("--runtime", default=runtime, choices=["megatron", "torch"],
                   help="whose conventions to predict: 'megatron' (16-bit weights, fp32 master "
                        "in the optimizer) or 'torch' (fp32 weights + autocast, DDP/FSDP2: "
                        f"what `meshplan run` executes) [{runtime}]")
    g.add_argument("--strict", action="store_true",
                   help="treat meshplan's warnings (e.g. --seq-len past the model's maximum) "
                        "as errors")


def add_layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=positive_int, default=1)
    g.add_argument("--pp", type=positive_int, default=1)
    g.add_argument("--tp", type=positive_int, default=1)
    g.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel degree (each sequence split over cp ranks)")
    g.add_argument("--cp-style", default="ring", choices=CP_STYLES,
                   help="how context parallelism exchanges keys and values [ring]")
    g.add_argument("--ep", type=positive_int, default=1,
                   help="expert-parallel degree (MoE models; ep·etp divides tp·cp·dp)")
    g.add_argument("--etp", type=positive_int, default=1,
                   help="expert tensor-parallel degree (MoE models)")
    g.add_argument("--micro-batch", type=positive_int, default=1)
    g.add_argument("--schedule", default="1f1b", choices=SCHEDULES)
    g.add_argument("--vpp", type=positive_int, default=1, help="virtual stages per pipeline rank")
    g.add_argument("--recompute", default="none", choices=RECOMPUTE)
    g.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each block (Layout.compile; priced from the profile's "
                        "compiled layer rows, else as eager with a caution)")
    g.add_argument("--stage-layers", default=None,
                   help="comma-separated layers per (virtual) stage, e.g. 9,10,10,9")


def model_cluster_from_args(args) -> tuple[ModelSpec, Cluster]:
    return load_model(args.model), load_cluster(args.cluster, args.nodes, args.profile,
                                                getattr(args, "profile_override", False))


def job_from_args(args) -> Job:
    recipe = getattr(args, "fp8_recipe", None)
    modules = getattr(args, "recompute_modules", None)
    return Job(global_batch=args.global_batch, seq_len=args.seq_len, precision=args.precision,
               **({"fp8_recipe": recipe} if recipe else {}),
               fp8_param_gather=getattr(args, "fp8_param_gather", False),
               cuda_graphs=getattr(args, "cuda_graphs", False),
               moe_a2a_overlap=getattr(args, "moe_a2a_overlap", False),
               recompute_modules=(tuple(m.strip() for m in modules.split(","))
                                  if modules is not None else None),
               tokens=args.tokens, flash_attention=not args.no_flash_attention,
               overlap_dp_comm=not args.no_overlap_dp,
               runtime=getattr(args, "runtime", "megatron"))


def layout_from_args(args) -> Layout:
    stage_layers = None
    if args.stage_layers:
        try:
            stage_layers = tuple(int(x) for x in args.stage_layers.split(","))
        except ValueError:
            raise ConfigError(f"--stage-layers {args.stage_layers!r} must be comma-separated "
                              f"integers") from None
    return Layout(dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp, cp_style=args.cp_style,
                  ep=args.ep, etp=args.etp, micro_batch=args.micro_batch,
                  schedule=args.schedule, vpp=args.vpp, recompute=args.recompute,
                  zero=args.zero, sequence_parallel=args.sequence_parallel,
                  compile=args.compile, stage_layers=stage_layers)


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
