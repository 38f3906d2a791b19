"""A small byte-level BPE trained locally on the built-in prose, cached on disk.

Digits are split one per token (needle values and passkeys are digit strings), a BOS `<s>`
is added by the post-processor (as Llama tokenizers do), and 16 domain-tag tokens are
reserved for the anchor_tag paradigm.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import weakref
from pathlib import Path

from evalkit.corpus.prose import prose_documents
from evalkit.files import cache_root

TOKENIZER_VERSION = 1
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
BUILTIN_DOMAIN_TAGS = tuple(f"<|domain_{i}|>" for i in range(16))


def _train(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    specials = [PAD, UNK, BOS, EOS, *BUILTIN_DOMAIN_TAGS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(prose_documents(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    return tokenizer


def builtin_tokenizer(vocab_size: int = 2048, cache_dir: Path | None = None):
    """The built-in BPE as a transformers fast tokenizer, trained once and then loaded from cache."""
    from transformers import PreTrainedTokenizerFast

    corpus_hash = hashlib.sha256("\x00".join(prose_documents()).encode()).hexdigest()[:12]
    directory = (cache_dir or cache_root() / "tokenizers") / f"bpe-v{TOKENIZER_VERSION}-{vocab_size}-{corpus_hash}"
    if not (directory / "tokenizer.json").exists():
        fast = PreTrainedTokenizerFast(
            tokenizer_object=_train(vocab_size),
            bos_token=BOS,
            eos_token=EOS,
            pad_token=PAD,
            unk_token=UNK,
            additional_special_tokens=list(BUILTIN_DOMAIN_TAGS),
        )
        tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
        fast.save_pretrained(tmp)
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # another process finished first: theirs is identical
            os.replace(tmp, directory)
    return PreTrainedTokenizerFast.from_pretrained(directory)


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (its checks, fingerprint)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides token ids: vocabulary, merges, normalisation, specials.

    Computed once per tokenizer object (serialising a 150k-token vocabulary takes about a second,
    and RULER keys every task at every length by it); recomputed if tokens were added or the
    specials changed since."""
    checks = (len(tokenizer), tokenizer.bos_token, tokenizer.eos_token)
    try:
        known = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # an object that cannot be weakly referenced: not remembered
        known = None
    if known is not None and known[0] == checks:
        return known[1]
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    payload = json.dumps({"backend": backend, "bos": tokenizer.bos_token, "eos": tokenizer.eos_token}, sort_keys=True)
    fingerprint = hashlib.sha256(payload.encode()).hexdigest()[:16]
    with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced: not remembered
        _FINGERPRINTS[tokenizer] = (checks, fingerprint)
    return fingerprint
