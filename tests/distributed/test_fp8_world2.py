"""fp8 under tensor parallelism: TP 2 trains like TP 1 in fp8 (CPU, gloo, emulated GEMMs).

Both sides run the executor's fp8 linears (ParallelTrainer with Job.precision "fp8"); the
TP 1 run is the reference. Under tp each rank casts its own shards with their own scales
(no amax all-reduce: meshplan.executor.fp8 says why that is sound), so two kinds of case:

* Finite blocks that do not straddle the split (blockwise, mxfp8): a rank's blocks are the
  blocks one GPU scales, so both sides cast the same values with the same scales. What
  differs is fp32 summation order (row-parallel partial sums), which now and then moves an
  fp8 rounding by one step of one element. Checks: the first step's loss (rtol 1e-5, as the
  fp32 cases; measured ≤ 1e-7) and the gradients as in the next case, against fp32 (ratio
  measured 1.000 for both recipes). Element-wise equality was checked until 2026-11-30
  (rtol 1e-4, atol 1e-6; gradients ≤ 1.3e-4 of the largest entry on the machine it was
  written on) and failed on another of this project's CPU machines at the same commit:
  blockwise's gradients differed in 238 of 526,592 elements, by up to 1.0e-3 of the largest
  entry — how many roundings move depends on the machine's summation order.
* A scale spanning a tp-split dimension (tensorwise, rowwise): tp 2 scales each shard by its
  own amax, which is at most the tensor's, so its scale is the same or larger and each
  element's rounding error obeys the same bound (2^-4 relative in e4m3, 2^-3 in e5m2, for
  normals) on a different grid: tp 2 and tp 1 are two fp8 roundings of the same model, not
  one. So both are compared with the fp32 model (tp 1, same data): tp 2's first-step
  gradient error (2-norm over all parameters) must be no more than GRAD_ERR_RATIO = 1.25
  times tp 1's — the same rounding process, the same size of error. tp 1's error is
  2.3-3.8 % of the gradient's norm here, so a shard dequantised with a wrong scale (off by
  a factor 2, say) would add an error of the order of that shard's share of the gradient,
  far past 1.25 ×. Measured (torch 2.13): ratios 0.96-1.05. The first-step losses: each fp8 run's loss is within 2.7e-4 (absolute,
  5.6e-5 of the 4.85 loss) of fp32's, so the two differ by at most twice that,
  FP8_LOSS_RTOL 1e-4 of the loss; measured ≤ 2.8e-5.

Steps 2-3 (after AdamW at lr 1e-2, whose update is ~lr·sign(g) for tiny g, so a moved
rounding becomes a weight change of lr): losses within rtol 1e-3; measured ≤ 3.9e-4
(blockwise), ≤ 7.5e-4 (tensorwise, local scales).
"""

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

from _cases import GPT, LLAMA, LLAMA_MOE  # noqa: E402
import torch  # noqa: E402

from meshplan.costmodel.fp8 import OPERAND_SOURCE, TP_SHARDED_DIM, recipe  # noqa: E402

from _harness import Case, run_cases  # noqa: E402

# 128-aligned: blockwise (128 × 128) and MX (32) blocks fit each tp half of q | k | v,
# gate | up and the row-parallel inputs.
LLAMA128 = ModelSpec(name="tiny-llama-128", num_layers=1, hidden_size=256, num_heads=2,
                     num_kv_heads=2, ffn_hidden_size=256, vocab_size=128, max_seq_len=16,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     tied_embeddings=False, bias=False)
FIRST_LOSS_RTOL, LATER_LOSS_RTOL = 1e-5, 1e-3
GRAD_ERR_RATIO, FP8_LOSS_RTOL = 1.25, 1e-4


def _job(recipe):
    return Job(global_batch=8, seq_len=16, precision="fp8", fp8_recipe=recipe)


def _L(**kw):
    return Layout(micro_batch=2, **kw)


CASES = [  # (name, model, recipe, sequence parallel)
    ("tensorwise-llama", LLAMA, "tensorwise", False),
    ("tensorwise-gpt-sp", GPT, "tensorwise", True),
    ("rowwise-llama-sp", LLAMA, "rowwise", True),
    ("rowwise-gpt", GPT, "rowwise", False),
    ("blockwise-llama128", LLAMA128, "blockwise", False),
    ("mxfp8-llama128-sp", LLAMA128, "mxfp8", True),
]
TP2 = [Case(n, m, _job(r), _L(tp=2, sequence_parallel=sp)) for n, m, r, sp in CASES]
MISALIGNED = Case("blockwise-misaligned", LLAMA, _job("blockwise"), _L(tp=2))
TP1 = [Case(n, m, _job(r), _L()) for n, m, r, _ in CASES]
# the fp32 model at tp 1, once per model (two recipes share each): the same run either way
MODELS = {n: m for n, m, _, _ in CASES}
FP32 = [Case(m.name + "-fp32", m, Job(global_batch=8, seq_len=16, precision="fp32"), _L())
        for m in dict.fromkeys(MODELS.values())]


def _spans_tp_split(name: str) -> bool:
    """Whether some operand's scale covers a whole tp-split dimension (tp 2 scales it per
    shard, tp 1 whole)."""
    r = recipe(name)
    return any(op.block[dim] == 0 for kind in TP_SHARDED_DIM.values()
               for key, op in r.operands().items()
               for t, dim in kind.items() if OPERAND_SOURCE[key][0] == t)


# the routed experts' fp8 grouped GEMMs (rowwise) over ep 2 (folded over dp 2): an
# expert's weight gradient is scaled per column over all the rows it receives, from both dp
# ranks' tokens, where ep 1 scales each rank's rows apart — two fp8 roundings of the same
# model, compared with fp32 as the tp cases
EP2 = Case("rowwise-moe-ep2", LLAMA_MOE, _job("rowwise"), _L(dp=2, ep=2))
EP1 = [Case("rowwise-moe", LLAMA_MOE, _job("rowwise"), _L()),
       Case("tiny-llama-moe-fp32", LLAMA_MOE, Job(global_batch=8, seq_len=16,
                                                  precision="fp32"), _L())]


@pytest.fixture(scope="module")
def results():
    """(tp 2 runs, tp 1 runs): one spawned world of each size for the module, the compiled
    cases (COMPILED, below) and the MoE cases included; the misaligned case, refused, last
    (a case that fails ends its world's run)."""
    return (run_cases(2, TP2 + COMPILED[:1] + [EP2, MISALIGNED]),
            run_cases(1, TP1 + FP32 + COMPILED[1:] + EP1))


def _grads_by_name(run: dict, ref: dict) -> list[tuple[str, torch.Tensor]]:
    """(name, gradient) of every parameter of ``ref``, and every tp replica of one."""
    out = []
    for pname in (k for k in ref["grads"] if "@" not in k):
        got = [v for k, v in run["grads"].items() if k == pname or k.startswith(pname + "@")]
        assert got, f"{pname} missing from the tp 2 run"
        out += [(pname, g) for g in got]
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("name,recipe_name", [(c[0], c[2]) for c in CASES])
def test_tp2_fp8_matches_tp1_fp8(results, name, recipe_name):
    tp2, tp1 = results[0][name], results[1][name]
    fp32 = results[1][MODELS[name].name + "-fp32"]
    for run in (tp2, tp1, fp32):
        assert "error" not in run, run.get("error")
    l2, l1 = (torch.tensor(r["losses"], dtype=torch.float64) for r in (tp2, tp1))
    torch.testing.assert_close(l2[1:], l1[1:], rtol=LATER_LOSS_RTOL, atol=0)
    # blocks inside each shard scale as at tp 1, so the first loss matches closely; the
    # gradients meet the bound every recipe meets (module docstring: element-wise equality
    # depends on the machine's summation order)
    first_rtol = FIRST_LOSS_RTOL if not _spans_tp_split(recipe_name) else FP8_LOSS_RTOL
    torch.testing.assert_close(l2[0], l1[0], rtol=first_rtol, atol=0)
    pairs = _grads_by_name(tp2, fp32)
    err2 = sum(float((g - fp32["grads"][n]).double().square().sum()) for n, g in pairs)
    err1 = sum(float((tp1["grads"][n] - fp32["grads"][n]).double().square().sum())
               for n, g in pairs)
    assert err1 > 0, "tp 1 fp8 gradients equal fp32's: the fp8 casts did not run"
    ratio = (err2 / err1) ** 0.5
    assert ratio <= GRAD_ERR_RATIO, (f"{name}: tp 2's fp8 gradient error against fp32 is "
                                     f"{ratio:.3f} × tp 1's (at most {GRAD_ERR_RATIO})")


def test_recipes_with_whole_dimension_scales_are_the_local_scale_cases():
    assert [n for n in ("tensorwise", "rowwise", "blockwise", "mxfp8") if _spans_tp_split(n)] \
        == ["tensorwise", "rowwise"]


@pytest.mark.distributed
def test_blocks_straddling_the_tp_split_are_refused(results):
    err = results[0]["blockwise-misaligned"].get("error", "")
    assert "scales 128-element blocks, but tp = 2 splits" in err, err


# Issue 41: compiled tp 2 (no SP) with full recompute failed at step 0 on 4 × H200: the fp8
# linear returned a reshape (a view) that the row-parallel all-reduce then wrote in place,
# which dynamo refuses ("Output 0 of ApplyTemplateBackward is a view ... modified inplace").
COMPILED = [Case("tensorwise-llama-compiled-rc", LLAMA, _job("tensorwise"),
                 _L(tp=tp, recompute="full", compile=True)) for tp in (2, 1)]


@pytest.mark.distributed
def test_compiled_tp2_full_recompute_fp8_trains_like_tp1(results):
    tp2 = results[0][COMPILED[0].name]
    tp1 = results[1][COMPILED[1].name]
    for run in (tp2, tp1):
        assert "error" not in run, run.get("error")
    l2, l1 = (torch.tensor(r["losses"], dtype=torch.float64) for r in (tp2, tp1))
    # tensorwise: per-shard scales under tp, the bound of the eager tensorwise cases
    torch.testing.assert_close(l2[0], l1[0], rtol=FP8_LOSS_RTOL, atol=0)
    torch.testing.assert_close(l2[1:], l1[1:], rtol=LATER_LOSS_RTOL, atol=0)


@pytest.mark.distributed
def test_fp8_experts_over_ep2_train_as_at_ep1(results):
    ep2, ep1, fp32 = (results[0][EP2.name], results[1][EP1[0].name],
                      results[1][EP1[1].name])
    for run in (ep2, ep1, fp32):
        assert "error" not in run, run.get("error")
    l2, l1 = (torch.tensor(r["losses"], dtype=torch.float64) for r in (ep2, ep1))
    torch.testing.assert_close(l2[0], l1[0], rtol=FP8_LOSS_RTOL, atol=0)
    torch.testing.assert_close(l2[1:], l1[1:], rtol=LATER_LOSS_RTOL, atol=0)
    experts = [n for n in fp32["grads"] if "experts" in n]
    assert experts

    def err(run, names):
        return sum(float((run["grads"][n] - fp32["grads"][n]).double().square().sum())
                   for n in names)
    # the experts ran fp8 at ep 1 (their gradients moved off fp32's), and ep 2's error is
    # the same size as ep 1's, over the experts and over the whole model (measured 1.008
    # and 1.000, torch 2.13)
    assert err(ep1, experts) > 0
    for names in (experts, list(fp32["grads"])):
        ratio = (err(ep2, names) / err(ep1, names)) ** 0.5
        assert ratio <= GRAD_ERR_RATIO, f"ep 2 / ep 1 fp8 gradient error {ratio:.3f}"
