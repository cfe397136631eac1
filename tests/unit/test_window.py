"""Sliding-window attention (meshplan.costmodel.window, ModelSpec.sliding_window): the spec's
checks, the tiles a flash kernel runs, the attention time and the model FLOPs, by hand."""

from __future__ import annotations

import dataclasses

import pytest

import meshplan as mp
from meshplan.costmodel import estimate, window
from meshplan.costmodel.compute import layer_cost
from meshplan.costmodel.flops import layer_forward_flops_per_token, model_flops_per_step
from meshplan.errors import ConfigError
from meshplan.spec.validate import check_modelled

OSS = mp.ModelSpec.preset("gpt-oss-120b")     # window 128 on the 18 even layers of 36
H100 = mp.Cluster.preset("dgx-h100")


def test_gpt_oss_window_on_the_even_layers():
    assert OSS.sliding_window == 128 and OSS.window_layers == tuple(range(0, 36, 2))
    assert OSS.attention_window(0) == 128 and OSS.attention_window(1) is None
    assert window.keys_per_query(OSS, 0, 4096) == 128
    assert window.keys_per_query(OSS, 1, 4096) == 4096
    assert window.keys_per_query(OSS, 0, 64) == 64           # a window past the sequence


def test_window_fields_checked():
    base = mp.ModelSpec.preset("llama3-8b")
    with pytest.raises(ConfigError, match="window_layers .* needs sliding_window"):
        dataclasses.replace(base, window_layers=(0,))
    with pytest.raises(ConfigError, match="contains 32"):
        dataclasses.replace(base, sliding_window=4096, window_layers=(32,))
    with pytest.raises(ConfigError, match="twice"):
        dataclasses.replace(base, sliding_window=4096, window_layers=(1, 1))
    with pytest.raises(ConfigError, match="sliding_window"):
        dataclasses.replace(base, sliding_window=0)
    every = dataclasses.replace(base, sliding_window=4096)   # None: every layer (Mistral 7B)
    assert all(every.attention_window(i) == 4096 for i in range(32))


def test_window_fields_round_trip_and_stay_out_of_dense_dicts():
    assert mp.ModelSpec.from_dict(OSS.to_dict()) == OSS
    assert OSS.to_dict()["window_layers"] == list(range(0, 36, 2))
    d = mp.ModelSpec.preset("llama3-8b").to_dict()
    assert "sliding_window" not in d and "window_layers" not in d


def test_executed_tiles_by_hand():
    # full causal: the cost model's half of s²
    assert window.executed_fraction(4096, None) == 0.5
    assert window.executed_fraction(4096, 4096) == 0.5
    # w = 128, 128-key tiles: query block 0 needs its own tile, every later block 2
    assert window.executed_fraction(4096, 128) == (1 + 31 * 2) * 128 ** 2 / 4096 ** 2
    # w = 1: the diagonal tiles only
    assert window.executed_fraction(4096, 1) == 32 * 128 ** 2 / 4096 ** 2
    # a window of most of the sequence never costs more than full causal
    assert window.executed_fraction(4096, 4000) == 0.5


def test_attention_time_is_the_mean_of_the_two_kinds():
    job = mp.Job(global_batch=64, seq_len=4096)
    link = H100.group_link(1, 1)
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, recompute="none", tp_link=link)
    full = dataclasses.replace(OSS, sliding_window=None, window_layers=None)
    gpu, peak = H100.gpu, H100.gpu.peak_flops("bf16")
    core = 4.0 * 4096 * 4096 * 64 * 64                     # 4·b·s²·head_dim·heads

    def t(executed):   # at gpt-oss's head dim, 64 (GPUSpec.attention_efficiency_at)
        return executed / (peak * gpu.attention_efficiency_at(executed, OSS.head_dim))
    want = 0.5 * t(core * 0.5) + 0.5 * t(core * window.executed_fraction(4096, 128))
    assert layer_cost(OSS, H100, job, **kw).forward.attention_s == pytest.approx(want, rel=1e-12)
    assert layer_cost(full, H100, job, **kw).forward.attention_s == pytest.approx(
        t(core * 0.5), rel=1e-12)
    # the projections and the MLP do not see the window
    assert (layer_cost(OSS, H100, job, **kw).forward.gemm_s
            == layer_cost(full, H100, job, **kw).forward.gemm_s)


def test_model_flops_count_the_window_keys():
    s, q = 4096, 64 * 64
    full = dataclasses.replace(OSS, sliding_window=None, window_layers=None)
    per_token_cut = 18 * 4.0 * (s - 128) * q                 # 18 windowed layers
    assert (model_flops_per_step(full, 1, s) - model_flops_per_step(OSS, 1, s)) \
        == pytest.approx(3 * s * per_token_cut, rel=1e-12)
    # a dense model windowed on every layer (Mistral 7B's layout) at twice the window
    mistral = dataclasses.replace(mp.ModelSpec.preset("llama3-8b"), sliding_window=4096)
    assert layer_forward_flops_per_token(mistral, 8192)[1] == 4.0 * 4096 * 4096


def test_ring_context_parallel_with_a_window_refused():
    with pytest.raises(ConfigError, match="cp_style 'ring' and the sliding-window.*'all-to-all'"):
        check_modelled(mp.Layout(dp=2, cp=2), OSS)
    check_modelled(mp.Layout(dp=2, cp=2), mp.ModelSpec.preset("llama3-8b"))
    check_modelled(mp.Layout(dp=2, cp=2, cp_style="all-to-all"), OSS)


def test_all_to_all_context_parallel_prices_the_window_band():
    """Ulysses runs each head's whole sequence on one rank: its windowed layers execute
    only their band, as at cp = 1 (layer_mix), the full ones the causal half."""
    from meshplan.costmodel.context_tables import _block_s, cp_attention
    from meshplan.costmodel.compute import kernel_head_dim
    from meshplan.costmodel.inputs import table_inputs
    h100 = mp.Cluster.preset("dgx-h100", nodes=1)
    job = mp.Job(global_batch=8, seq_len=32768)
    lay = mp.Layout(dp=4, cp=2, cp_style="all-to-all")
    full = dataclasses.replace(OSS, sliding_window=None, window_layers=None)
    link = table_inputs(OSS, h100, job, lay).links.cp
    windowed_s = cp_attention(OSS, h100, job, lay, link)[0]
    full_s = cp_attention(full, h100, job, lay, link)[0]
    per = job.seq_len ** 2 * 4.0 * OSS.q_dim / 2                  # one sequence, cp 2
    hd = kernel_head_dim(OSS)
    want = sum(share * _block_s(h100, job, per * frac, hd) for share, frac in
               window.layer_mix(OSS, job.seq_len))
    assert windowed_s == pytest.approx(want, rel=1e-12)
    assert full_s == pytest.approx(_block_s(h100, job, per * 0.5, hd), rel=1e-12)
    assert windowed_s < 0.6 * full_s          # half the layers attend to 128 keys
    e = estimate(OSS, mp.Cluster.preset("dgx-h100", nodes=8),
                 mp.Job(global_batch=64, seq_len=32768), mp.Layout(
                     dp=4, pp=2, tp=4, cp=2, cp_style="all-to-all", ep=8,
                     sequence_parallel=True, zero=1))
    assert e.step_time_s > 0


def test_the_planner_offers_a_windowed_model_all_to_all_context_parallelism_only():
    from meshplan.planner import Constraints
    from meshplan.planner.space import cp_styles
    assert cp_styles(OSS, Constraints(), 1, 2) == ["all-to-all"]
    assert cp_styles(mp.ModelSpec.preset("llama3-8b"), Constraints(), 1, 2) == \
        ["ring", "all-to-all"]
    assert cp_styles(OSS, Constraints(cp_styles=("ring",)), 1, 2) == []


def test_hf_gpt_oss_layer_types():
    cfg = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "num_hidden_layers": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
           "vocab_size": 1000, "sliding_window": 64,
           "layer_types": ["full_attention", "sliding_attention", "sliding_attention",
                           "full_attention"]}
    m = mp.ModelSpec.from_hf_config(cfg)
    assert (m.sliding_window, m.window_layers) == (64, (1, 2))
    assert mp.ModelSpec.from_hf_config({**cfg, "sliding_window": None}).sliding_window is None
    no_types = {k: v for k, v in cfg.items() if k != "layer_types"}
    assert mp.ModelSpec.from_hf_config(no_types).window_layers == (0, 2)   # GptOssConfig's
    with pytest.raises(ConfigError, match="layer_types"):
        mp.ModelSpec.from_hf_config({**cfg, "layer_types": ["sliding_attention"]})


def test_executor_refuses_a_windowed_model():
    """the executor's attention is full causal: a windowed model would train another model"""
    pytest.importorskip("torch")
    from meshplan.errors import ExecutorError
    from meshplan.executor.parallelize import check_layout_runnable
    tiny = dataclasses.replace(mp.ModelSpec.preset("llama3-8b"), num_layers=2, hidden_size=64,
                               num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                               vocab_size=256, max_seq_len=64)
    job = mp.Job(global_batch=2, seq_len=64, runtime="torch")
    assert check_layout_runnable(tiny, job, mp.Layout()) == 2
    windowed = dataclasses.replace(tiny, sliding_window=16)
    with pytest.raises(ExecutorError, match="sliding_window = 16 < seq_len = 64"):
        check_layout_runnable(windowed, job, mp.Layout())
    # a window as long as the sequence (Mistral 7B v0.1's 4096 at 4k tokens) is full causal
    assert check_layout_runnable(dataclasses.replace(tiny, sliding_window=64), job,
                                 mp.Layout()) == 2


# Dense families' config.json as published on the Hugging Face hub (the keys that matter), with
# their checkpoints' parameter counts; the differences are what ModelSpec does not count:
# Gemma's two extra norms a layer (and Gemma 3's q/k norms), Qwen2's q/k/v biases (< 0.01 %)
GEMMA3_1B = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 1152,
             "intermediate_size": 6912, "max_position_embeddings": 32768,
             "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
             "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144}
GEMMA2_2B = {"model_type": "gemma2", "head_dim": 256, "hidden_size": 2304,
             "intermediate_size": 9216, "max_position_embeddings": 8192,
             "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
             "sliding_window": 4096, "vocab_size": 256000}
MISTRAL_7B_V01 = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                  "max_position_embeddings": 32768, "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096,
                  "tie_word_embeddings": False, "vocab_size": 32000}
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
             "max_position_embeddings": 131072, "max_window_layers": 28,
             "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
             "sliding_window": 131072, "tie_word_embeddings": False,
             "use_sliding_window": False, "vocab_size": 152064}


@pytest.mark.parametrize("cfg,params,window,layers", [
    # Gemma ties its embeddings (no tie_word_embeddings key: Gemma*Config's default True)
    (GEMMA3_1B, 999_885_952, 512, tuple(i for i in range(26) if (i + 1) % 6)),
    (GEMMA2_2B, 2_614_341_888, 4096, tuple(range(0, 26, 2))),
    (MISTRAL_7B_V01, 7_241_732_096, 4096, None),
    (QWEN25_7B, 7_615_616_512, None, None),  # use_sliding_window false: full attention
])
def test_hf_dense_families_read_ties_and_windows_as_transformers_does(cfg, params, window,
                                                                       layers):
    m = mp.ModelSpec.from_hf_config(cfg)
    assert m.num_params() == pytest.approx(params, rel=1e-4)
    assert (m.sliding_window, m.window_layers) == (window, layers)


def test_hf_windows_a_family_rule_cannot_place_are_refused():
    qwen_on = {**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096,
               "max_window_layers": 20}
    assert mp.ModelSpec.from_hf_config(qwen_on).window_layers == tuple(range(20, 28))
    unknown = {**MISTRAL_7B_V01, "model_type": "exaone"}
    with pytest.warns(mp.MeshplanWarning, match="'exaone' is not a family .* not gated"):
        with pytest.raises(ConfigError, match="sliding_window = 4096.*'exaone'.*layer_types"):
            mp.ModelSpec.from_hf_config(unknown)
        typed = {**unknown, "layer_types": ["sliding_attention"] * 32}
        assert mp.ModelSpec.from_hf_config(typed).window_layers is None     # every layer
        with pytest.raises(ConfigError, match="other attention kinds"):
            mp.ModelSpec.from_hf_config({**unknown, "layer_types": ["linear_attention"] * 32})


def test_an_unreadable_config_lists_every_family_read():
    with pytest.raises(ConfigError) as err:
        mp.ModelSpec.from_hf_config({"model_type": "t5", "d_model": 512})
    for family in ("gemma3_text", "phi3", "olmo2", "gpt_neox", "glm4_moe", "kimi_k2"):
        assert family in str(err.value)
    # OLMo 2 7B (huggingface.co/allenai/OLMo-2-1124-7B: 7.30B) is read without a warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", mp.MeshplanWarning)
        m = mp.ModelSpec.from_hf_config(
            {"model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 100352,
             "tie_word_embeddings": False, "max_position_embeddings": 4096})
    assert m.num_params() == pytest.approx(7.30e9, rel=0.01)
