"""ModelSpec / Job / Layout: presets, Hugging Face configs, validation messages."""

from __future__ import annotations

import json
import warnings

import pytest

import meshplan as mp
from meshplan.spec import default_stage_layers


@pytest.mark.parametrize("name,billions,tol", [
    ("llama3-8b", 8.03, 0.005), ("llama3-70b", 70.55, 0.01), ("llama3-405b", 405.85, 0.01),
    ("llama2-7b", 6.74, 0.005), ("llama2-13b", 13.02, 0.01), ("llama2-70b", 68.98, 0.01),
    ("gpt3-175b", 174.6, 0.05), ("megatron-8.3b", 8.3, 0.05), ("gpt-1t", 1008.0, 0.1),
])
def test_preset_parameter_counts_match_published(name, billions, tol):
    assert mp.ModelSpec.preset(name).num_params() / 1e9 == pytest.approx(billions, abs=tol)


def test_every_preset_builds():
    for name in mp.ModelSpec.preset_names():
        m = mp.ModelSpec.preset(name)
        assert m.num_params() > 1e9 and m.name == name


def test_unknown_preset_suggests_closest():
    with pytest.raises(mp.UnknownPresetError, match="llama3-8b"):
        mp.ModelSpec.preset("llama3-8")


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_layers=0), "num_layers"),
    (dict(hidden_size=-4), "hidden_size"),
    (dict(num_heads=7), "divisible by num_heads"),
    (dict(num_kv_heads=3), "num_kv_heads"),
    (dict(activation="relu"), "activation"),
])
def test_model_spec_rejects_bad_values(kwargs, match):
    base = dict(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100)
    base.update(kwargs)
    with pytest.raises(mp.ConfigError, match=match):
        mp.ModelSpec(**base)


LLAMA3_8B_HF = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False,
}


def test_from_hf_config_llama_matches_preset(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_HF))
    m = mp.ModelSpec.from_hf_config(path)
    assert m.num_params() == mp.ModelSpec.preset("llama3-8b").num_params()


@pytest.mark.parametrize("cfg,params_b", [
    ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
      "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "vocab_size": 32000, "tie_word_embeddings": False}, 7.24),
    ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
      "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
      "vocab_size": 152064, "tie_word_embeddings": False, "attention_bias": True}, 7.62),
    ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
      "n_positions": 1024}, 0.124),
    ({"model_type": "gpt_neox", "hidden_size": 2560, "intermediate_size": 10240,
      "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 50304,
      "max_position_embeddings": 2048, "tie_word_embeddings": False}, 2.78),
    # non-gated RoPE decoders (published: phi-2 2.78 B, phi-1.5 1.42 B, starcoder2-3b 3.03 B,
    # starcoder2-7b 7.17 B); read as Llama-like they came out 1.5x in their MLPs
    ({"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
      "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 51200,
      "resid_pdrop": 0.1, "partial_rotary_factor": 0.4, "tie_word_embeddings": False}, 2.78),
    ({"model_type": "phi", "hidden_size": 2048, "intermediate_size": 8192,
      "num_hidden_layers": 24, "num_attention_heads": 32, "vocab_size": 51200}, 1.418),
    ({"model_type": "starcoder2", "hidden_size": 3072, "intermediate_size": 12288,
      "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2,
      "vocab_size": 49152, "max_position_embeddings": 16384, "sliding_window": 4096,
      "use_bias": True, "residual_dropout": 0.1}, 3.03),
    ({"model_type": "starcoder2", "hidden_size": 4608, "intermediate_size": 18432,
      "num_hidden_layers": 32, "num_attention_heads": 36, "num_key_value_heads": 4,
      "vocab_size": 49152, "max_position_embeddings": 16384, "sliding_window": 4096}, 7.17),
    # gated MLPs read as Llama-like (published: granite-3.0-8b 8.17 B, OLMo-7B 6.89 B,
    # command-r 35 B, stablelm-2-1.6b 1.64 B)
    ({"model_type": "granite", "hidden_size": 4096, "intermediate_size": 12800,
      "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
      "vocab_size": 49155, "tie_word_embeddings": True, "embedding_multiplier": 12.0}, 8.17),
    ({"model_type": "olmo", "hidden_size": 4096, "intermediate_size": 11008,
      "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 50304}, 6.89),
    ({"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528,
      "num_hidden_layers": 40, "num_attention_heads": 64, "vocab_size": 256000}, 35.0),
    ({"model_type": "stablelm", "hidden_size": 2048, "intermediate_size": 5632,
      "num_hidden_layers": 24, "num_attention_heads": 32, "vocab_size": 100352}, 1.64),
])
def test_from_hf_config_families(cfg, params_b):
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # every family here is known: no warning
        m = mp.ModelSpec.from_hf_config(cfg)
    assert m.num_params() / 1e9 == pytest.approx(params_b, rel=0.01)


def test_phi_and_starcoder2_read_their_own_keys():
    phi = mp.ModelSpec.from_hf_config({"model_type": "phi", "hidden_size": 64,
                                       "intermediate_size": 256, "num_hidden_layers": 2,
                                       "num_attention_heads": 4, "vocab_size": 100})
    assert (phi.activation, phi.norm, phi.position_embedding, phi.bias, phi.tied_embeddings,
            phi.dropout, phi.max_seq_len) == ("gelu", "layernorm", "rope", True, False,
                                              False, 2048)
    sc = mp.ModelSpec.from_hf_config({"model_type": "starcoder2", "hidden_size": 64,
                                      "intermediate_size": 256, "num_hidden_layers": 2,
                                      "num_attention_heads": 4, "num_key_value_heads": 2,
                                      "vocab_size": 100, "sliding_window": 32,
                                      "use_bias": False, "embedding_dropout": 0.1})
    assert (sc.bias, sc.tied_embeddings, sc.dropout, sc.sliding_window, sc.window_layers,
            sc.num_kv_heads, sc.max_seq_len) == (False, True, True, 32, None, 2, 4096)


def test_from_hf_config_errors_name_the_problem(tmp_path):
    with pytest.raises(mp.ConfigError, match="does not exist"):
        mp.ModelSpec.from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(mp.ConfigError, match="not valid JSON"):
        mp.ModelSpec.from_hf_config(bad)
    with pytest.raises(mp.ConfigError, match="num_attention_heads"):
        mp.ModelSpec.from_hf_config({"model_type": "llama", "hidden_size": 64,
                                     "intermediate_size": 128, "num_hidden_layers": 2,
                                     "vocab_size": 10})
    with pytest.raises(mp.ConfigError, match="not understood"):
        mp.ModelSpec.from_hf_config({"model_type": "t5"})


@pytest.mark.parametrize("kwargs,match", [
    (dict(dp=0), "dp"), (dict(schedule="pipedream"), "schedule"),
    (dict(vpp=2), "interleaved"), (dict(sequence_parallel=True), "tp > 1"),
    (dict(recompute="some"), "recompute"), (dict(zero=4), "zero"),
    (dict(pp=2, stage_layers=(3,)), "pp·vpp"),
    (dict(pp=2, stage_layers=(3, -1)), r"stage_layers\[1\] = -1 must be a non-negative"),
    (dict(pp=2, stage_layers=(0, 0)), "hold no transformer layer"),
    (dict(pp=2, vpp=2, schedule="interleaved-1f1b", stage_layers=(2, 0, 0, 2)),
     r"stage_layers\[1\] = 0: only the first stage .* or the last"),
    (dict(schedule="interleaved-1f1b", vpp=7), "needs pp > 1"),
    (dict(cp=0), "cp"), (dict(cp_style="ulysses"), "cp_style"), (dict(ep=0), "ep"),
    (dict(dp=2, tp=2, ep=8), r"ep·etp = 8·1 = 8 must divide tp·cp·dp = 2·1·2 = 4"),
    (dict(compile="yes"), "compile must be True or False"),
    (dict(tp=2, sequence_parallel=1), "sequence_parallel must be True or False"),
])
def test_layout_rejects_bad_values(kwargs, match):
    with pytest.raises(mp.ConfigError, match=match):
        mp.Layout(**kwargs)


def test_job_rejects_bad_values():
    with pytest.raises(mp.ConfigError, match="global_batch"):
        mp.Job(global_batch=0, seq_len=10)
    with pytest.raises(mp.ConfigError, match="precision"):
        mp.Job(global_batch=1, seq_len=10, precision="int8")
    with pytest.raises(mp.ConfigError, match="tokens"):
        mp.Job(global_batch=1, seq_len=10, tokens=-5)


def test_layout_short_names_runs_of_equal_stages_once():
    lay = mp.Layout(pp=16, vpp=8, schedule="interleaved-1f1b",
                    stage_layers=(0,) + (1,) * 126 + (0,))
    assert lay.short().endswith(" layers 0/1×126/0")
    assert mp.Layout(pp=4, stage_layers=(5, 7, 7, 5)).short().endswith(" layers 5/7/7/5")


def test_layout_round_trips_through_dict():
    lay = mp.Layout(dp=2, pp=2, tp=2, schedule="interleaved-1f1b", vpp=2,
                    stage_layers=(1, 2, 2, 1), sequence_parallel=True, zero=1)
    assert mp.Layout.from_dict(lay.to_dict()) == lay
    with pytest.raises(mp.ConfigError, match="no field"):
        mp.Layout.from_dict({"dp": 1, "bogus": 3})


def test_default_stage_layers_even_and_complete():
    assert default_stage_layers(10, 4) == (2, 3, 3, 2)
    assert default_stage_layers(8, 4) == (2, 2, 2, 2)
    for n, s in [(96, 16), (126, 16), (5, 5), (7, 2)]:
        split = default_stage_layers(n, s)
        assert sum(split) == n and max(split) - min(split) <= 1


def test_zero_bubble_under_zero3_is_refused_for_the_torch_runtime_only():
    from meshplan.spec import Job, Layout, ModelSpec
    from meshplan.spec.validate import check_layout
    from meshplan.errors import ConfigError
    from meshplan.hardware_profiles import Cluster
    model = ModelSpec(name="m", num_layers=8, hidden_size=256, num_heads=4, vocab_size=1000,
                      max_seq_len=512)
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    lay = Layout(dp=2, pp=2, micro_batch=1, schedule="zero-bubble", zero=3)
    with pytest.raises(ConfigError, match=r"zero-bubble' with zero = 3 .*zero <= 2"):
        check_layout(model, cluster, Job(global_batch=8, seq_len=512, runtime="torch"), lay)
    check_layout(model, cluster, Job(global_batch=8, seq_len=512), lay)      # megatron
    check_layout(model, cluster, Job(global_batch=8, seq_len=512, runtime="torch"),
                 lay.replace(zero=2))


def test_planner_space_leaves_out_zero_bubble_under_zero3_for_the_torch_runtime():
    from meshplan.spec import Job, ModelSpec
    from meshplan.hardware_profiles import Cluster
    from meshplan.planner.constraints import Constraints
    from meshplan.planner.space import enumerate_configs
    model = ModelSpec(name="m", num_layers=8, hidden_size=256, num_heads=4, vocab_size=1000,
                      max_seq_len=512)
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)

    def zb_zero3(job):
        return [c for c in enumerate_configs(model, cluster, job, [4], Constraints())
                if c.schedule == "zero-bubble" and c.zero == 3 and c.dp > 1 and c.pp > 1]
    assert zb_zero3(Job(global_batch=16, seq_len=512))                  # megatron: kept
    assert zb_zero3(Job(global_batch=16, seq_len=512, runtime="torch")) == []


def test_layout_new_dimensions_count_gpus_and_fold_experts():
    lay = mp.Layout(dp=4, pp=2, tp=2, cp=2, ep=4, etp=2)
    assert lay.num_gpus == 32
    assert lay.edp == 2            # tp·cp·dp / (ep·etp) = 16 / 8
    assert "cp2" in lay.short() and "ep4·etp2" in lay.short()
    assert mp.Layout.from_dict(lay.to_dict()) == lay
    assert mp.Layout.from_dict({"dp": 2}).cp == 1      # plan files written before cp load


@pytest.mark.parametrize("kwargs", [dict(tp=2, cp=2), dict(tp=2, ep=2), dict(compile=True)])
def test_estimate_prices_the_new_dimensions(kwargs):
    """cp (issue 39), ep (issue 38) and compile are priced: check_modelled lets them pass."""
    from meshplan.spec.validate import check_modelled
    assert check_modelled(mp.Layout(**kwargs)) is None
