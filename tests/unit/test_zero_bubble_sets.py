"""Zero-bubble's kept W sets are capped by the step's micro-batches
(:meth:`meshplan.costmodel.rank_memory.LayerTables._split_sets`)."""
from dataclasses import replace

import pytest

from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
LAYOUT = Layout(pp=2, micro_batch=4, schedule="zero-bubble", recompute="selective")


def _tables(global_batch: int):
    return layer_tables(MODEL, CLUSTER, Job(global_batch=global_batch, seq_len=1024,
                                            runtime="torch"), LAYOUT)


def test_one_microbatch_holds_one_w_set_not_the_pending_one_plus_the_one_just_run():
    one = _tables(4)             # m = 1: rank 1 runs F0 I0 W0
    assert one.split_backward and one.wgrad_pending[1] == 1.0
    assert one._split_sets(1) == 1.0
    assert _tables(8)._split_sets(1) == 2.0          # m = 2: pending W0 + the I1 just ended
    uncapped = replace(one, microbatches=0.0)
    assert uncapped._split_sets(1) == 2.0
    layers = 4
    extra = (uncapped.rank_memory_bytes(1, layers) - one.rank_memory_bytes(1, layers))
    assert extra == pytest.approx(layers * one.wgrad_pending_bytes + one.logits_grad_bytes)
    assert extra > 0
