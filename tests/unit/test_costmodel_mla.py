"""Multi-head latent attention's memory-bound terms (meshplan.costmodel.mla): RoPE with the
key / value split of Megatron-Core's fused kernels, and the latents' RMSNorms."""

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import mla
from meshplan.costmodel.compute import hbm_s, layer_cost

DSV3 = mp.ModelSpec.preset("deepseek-v3")
H200 = mp.Cluster.preset("dgx-h200", nodes=1)
JOB = mp.Job(global_batch=8, seq_len=4096)


@pytest.mark.parametrize("tp", [1, 8])
def test_rope_and_split_elements_by_hand(tp):
    n = 128 / tp
    q_rope = 2 * n * 64                              # q's rotary part, in place
    kv_in = n * (128 + 128) + 64                     # kv up-projection output + rotary key
    out = n * (128 + 64) + n * 128                   # key (rotary key per head) + value
    assert mla.rope_elements(DSV3, tp) == pytest.approx(q_rope + kv_in + out)


def test_latent_norms_are_in_the_layers_memory_bound_time():
    assert mla.latent_norm_elements(DSV3) == 2 * (1536 + 512)
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, recompute="none",
              tp_link=H200.group_link(1, 1), mlp_width=0)
    with_q = layer_cost(DSV3, H200, JOB, **kw).forward.memory_bound_s
    no_q = layer_cost(replace(DSV3, q_lora_rank=None), H200, JOB, **kw).forward.memory_bound_s
    # only c_Q's norm differs (RoPE does not read the query latent)
    assert with_q - no_q == pytest.approx(hbm_s(H200.gpu, 4096 * 2 * 1536 * 2, DSV3.norm))
