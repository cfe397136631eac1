"""Shared check of a compiled-block memory rule at pp 2 under 1F1B (the dense and MoE rules'
tests: ``test_compiled_dense_saved_bytes.py``, ``test_compiled_moe_saved_bytes.py``)."""

import dataclasses

import meshplan as mp
from meshplan.costmodel import estimate


def rule_at_pp2(spec, rule: str, applies, recompute: str):
    """The estimates of ``spec`` at pp 2, micro-batch 2, compiled, under 1F1B on two H100s,
    with the named ``rule`` and without it; checks the rule applies (``applies``: its gate),
    is named only where on, and leaves the step time alone. Returns (with, without)."""
    lay = mp.Layout(pp=2, micro_batch=2, compile=True, recompute=recompute)
    on = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
    off = on.replace(gpu=dataclasses.replace(
        on.gpu, corrections=on.gpu.corrections.without(rule)))
    job = mp.Job(global_batch=16, seq_len=2048, runtime="torch")
    assert applies(spec, job, lay, on.gpu.corrections)
    e, e0 = estimate(spec, on, job, lay), estimate(spec, off, job, lay)
    assert rule in {c.name for c in e.corrections}
    assert rule not in {c.name for c in e0.corrections}
    assert e.step_time_s == e0.step_time_s
    return e, e0
