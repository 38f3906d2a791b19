"""One generated sample and its JSON-line form (the cache file format)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Sample:
    index: int  # position in the task's sample list (NVIDIA's niah.py overwrites it; evalkit does not)
    input: str  # the task text without the answer prefix and without any chat wrapping
    answer_prefix: str
    outputs: list[str]  # reference answers
    length: int  # tokens of the prompt as the engine feeds it (wrapping, prefix and BOS included)
    depths: list[float] | None = None  # per output, its needle's depth in percent (KindPlan.answer_depths)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Sample:
        return cls(**json.loads(line))  # a missing or unknown field is a TypeError


def dumps_jsonl(samples: list[Sample]) -> str:
    return "".join(sample.to_json() + "\n" for sample in samples)


def loads_jsonl(text: str) -> list[Sample]:
    return [Sample.from_json(line) for line in text.splitlines() if line.strip()]
