"""Summaries decide the paper's observations from the numbers, whichever way the numbers go."""

import pytest

from evalkit.probe import summarise, summary_markdown, write_plots
from evalkit.store.provenance import stamp


def row(metric, value, dtype="bf16", condition="pretrained", rope="cast", delta1=0, length=64, column=None):
    return {
        "metric": metric,
        "kind": "test",
        "condition": condition,
        "dtype": dtype,
        "rope": rope,
        "delta1": delta1,
        "delta2": 16,
        "length": length,
        "n_texts": 3,
        "column": column,
        "value": value,
        "std": 0.0,
    }


def shift_rows(bf16: float, fp32: float) -> list[dict]:
    return [
        row("attn_diff", bf16),
        row("attn_diff", fp32, dtype="fp32"),
        row("attn_diff", 0.0, delta1=16),
        row("attn_diff", 0.0, dtype="fp32", delta1=16),
    ]


def column_rows(values: list[float]) -> list[dict]:
    return [row("attn_diff_column", v, column=j, length=len(values)) for j, v in enumerate(values, start=1)]


def length_rows(values: dict[int, float]) -> list[dict]:
    return [row("logit_diff_first", v, length=n) for n, v in values.items()]


PROVENANCE = {
    **stamp(),
    "checkpoint": "ckpt",
    "texts": "prose",
    "device": "cpu",
    "first_token_is_bos": True,
    "n_texts": {"64": 3},
    "n_texts_requested": 3,
    "texts_skipped_short": {"64": 0},
}


def markdown(kind: str, rows: list[dict]) -> str:
    payload = {"kind": kind, "summary": summarise(rows), "rows": rows, "notes": [], "provenance": PROVENANCE}
    return summary_markdown(payload)


@pytest.mark.parametrize("bf16, fp32, holds", [(0.5, 1e-6, True), (1.1e-6, 1e-6, False), (0.5, 0.0, True)])
def test_precision_observation_follows_the_numbers(bf16, fp32, holds):
    found = summarise(shift_rows(bf16, fp32))["precision_ratio"]
    assert found["holds"] is holds
    assert found["delta1"] == 0  # Δ1 = 0, not the Δ1 = Δ2 row
    text = markdown("shift", shift_rows(bf16, fp32))
    statement = next(line for line in text.splitlines() if line.startswith("- BF16 breaks"))
    assert ("**holds**" in statement) is holds and ("**does not hold**" in statement) is not holds
    if fp32 > 0:
        assert f"{bf16 / fp32:.3g}" in text


@pytest.mark.parametrize(
    "values, holds",
    [
        ([5.0] + [0.1] * 31, True),  # the sink stands far above the rest
        ([0.1] * 32, False),  # flat
        ([0.5, 1.0] + [0.01] * 30, False),  # large, but another column is larger
    ],
)
def test_first_token_observation_follows_the_numbers(values, holds):
    found = summarise(column_rows(values))["first_token"]
    assert found["holds"] is holds
    assert found["share"] == pytest.approx(values[0] / sum(values))
    text = markdown("tokens", column_rows(values))
    statement = next(line for line in text.splitlines() if line.startswith("- The first token"))
    assert ("**holds**" in statement) is holds


@pytest.mark.parametrize(
    "values, holds",
    [
        ({64: 0.1, 128: 0.2, 256: 0.4}, True),
        ({64: 0.1, 128: 0.1, 256: 0.11}, False),
    ],
)
def test_growth_observation_follows_the_numbers(values, holds):
    found = summarise(length_rows(values))["logit_growth"]
    assert found["holds"] is holds
    assert found["ratio"] == pytest.approx(values[256] / values[64])


def test_unmeasured_observations_say_so():
    summary = summarise(shift_rows(0.5, 1e-6))
    assert summary["first_token"] is None and summary["logit_growth"] is None
    text = markdown("shift", shift_rows(0.5, 1e-6))
    assert text.count("not measured here") == 2


def test_bf16_only_rows_leave_the_precision_ratio_unmeasured():
    assert summarise([row("attn_diff", 0.5)])["precision_ratio"] is None


@pytest.mark.parametrize(
    "kind, rows",
    [
        ("shift", shift_rows(0.5, 1e-6)),
        ("tokens", column_rows([5.0] + [0.1] * 31)),
        ("length", length_rows({64: 0.1, 128: 0.2})),
    ],
)
def test_plots_are_written_as_png_and_svg(tmp_path, kind, rows):
    png, svg = write_plots(kind, rows, tmp_path / f"probe-{kind}")
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 1000
    assert "<svg" in svg.read_text()
