"""A layer priced from measured rows carried beyond the micro-batches they were timed at says
so (costmodel/caveats.extended_rows_caveat; measured values: docs/benchmarks/fp8_checks.md,
fp8h2/fp8h3)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import Cluster, Job, Layout, ModelSpec, estimate
from meshplan.hardware_profiles.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                                 ends_shape_key, layer_shape_key)

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _cluster(micro_batches) -> Cluster:
    def layer(mb):
        return MeasuredLayer(shape=layer_shape_key(MODEL), seq_len=1024, tp=1,
                             sequence_parallel=False, recompute="none", micro_batch=mb,
                             forward_s=1e-3 * mb + 2e-4, backward_s=2e-3 * mb + 3e-4,
                             activation_bytes=1e8 * mb, backward_peak_bytes=5e7 * mb)

    def end(part, mb):
        return MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                           sequence_parallel=False, micro_batch=mb, forward_s=1e-4 * mb,
                           backward_s=2e-4 * mb, activation_bytes=1e6 * mb, peak_bytes=0.0)
    tables = MeasuredTables(tuple(layer(mb) for mb in micro_batches),
                            tuple(end(p, mb) for p in ("embedding", "output")
                                  for mb in micro_batches))
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    return replace(c, gpu=replace(c.gpu, measured=tables))


def _extended(c, mb) -> list[str]:
    return [x for x in estimate(MODEL, c, JOB, Layout(micro_batch=mb)).caveats
            if "are extended to" in x]


@pytest.mark.parametrize("timed, mb, expected", [
    ((1, 2), 4, "micro-batch 1, 2 and are extended to 4"),     # beyond: linear from 1 and 2
    ((2, 4), 1, "micro-batch 2, 4 and are extended to 1"),     # below the smallest
    ((4,), 8, "micro-batch 4 and are extended to 8"),          # one row: proportional
])
def test_rows_carried_beyond_the_timed_micro_batches_say_so(timed, mb, expected):
    got = _extended(_cluster(timed), mb)
    assert len(got) == 1 and expected in got[0]
    assert f"--micro-batches ...,{mb}" in got[0]


@pytest.mark.parametrize("timed, mb", [((1, 2), 2), ((1, 4), 2), ((1, 2, 4), 4)])
def test_timed_or_interpolated_micro_batches_carry_no_such_caveat(timed, mb):
    assert _extended(_cluster(timed), mb) == []


@pytest.mark.usefixtures("no_grad_accumulation")
def test_the_extension_it_names_is_linear_from_the_two_nearest_rows():
    e = estimate(MODEL, _cluster((1, 2)), JOB, Layout(micro_batch=4))
    # backward rows 2.3 and 4.3 ms at micro-batch 1 and 2: 8.3 ms a layer at 4, eight
    # layers, plus the two ends' 0.8 ms each (their rows extended the same way)
    assert e.stage_backward_s[0] == pytest.approx(8 * 8.3e-3 + 2 * 0.8e-3, rel=1e-12)
    assert any("are extended to 4" in x for x in e.caveats)
