"""HELMET's JSON-KV (data.py load_json_kv), generated per tokenizer and length (docs/ruler.md, HELMET's
Recall): the size is the number of uuid4 pairs in the object; the queried pair sits at a depth drawn
once per sample, as a share of the object's records.
"""

from __future__ import annotations

import random

from evalkit.ruler.context import Context
from evalkit.ruler.counting import Item
from evalkit.ruler.kinds import KindPlan, KindTask
from evalkit.ruler.layout import GrowingStream, stream_items
from evalkit.ruler.spec import JSON_KV_DEMO
from evalkit.ruler.words import random_value

CONTEXT_START = "JSON data:\n{"
RECORD = '"{key}": "{value}"'
RECORD_SEP = ",\n "  # between records: the previous one's comma, a line break, a space
CONTEXT_END = "}"
DATA_CONSTANTS = {"CONTEXT": [CONTEXT_START, RECORD, RECORD_SEP, CONTEXT_END], "DEMO": JSON_KV_DEMO}  # cache key


def uuid_pair(rng: random.Random) -> tuple[str, str]:
    return random_value("uuids", rng), random_value("uuids", rng)


class RecordStream(GrowingStream):
    """The object's other records, drawn from the sample's own seed (a uuid4 repeats with
    probability ~2^-122: no check that a drawn key is the queried or a demonstration's)."""

    block_size = 64

    def __init__(self, ctx: Context, seed: int):
        super().__init__(ctx.counter, RECORD_SEP)
        self.rng = random.Random(seed)

    def _next_block(self, start: int, size: int) -> list[str]:
        return [
            RECORD_SEP + RECORD.format(key=key, value=value)
            for key, value in (uuid_pair(self.rng) for _ in range(size))
        ]


class JsonKvPlan(KindPlan["JsonKvTask"]):
    min_size = 1  # the queried pair alone

    def __init__(self, task: JsonKvTask, index: int):
        super().__init__(task, index)
        ctx = task.ctx
        rng = ctx.rng(index)
        key, value = uuid_pair(rng)
        self.record = RECORD.format(key=key, value=value)
        self.depth = rng.random()  # where the queried record goes: a share of the records before it
        demos = [uuid_pair(rng) for _ in range(ctx.spec.params["shots"])]
        shown = "\n\n".join(JSON_KV_DEMO.format(key=f'"{k}"', value=" " + v) for k, v in demos)
        question = task.tail_template.format(demos=shown + "\n\n" if demos else "", question=f'"{key}"')
        self.outputs = [value]
        self.prefix = ctx.spec.answer_prefix
        self.head = ctx.head(CONTEXT_START)
        self.tail = ctx.tail(CONTEXT_END + question, self.prefix)
        self.stream = RecordStream(ctx, ctx.seed_for(index, "records"))

    def position(self, size: int) -> int:
        """The queried record's index among the `size` records (each index equally likely)."""
        return int(self.depth * size)

    def answer_depths(self, size: int) -> list[float] | None:
        """The queried record's place among the records in percent: 0 first, 100 last."""
        return [100 * self.position(size) / max(1, size - 1)]

    def items(self, size: int) -> list[Item]:
        records = stream_items(self.stream, size - 1, [(self.position(size), self.record)], strip_first=True)
        return [self.head, *records, self.tail]

    def per_unit(self) -> float:
        return self.stream.average(self.stream.block_size)


class JsonKvTask(KindTask):
    Plan = JsonKvPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        head, self.tail_template = ctx.spec.template.split("{context}")
        assert not head  # the template starts with the context
