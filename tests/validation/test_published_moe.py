"""The published MoE runs (``moe_bf16_2024_2026.csv``): what the loader reads from each row,
the published figure's conversion into a step time, and the cross-node all-to-all of the
one row whose ep group spans nodes, by hand."""

from __future__ import annotations

import pytest

from meshplan import Cluster
from meshplan.costmodel import comm, estimate
from meshplan.costmodel.inputs import table_inputs
from meshplan.costmodel.flops import model_flops_per_step

from published_runs import (MOE_DISPATCHER, moe_fp8_runs, moe_modelzoo_runs,
                            moe_nemo_dgxc_runs, moe_runs)


def _runs():
    return {(r.row["source"], r.row["system"]): r for r in moe_runs()}


def test_rows_read_as_published():
    runs = _runs()
    assert len(runs) == 5
    for r in runs.values():
        lay, d = r.layout, r.row
        assert lay.num_gpus == int(d["gpus"])
        assert (lay.tp, lay.pp, lay.micro_batch, lay.vpp) == tuple(
            int(d[k]) for k in ("tp", "pp", "micro_batch", "vp"))
        # the table's ep, unless the container's recipe ran another (ep_as_run)
        assert lay.ep == int(d["ep_as_run"] or d["ep"])
        assert r.job.precision == "bf16" and r.job.seq_len == int(d["seq_len"])
        # forced-balanced rows run at rho = 1; the others keep the profile's built-in value
        rho = r.cluster.gpu.corrections.moe_load_imbalance
        assert (rho == 1.0) == (d["balanced"] == "yes")
        # HybridEP de-duplicates like DeepEP; the others are all-to-all dispatchers
        assert r.job.moe_dispatcher == ("deepep" if d["dispatcher"] == "hybridep"
                                        else "alltoall")


def test_the_recipe_ep_is_recorded_beside_the_table():
    """25.11's B200 row: the table's EP 8 is kept in the row, the recipe's EP 64 is run,
    and the label says both."""
    runs = _runs()
    r = runs.pop(("megatron-bridge-25.11", "dgx-b200"))
    assert (r.row["ep"], r.row["ep_as_run"], r.layout.ep) == ("8", "64", 64)
    assert "table: ep 8" in r.label
    assert all(not x.row["ep_as_run"] for x in runs.values())


def test_modelzoo_rows_read_as_printed_and_skips_say_why():
    runs, skipped = moe_modelzoo_runs()
    assert len(runs) + len(skipped) == 5
    for r in runs:
        d, lay = r.row, r.layout
        assert (lay.tp, lay.ep, lay.pp, lay.vpp, lay.dp, lay.micro_batch) == tuple(
            int(d[k]) for k in ("tp", "ep", "pp", "vpp", "dp", "mbs"))
        assert r.job.global_batch == int(d["gbs"]) and r.published == float(d["step_s"])
        # the account-for-embedding/loss split: 94 layers + 2 over pp * vpp chunks
        assert sum(lay.stage_layers) == 94 and len(lay.stage_layers) == lay.pp * lay.vpp
        assert lay.stage_layers[0] == lay.stage_layers[-1] == 96 // (lay.pp * lay.vpp) - 1
        # the published GA is the layout's micro-batches per step
        assert int(d["gbs"]) // (lay.dp * lay.micro_batch) == int(d["ga"])
        assert r.job.moe_dispatcher == MOE_DISPATCHER[d["dispatcher"]]
        assert r.cluster.gpu.corrections.moe_load_imbalance == 1.0
    reasons = dict(skipped)
    assert len(skipped) == 2
    assert any("overlapped" in why for why in reasons.values())
    assert any("published command" in why for why in reasons.values())
    # pp 32 · vpp 3 = 96 chunks for 94 layers: the first chunk runs only the embedding, the
    # last only the loss
    a2a = [r for r in runs if r.layout.pp == 32]
    assert len(a2a) == 1 and a2a[0].job.moe_dispatcher == "alltoall"
    assert a2a[0].layout.stage_layers[0] == a2a[0].layout.stage_layers[-1] == 0


def test_published_figures_to_step_time():
    runs = _runs()
    b200 = runs[("megatron-bridge-26.02", "dgx-b200")]
    assert b200.published == pytest.approx(1280 * 4096 / (8047 * 64))       # 10.18 s
    mixtral = runs[("mcore-moe-readme", "dgx-h100")]
    # Megatron-LM's num_floating_point_operations for Mixtral 8x7B (h 4096, 32 layers, 8 kv
    # groups of 32 heads, f 14336, top-2, SwiGLU, vocab 32000) at seq 4096, per token
    h, L, s, f, v = 4096, 32, 4096, 14336, 32000
    per_token = 12 * L * h * h * ((1 + 8 / 32 + s / h) + f / h * 2 * 1.5 + v / (2 * L * h))
    flops = model_flops_per_step(mixtral.model, 256, 4096)
    assert flops / (256 * 4096) == pytest.approx(per_token, rel=2e-3)   # router 2hE aside
    assert mixtral.published == pytest.approx(flops / (468e12 * 64))


def test_ep64_b200_all_to_all_goes_through_each_rank_nic():
    """ep 64 over 8 DGX-B200: each rank sends k·T·h·2 bytes a dispatch, 56/64 of them to
    other nodes through its 50 GB/s share of the node's NICs."""
    r = _runs()[("megatron-bridge-26.02", "dgx-b200")]
    t = table_inputs(r.model, r.cluster, r.job, r.layout)
    tokens = 4 * 4096
    sent = 4 * tokens * 2880 * 2 * 63 / 64
    link = t.links.ep
    net_s = sent * 56 / 63 / (50e9 * r.cluster.network.efficiency(sent * 64 / 63))
    fwd = t.parts.layer.forward.ep_comm_s
    assert fwd == pytest.approx(2 * (net_s + comm.call_latency_s(link, "all_to_all")),
                                rel=1e-9)
    est = estimate(r.model, r.cluster, r.job, r.layout)
    # 36 layers x 5 micro-batches x (forward + backward), nothing overlapped
    assert est.time.ep_comm_s == pytest.approx(36 * 5 * 2 * fwd, rel=1e-6)
    assert link.nodes_spanned == 8


def _published_moe():
    import sys
    from pathlib import Path
    bench = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import published_moe
    return published_moe


def test_missing_time_per_layer_and_microbatch_by_hand():
    """26.02's ep 64 B200 row: 1280 / (64 · 4) = 5 micro-batches of 36 layers (pp 1); its
    all-to-all latency is 4 calls per layer and micro-batch, n − 1 ring steps each."""
    pm = _published_moe()
    r = _runs()[("megatron-bridge-26.02", "dgx-b200")]
    step = estimate(r.model, r.cluster, r.job, r.layout).step_time_s
    assert pm.gap_per_layer_ms(r, step) == pytest.approx(
        (r.published - step) / (5 * 36) * 1e3, rel=1e-12)
    link = table_inputs(r.model, r.cluster, r.job, r.layout).links.ep
    lat = pm.a2a_latency_s(r)
    assert lat == pytest.approx(4 * 36 * 5 * comm.call_latency_s(link, "all_to_all"), rel=1e-12)
    # taking the latency out leaves more time missing, never less
    assert pm.gap_per_layer_ms(r, step - lat) > pm.gap_per_layer_ms(r, step)


def test_a2a_latency_only_for_all_to_all_dispatch_across_ranks():
    pm = _published_moe()
    zoo, _ = moe_modelzoo_runs()
    for r in zoo:                                   # DeepEP: one step, left in
        assert (pm.a2a_latency_s(r) > 0.0) == (r.job.moe_dispatcher == "alltoall")
    hybrid = _runs()[("megatron-bridge-26.02.01", "dgx-b200")]
    assert hybrid.job.moe_dispatcher == "deepep" and pm.a2a_latency_s(hybrid) == 0.0
    mixtral = _runs()[("mcore-moe-readme", "dgx-h100")]
    # pp 4: the stage's 8 MoE layers, 256 / 16 = 16 micro-batches
    link = table_inputs(mixtral.model, mixtral.cluster, mixtral.job, mixtral.layout).links.ep
    assert pm.a2a_latency_s(mixtral) == pytest.approx(
        4 * 8 * 16 * comm.call_latency_s(link, "all_to_all"), rel=1e-12)


def test_modelzoo_shapes_list_every_row_with_its_expert_gemms():
    pm = _published_moe()
    lines = pm.modelzoo_shapes()[2:]
    assert len(lines) == 5
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    # the FSDP row as printed: tp 2, ep 8, mb 4 -> 8192 tokens a rank, 16 experts, 4096 rows
    fsdp = next(c for c in cells if c[5] == "full")
    assert (fsdp[6], fsdp[7], fsdp[8], fsdp[9]) == ("8192", "16", "4096", "276")
    tp4 = next(c for c in cells if c[1] == "4")
    assert (tp4[6], tp4[7], tp4[8], tp4[9]) == ("1024", "16", "512", "167")


def test_fp8_rows_read_as_published_with_their_recipe_and_split():
    """The FP8 / MXFP8 Megatron-Bridge rows (``moe_fp8_2025_2026.csv``): the table's layout
    (or, where it contradicts its container's recipe, the recipe's), the system's recipe
    (H100 per-tensor current scaling, B200 MXFP8), no recompute or the recipe's modules,
    forced balance, the dispatcher, the published tokens/s as a step, and Qwen3-235B's
    account-for-embedding/loss split; rows run with a mechanism the cost model lacks come back
    with the reason."""
    runs, skipped = moe_fp8_runs()
    assert len(runs) == 18 and len(skipped) == 6
    for r in runs:
        lay, d, job = r.layout, r.row, r.job
        # the table's pp / vp / ep, unless the container's recipe ran others (*_as_run)
        assert lay.num_gpus == int(d["gpus"]) and lay.ep == int(d["ep_as_run"] or d["ep"])
        assert (lay.tp, lay.pp, lay.micro_batch, lay.vpp) == (
            int(d["tp"]), int(d["pp_as_run"] or d["pp"]), int(d["micro_batch"]),
            int(d["vp_as_run"] or d["vp"]))
        assert job.fp8_param_gather      # both recipes keep and gather fp8 weights
        assert job.precision == "fp8" and job.fp8_recipe == (
            "tensorwise" if d["system"] == "dgx-h100" else "mxfp8")
        assert job.moe_dispatcher == MOE_DISPATCHER[d["dispatcher"]]
        assert lay.zero == 1
        if d["recompute_modules"]:
            assert lay.recompute == "selective"
            assert job.recompute_modules == tuple(d["recompute_modules"].split("+"))
        else:
            assert lay.recompute == "none"
        assert lay.sequence_parallel == (lay.tp > 1)
        assert r.cluster.gpu.corrections.moe_load_imbalance == 1.0
        assert r.published == pytest.approx(
            job.global_batch * job.seq_len / (float(d["tokens_per_s_per_gpu"]) * lay.num_gpus))
        if d["stage_split"] == "embedding_loss":
            # 94 layers + embedding + loss over pp * vpp chunks, the ends one layer short
            chunks = lay.pp * lay.vpp
            assert len(lay.stage_layers) == chunks and sum(lay.stage_layers) == 94
            assert lay.stage_layers[0] == lay.stage_layers[-1] == 96 // chunks - 1
        elif d["stage_layers"]:
            assert lay.stage_layers == tuple(int(n) for n in d["stage_layers"].split())
            assert len(lay.stage_layers) == lay.pp * lay.vpp
        else:
            assert lay.stage_layers is None
        assert f" {job.fp8_recipe} ep {lay.ep} " in r.label
    assert len({r.label for r in runs} | {label for label, _ in skipped}) == 24
    reasons = dict(skipped)
    assert sum("moe_a2a_overlap" in why for why in reasons.values()) == 6
    # 26.04.01's DeepSeek-V3 B200 preset also recomputes "mlp", which is not priced
    assert [label for label, why in skipped if "recompute of mlp" in why] == [
        "deepseek-v3 megatron-bridge-26.04.01 dgx-b200 mxfp8 ep 32 deepep (256 GPUs)"]
    # DeepSeek-V3 as its recipes ran: MTP, mla_up_proj, [emb + 4] + 14 x [4] + [1 + MTP + loss]
    # over pp 16; HybridEP from 26.02, the provider's all-to-all in 25.11
    ds = {r.row["source"]: r for r in runs if r.model.name == "deepseek-v3"}
    assert sorted(ds) == ["megatron-bridge-25.11", "megatron-bridge-26.02",
                          "megatron-bridge-26.02.01", "megatron-bridge-26.04"]
    for source, r in ds.items():
        assert r.model.mtp_layers == 1 and r.layout.pp == 16 and r.layout.vpp == 1
        assert r.job.recompute_modules == ("mla_up_proj",) and r.layout.recompute == "selective"
        assert r.layout.stage_layers == (4,) * 15 + (1,)
        assert r.job.moe_dispatcher == ("alltoall" if source.endswith("25.11") else "deepep")


def test_fp8_recipe_layout_is_recorded_beside_the_table():
    """26.02.01's Qwen3-30B H100 row: the table's PP 2, VP 12, EP 8 stay in the row, the
    container's recipe (v0.3.1: PP 1, EP 16, HybridEP) is run, and the label says both; no
    other row disagrees with its recipe."""
    runs, skipped = moe_fp8_runs()
    as_run = [r for r in runs if r.row["ep_as_run"] or r.row["pp_as_run"] or r.row["vp_as_run"]]
    assert len(as_run) == 1
    r = as_run[0]
    assert (r.row["source"], r.row["system"], r.model.name) == (
        "megatron-bridge-26.02.01", "dgx-h100", "qwen3-30b-a3b")
    assert (r.row["pp"], r.row["vp"], r.row["ep"]) == ("2", "12", "8")
    assert (r.layout.pp, r.layout.vpp, r.layout.ep, r.layout.dp) == (1, 1, 16, 16)
    assert r.layout.schedule == "1f1b" and r.job.moe_dispatcher == "deepep"
    assert "ep 16 (table: pp 2 vp 12 ep 8) hybridep" in r.label
    # the later containers' rows of the same preset print its layout
    same = [x for x in runs if x.model.name == "qwen3-30b-a3b" and x.row["system"] == "dgx-h100"
            and x is not r and x.row["source"] != "megatron-bridge-25.11"]
    assert len(same) == 3
    assert all((x.layout.pp, x.layout.vpp, x.layout.ep) == (1, 1, 16) for x in same)


def test_fp8_rows_predicted_without_error_and_bf16_labels_unchanged():
    """Every predicted FP8 row prices (the table's errors are the published figures'), and
    the BF16 rows, read by the same row reader, keep their labels."""
    runs, _ = moe_fp8_runs()
    for r in runs:
        e = estimate(r.model, r.cluster, r.job, r.layout)
        assert e.step_time_s > 0 and e.num_gpus == r.layout.num_gpus
    labels = [r.label for r in moe_runs()]
    assert "gpt-oss-120b megatron-bridge-26.02 dgx-h100 ep 8 alltoall (64 GPUs)" in labels
    assert all(" tensorwise " not in x and " mxfp8 " not in x for x in labels)


# ---- NeMo 25.02 performance summary and DGX Cloud Benchmarking 25.05 (moe_nemo_dgxc_2025.csv) --

NEMO_DGXC = moe_nemo_dgxc_runs()


def test_nemo_dgxc_rows_read_as_printed_with_their_recipes():
    """NeMo 25.02's DGX-B200 Mixtral rows (FP8) and DGX Cloud 25.05 / 25.05.04's DeepSeek-V3
    DGX-H100 rows (BF16), as printed (GPUs = tp · pp · cp · dp, the printed GA = GBS / (dp ·
    micro-batch), 8x22B's "1 | 64" read as GBS 64, MBS 1) with their recipes' settings: the
    all-to-all dispatcher, learned routing (the profile's ρ), NeMo's token dropping at
    capacity factor 1.0, ZeRO-1, SP where tp > 1 without TP overlap, etp 1; Mixtral at fp8
    with delayed scaling and fp8 weights, no recompute; DeepSeek-V3 at bf16 with its MTP
    layer, mla_up_proj recompute and the recipe's first / last stages of 64 / pp − 1 and
    64 / pp − 2 layers. No error bound: an as-run set."""
    got = [(r.model.name, r.row["source"], r.cluster.num_gpus) for r in NEMO_DGXC]
    assert got == [("mixtral-8x7b", "nemo-25.02", 64), ("mixtral-8x22b", "nemo-25.02", 256),
                   ("deepseek-v3", "dgxc-25.05", 1024), ("deepseek-v3", "dgxc-25.05.04", 512)]
    ga = {"mixtral-8x7b": 2, "mixtral-8x22b": 16, "deepseek-v3": None}
    for r in NEMO_DGXC:
        lay, job, m = r.layout, r.job, r.model
        assert lay.tp * lay.pp * lay.cp * lay.dp == r.cluster.num_gpus
        assert (lay.etp, lay.zero, lay.sequence_parallel) == (1, 1, lay.tp > 1)
        assert not job.overlap_tp_comm and job.overlap_dp_comm
        assert job.moe_dispatcher == "alltoall" and m.capacity_factor == 1.0
        assert r.cluster.gpu.corrections.moe_load_imbalance == Cluster.preset(
            r.row["system"], nodes=1).gpu.corrections.moe_load_imbalance
        if ga[m.name]:
            assert lay.num_microbatches(job.global_batch) == ga[m.name]
        if m.name.startswith("mixtral"):
            assert r.cluster.gpu.name.startswith("B200")
            assert (job.precision, job.fp8_recipe, job.fp8_param_gather) == ("fp8", "delayed",
                                                                              True)
            assert lay.recompute == "none"
        else:
            assert r.cluster.gpu.name.startswith("H100") and m.mtp_layers == 1
            assert (lay.tp, lay.ep, lay.vpp, lay.micro_batch) == (2, 64, 1, 1)
            assert job.global_batch == 8 * r.cluster.num_gpus and job.precision == "bf16"
            assert lay.recompute == "selective" and job.recompute_modules == ("mla_up_proj",)
            mid = 64 // lay.pp
            assert lay.stage_layers == (mid - 1, *[mid] * (lay.pp - 2), mid - 2)
    x7, x22 = NEMO_DGXC[0], NEMO_DGXC[1]
    assert (x7.layout.ep, x7.layout.micro_batch, x7.job.global_batch, x7.job.seq_len) == (
        8, 2, 256, 4096)
    assert (x22.layout.tp, x22.layout.pp, x22.layout.cp, x22.layout.vpp, x22.layout.ep) == (
        2, 4, 8, 14, 8)
    assert (x22.layout.micro_batch, x22.job.global_batch, x22.job.seq_len) == (1, 64, 65536)
    assert [round(r.published, 3) for r in NEMO_DGXC] == [1.06, 7.341, 52.04, 48.948]


@pytest.mark.parametrize("run", NEMO_DGXC, ids=lambda r: r.label)
def test_nemo_dgxc_published_layout_fits(run):
    """Each layout ran on its GPUs (80 GB H100, 180 GB B200), so the prediction must fit."""
    assert estimate(run.model, run.cluster, run.job, run.layout).fits
