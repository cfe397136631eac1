"""The valid values of the specs' string fields, in one place (the CLI and planner read them)."""

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
#: how fp8 GEMM operands are scaled (docs/fp8.md; meshplan.costmodel.fp8 gives each one's costs)
FP8_RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")
OPTIMIZERS = ("adam", "sgd")
RUNTIMES = ("megatron", "torch")
CP_STYLES = ("ring", "all-to-all")
ROUTERS = ("softmax", "sigmoid")
