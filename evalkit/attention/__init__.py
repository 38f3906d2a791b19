"""One specification of the paper's attention paradigms, several implementations that agree (docs/attention.md)."""

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
