"""Which attention sizes `meshplan calibrate` times (pure Python, no torch)."""

from meshplan.calibrate import shapes
from meshplan.spec import ModelSpec


def test_long_context_points_on_gpu_only_and_beyond_the_planned_length():
    m = ModelSpec.preset("llama3-8b")
    got = shapes.long_context_attention_shapes(m, 2048, "cuda", False)
    assert [(a.batch, a.seq, a.heads, a.head_dim) for a in got] == \
        [(1, 16384, m.num_heads, m.head_dim), (1, 65536, m.num_heads, m.head_dim)]
    # a calibration at 32k tokens already times 16k and 32k: only 64k is added
    assert [a.seq for a in shapes.long_context_attention_shapes(m, 32768, "cuda", False)] \
        == [65536]
    assert shapes.long_context_attention_shapes(m, 2048, "cpu", False) == []
    assert shapes.long_context_attention_shapes(m, 2048, "cuda", True) == []


def test_long_context_points_without_a_model_use_16_heads_of_128():
    got = shapes.long_context_attention_shapes(None, 4096, "cuda", False)
    assert {(a.heads, a.head_dim) for a in got} == {(16, 128)}
    assert max(a.seq for a in got) > max(
        a.seq for a in shapes.default_attention_shapes(False, "cuda"))
