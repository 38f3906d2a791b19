"""Which shots each task gets, how mmlu aggregates, unknown names, and offline mode for fixtures only.

lm-eval's own mmlu and hellaswag YAMLs are indexed from its install (a few dozen files) rather
than through its full index of ~15k task files, which takes 10-20 s to build.
"""

import os
from pathlib import Path

import pytest
import yaml

from evalkit.errors import UserError
from evalkit.general.catalog import TASKS_DIR, TaskCatalog, default_include_paths, offline_hubs
from evalkit.general.errors import DatasetUnavailable

MMLU_STYLE = "evalkit_fixture_mmlu_style"


def lm_eval_tasks() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


@pytest.fixture(scope="module")
def real_catalog() -> TaskCatalog:
    """lm-eval's real mmlu (default variant) and hellaswag definitions, plus evalkit's fixtures."""
    paths = [TASKS_DIR, lm_eval_tasks() / "mmlu" / "default", lm_eval_tasks() / "hellaswag"]
    return TaskCatalog(paths, ["mmlu", "hellaswag", MMLU_STYLE])


def test_standard_shots_for_mmlu_and_hellaswag_defaults_elsewhere(real_catalog):
    for name in ("mmlu", "mmlu_stem", "mmlu_anatomy"):
        assert real_catalog.fewshot(name, None) == (5, "evalkit standard for mmlu")
    assert real_catalog.fewshot("hellaswag", None) == (0, "evalkit standard for hellaswag")
    assert real_catalog.fewshot(MMLU_STYLE, None) == (None, "lm-eval default")  # a fixture is not mmlu
    assert real_catalog.fewshot("mmlu", 0) == (0, "given")
    assert real_catalog.fewshot("hellaswag", 10) == (10, "given")


def test_mmlu_groups_average_over_questions():
    """The reported mmlu number is lm-eval's group row; every level of the group weights by size."""
    folder = lm_eval_tasks() / "mmlu" / "default"
    groups = [yaml.safe_load(path.read_text()) for path in sorted(folder.glob("_mmlu*.yaml"))]
    assert {g["group"] for g in groups} == {
        "mmlu",
        "mmlu_stem",
        "mmlu_other",
        "mmlu_social_sciences",
        "mmlu_humanities",
    }
    for group in groups:
        assert group["aggregate_metric_list"] == [{"metric": "acc", "weight_by_size": True}], group["group"]


def test_unknown_task_is_a_user_error_with_a_close_match(real_catalog):
    with pytest.raises(UserError, match="did you mean evalkit_fixture_mmlu_style"):
        real_catalog.check(["evalkit_fixture_mmlu_styl"])
    real_catalog.check(["mmlu", "hellaswag", MMLU_STYLE])


def test_include_paths_start_with_the_repositorys_tasks(tmp_path):
    assert default_include_paths() == [TASKS_DIR]
    assert default_include_paths([tmp_path, TASKS_DIR]) == [TASKS_DIR, tmp_path.resolve()]
    with pytest.raises(UserError, match="not a directory"):
        default_include_paths([tmp_path / "missing"])


def test_offline_mode_for_fixtures_only_and_restored(real_catalog, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with real_catalog.loading("mmlu"):  # real tasks reach the cache or the hub as the user set up
        assert not huggingface_hub.constants.HF_HUB_OFFLINE and "HF_HUB_OFFLINE" not in os.environ
    with real_catalog.loading(MMLU_STYLE):
        assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
        assert os.environ["HF_DATASETS_OFFLINE"] == os.environ["HF_HUB_OFFLINE"] == "1"
    assert not huggingface_hub.constants.HF_HUB_OFFLINE and not datasets.config.HF_HUB_OFFLINE
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ


def test_real_mmlu_without_its_data_names_the_dataset_and_the_switches(real_catalog, tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # Empty caches: the test must not depend on (or read) a cache the machine may have.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    with offline_hubs(), pytest.raises(DatasetUnavailable) as caught:
        real_catalog.load("mmlu")
    reason = caught.value.reason
    assert "\n" not in reason and reason.startswith("dataset cais/mmlu (")
    assert "load_dataset('cais/mmlu', '" in reason
    assert "HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1" in reason
