"""A stored lm-eval task record is reused when its key matches: the key is read from
GeneralSettings' fields (evalkit.store.identity) and the engine's dtype, and the committed
results/smollm2-135m/general run (migrated to the current keys: results/README.md) matches it."""

import dataclasses
import json
from pathlib import Path

import pytest

from evalkit.general.runner import GeneralSettings, _plan

STORED = Path(__file__).resolve().parents[2] / "results" / "smollm2-135m" / "general" / "smollm2-135m" / "step-0"


class StoredShots:
    """The catalog's one answer the key needs: the shots asked for, as each record says (None:
    the task's own default, which lm-eval chose)."""

    def __init__(self, records: dict[str, dict]):
        self.records = records

    def fewshot(self, name: str, asked):
        return (self.records[name]["num_fewshot_asked"] if asked is None else asked), "recorded"


def stored_records() -> dict[str, dict]:
    records = [json.loads(p.read_text()) for p in (STORED / "general").glob("*.json") if ".lm_eval." not in p.name]
    assert records, f"no stored task records under {STORED}"
    return {record["task"]: record for record in records}


def key(settings: GeneralSettings, records: dict[str, dict], task: str) -> str:
    # an imported model (no training regime): served alike either way, wherever it lies now
    return _plan(StoredShots(records), task, settings, Path(records[task]["checkpoint"])).key


@pytest.mark.parametrize("task", sorted(stored_records()))
def test_the_committed_records_match_their_key(task):
    from evalkit.models.precision import engine_dtype

    records = stored_records()
    stored = records[task]["provenance"]["settings"]
    settings = GeneralSettings(**stored)
    assert key(settings, records, task) == records[task]["key"]
    # No dtype asked: the engine's default, the fp32 these were computed in only where that is the default.
    unasked = dataclasses.replace(settings, engine_settings={**stored["engine_settings"], "dtype": None})
    assert (key(unasked, records, task) == records[task]["key"]) == (engine_dtype() == "fp32")

    engine = stored["engine_settings"]
    faster = dataclasses.replace(settings, engine_settings={**engine, "batch_size": 64, "device": "cpu"})
    moved = dataclasses.replace(settings, include_paths=["/elsewhere/tasks"])
    assert key(faster, records, task) == key(moved, records, task) == records[task]["key"]  # speed, place: reused
    for changed in (
        {"engine_settings": {**engine, "dtype": "bf16"}},
        {"engine_settings": {**engine, "max_length": 4096}},
        {"limit": 3},
        {"too_long": "middle"},  # ("documents" cannot be combined with the stored limit)
        {"engine": "vllm"},
    ):
        assert key(dataclasses.replace(settings, **changed), records, task) != records[task]["key"], changed


def test_stored_settings_missing_a_field_read_it_as_its_default():
    from evalkit.ruler.runner import RulerSettings
    from evalkit.store.identity import identity, stored_identity

    now = RulerSettings(tasks=["vt"], lengths=[1024], num_samples=20, batch_size=64)
    old_record = {"num_samples": 20, "seed": 42, "engine": "hf", "batch_size": 8, "tasks": ["fwe"]}  # no sizing etc.
    assert stored_identity(RulerSettings, old_record) == identity(now)  # tasks, lengths, batch size: not identity
    assert "num_samples" in identity(now) and "num_samples" not in identity(now, with_count=False)
    assert stored_identity(RulerSettings, {**old_record, "seed": 1}) != identity(now)


def test_a_location_field_is_no_part_of_the_identity():
    """LOCATION: where input files lie (their content is keyed where it is read). Two paths are one identity."""
    import hashlib

    from evalkit.store.identity import LOCATION, identity, identity_key, setting, stored_identity

    @dataclasses.dataclass
    class Settings:
        seed: int = 1
        data_dir: str | None = setting(None, role=LOCATION)

    assert identity(Settings(data_dir="/a")) == identity(Settings(data_dir="/b")) == {"seed": 1}
    assert stored_identity(Settings, {"seed": 1, "data_dir": "/a"}) == identity(Settings())
    by_hand = hashlib.sha256(json.dumps({"seed": 1}, sort_keys=True).encode()).hexdigest()[:16]
    assert identity_key(Settings()) == identity_key(Settings(data_dir="/a")) == by_hand
    assert identity_key(Settings(seed=2)) != by_hand
