"""A cold static BlockMask build for the anchor paradigm, in a process of its own (tests/gpu/test_mask_build.py).

argv: LENGTH DEVICE. Packs LENGTH tokens of anchor documents and builds the training path's
BlockMask (evalkit.attention.kernels._build_block_mask: create_block_mask compiled on CUDA, the
build pytorch#182060 found taking minutes in Inductor on torch <= 2.12 at 64K), timed cold, then
once more warm; checks which blocks it keeps against the reference mask (attention.document_mask)
reduced to blocks, 128 queries at a time. Prints one JSON line.
"""

import json
import sys
import time

import torch


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def reference_blocks(doc_ids: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """[length/block, length/block] bool: whether any (query, key) of each block pair may attend."""
    from evalkit.attention import document_mask

    blocks = length // block
    kept = torch.zeros(blocks, blocks, dtype=torch.bool, device=doc_ids.device)
    for row in range(blocks):
        stop = (row + 1) * block  # this block's queries are the last `block` of the first `stop` tokens
        mask = document_mask(doc_ids[..., :stop], stop, block)[0]
        kept[row, : row + 1] = mask.view(block, row + 1, block).any(dim=2).any(dim=0)
    return kept


def main() -> None:
    from evalkit.attention import pack
    from evalkit.attention.kernels import _build_block_mask
    from tests.gpu.serving import document_lengths

    length, device = int(sys.argv[1]), sys.argv[2]
    docs = [[5] * n for n in document_lengths(length, min(1024, length // 16), seed=length)]
    doc_ids = pack(docs, length, "anchor", bos_id=1, eos_id=2).doc_ids[None].to(device)
    seconds = []
    for _ in range(2):  # cold (the compile), then warm
        started = time.perf_counter()
        mask = _build_block_mask(doc_ids, 1, length, length, device)
        _synchronize(device)
        seconds.append(time.perf_counter() - started)
    block = mask.BLOCK_SIZE[0]
    kept = mask.to_dense()[0, 0].bool()
    expected = reference_blocks(doc_ids, length, block)
    result = {"cold_s": seconds[0], "warm_s": seconds[1], "block": block, "documents": len(docs)}
    result |= {"blocks_kept": int(kept.sum()), "blocks_differing": int((kept != expected).sum())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
