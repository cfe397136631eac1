"""benchmarks/draw_models.py: random realistic decoders, and the committed transfer36 set."""

import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import draw_models as dm  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.costmodel.measured import layer_shape_key  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec, RECOMPUTE, SCHEDULES  # noqa: E402
from meshplan.spec.validate import check_layout  # noqa: E402

SET = ROOT / "benchmarks" / "sets" / "transfer36"


def _draws(seed, n):
    rng = random.Random(seed)
    return [dm.draw_model(rng, f"m{i}") for i in range(n)]


def test_draw_is_seeded():
    assert _draws(5, 6) == _draws(5, 6)
    assert _draws(5, 6) != _draws(6, 6)


@pytest.mark.parametrize("model", _draws(11, 40), ids=lambda m: m.name)
def test_every_draw_is_in_the_issue_ranges(model):
    h = model.hidden_size
    assert 1024 <= h <= 5120 and 8 <= model.num_heads <= 40 and model.num_heads % 2 == 0
    assert model.num_kv_heads in (model.num_heads, 1, 2, 4, 8)
    assert model.num_heads % model.num_kv_heads == 0
    assert 2.5 - 0.25 <= model.ffn_hidden_size / h <= 4 + 0.25   # rounded to 256
    assert model.ffn_hidden_size % 256 == 0
    assert model.vocab_size in dm.VOCABS and model.max_seq_len in dm.SEQS
    assert 0.5e9 <= model.num_params() <= 3e9
    assert model.num_layers % 4 == 0 and 32 <= h / model.num_layers <= 320
    family = "gpt" if model.activation == "gelu" else "llama"
    assert family in model.name
    assert (model.norm, model.tied_embeddings) == (
        ("layernorm", True) if family == "gpt" else ("rmsnorm", False))


def test_draws_cover_both_families_and_every_attention():
    names = [m.name for m in _draws(3, 60)]
    kinds = Counter(n.split("-")[1] + "-" + n.split("-")[2] for n in names)
    assert {f"{f}-{a}" for f in ("gpt", "llama") for a in ("mha", "gqa", "mqa")} <= set(kinds)


def test_wider_sizes_on_request():
    rng = random.Random(1)
    big = [dm.draw_model(rng, "b", min_params=5e9, max_params=20e9) for _ in range(5)]
    assert all(5e9 <= m.num_params() <= 20e9 for m in big)


def test_job_is_32k_tokens_at_the_models_sequence():
    m = _draws(2, 1)[0]
    job = dm.job_for(m)
    assert job.seq_len == m.max_seq_len and job.runtime == "torch"
    assert job.global_batch == max(4, 32768 // m.max_seq_len)


# ---- the committed set --------------------------------------------------------------------

DOC = json.loads((SET / "set.json").read_text())
ENTRIES = [(m, x) for m in DOC["models"] for x in m["layouts"]]


def test_set_is_seeded_models_and_files_agree():
    assert DOC["seed"] == 36 and len(DOC["models"]) >= 4 and len(ENTRIES) >= 24
    # no model was rejected, so the models are the seed's first four draws
    assert DOC["rejected_models"] == []
    rng = random.Random(36)
    for i, m in enumerate(DOC["models"]):
        assert dm.draw_model(rng, f"t36m{i + 1:02d}").to_dict() == m["spec"]
        assert json.loads((SET / "models" / f"{m['name']}.json").read_text()) == m["spec"]
        listed = json.loads((SET / "layouts" / f"{m['name']}.json").read_text())
        assert [x["name"] for x in listed] == [x["name"] for x in m["layouts"]]


def _covered(entries) -> list[Layout]:
    """The entries' layouts, asserting the protocol's coverage."""
    layouts = [Layout.from_dict({k: v for k, v in x.items()
                                 if k != "name" and not k.startswith("screen_")})
               for _, x in entries]
    assert {l.schedule for l in layouts} == set(SCHEDULES)
    assert {l.zero for l in layouts} == {0, 1, 2, 3}
    assert {l.recompute for l in layouts} == set(RECOMPUTE)
    assert any(l.sequence_parallel for l in layouts)
    return layouts


def _never_run_and_gpu_bound(doc: dict, entries) -> None:
    """The set's models have layer shapes no other set ran, and every layout was screened
    GPU-bound with room on calibrated rows (host load ≤ 0.5)."""
    known = dm.known_shapes(except_set=doc["set"])
    assert not {layer_shape_key(ModelSpec.from_dict(m["spec"])) for m in doc["models"]} & known
    assert all(0 < x["screen_host_load"] <= 0.5 for _, x in entries)


def test_set_covers_the_protocol():
    layouts = _covered(ENTRIES)
    assert all(l.dp * l.pp * l.tp == 4 for l in layouts)
    assert len({(l.dp, l.pp, l.tp) for l in layouts}) >= 4


def test_set_models_were_never_run():
    known = dm.known_shapes(except_set="transfer36")
    assert not {layer_shape_key(ModelSpec.from_dict(m["spec"])) for m in DOC["models"]} & known


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e[1]["name"])
def test_every_layout_is_accepted_and_fits_an_80gb_h100(entry):
    m, x = entry
    model = ModelSpec.from_dict(m["spec"])
    job = Job.from_dict(m["job"])
    layout = Layout.from_dict({k: v for k, v in x.items()
                               if k != "name" and not k.startswith("screen_")})
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=layout.num_gpus)
    check_layout(model, h100, job, layout)
    parallelize = pytest.importorskip("meshplan.executor.parallelize")
    parallelize.check_layout_runnable(model, job, layout)
    est = estimate(model, h100, job, layout)
    assert est.fits and est.memory_peak_bytes <= 70 * 2**30


# ---- the next round's set (seed 37), drawn before any run ----------------------------------
SET37 = ROOT / "benchmarks" / "sets" / "transfer37"
DOC37 = json.loads((SET37 / "set.json").read_text())
ENTRIES37 = [(m, x) for m in DOC37["models"] for x in m["layouts"]]


def test_set37_is_seeded_with_its_round_plan():
    assert DOC37["seed"] == 37 and len(DOC37["models"]) == 4 and len(ENTRIES37) == 24
    assert DOC37["rejected_models"] == []
    rng = random.Random(37)
    plan = dm.round_plan(rng, 4)
    for i, m in enumerate(DOC37["models"]):
        family, attention = plan[i]
        assert dm.draw_model(rng, f"t37m{i + 1:02d}", family=family,
                             attention=attention).to_dict() == m["spec"]
        assert json.loads((SET37 / "models" / f"{m['name']}.json").read_text()) == m["spec"]
    # both families and every attention kind (round 36 had no MQA model)
    assert {n.split("-")[1] for n in (m["name"] for m in DOC37["models"])} == {"gpt", "llama"}
    assert {n.split("-")[2] for n in (m["name"] for m in DOC37["models"])} == {"mha", "gqa",
                                                                             "mqa"}


def test_set37_covers_the_protocol_and_was_never_run():
    _covered(ENTRIES37)
    # screened on calibrated rows, not round 36's proxy
    _never_run_and_gpu_bound(DOC37, ENTRIES37)


@pytest.mark.parametrize("entry", ENTRIES37, ids=lambda e: e[1]["name"])
def test_every_set37_layout_is_accepted_and_fits_an_80gb_h100(entry):
    test_every_layout_is_accepted_and_fits_an_80gb_h100(entry)


# ---- round 38: a 2-GPU round (seed 38), drawn before any run -------------------------------
SET38 = ROOT / "benchmarks" / "sets" / "transfer38"
DOC38 = json.loads((SET38 / "set.json").read_text())
ENTRIES38 = [(m, x) for m in DOC38["models"] for x in m["layouts"]]


def test_set38_is_a_seeded_two_gpu_round():
    assert DOC38["seed"] == 38 and DOC38["nproc"] == 2 and len(ENTRIES38) == 24
    assert DOC38["tokens_per_step"] == 16384
    for m in DOC38["models"]:
        assert Job.from_dict(m["job"]) == dm.job_for(ModelSpec.from_dict(m["spec"]), 16384)
    layouts = _covered(ENTRIES38)
    assert all(l.dp * l.pp * l.tp == 2 for l in layouts)
    assert {(l.dp, l.pp, l.tp) for l in layouts} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    _never_run_and_gpu_bound(DOC38, ENTRIES38)


@pytest.mark.parametrize("entry", ENTRIES38, ids=lambda e: e[1]["name"])
def test_every_set38_layout_is_accepted_and_fits_an_80gb_h100(entry):
    test_every_layout_is_accepted_and_fits_an_80gb_h100(entry)


def test_round_refuses_a_non_positive_token_count(capsys):
    with pytest.raises(SystemExit) as exc:
        dm.main(["--round", "--seed", "1", "--tokens-per-step", "-5"])
    assert exc.value.code == 2 and "--tokens-per-step" in capsys.readouterr().err
