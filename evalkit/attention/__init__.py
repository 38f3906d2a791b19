"""One specification of the paper's attention paradigms, several implementations that agree.

    pack(docs, seq_len, paradigm, ...)    -> PackedSequence (input_ids, position_ids, doc_ids, loss_mask)
    reference_mask(packed)                -> the definition: bool [S, S]
    document_attention(q, k, v, doc_ids)  -> attention under that definition (dense/blocked/flex/flash)
    register_hf_attention()               -> the same inside unmodified transformers models
"""  # fmt: skip # the formatter would dedent this docstring, changing its text

from evalkit.attention.hf import HF_NAMES, register_hf_attention
from evalkit.attention.kernels import (
    IMPLEMENTATIONS,
    available_implementations,
    document_attention,
    varlen_layout,
)
from evalkit.attention.masks import document_mask, reference_mask
from evalkit.attention.packing import ANCHOR_DOC_ID, PAD_DOC_ID, Document, PackedSequence, pack
from evalkit.attention.paradigms import Paradigm

__all__ = [
    "ANCHOR_DOC_ID",
    "HF_NAMES",
    "IMPLEMENTATIONS",
    "PAD_DOC_ID",
    "Document",
    "PackedSequence",
    "Paradigm",
    "available_implementations",
    "document_attention",
    "document_mask",
    "pack",
    "reference_mask",
    "register_hf_attention",
    "varlen_layout",
]
