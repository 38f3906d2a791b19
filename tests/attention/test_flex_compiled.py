"""Compiled FlexAttention is whole or an error: a graph break raises instead of running flex
eagerly (scores materialised), and torch's eager-flex warning is silenced only where evalkit runs
flex uncompiled on purpose."""

import warnings

import pytest
import torch

from evalkit.attention import kernels


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """Compile FlexAttention on the CPU with Dynamo alone (the eager backend), as on CUDA."""
    torch._dynamo.reset()
    monkeypatch.setattr(kernels, "COMPILE_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(kernels, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(kernels, "_compiled_flex", {})
    yield
    torch._dynamo.reset()


def _inputs():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=generator) for _ in range(3))
    doc_ids = torch.tensor([[0] + [1] * 60 + [2] * 67])
    return q, k, v, doc_ids


def test_compiled_flex_equals_the_dense_reference(compiled_on_cpu):
    q, k, v, doc_ids = _inputs()
    with torch.no_grad():
        flex = kernels.document_attention(q, k, v, doc_ids, impl="flex")
        dense = kernels.document_attention(q, k, v, doc_ids, impl="dense")
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_a_graph_break_is_an_error_not_a_silent_eager_run(compiled_on_cpu, monkeypatch):
    real_frame = kernels._flex_frame

    def breaking_frame():
        inner = real_frame()

        def call(q, k, v, **kwargs):
            torch._dynamo.graph_break()  # what an unsupported op inside the frame would do
            return inner(q, k, v, **kwargs)

        return call

    monkeypatch.setattr(kernels, "_flex_frame", breaking_frame)
    q, k, v, doc_ids = _inputs()
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.Unsupported):
        kernels.document_attention(q, k, v, doc_ids, impl="flex")


def _warns(*args, **kwargs):
    warnings.warn("flex_attention called without torch.compile() - an unfused implementation", stacklevel=2)
    return torch.zeros(())


@pytest.mark.parametrize("compiled, heard", [(False, False), (True, True)])
def test_the_eager_flex_warning_is_silenced_only_off_compiled_devices(compiled, heard, monkeypatch):
    monkeypatch.setattr(kernels, "COMPILE_DEVICES", {"cuda", "cpu"} if compiled else {"cuda"})
    monkeypatch.setattr(kernels, "flex_attention_function", lambda device, dynamic=False, variant=(): _warns)
    q = torch.zeros(1, 1, 1, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernels.run_flex(q, q, q, None, scale=None, mask_kind="causal")
    assert bool(caught) == heard
