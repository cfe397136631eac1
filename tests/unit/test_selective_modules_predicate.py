"""recomputes_core_attention: the one test of whether selective recomputation re-runs the
attention core, and op_curve: the one choice of an op's measured curve over the
collectives' curve (the MoE dispatch's NVLink share, priced from the GPU)."""

from dataclasses import replace

import meshplan as mp
from meshplan.costmodel.memory import layer_activations, recomputes_core_attention
from meshplan.hardware_profiles.curve import Curve, op_curve
from meshplan.hardware_profiles.topology import group_link

LLAMA = mp.ModelSpec.preset("llama3-8b")


def test_job_with_core_attention_among_its_selective_modules():
    assert recomputes_core_attention(mp.Job(global_batch=8, seq_len=1024))   # the default
    assert recomputes_core_attention(
        mp.Job(global_batch=8, seq_len=1024, recompute_modules=("layernorm", "core_attn")))


def test_job_without_core_attention_among_its_selective_modules():
    for mods in (("layernorm",), ("layernorm", "moe_act"), ("moe_act",)):
        assert not recomputes_core_attention(
            mp.Job(global_batch=8, seq_len=1024, recompute_modules=mods))


def test_layer_activations_carry_the_jobs_answer():
    for mods in (None, ("layernorm",)):
        job = mp.Job(global_batch=8, seq_len=1024, flash_attention=False,
                     recompute_modules=mods)
        acts = layer_activations(LLAMA, job, 1, 1, False)
        assert recomputes_core_attention(acts) == recomputes_core_attention(job)
        # the s² terms are dropped by selective recomputation exactly when it re-runs them
        assert acts.attention_core_bytes > 0
        dropped = acts.stored("none") - acts.stored("selective")
        want = acts.attention_core_bytes if mods is None else acts.norm_output_bytes
        assert dropped == want


def test_op_curve_prefers_the_measured_curve_like_group_link():
    gpu = mp.Cluster.preset("dgx-h100", nodes=1).gpu
    measured = Curve(((1e5, 0.2), (1e8, 0.7)))
    assert op_curve(None, gpu.nvlink_efficiency) is gpu.nvlink_efficiency
    assert op_curve(measured, gpu.nvlink_efficiency) is measured
    cl = mp.Cluster.preset("dgx-h100", nodes=1)
    cl = cl.replace(gpu=replace(cl.gpu, nvlink_all_to_all_efficiency=measured))
    link = group_link(cl, 8, 1)        # inside the node: the link holds the GPU's curves
    for nbytes in (1e5, 1e7, 1e9):
        assert link.all_to_all_bytes_per_s(nbytes) == link.busbw_gbps * 1e9 * op_curve(
            cl.gpu.nvlink_all_to_all_efficiency, cl.gpu.nvlink_efficiency)(nbytes)
