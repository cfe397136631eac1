"""The executor's torch.compile backend: MESHPLAN_COMPILE_BACKEND names it (unset: Inductor,
what GPU runs use), an unknown name is refused with the valid ones, and the compiled loss
compiles with it (the test session's backend, tests/conftest.py, gives the same loss as
eager)."""

import pytest

torch = pytest.importorskip("torch")

from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.parallelize import (COMPILE_BACKEND_ENV, COMPILE_BACKENDS,  # noqa: E402
                                           compile_backend, compiled_cross_entropy)


def test_unset_or_empty_is_inductor(monkeypatch):
    monkeypatch.delenv(COMPILE_BACKEND_ENV, raising=False)
    assert compile_backend() == "inductor"
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "")
    assert compile_backend() == "inductor"


@pytest.mark.parametrize("name", COMPILE_BACKENDS)
def test_each_listed_backend_is_taken(monkeypatch, name):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, name)
    assert compile_backend() == name


def test_an_unknown_backend_is_refused_with_the_valid_ones(monkeypatch):
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "tensorrt")
    with pytest.raises(ExecutorError, match="'tensorrt'.*inductor, aot_eager_decomp_partition"):
        compile_backend()
    with pytest.raises(ExecutorError, match="tensorrt"):
        compiled_cross_entropy()


def test_the_session_backend_is_graph_only_and_the_compiled_loss_matches_eager():
    from meshplan.executor.model import cross_entropy
    assert compile_backend() == "aot_eager_decomp_partition"
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 8, 32, generator=gen, requires_grad=True)
    targets = torch.randint(0, 32, (2, 8), generator=gen)
    compiled = compiled_cross_entropy()(logits, targets)
    (g_compiled,) = torch.autograd.grad(compiled, logits)
    eager = cross_entropy(logits, targets)
    (g_eager,) = torch.autograd.grad(eager, logits)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)
    torch.testing.assert_close(g_compiled, g_eager, rtol=0, atol=1e-7)
