"""How packed requests are described to vLLM: segments in extra_args, matching evalkit's packed layout."""

import pytest

from evalkit.engines import tokens as tok
from evalkit.vllm_plugin.kernels import anchor_document_ids
from evalkit.vllm_plugin.packing import (
    EXTRA_ARGS_KEY,
    PackedSegments,
    segments_from_doc_ids,
    segments_from_extra_args,
)


def test_segments_reproduce_the_engines_packed_layout(tokenizer):
    layout = tok.packed_layout(tokenizer, ["The grass is green.", "The sky is blue.", "Seven."], " Which color?")
    segments = segments_from_doc_ids(layout.doc_ids)
    assert segments.anchor_length + sum(segments.document_lengths) == layout.num_document_tokens
    assert anchor_document_ids(segments.anchor_length, segments.document_lengths).tolist() == layout.doc_ids
    assert len(segments.document_lengths) == 3


def test_segments_travel_through_extra_args():
    segments = PackedSegments(anchor_length=1, document_lengths=(5, 7, 2))
    extra = segments.extra_args()
    assert extra == {EXTRA_ARGS_KEY: {"anchor_length": 1, "document_lengths": [5, 7, 2]}}
    assert segments_from_extra_args(extra) == segments
    assert segments_from_extra_args(None) is None
    assert segments_from_extra_args({"other": 1}) is None


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"anchor_length": 1}, "must be"),
        ({"anchor_length": 1, "document_lengths": [3, "x"]}, "list of integers"),
        ({"anchor_length": "1", "document_lengths": [3]}, "must be an integer"),
        ({"anchor_length": 0, "document_lengths": [3]}, "anchor"),
        ({"anchor_length": 1, "document_lengths": []}, "at least one document"),
        ({"anchor_length": 1, "document_lengths": [3, 0]}, "empty"),
    ],
)
def test_malformed_layouts_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        segments_from_extra_args({EXTRA_ARGS_KEY: spec})


def test_cache_salts_separate_layouts():
    one = PackedSegments(1, (5, 7)).cache_salt()
    assert one == PackedSegments(1, (5, 7)).cache_salt()
    assert one != PackedSegments(1, (7, 5)).cache_salt()
