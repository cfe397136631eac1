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


def test_the_optimizer_row_is_timed_at_a_model_sized_step_on_a_gpu():
    gib = 1 << 30
    # 2^29 elements (8 GiB of AdamW state) once a quarter of the free memory holds them
    assert shapes.optimizer_elements(False, "cuda", 139 * gib) == 1 << 29
    assert shapes.optimizer_elements(False, "cuda", None) == 1 << 29
    # a smaller GPU, or one mostly taken: the largest power of two within a quarter
    assert shapes.optimizer_elements(False, "cuda", 20 * gib) == 1 << 28
    assert shapes.optimizer_elements(False, "cuda", 10 * gib) == 1 << 27
    assert (shapes.optimizer_elements(False, "cuda", 20 * gib)
            * shapes.ADAMW_STATE_BYTES_PER_ELEMENT * 4 <= 20 * gib)
    # never below the memory-bound ops' size, nor above 2^26 with --quick
    assert shapes.optimizer_elements(False, "cuda", gib) == shapes.membound_elements(
        False, "cuda")
    assert shapes.optimizer_elements(True, "cuda", 139 * gib) == 1 << 26
    assert shapes.optimizer_elements(False, "cpu", None) == shapes.membound_elements(
        False, "cpu")
