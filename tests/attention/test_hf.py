"""evalkit attention inside unmodified transformers models: packed equals per-document."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from evalkit.attention import ANCHOR_DOC_ID, Paradigm, pack, register_hf_attention

BOS, EOS = 1, 2
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    attention_dropout=0.0,
)
ARCHES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}
DOCS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19]]


def tiny_model(arch: str, impl: str = "evalkit_blocked"):
    register_hf_attention()
    config_cls, model_cls = ARCHES[arch]
    torch.manual_seed(0)
    config = config_cls(**TINY)
    if arch == "mistral":
        config.sliding_window = None
    model = model_cls(config).eval()
    model.set_attn_implementation(impl)
    return model


def logits_of(model, ids, positions, doc_ids=None):
    out = model(input_ids=ids[None], position_ids=positions[None], doc_ids=None if doc_ids is None else doc_ids[None])
    return out.logits[0]


@pytest.mark.parametrize("arch", list(ARCHES))
@pytest.mark.parametrize("impl", ["evalkit_blocked", "evalkit_dense", "evalkit"])
def test_intra_doc_reset_equals_each_document_alone(arch, impl):
    model = tiny_model(arch, impl)
    packed = pack(DOCS, 21, "intra_doc_reset", bos_id=BOS, eos_id=EOS)
    with torch.no_grad():
        together = logits_of(model, packed.input_ids, packed.position_ids, packed.attention_doc_ids())
        for d in range(1, len(DOCS) + 1):
            where = (packed.doc_ids == d).nonzero().flatten()
            alone = logits_of(model, packed.input_ids[where], torch.arange(where.numel()))  # positions from 0
            torch.testing.assert_close(together[where], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(ARCHES))
@pytest.mark.parametrize("paradigm", ["anchor", "anchor_interleaved"])
def test_anchor_equals_each_document_behind_the_anchor(arch, paradigm, monkeypatch):
    import evalkit.attention.packing as packing

    monkeypatch.setattr(packing, "INTERLEAVE_MIN_LEN", 4)
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_GAP", 1)
    model = tiny_model(arch)
    packed = pack(DOCS, 20, paradigm, bos_id=BOS, eos_id=EOS, seed=1)
    with torch.no_grad():
        together = logits_of(model, packed.input_ids, packed.position_ids, packed.attention_doc_ids())
        for d in range(1, len(DOCS) + 1):
            where = (packed.doc_ids == d).nonzero().flatten()
            with_anchor = torch.cat([torch.tensor([0]), where])  # the anchor, then the document
            alone = logits_of(model, packed.input_ids[with_anchor], packed.position_ids[with_anchor])
            torch.testing.assert_close(together[where], alone[1:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(together[0], alone[0], atol=1e-5, rtol=1e-5)


def test_full_paradigm_is_plain_causal():
    model = tiny_model("llama")
    packed = pack(DOCS, 20, "full", bos_id=BOS, eos_id=EOS)
    with torch.no_grad():
        ours = logits_of(model, packed.input_ids, packed.position_ids, packed.attention_doc_ids())
        model.set_attn_implementation("eager")
        stock = logits_of(model, packed.input_ids, packed.position_ids)
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=1e-5)


def doc2_loss_grad_on_inputs(paradigm: Paradigm, impl: str) -> tuple[torch.Tensor, torch.Tensor]:
    model = tiny_model("llama", impl)
    packed = pack(DOCS, 21, paradigm, bos_id=BOS, eos_id=EOS)
    embeds = model.get_input_embeddings()(packed.input_ids[None]).detach().requires_grad_()
    logits = model(
        inputs_embeds=embeds, position_ids=packed.position_ids[None], doc_ids=packed.attention_doc_ids()
    ).logits[0]
    targets = packed.input_ids[1:]
    in_doc2 = (packed.doc_ids[1:] == 2) & packed.loss_mask[1:]
    loss = torch.nn.functional.cross_entropy(logits[:-1][in_doc2], targets[in_doc2])
    (grad,) = torch.autograd.grad(loss, embeds)
    return grad[0].abs().sum(-1), packed.doc_ids


@pytest.mark.parametrize("impl", ["evalkit_blocked", "evalkit_dense"])
@pytest.mark.parametrize("paradigm", [Paradigm.INTRA_DOC, Paradigm.ANCHOR])
def test_no_gradient_leaks_across_documents(impl, paradigm):
    grad, doc_ids = doc2_loss_grad_on_inputs(paradigm, impl)
    assert torch.all(grad[doc_ids == 1] == 0)  # exactly zero, not merely small
    assert torch.all(grad[doc_ids == 2][:-1] > 0)  # its last token (EOS) predicts nothing in the loss
    if paradigm.has_anchor:
        assert grad[doc_ids == ANCHOR_DOC_ID].item() > 0  # the anchor is shared on purpose


def test_full_attention_does_leak_control():
    grad, doc_ids = doc2_loss_grad_on_inputs(Paradigm.FULL, "evalkit_blocked")
    assert torch.all(grad[doc_ids == 1] > 0)


def test_padded_batches_are_refused():
    model = tiny_model("llama")
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    with pytest.raises(ValueError, match="padded batches"):
        model(input_ids=ids, attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]))
    model(input_ids=ids, attention_mask=torch.ones_like(ids))  # an all-ones mask is no padding


def test_generation_with_kv_cache_matches_sdpa():
    model = tiny_model("llama")
    prompt = torch.tensor([[1, 5, 6, 7, 8]])
    ours = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("sdpa")
    stock = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, stock)
