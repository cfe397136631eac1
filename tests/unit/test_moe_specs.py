"""Mixture-of-experts and latent-attention ModelSpecs: presets against published parameter
counts, Hugging Face configs of every supported MoE family, validation messages."""

from __future__ import annotations

import dataclasses
import json

import pytest

import meshplan as mp

# (preset, published total, published active, the publisher's convention for "active",
#  source). Active counts: Mistral, Qwen and AI2 count the input embedding matrix;
# OpenAI's gpt-oss card counts the output head but not the input embedding; DeepSeek's
# rounded figures are checked with the input embedding left out (what makes V2's 21B come
# out; the V3 row below shows neither convention reaches 1 % of "37B").
PUBLISHED = [
    # Mistral AI, "Mixtral of experts" (2023-12-11); Jiang et al. 2024, arXiv 2401.04088
    ("mixtral-8x7b", 46.7e9, 12.9e9, True),
    # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17)
    ("mixtral-8x22b", 141e9, 39e9, True),
    # DeepSeek-V2, arXiv 2405.04434, abstract
    ("deepseek-v2", 236e9, 21e9, False),
    # Qwen3-235B-A22B model card (huggingface.co/Qwen/Qwen3-235B-A22B)
    ("qwen3-235b-a22b", 235e9, 22e9, True),
    # gpt-oss model card, arXiv 2508.10925, Table 1
    ("gpt-oss-120b", 116.83e9, 5.13e9, False),
    ("gpt-oss-20b", 20.91e9, 3.61e9, False),
]
# Published to two significant digits, and our exact count is more than 1 % away from the
# rounded figure; the totals of these models match within 0.3 % (test below).
ROUNDED_ACTIVE = [
    # DeepSeek-V3, arXiv 2412.19437, abstract: "37B activated". Ours: 36.63B without the
    # input embedding (-1.01 %), 37.55B with it (+1.49 %).
    ("deepseek-v3", 37e9, False),
    # Qwen3-30B-A3B model card: "3.3B activated". Ours: 3.353B (+1.6 %): Qwen appears to
    # truncate (its 30.5B total and 29.9B non-embedding match ours, 30.53B and 29.91B).
    ("qwen3-30b-a3b", 3.3e9, True),
    # OLMoE, arXiv 2409.02060: "1.3B active". Ours: 1.282B (-1.4 %).
    ("olmoe-1b-7b", 1.3e9, True),
]
TOTALS = [(n, t) for n, t, _, _ in PUBLISHED] + [
    ("deepseek-v3", 671e9),      # main model, without the 14B multi-token-prediction module
    ("qwen3-30b-a3b", 30.5e9),
    ("olmoe-1b-7b", 6.9e9),      # arXiv 2409.02060
]


@pytest.mark.parametrize("name,total", TOTALS, ids=[t[0] for t in TOTALS])
def test_moe_preset_total_parameters_match_published_within_1_percent(name, total):
    m = mp.ModelSpec.preset(name)
    assert m.num_params(mtp=False) == pytest.approx(total, rel=0.01)


@pytest.mark.parametrize("name,total,active,input_embedding", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_moe_preset_active_parameters_match_published_within_1_percent(
        name, total, active, input_embedding):
    m = mp.ModelSpec.preset(name)
    assert m.num_active_params(input_embedding=input_embedding, mtp=False) == \
        pytest.approx(active, rel=0.01)


@pytest.mark.xfail(strict=True, reason="published active count is rounded to two digits and "
                   "our exact count lies 1.0-1.6 % from it (numbers in ROUNDED_ACTIVE)")
@pytest.mark.parametrize("name,active,input_embedding", ROUNDED_ACTIVE,
                         ids=[p[0] for p in ROUNDED_ACTIVE])
def test_moe_preset_active_parameters_rounded_figures(name, active, input_embedding):
    m = mp.ModelSpec.preset(name)
    assert m.num_active_params(input_embedding=input_embedding, mtp=False) == \
        pytest.approx(active, rel=0.01)


def test_counts_equal_released_checkpoints_to_the_parameter():
    """The released safetensors' total_size in bytes, bf16 = 2 bytes a parameter:
    Mixtral-8x7B-v0.1 93,405,585,408 bytes; Qwen3-30B-A3B 61,064,245,248 bytes, of which
    Qwen3's query/key RMSNorm gains (2·128 per layer, 12,288 in all) are not modelled."""
    assert mp.ModelSpec.preset("mixtral-8x7b").num_params() * 2 == 93_405_585_408
    qwen = mp.ModelSpec.preset("qwen3-30b-a3b").num_params()
    assert qwen + 48 * 2 * 128 == 61_064_245_248 // 2


def test_deepseek_v3_with_its_mtp_module_matches_the_685b_checkpoint():
    """README_WEIGHTS (github.com/deepseek-ai/DeepSeek-V3): 685B = 671B main model + 14B
    MTP module; the checkpoint's MTP layer stores its own copies of the embedding and the
    output head, which training shares with the main model (arXiv 2412.19437 §2.2)."""
    m = mp.ModelSpec.preset("deepseek-v3")
    stored_copies = 2 * m.vocab_size * m.hidden_size
    assert m.num_params() + stored_copies == pytest.approx(685e9, rel=0.01)
    assert m.num_params() - m.num_params(mtp=False) == m.mtp_module_params()


def test_layer_kinds_of_deepseek_v3():
    m = mp.ModelSpec.preset("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(4)] == [False, False, False, True]
    assert m.num_moe_layers == 58
    # MLA attention, hand-computed from DeepSeek-V2 eqs. 9-19 with V3's dimensions:
    # W_DQ 7168·1536 + W_UQ 1536·128·192 + W_DKV|W_KR 7168·576 + W_UK|W_UV 512·128·256
    # + W_O 128·128·7168, plus the two latent RMSNorms (1536 + 512)
    assert m.attention_params() == (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576
                                    + 512 * 128 * 256 + 128 * 128 * 7168 + 1536 + 512)
    dense = m.layer_params(0)
    moe = m.layer_params(3)
    assert moe - dense == (256 * 3 * 7168 * 2048 + 7168 * 256 + 3 * 7168 * 2048
                           - 3 * 7168 * 18432)
    assert m.layer_params(3, active=True) == (m.attention_params() + 2 * 7168
                                              + 7168 * 256 + 9 * 3 * 7168 * 2048)


def test_dense_models_unchanged_and_active_equals_total():
    m = mp.ModelSpec.preset("llama3-8b")
    assert not m.is_moe and not m.is_mla and m.num_experts == 0
    assert m.num_active_params() == m.num_params() == 8_030_261_248
    assert m.layer_params() == m.layer_params(5)
    assert mp.ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=10,
                        num_experts=None).num_experts == 0


def test_layer_params_of_an_moe_model_needs_the_layer():
    m = mp.ModelSpec.preset("mixtral-8x7b")
    with pytest.raises(mp.ConfigError, match="layer_params.*8 experts"):
        m.layer_params()
    with pytest.raises(mp.ConfigError, match="layer = 32 is not a layer"):
        m.layer_params(32)


HF_MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
              "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
              "max_position_embeddings": 32768, "router_aux_loss_coef": 0.02,
              "tie_word_embeddings": False, "sliding_window": None}
HF_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "scoring_func": "sigmoid", "norm_topk_prob": True,
    "num_nextn_predict_layers": 1, "vocab_size": 129280, "max_position_embeddings": 163840,
    "tie_word_embeddings": False, "attention_bias": False, "topk_method": "noaux_tc",
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
HF_QWEN3_30B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                "moe_intermediate_size": 768, "num_attention_heads": 32, "head_dim": 128,
                "num_key_value_heads": 4, "num_hidden_layers": 48, "num_experts": 128,
                "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                "norm_topk_prob": True, "vocab_size": 151936, "max_position_embeddings": 40960,
                "tie_word_embeddings": False, "router_aux_loss_coef": 0.001}
HF_GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                   "num_hidden_layers": 36, "num_local_experts": 128, "num_experts_per_tok": 4,
                   "experts_per_token": 4, "vocab_size": 201088, "sliding_window": 128,
                   "max_position_embeddings": 131072, "tie_word_embeddings": False,
                   "router_aux_loss_coef": 0.9, "swiglu_limit": 7.0}
HF_OLMOE = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 16,
            "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False,
            "vocab_size": 50304, "max_position_embeddings": 4096, "tie_word_embeddings": False}


@pytest.mark.parametrize("cfg,preset", [
    (HF_MIXTRAL, "mixtral-8x7b"), (HF_DEEPSEEK_V3, "deepseek-v3"),
    (HF_QWEN3_30B, "qwen3-30b-a3b"), (HF_GPT_OSS_120B, "gpt-oss-120b"), (HF_OLMOE, "olmoe-1b-7b"),
], ids=["mixtral", "deepseek-v3", "qwen3-moe", "gpt-oss", "olmoe"])
def test_from_hf_config_reads_released_moe_configs_as_the_presets(cfg, preset):
    m = mp.ModelSpec.from_hf_config(cfg, name=preset)
    want = mp.ModelSpec.preset(preset)
    if preset == "deepseek-v3":
        # the released config has no aux_loss_alpha (the modelling code's default is 0.001);
        # the preset takes the report's sequence-wise balance factor 0.0001 (§4.2)
        assert m.router_aux_loss_coeff == 0.001
        m = dataclasses.replace(m, router_aux_loss_coeff=want.router_aux_loss_coeff)
    assert m == want


def test_from_hf_config_mixtral_is_no_longer_a_dense_7b():
    m = mp.ModelSpec.from_hf_config(HF_MIXTRAL)
    assert m.num_experts == 8 and m.num_params() / 1e9 == pytest.approx(46.7, rel=0.01)


def test_from_hf_config_qwen2_moe_shared_expert_and_sparse_step():
    """Qwen1.5-MoE-A2.7B (huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json; Qwen blog
    2024-03-28: 14.3B total, 2.7B activated) with one shared expert of width 5632."""
    cfg = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
           "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
           "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
           "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
           "vocab_size": 151936, "max_position_embeddings": 8192, "tie_word_embeddings": False}
    m = mp.ModelSpec.from_hf_config(cfg)
    assert (m.num_shared_experts, m.shared_expert_ffn_hidden_size) == (1, 5632)
    assert m.num_params() == pytest.approx(14.3e9, rel=0.01)
    assert m.num_active_params() == pytest.approx(2.7e9, rel=0.01)
    sparse = mp.ModelSpec.from_hf_config({**cfg, "decoder_sparse_step": 2, "mlp_only_layers": [3]})
    # layer i is MoE when (i + 1) % 2 == 0 and i is not in mlp_only_layers
    assert [i for i in range(8) if sparse.is_moe_layer(i)] == [1, 5, 7]


HF_GLM45 = {"model_type": "glm4_moe", "hidden_size": 5120, "num_hidden_layers": 92,
            "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
            "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
            "norm_topk_prob": True, "vocab_size": 151552, "tie_word_embeddings": False,
            "attention_bias": True, "partial_rotary_factor": 0.5, "use_qk_norm": True,
            "num_nextn_predict_layers": 1, "max_position_embeddings": 131072}
HF_GLM45_AIR = {**HF_GLM45, "hidden_size": 4096, "num_hidden_layers": 46,
                "intermediate_size": 10944, "moe_intermediate_size": 1408,
                "n_routed_experts": 128, "first_k_dense_replace": 1, "use_qk_norm": False}


@pytest.mark.parametrize("cfg,total", [(HF_GLM45, 355e9), (HF_GLM45_AIR, 106e9)],
                         ids=["glm-4.5", "glm-4.5-air"])
def test_from_hf_config_glm45_reads_deepseek_experts_with_gqa(cfg, total):
    """GLM-4.5 / GLM-4.5-Air (huggingface.co/zai-org config.json; model cards: 355B and 106B
    total parameters, without the multi-token-prediction layer): DeepSeek-V3's experts with
    grouped-query attention and a sigmoid router."""
    m = mp.ModelSpec.from_hf_config(cfg)
    assert m.num_params(mtp=False) == pytest.approx(total, rel=0.01)
    assert (m.num_experts, m.experts_per_token, m.num_shared_experts, m.router) == (
        cfg["n_routed_experts"], 8, 1, "sigmoid")
    assert m.dense_layers == tuple(range(cfg["first_k_dense_replace"]))
    assert (m.num_kv_heads, m.head_dim, m.mtp_layers, m.is_mla) == (8, 128, 1, False)


def test_from_hf_config_kimi_k2_is_deepseek_v3_under_its_own_name():
    """Kimi K2 (huggingface.co/moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's
    architecture, ``model_type`` "kimi_k2"; model card: 1T total, 32B activated — one
    significant digit)."""
    cfg = {**HF_DEEPSEEK_V3, "model_type": "kimi_k2", "num_attention_heads": 64,
           "num_key_value_heads": 64, "n_routed_experts": 384, "first_k_dense_replace": 1,
           "vocab_size": 163840, "num_nextn_predict_layers": 0}
    m = mp.ModelSpec.from_hf_config(cfg)
    assert (m.num_experts, m.is_mla, m.mtp_layers, m.router) == (384, True, 0, "sigmoid")
    assert m.num_params() == pytest.approx(1.0e12, rel=0.05)
    assert m.num_active_params(input_embedding=False) == pytest.approx(32e9, rel=0.05)


def test_from_hf_config_deepseek_v2_lite_without_query_compression():
    """DeepSeek-V2-Lite (arXiv 2405.04434 App. B: 15.7B total): q_lora_rank null, so the
    queries use one full h × n_h·(d_nope + d_rope) projection."""
    cfg = {**HF_DEEPSEEK_V3, "model_type": "deepseek_v2", "hidden_size": 2048,
           "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
           "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64,
           "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
           "q_lora_rank": None, "scoring_func": "softmax", "norm_topk_prob": False,
           "vocab_size": 102400, "num_nextn_predict_layers": None}
    m = mp.ModelSpec.from_hf_config(cfg)
    assert m.q_lora_rank is None and m.kv_lora_rank == 512 and m.mtp_layers == 0
    assert m.num_params() == pytest.approx(15.7e9, rel=0.01)


@pytest.mark.parametrize("cfg,match", [
    ({"model_type": "jamba", "hidden_size": 64, "intermediate_size": 128, "num_experts": 16,
      "num_experts_per_tok": 2}, r"'jamba' declares num_experts.*supported MoE families"),
    ({"model_type": "llama4", "text_config": {}}, "text_config"),
    ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10,
      "num_local_experts": 4}, "declares num_local_experts"),
    ({**HF_DEEPSEEK_V3, "kv_lora_rank": None}, "without kv_lora_rank"),
    ({**HF_MIXTRAL, "num_local_experts": None}, "lacks num_local_experts"),
    ({**HF_MIXTRAL, "num_experts_per_tok": 0}, "num_experts_per_tok = 0"),
])
def test_from_hf_config_refuses_what_it_cannot_read_faithfully(cfg, match):
    with pytest.raises(mp.ConfigError, match=match):
        mp.ModelSpec.from_hf_config(cfg)


def test_gpt2_config_without_dropout_keys_takes_hugging_faces_default():
    """GPT2Config documents resid_pdrop = embd_pdrop = attn_pdrop = 0.1 (issue 36)."""
    base = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    assert mp.ModelSpec.from_hf_config(base).dropout is True
    off = {**base, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert mp.ModelSpec.from_hf_config(off).dropout is False
    assert mp.ModelSpec.from_hf_config({**off, "attn_pdrop": 0.1}).dropout is True


BASE = dict(num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, activation="swiglu",
            norm="rmsnorm", position_embedding="rope", bias=False)


@pytest.mark.parametrize("kwargs,match", [
    (dict(experts_per_token=2), r"experts_per_token = 2 describe a mixture-of-experts model "
                                r"but num_experts = 0"),
    (dict(num_experts=4), "experts_per_token = 0 must be between 1 and num_experts = 4"),
    (dict(num_experts=4, experts_per_token=5), "between 1 and num_experts = 4"),
    (dict(num_experts=-1), "num_experts must be a non-negative integer"),
    (dict(num_experts=4, experts_per_token=1, dense_layers=(0, 1, 2, 3)), "all 4 layers"),
    (dict(num_experts=4, experts_per_token=1, dense_layers=(4,)), r"contains 4.*0 \.\. 3"),
    (dict(num_experts=4, experts_per_token=1, capacity_factor=0), "capacity_factor must be a "
                                                                  "number > 0"),
    (dict(num_experts=4, experts_per_token=1, router="relu"), "router"),
    (dict(kv_lora_rank=16), "needs qk_nope_head_dim, qk_rope_head_dim, v_head_dim"),
    (dict(q_lora_rank=16), "need kv_lora_rank"),
    (dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
          num_kv_heads=2), "every one of the 4 heads"),
    (dict(mtp_layers=-1), "mtp_layers"),
])
def test_moe_and_mla_fields_reject_bad_values(kwargs, match):
    with pytest.raises(mp.ConfigError, match=match):
        mp.ModelSpec(**{**BASE, **kwargs})


def test_moe_spec_round_trips_through_json():
    m = mp.ModelSpec.preset("deepseek-v3")
    d = json.loads(json.dumps(m.to_dict()))          # as a plan file holds it
    assert d == m.to_dict() and d["dense_layers"] == [0, 1, 2]
    assert mp.ModelSpec.from_dict(d) == m
    assert hash(mp.ModelSpec.from_dict(d)) == hash(m)


def test_dense_dict_has_no_moe_fields():
    """Plan files, checkpoints and committed model sets of dense models keep their keys."""
    d = mp.ModelSpec.preset("llama3-8b").to_dict()
    assert not {"num_experts", "dense_layers", "kv_lora_rank", "router"} & set(d)
    assert mp.ModelSpec.from_dict(d) == mp.ModelSpec.preset("llama3-8b")


def test_cost_model_prices_moe_models_and_expert_parallel_layouts():
    """The refusals are gone since the cost model prices MoE (meshplan.costmodel.moe_tables);
    check_experts still names invalid degrees (below)."""
    from meshplan.spec.validate import check_modelled
    moe = mp.ModelSpec.preset("mixtral-8x7b")
    check_modelled(mp.Layout(), moe)
    check_modelled(mp.Layout(dp=2, ep=2))
    cluster = mp.Cluster.preset("dgx-h100", nodes=1)
    job = mp.Job(global_batch=64, seq_len=4096)
    est = mp.estimate(moe, cluster, job, mp.Layout(dp=8, ep=8, zero=1))
    assert est.time.ep_comm_s > 0 and est.comm_bytes["ep"] > 0
    mla = mp.ModelSpec(**BASE, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                       v_head_dim=8, max_seq_len=job.seq_len)
    check_modelled(mp.Layout(), mla)
    assert mp.estimate(mla, cluster, job, mp.Layout(dp=8)).step_time_s > 0


def test_expert_degrees_must_fit_the_model():
    from meshplan.spec.validate import check_experts
    with pytest.raises(mp.ConfigError, match="need a mixture-of-experts model"):
        check_experts(mp.ModelSpec.preset("llama3-8b"), mp.Layout(dp=2, ep=2))
    with pytest.raises(mp.ConfigError, match=r"ep = 3 must divide the 8 routed experts.*\[1, 2, 4, 8\]"):
        check_experts(mp.ModelSpec.preset("mixtral-8x7b"), mp.Layout(dp=3, ep=3))
    check_experts(mp.ModelSpec.preset("mixtral-8x7b"), mp.Layout(dp=8, ep=8))
