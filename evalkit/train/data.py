"""Training data: document sources, tokenization, and the resumable window stream.

    DocumentSource  random access to (text, domain) by index: built-in corpus, JSONL, HF datasets
    WindowStream    documents in a seeded order per epoch, packed window by window with
                    evalkit.attention.pack (leftovers carried); its state_dict() is the data
                    position a checkpoint stores, so a resumed run sees exactly the same windows
"""  # fmt: skip # the formatter would dedent this docstring, changing its text

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from evalkit.attention import Document, PackedSequence, Paradigm, pack
from evalkit.attention.anchor import anchor_token_id
from evalkit.corpus.prose import prose_documents
from evalkit.errors import UserError
from evalkit.train.config import DataConfig
from evalkit.train.synthetic import SYNTHETIC_VERSION, copy_example, retrieval_example


class DocumentSource(Protocol):
    fingerprint: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[str, str | None]: ...

    def domains(self) -> list[str]: ...  # the distinct domain names, sorted (anchor_tag tags each)


class BuiltinSource:
    """Built-in documents (no download): synthetic retrieval and copy ones in the config's shares,
    prose, repeated as needed, for the rest."""

    def __init__(self, config: DataConfig, seed: int, seq_len: int):
        prose = prose_documents()
        fraction, copy_fraction = config.retrieval_fraction, config.copy_fraction
        num_retrieval = config.num_retrieval_docs if fraction > 0 else 0
        if copy_fraction <= 0:
            num_copy = 0
        elif num_retrieval:
            num_copy = max(1, round(num_retrieval * copy_fraction / fraction))
        else:
            num_copy = config.num_retrieval_docs
        num_synthetic, synthetic_share = num_retrieval + num_copy, fraction + copy_fraction
        if synthetic_share >= 1:
            repeats = 0
        elif num_synthetic == 0:
            repeats = 1
        else:  # repeat the prose so that it makes up (1 - synthetic share) of the documents
            repeats = max(1, round(num_synthetic * (1 - synthetic_share) / synthetic_share / len(prose)))
        self._prose, self._repeats = prose, repeats
        self._num_retrieval, self._num_copy, self._seed, self._seq_len = num_retrieval, num_copy, seed, seq_len
        self._phrasing = config.retrieval_phrasing
        key = f"builtin-{SYNTHETIC_VERSION}-{len(prose)}x{repeats}-{num_retrieval}-{seed}-{seq_len}"
        if num_copy:  # runs without copy documents keep their fingerprint
            key += f"-copy{num_copy}"
        if self._phrasing != "plain":
            key += f"-{self._phrasing}"
        self.fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]

    def domains(self) -> list[str]:
        counts = (("copy", self._num_copy), ("prose", self._repeats), ("retrieval", self._num_retrieval))
        return [name for name, count in counts if count]

    def __len__(self) -> int:
        return len(self._prose) * self._repeats + self._num_retrieval + self._num_copy

    def __getitem__(self, index: int) -> tuple[str, str | None]:
        num_prose = len(self._prose) * self._repeats
        if index < num_prose:
            return self._prose[index % len(self._prose)], "prose"
        index -= num_prose
        if index < self._num_retrieval:
            return retrieval_example(index, self._seed, self._seq_len, self._phrasing).text, "retrieval"
        return copy_example(index - self._num_retrieval, self._seed, self._seq_len).text, "copy"


class JsonlSource:
    """One JSON object per line with a text field (and optionally a domain field), every non-blank
    line checked on opening: a fault found lazily at step N would stop a run that has written
    checkpoints. It is the streaming pass the source makes anyway, for line offsets, content hash
    and domains; parsing costs far less than training on it."""

    def __init__(self, path: Path, text_field: str, domain_field: str):
        self._path, self._text_field, self._domain_field = path, text_field, domain_field
        self._offsets, self._lines = array("q"), array("q")  # compact: a corpus may have 100M lines
        found: set[str] = set()
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            offset = 0
            for number, line in enumerate(handle, start=1):
                digest.update(line)
                if line.strip():
                    domain = self._parse(line, number).get(domain_field)
                    if domain is not None:
                        found.add(str(domain))
                    self._offsets.append(offset)
                    self._lines.append(number)
                offset += len(line)
        if not self._offsets:
            raise UserError(f"{path} has no documents")
        self.fingerprint = digest.hexdigest()[:16]
        self._domains = sorted(found)

    def _parse(self, line: bytes, number: int) -> dict:
        where = f"{self._path}, line {number}"
        try:
            text = line.decode("utf-8-sig")  # -sig: a BOM some editors write on line 1 is not JSON
        except UnicodeDecodeError as err:
            raise UserError(
                f"{where}: byte {line[err.start]:#04x} at column {err.start + 1} is not UTF-8; save the file as UTF-8"
            ) from None
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            reason = err.msg.removesuffix(" at")  # json's "Invalid control character at" continues with the place
            raise UserError(
                f"{where} is not valid JSON ({reason}, column {err.colno}); fix or remove that line"
            ) from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise UserError(f"{where} is a JSON {kind}, not an object with a {self._text_field!r} field")
        if self._text_field not in record:
            raise UserError(
                f"{where} has no field {self._text_field!r}; add it, or set data.text_field to the field "
                "that holds each document's text"
            )
        if not isinstance(record[self._text_field], str):
            kind = type(record[self._text_field]).__name__
            raise UserError(
                f"{where}: field {self._text_field!r} holds a value of type {kind}, not a string (data.text_field "
                "names the text field)"
            )
        return record

    def __len__(self) -> int:
        return len(self._offsets)

    def domains(self) -> list[str]:
        return list(self._domains)

    def __getitem__(self, index: int) -> tuple[str, str | None]:
        with self._path.open("rb") as handle:
            handle.seek(self._offsets[index])
            line = handle.readline()
        record = self._parse(line, self._lines[index])  # checked again: the file may change during a run
        domain = record.get(self._domain_field)
        return record[self._text_field], None if domain is None else str(domain)


class HFDatasetSource:
    def __init__(self, source: str, split: str, text_field: str, domain_field: str):
        import datasets

        try:
            if Path(source).is_dir():
                loaded = datasets.load_from_disk(source)
                dataset = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
            else:
                dataset = datasets.load_dataset(source, split=split)
        except Exception as err:  # datasets raises many types; the user needs the one line
            raise UserError(f"could not load dataset {source!r} split {split!r}: {str(err).splitlines()[0]}") from None
        if text_field not in dataset.column_names:
            raise UserError(f"dataset {source!r} has no column {text_field!r} (set data.text_field)")
        self._dataset, self._text_field = dataset, text_field
        self._domain_field = domain_field if domain_field in dataset.column_names else None
        self.fingerprint = str(getattr(dataset, "_fingerprint", source))[:16]

    def __len__(self) -> int:
        return len(self._dataset)

    def domains(self) -> list[str]:
        if not self._domain_field:
            return []
        return sorted(str(d) for d in self._dataset.unique(self._domain_field) if d is not None)

    def __getitem__(self, index: int) -> tuple[str, str | None]:
        row = self._dataset[index]
        domain = row[self._domain_field] if self._domain_field else None
        return str(row[self._text_field]), None if domain is None else str(domain)


class _Truncated:
    def __init__(self, source: DocumentSource, limit: int):
        self._source, self._limit = source, min(limit, len(source))
        self.fingerprint = f"{source.fingerprint}-first{self._limit}"

    def __len__(self) -> int:
        return self._limit

    def domains(self) -> list[str]:
        return sorted({d for i in range(self._limit) if (d := self._source[i][1]) is not None})

    def __getitem__(self, index: int) -> tuple[str, str | None]:
        return self._source[index]


def open_source(config: DataConfig, seed: int, seq_len: int) -> DocumentSource:
    if config.source == "builtin":
        source: DocumentSource = BuiltinSource(config, seed, seq_len)
    elif config.source.endswith(".jsonl"):
        path = Path(config.source).expanduser()
        if not path.is_file():
            raise UserError(f"data file {config.source} does not exist")
        source = JsonlSource(path, config.text_field, config.domain_field)
    else:
        source = HFDatasetSource(config.source, config.split, config.text_field, config.domain_field)
    if config.max_documents is not None:
        source = _Truncated(source, config.max_documents)
    return source


def data_fingerprint(source: DocumentSource, window_start: str) -> str:
    """What a checkpoint records as its data: the source's fingerprint, and how windows were cut.
    Under "document" (the packing before data.window_start existed) the source's own, so earlier
    runs keep theirs; any other window start changes the windows, so the fingerprint."""
    if window_start == "document":
        return source.fingerprint
    return hashlib.sha256(f"{source.fingerprint}-start-{window_start}".encode()).hexdigest()[:16]


def domain_tag_ids(tokenizer, domains: list[str]) -> dict[str, int]:
    from evalkit.corpus.tokenizer import BUILTIN_DOMAIN_TAGS

    vocab = tokenizer.get_vocab()
    if all(tag in vocab for tag in BUILTIN_DOMAIN_TAGS):
        if len(domains) > len(BUILTIN_DOMAIN_TAGS):
            raise UserError(
                f"{len(domains)} domains, but the built-in tokenizer reserves {len(BUILTIN_DOMAIN_TAGS)} tags"
            )
        return {d: vocab[tag] for d, tag in zip(sorted(domains), BUILTIN_DOMAIN_TAGS)}
    ids = {}
    for domain in domains:
        pieces = tokenizer.encode(domain, add_special_tokens=False)
        if len(pieces) != 1:
            raise UserError(
                f"domain {domain!r} is {len(pieces)} tokens for this tokenizer; "
                "anchor_tag needs one token per domain tag"
            )
        ids[domain] = pieces[0]
    return ids


@dataclass
class StreamState:
    epoch: int = 0
    cursor: int = 0  # next position in this epoch's document order
    windows: int = 0  # windows produced so far (seeds the interleaving draw)
    leftover_tokens: list[int] | None = None
    leftover_tag: int | None = None


class WindowStream:
    def __init__(
        self,
        source: DocumentSource,
        tokenizer,
        paradigm: Paradigm,
        seq_len: int,
        seed: int,
        domain_tags: dict[str, int] | None = None,
        window_start: str = "bos",
    ):
        if len(source) == 0:
            raise UserError("the data source has no documents")
        self.source, self.tokenizer, self.paradigm = source, tokenizer, paradigm
        self.seq_len, self.seed, self.window_start = seq_len, seed, window_start
        # The anchor's one rule (BOS, else EOS: evalkit.attention.anchor), which also refuses a
        # tokenizer with neither.
        self.bos_id = anchor_token_id(tokenizer)
        self.eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id
        self.domain_tags = domain_tags or {}
        self.state = StreamState()
        self._orders: dict[int, torch.Tensor] = {}

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = torch.randperm(len(self.source), generator=generator)
        return self._orders[epoch]

    def _document(self, epoch: int, cursor: int) -> Document:
        text, domain = self.source[int(self._order(epoch)[cursor])]
        tag = None
        if self.paradigm.uses_tags:
            if domain is None or domain not in self.domain_tags:
                raise UserError(f"anchor_tag needs a known domain for every document; a document has domain {domain!r}")
            tag = self.domain_tags[domain]
        return Document(tokens=self.tokenizer.encode(text, add_special_tokens=False), tag=tag)

    def next_window(self) -> PackedSequence:
        docs: list[Document] = []
        after: list[tuple[int, int] | None] = []  # the (epoch, cursor) once each document is consumed
        if self.state.leftover_tokens is not None:
            docs.append(Document(self.state.leftover_tokens, self.state.leftover_tag, continued=True))
            after.append(None)
        epoch, cursor = self.state.epoch, self.state.cursor
        budget = sum(len(d.tokens) + 2 for d in docs)
        looked_at = 0
        while budget < self.seq_len:  # look ahead until the window can be filled
            if cursor >= len(self.source):
                epoch, cursor = epoch + 1, 0
            looked_at += 1
            if looked_at > len(self.source) and len(docs) == 0:
                raise UserError("every document of the data source is empty after tokenization")
            doc = self._document(epoch, cursor)
            cursor += 1
            if doc.tokens:  # an empty document is skipped along with the next one consumed
                docs.append(doc)
                after.append((epoch, cursor))
                budget += len(doc.tokens) + 2
        packed = pack(
            docs,
            self.seq_len,
            self.paradigm,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            seed=self.seed * 1_000_003 + self.state.windows,
            window_start=self.window_start,
        )
        consumed = [pos for pos in after[: packed.num_consumed] if pos is not None]
        if consumed:
            self.state.epoch, self.state.cursor = consumed[-1]
        self.state.windows += 1
        leftover = packed.leftover
        self.state.leftover_tokens = None if leftover is None else list(leftover.tokens)
        self.state.leftover_tag = None if leftover is None else leftover.tag
        return packed

    def state_dict(self) -> dict:
        return dict(vars(self.state))

    def load_state_dict(self, state: dict) -> None:
        self.state = StreamState(**state)
