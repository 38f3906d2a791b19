"""Which rows of vLLM's batch are packed requests: how per-request data reaches the attention backend.

vLLM gives attention backends per-row lengths and block tables, never the request behind a
row. The one worker-side hook that sees each request's SamplingParams, and is told whenever
the batch is reordered, is a logits processor (vLLM's documented extension point for custom
`extra_args`). PackedRequestTracker is one that changes no logits: it keeps this worker's packed
layout per batch row, which the backend's metadata builder reads when vLLM builds the step's
attention metadata (after applying the batch update, before the forward pass).

It implements the V1 model runner's interface (vllm.v1.sample.logits_processor), where a row is
the request's index in the persistent batch and its row in the attention metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from evalkit.vllm_plugin.kernels import anchor_document_ids
from evalkit.vllm_plugin.packing import PackedSegments, segments_from_extra_args


@dataclass
class PackedRow:
    """One packed request in the batch: its document ids, and copies of them per device."""

    segments: PackedSegments
    doc_ids: torch.Tensor  # long [document end, or prompt length if less] on the CPU: 0 anchor, 1.. documents
    _on_device: dict[str, torch.Tensor] = field(default_factory=dict)

    def doc_ids_on(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = self.doc_ids.to(device)
        return self._on_device[key]


_rows: dict[int, PackedRow] = {}  # batch row -> layout, for the model runner of this process


def packed_rows() -> Mapping[int, PackedRow]:
    """The packed requests of the current batch, by row (empty when every request is plain)."""
    return _rows


def _packed_row(params: SamplingParams, prompt_token_ids: list[int] | None, _output_ids: list[int]) -> PackedRow | None:
    segments = segments_from_extra_args(params.extra_args)
    if segments is None:
        return None
    doc_ids = anchor_document_ids(segments.anchor_length, segments.document_lengths)
    if prompt_token_ids is not None and doc_ids.numel() > len(prompt_token_ids):
        # Generated tokens always attend to everything: a layout longer than its prompt is cut
        # at the prompt (evalkit's engine never sends one).
        doc_ids = doc_ids[: len(prompt_token_ids)]
    return PackedRow(segments, doc_ids)


class PackedRequestTracker(LogitsProcessor):
    """A logits processor that changes nothing and records the batch's packed layouts (see module doc)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        _rows.clear()  # a new model runner starts from an empty batch

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        segments_from_extra_args(sampling_params.extra_args)  # a malformed layout fails its request

    def is_argmax_invariant(self) -> bool:
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(_rows, batch_update, _packed_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits
