"""Apply a Layout to the model: build this rank's part, cut it, wrap it, and train it.

Order of construction (every rank):

1. the model parts this pipeline rank owns (:func:`meshplan.executor.pipeline.local_parts`)
   are built on the meta device, pruned to their layers, materialized on the device and
   initialized per parameter from the seed (identical to a single-process model);
2. tensor parallelism slices them in place (:mod:`meshplan.executor.tensor_parallel`);
   context parallelism gives them their tokens' global positions and a ring or all-to-all
   attention core (:mod:`meshplan.executor.context_parallel`);
3. activation recomputation flags (full: whole block; selective: attention core);
4. optional ``torch.compile`` per block (and of the loss where tp = 1);
5. data parallelism (DDP / FSDP2, :mod:`meshplan.executor.data_parallel`);
6. pipeline stages and schedule when pp > 1; the optimizer.

One optimizer step = all micro-batches of this dp rank's share of the global batch (with
cp > 1, this cp rank's load-balanced seq_len/cp tokens of each), gradient reduction over
dp × cp, the tensor-parallel fix-ups (sequence-parallel gradients, tied
embedding copies), then AdamW.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshplan.costmodel.fp8_experts import expert_weights_cached
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.validate import (capacity_cuts_cp_chunks, check_context_parallel,
                                    check_experts)
from meshplan.errors import ConfigError, ExecutorError
from meshplan.executor import expert_parallel as epm
from meshplan.executor.data import shard_sequence
from meshplan.executor.data_parallel import (OptimizerConfig, allreduce_grads, build_optimizer,
                                             wrap_data_parallel)
from meshplan.executor.mesh import MeshGroups
from meshplan.executor.mla import check_mla_runnable
from meshplan.executor.model import Transformer, cross_entropy
from meshplan.executor.pipeline import (PartSpec, build_schedule, build_stage, check_schedule,
                                        local_parts)
from meshplan.executor import tensor_parallel as tpm


def check_layout_runnable(model: ModelSpec, job: Job, layout: Layout) -> int:
    """Checks that need no process group; returns the number of micro-batches per step."""
    if layout.recompute == "selective" and job.selective_modules != ("core_attn",):
        raise ExecutorError(f"Job.recompute_modules = {list(job.selective_modules)}: the "
                            f"executor's selective recompute re-runs the attention core only "
                            f"(Megatron-Core re-runs the others); plan with "
                            f"recompute_modules=None to run it here")
    if model.sliding_window is not None and model.sliding_window < job.seq_len:
        # its attention is full causal: it would train another model than the one planned
        # (a window as long as the sequence is full causal attention)
        raise ExecutorError(f"ModelSpec.sliding_window = {model.sliding_window} < seq_len = "
                            f"{job.seq_len}: the executor runs full causal attention only; "
                            f"plan it with meshplan, or run it with sliding_window = None (full "
                            f"attention on every layer)")
    check_context_parallel(model, job, layout)
    check_moe_runnable(model, job, layout)
    check_mla_runnable(model, job, layout)
    per = layout.dp * layout.micro_batch
    if job.global_batch % per:
        raise ExecutorError(f"Job.global_batch = {job.global_batch} is not divisible by "
                            f"dp·micro_batch = {layout.dp}·{layout.micro_batch} = {per}")
    if job.seq_len > model.max_seq_len:
        raise ExecutorError(f"Job.seq_len = {job.seq_len} exceeds ModelSpec.max_seq_len = "
                            f"{model.max_seq_len}")
    if layout.sequence_parallel and job.seq_len % layout.tp:
        raise ExecutorError(f"sequence parallelism needs seq_len divisible by tp; seq_len "
                            f"{job.seq_len}, tp {layout.tp}")
    if layout.tp > 1:
        for field in ("num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
            v = getattr(model, field)
            if v % layout.tp:
                raise ExecutorError(f"tp = {layout.tp} must divide ModelSpec.{field} = {v}")
    if layout.pp > model.num_layers:
        raise ExecutorError(f"pp = {layout.pp} exceeds num_layers = {model.num_layers}")
    if job.precision == "fp16":
        raise ExecutorError("Job.precision = 'fp16' needs loss scaling, which the executor does "
                            "not implement; use 'bf16' or 'fp32'")
    if job.precision == "fp8":
        from meshplan.executor.fp8 import check_layout_fp8
        check_layout_fp8(job, layout)
    n = job.global_batch // per
    check_schedule(layout, n)
    return n


def check_moe_runnable(model: ModelSpec, job: Job, layout: Layout) -> None:
    """What the executor's MoE layers need of the layout (no process group needed)."""
    try:
        check_experts(model, layout)
    except ConfigError as exc:
        raise ExecutorError(str(exc)) from None
    if not model.is_moe:
        return
    if capacity_cuts_cp_chunks(model, layout.tp, layout.cp):
        raise ExecutorError(f"MoE layers with a capacity (ModelSpec.capacity_factor = "
                            f"{model.capacity_factor}) at cp = {layout.cp}: an odd tp = "
                            f"{layout.tp} slices the cp chunks across their boundary, and "
                            f"which copies an expert drops is counted per chunk; use an even "
                            f"tp or tp = 1")
    if layout.tp > 1 and job.seq_len % layout.tp:
        raise ExecutorError(f"MoE layers route this tp rank's 1/tp of the sequence; seq_len "
                            f"{job.seq_len} must be divisible by tp = {layout.tp}")
    if model.num_shared_experts and (model.num_shared_experts
                                     * model.shared_expert_ffn_hidden_size) % layout.tp:
        raise ExecutorError(f"tp = {layout.tp} must divide the shared experts' width "
                            f"{model.num_shared_experts}·{model.shared_expert_ffn_hidden_size}")


@dataclass
class _Part:
    spec: PartSpec
    module: Transformer            # unwrapped (parameter names as in the full model)
    wrapped: torch.nn.Module       # what is called (DDP / FSDP / the module itself)


#: the environment variable naming the ``torch.compile`` backend of the executor's compiled
#: blocks and loss (:func:`compile_backend`)
COMPILE_BACKEND_ENV = "MESHPLAN_COMPILE_BACKEND"
#: the backends it may name: Inductor (the default, what every GPU run uses) and the graph-only
#: backends the CPU test suite uses (tests/conftest.py): Dynamo, AOTAutograd (and with
#: ``aot_eager_decomp_partition`` Inductor's decompositions and min-cut partitioner) without
#: Inductor's code generation
COMPILE_BACKENDS = ("inductor", "aot_eager_decomp_partition", "aot_eager", "eager")


def compile_backend() -> str:
    """The ``torch.compile`` backend of the executor's compiled blocks and loss: the value of
    ``MESHPLAN_COMPILE_BACKEND``, read at each compile (unset or empty: "inductor").

    Why: on CPU, Inductor compiles each fused kernel with a C++ compiler (1.5-2 s of CPU
    each), most of the test suite's time, while the CPU tests of compiled layouts check the
    graph (Dynamo's tracing, AOTAutograd's backward and partition, collectives under compile,
    numerics against eager), which ``aot_eager_decomp_partition`` runs without code
    generation. GPU runs leave it unset. Any other value is refused (ExecutorError)."""
    name = os.environ.get(COMPILE_BACKEND_ENV, "") or "inductor"
    if name not in COMPILE_BACKENDS:
        raise ExecutorError(f"{COMPILE_BACKEND_ENV}={name!r} is not a torch.compile backend the "
                            f"executor runs; valid: {', '.join(COMPILE_BACKENDS)} "
                            f"(unset: inductor)")
    return name


def compiled_cross_entropy():
    """:func:`~meshplan.executor.model.cross_entropy` under ``torch.compile`` (what
    ``Layout.compile`` adds to the compiled blocks when tp = 1; the vocabulary-parallel
    loss of tp > 1 stays eager).

    Why: eager, the loss writes the logits in fp32 (b·s·V·4 bytes: 1.68 GB for gpt3-1.3b at
    micro-batch 4), keeps the fp32 log-softmax for its backward and makes four more passes
    over fp32 logit-sized tensors in the backward — about 15 GB of HBM traffic a
    micro-batch, about 3-4 ms on an H200 at 4-5 TB/s; the calibrated gpt3-1.3b output row
    (head GEMM + loss, eager) takes 5.1 + 7.6 ms at micro-batch 4, of which the GEMMs are
    about 2.5 + 5 ms. Compiled, the upcast, log-sum-exp and the gradient fuse into passes
    over the 16-bit logits and nothing fp32 of logit size is kept. Same math in fp32 (the
    reduction order may differ, as in the compiled blocks). Backend: :func:`compile_backend`."""
    return torch.compile(cross_entropy, dynamic=False, backend=compile_backend())


class ParallelTrainer:
    """Trains ``model`` cut by ``layout`` on this rank's share of the mesh."""

    def __init__(self, model: ModelSpec, job: Job, layout: Layout, groups: MeshGroups,
                 device: torch.device, *, seed: int = 0,
                 optimizer: OptimizerConfig = OptimizerConfig(), compile: bool = False):
        self.model_spec, self.job, self.layout, self.groups = model, job, layout, groups
        self.device = device
        self.num_microbatches = check_layout_runnable(model, job, layout)
        # fp8: the linears' GEMMs in fp8 (meshplan.executor.fp8), everything else as bf16
        self.bf16 = device.type == "cuda" and job.precision in ("bf16", "fp8")
        act_dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.use_autocast = self.bf16 and layout.zero < 2
        self.shards: dict[str, tpm.ShardSpec] = {}
        self.parts: list[_Part] = []
        sp = layout.sequence_parallel
        self.expert_groups = (epm.build_expert_groups(groups.mesh, layout.ep, layout.etp,
                                                      device.type) if model.is_moe else None)
        for ps in local_parts(model, layout, groups.pp_rank):
            with torch.device("meta"):
                m = Transformer(model)
            m.keep_part(ps.first_layer, ps.num_layers, embeds_input=ps.is_first,
                        computes_logits=ps.is_last)
            if self.expert_groups is not None:
                epm.place_experts(m, self.expert_groups)
            m.to_empty(device=device)
            m.init_weights(seed)
            if layout.tp > 1:
                self.shards.update(tpm.apply_tensor_parallel(
                    m, groups.tp_group, sequence_parallel=sp,
                    moe=epm.apply_tensor_parallel_moe))
            if layout.cp > 1:
                from meshplan.executor.context_parallel import apply_context_parallel
                apply_context_parallel(m, groups.cp_group, style=layout.cp_style,
                                       seq_len=job.seq_len)
            if job.precision == "fp8":
                from meshplan.executor.fp8 import convert_to_fp8
                convert_to_fp8(m, job.fp8_recipe, device=device,
                               tp_group=groups.tp_group if layout.tp > 1 else None,
                               tokens=layout.micro_batch * job.seq_len // layout.cp)
            m.activation_dtype = act_dtype if self.bf16 else None
            backend = compile_backend() if compile else None
            for block in m.layers.values():
                block.recompute_block = layout.recompute == "full"
                block.attn.recompute_core = layout.recompute == "selective"
                if compile:
                    block.compile(backend=backend)
            if self.expert_groups is not None:
                # a pipeline schedule scales gradients by 1/micro-batches itself
                epm.configure_moe(m, self.expert_groups,
                                  aux_divisor=1 if layout.pp > 1 else self.num_microbatches,
                                  cp_group=groups.cp_group if layout.cp > 1 else None)
                epm.prepare_data_parallel(m, self.expert_groups, zero=layout.zero,
                                          bf16=self.bf16)
            wrapped = wrap_data_parallel(m, zero=layout.zero, groups=groups.grad_groups,
                                         device=device, bf16=self.bf16, pipelined=layout.pp > 1)
            self.parts.append(_Part(ps, m, wrapped))
        self.sp_params = []
        if sp:
            for part in self.parts:
                named = dict(part.module.named_parameters())
                self.sp_params += [named[n] for n in tpm.sequence_parallel_param_names(part.module)]
        self.embed_params = []
        if groups.embed_group is not None:
            for part in self.parts:
                if part.spec.is_first or part.spec.is_last:
                    self.embed_params.append(part.module.tok_embeddings.weight)
        self.expert_param_names = [n for part in self.parts
                                   for n in epm.expert_param_names(part.module)]
        self.expert_params, params, self.router_params = [], [], []
        self.etp_summed_params = []
        for part in self.parts:
            experts = set(epm.expert_param_names(part.module))
            routers = set(epm.router_param_names(part.module)) if layout.tp > 1 else set()
            summed = set(epm.etp_summed_param_names(part.module)) if layout.etp > 1 else set()
            for name, p in part.module.named_parameters():
                (self.expert_params if name in experts else params).append(p)
                if name in routers:
                    self.router_params.append(p)
                if name in summed:
                    self.etp_summed_params.append(p)
        self.optimizer = build_optimizer(params, zero=layout.zero, groups=groups.grad_groups,
                                         device=device, config=optimizer)
        if self.expert_params:
            self.optimizer = epm.JointOptimizer([self.optimizer, epm.build_expert_optimizer(
                self.expert_params, self.expert_groups, zero=layout.zero, device=device,
                config=optimizer)])
        self.fp8_weight_casts = self._cache_fp8_expert_weights(compile)
        self.vocab_start = groups.tp_rank * (model.vocab_size // layout.tp)
        self._cross_entropy = compiled_cross_entropy() if compile else cross_entropy
        self.has_last = any(p.spec.is_last for p in self.parts)
        self.has_first = any(p.spec.is_first for p in self.parts)
        self.schedule = None
        self._retains_graph = compile and layout.schedule == "zero-bubble"
        if layout.pp > 1:
            self.stages = [self._make_stage(p) for p in self.parts]
            self.schedule = build_schedule(layout, self.stages, self.num_microbatches,
                                           self.loss_fn)

    # ---- construction helpers ----------------------------------------------------------
    def _make_stage(self, part: _Part):
        return build_stage(part.wrapped, part.spec, device=self.device,
                           group=self.groups.pp_group)

    def _cache_fp8_expert_weights(self, compile: bool) -> list:
        """fp8 routed experts cast their weights once a step, not in every pass
        (:class:`~meshplan.executor.fp8_grouped.Fp8ExpertWeights`), where
        :func:`~meshplan.costmodel.fp8_experts.expert_weights_cached` says (the rule the
        cost model prices)."""
        layout = self.layout
        if not expert_weights_cached(layout.zero, self.num_microbatches, layout.recompute):
            return []
        return [w for part in self.parts for moe in epm.moe_layers(part.module)
                if moe.experts.fp8 is not None
                for w in moe.experts.cache_fp8_weights(
                    backend=compile_backend() if compile else None)]

    # ---- training ----------------------------------------------------------------------
    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.layout.tp > 1:
            return tpm.vocab_parallel_cross_entropy(logits, targets, self.vocab_start,
                                                    self.groups.tp_group)
        return self._cross_entropy(logits, targets)

    def _autocast(self):
        if self.use_autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, batch: torch.Tensor, mark=None) -> torch.Tensor:
        """One optimizer step on this dp rank's sequences ``batch`` (b, seq_len + 1).

        Returns the global mean loss (a 0-dim tensor, identical on every rank). ``mark``:
        called with each phase's name as it ends — "passes" (forward and backward of every
        micro-batch, the pipeline schedule), "grads" (gradient averaging outside DDP/FSDP2),
        "optimizer", "loss" (the global loss all-reduce) — for per-phase timing
        (:meth:`meshplan.executor.measure.StepTimer.mark`). Without a pipeline the passes
        are marked per micro-batch too, "forward i" and "backward i" (forward includes the
        loss), leaving "passes" the rest (the loss average).
        """
        mark = mark or (lambda name: None)
        self.optimizer.zero_grad(set_to_none=True)
        for w in self.fp8_weight_casts:    # the weights changed at the last optimizer step
            w.refresh()
        cp, cp_rank = self.layout.cp, self.groups.cp_rank
        x = shard_sequence(batch[:, :-1], cp, cp_rank).contiguous()
        y = shard_sequence(batch[:, 1:], cp, cp_rank).contiguous()
        with self._autocast():
            if self.schedule is None:
                local = self._step_local(x, y, mark)
            else:
                local = self._step_pipeline(x, y)
        mark("passes")
        self._finish_grads()
        mark("grads")
        self.optimizer.step()
        mark("optimizer")
        loss = self._global_loss(local)
        mark("loss")
        return loss

    def _step_local(self, x, y, mark) -> torch.Tensor:
        part = self.parts[0]
        n = self.num_microbatches
        total = torch.zeros((), device=self.device)
        ddp = hasattr(part.wrapped, "no_sync")
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
            sync = not ddp or i == n - 1
            with (contextlib.nullcontext() if sync else part.wrapped.no_sync()):
                loss = self.loss_fn(part.wrapped(xm), ym)
                mark(f"forward {i}")
                (loss / n).backward()
                mark(f"backward {i}")
            total += loss.detach()
        return total / n

    def _step_pipeline(self, x, y) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        with self._compile_config():
            if self.has_last:
                self.schedule.step(*args, target=y, losses=losses)
                return torch.stack([l.detach().float() for l in losses]).mean()
            self.schedule.step(*args)
        return torch.zeros((), device=self.device)

    def _compile_config(self):
        """Zero-bubble's input pass (B) keeps the graph for the weight pass (W): it calls
        ``autograd.grad`` with ``retain_graph=True``, which a compiled block's backward
        refuses where AOTAutograd donated its saved buffers ("compiled with non-empty donated
        buffers which requires ... retain_graph=False"; on by default since torch 2.6). So
        compiled blocks under zero-bubble are compiled — at their first pass, inside the
        schedule's step — without donated buffers. Found on CPU (gloo, 2 ranks): rank 1
        raised it and rank 0 waited out its receive timeout."""
        if self._retains_graph:
            import torch._functorch.config as functorch_config
            return functorch_config.patch(donated_buffer=False)
        return contextlib.nullcontext()

    def _finish_grads(self) -> None:
        replicas = self.groups.grad_groups     # dp × cp
        experts = {id(p) for p in self.expert_params}
        if self.layout.pp > 1 and self.layout.zero < 2 and replicas.dp > 1:
            allreduce_grads([p for part in self.parts for p in part.module.parameters()
                             if id(p) not in experts], replicas.dp_group, replicas.dp)
        if self.expert_params:
            epm.reduce_expert_grads(self.expert_params, self.expert_groups, dp=replicas.dp,
                                    zero=self.layout.zero)
        if self.sp_params:
            tpm.allreduce_sequence_parallel_grads(self.sp_params, self.groups.tp_group)
        if self.router_params:   # routers saw only this tp rank's tokens
            tpm.allreduce_sequence_parallel_grads(self.router_params, self.groups.tp_group)
        if self.etp_summed_params:   # experts' output biases saw only this rank's rows
            tpm.allreduce_sequence_parallel_grads(self.etp_summed_params,
                                                  self.expert_groups.etp_group)
        if self.embed_params:
            for p in self.embed_params:
                if p.grad is not None:
                    g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                    dist.all_reduce(g, group=self.groups.embed_group)

    def _global_loss(self, local: torch.Tensor) -> torch.Tensor:
        contrib = local if (self.has_last and self.groups.tp_rank == 0) else torch.zeros_like(local)
        contrib = contrib.clone()
        if dist.get_world_size() > 1:
            dist.all_reduce(contrib)
        # every dp × cp rank holds the mean over as many tokens (seq_len / cp of its sequences)
        return contrib / (self.layout.dp * self.layout.cp)

    # ---- introspection (tests, memory reports) -----------------------------------------
    def named_parameters(self):
        for part in self.parts:
            yield from part.module.named_parameters()

    def stage_indices(self) -> list[int]:
        return [p.spec.stage_index for p in self.parts]


def gather_full(trainer: ParallelTrainer, kind: str) -> dict[str, torch.Tensor] | None:
    """Reassemble full parameters (``kind="param"``) or gradients (``"grad"``) on rank 0.

    Collective over the world. Every copy of a replicated or tied parameter is returned
    under ``name`` (first copy) and ``name@dp{d}pp{p}tp{t}`` (all copies), so a test can
    check both the value and that replicas agree; ``d`` counts the dp × cp replicas
    (dp_rank·cp + cp_rank).
    """
    g = trainer.groups
    experts = set(trainer.expert_param_names)
    mine = []
    for name, p in trainer.named_parameters():
        if name in experts:
            continue
        t = p if kind == "param" else p.grad
        if t is None:
            mine.append((name, None))
            continue
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        mine.append((name, t.detach().float().cpu()))
    record = ((g.dp_rank * g.cp + g.cp_rank, g.pp_rank, g.tp_rank), mine, trainer.shards)
    world = dist.get_world_size()
    gathered = [None] * world if dist.get_rank() == 0 else None
    dist.gather_object(record, gathered, dst=0)
    expert_out = (epm.gather_expert_params(trainer, kind)
                  if trainer.expert_groups is not None else None)
    if dist.get_rank() != 0:
        return None
    pieces: dict[str, dict[tuple[int, int, int], torch.Tensor | None]] = {}
    shards: dict = {}
    for coord, items, rank_shards in gathered:
        shards.update(rank_shards)
        for name, t in items:
            pieces.setdefault(name, {})[coord] = t
    out: dict[str, torch.Tensor] = {}
    for name, by_coord in pieces.items():
        for coord, t in by_coord.items():
            if name not in shards:
                out[f"{name}@dp{coord[0]}pp{coord[1]}tp{coord[2]}"] = t
        pp_ranks = sorted({c[1] for c in by_coord})
        for pr in pp_ranks:
            for d in range(g.dp * g.cp):
                ts = [by_coord.get((d, pr, t)) for t in range(g.tp)]
                if any(x is None for x in ts):
                    full = None
                elif name in shards:
                    full = shards[name].unshard(ts)
                else:
                    full = ts[0]
                key = name if (d == 0 and pr == pp_ranks[0]) else f"{name}@dp{d}pp{pr}"
                out[key] = full
    out.update(expert_out or {})
    return out


__all__ = ["COMPILE_BACKENDS", "COMPILE_BACKEND_ENV", "ParallelTrainer", "check_layout_runnable",
           "compile_backend", "compiled_cross_entropy", "gather_full"]
