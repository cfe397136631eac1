"""The valid values of the specs' string fields, in one place (the CLI and planner read them)."""

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full")
#: what Layout.recompute = "selective" re-runs (Job.recompute_modules; Megatron-Core's
#: --recompute-modules names): the attention core, the two norms, the routed experts'
#: activation function, multi-head latent attention's up-projections and RoPE
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj")
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
#: how fp8 GEMM operands are scaled (docs/fp8.md; meshplan.costmodel.fp8 gives each one's costs)
FP8_RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")
#: the recipes runtime "torch" (meshplan's executor) runs: all but TransformerEngine's
#: delayed scaling (executor/fp8.py check_recipe_runnable), so the ones calibrate can time
TORCH_FP8_RECIPES = tuple(r for r in FP8_RECIPES if r != "delayed")
#: the recipes under which runtime "torch" (meshplan's executor) runs an MoE layer's routed
#: experts in fp8 (executor/fp8_grouped.py: the grouped kernel's scales are e4m3 per row;
#: under the others the experts stay 16-bit)
TORCH_FP8_EXPERT_RECIPES = ("rowwise",)
OPTIMIZERS = ("adam", "sgd")
RUNTIMES = ("megatron", "torch")
#: how an MoE layer's tokens reach their expert-parallel ranks (Job.moe_dispatcher)
MOE_DISPATCHERS = ("alltoall", "deepep")
CP_STYLES = ("ring", "all-to-all")
ROUTERS = ("softmax", "sigmoid")
