"""From probe rows to the key ratios, the paper's three observations, a markdown summary and plots.

Everything here reads only what probe-<kind>.json stores (rows, provenance): a summary can be
rebuilt from it. The observations read the rows summed over all layers (a model with more than
one layer type also gets the key numbers per layer type) and are decided by the *_FACTOR thresholds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from evalkit.figures import new_figure, write_figure
from evalkit.markdown import markdown_section, markdown_table
from evalkit.store.provenance import provenance_lines

TITLE = "# BF16 RoPE probe: {kind}"  # the markdown's first line, by which a rerun knows it as its own
PRECISION_FACTOR = 10.0  # "≫": an order of magnitude
DOMINANCE_FACTOR = 10.0  # the first column against the average column
GROWTH_FACTOR = 1.5  # longest against shortest length: well beyond text-to-text noise
LOW_PRECISION_ORDER = ("bf16", "fp16", "fp32")  # which dtype speaks for "the checkpoint in low precision"

Row = dict
ALL_LAYERS = "all"
# Per kind: what the summary says it measured, and the metric of its values table with that table's axis.
KIND_VALUES = {
    "shift": ("attention difference D (Eq. 4)", "attn_diff", "delta1"),
    "tokens": ("per-token attention difference", "attn_diff", "delta1"),
    "length": ("first-token logit difference D_logit (Eq. 5)", "logit_diff_first", "length"),
}
LAYER_TYPE_METRICS = {"attn_diff": "D", "first_token_share": "first-token share", "logit_diff_first": "D_logit"}


def _select(rows: Iterable[Row], **match) -> list[Row]:
    return [row for row in rows if all(row.get(key) == value for key, value in match.items())]


def _layers(row: Row) -> str:
    return row.get("layers", ALL_LAYERS)  # rows stored before layer types were reported sum over all layers


def over_all_layers(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if _layers(row) == ALL_LAYERS]


def _prefer(values: Iterable, order: Sequence) -> object | None:
    """The first of `order` among `values`, else the least of them (None when there are none)."""
    present = set(values)
    return next((choice for choice in order if choice in present), min(present, default=None))


def _reference_series(
    rows: list[Row], metric: str, dtypes: Sequence[str] = LOW_PRECISION_ORDER, condition: str = "pretrained"
) -> tuple[dict, list[Row]] | None:
    """The series the summary speaks about: `condition`, lowest precision, rope=cast, Δ1=0 where measured;
    as (its dtype, rope and delta1, its rows)."""
    candidates = _select(rows, metric=metric, condition=condition)
    dtype = _prefer((row["dtype"] for row in candidates), dtypes)
    candidates = _select(candidates, dtype=dtype)
    rope = _prefer((row["rope"] for row in candidates), ("cast", "fp32"))
    shifted = [row for row in _select(candidates, rope=rope) if row["delta1"] != row["delta2"]]
    delta1 = _prefer((row["delta1"] for row in shifted), (0,))
    if delta1 is None:
        return None
    return {"dtype": dtype, "rope": rope, "delta1": delta1}, _select(shifted, delta1=delta1)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def precision_ratio(rows: list[Row]) -> dict | None:
    """D of the checkpoint in BF16 (else FP16) over D in FP32, at the reference Δ1 and RoPE variant."""
    found = _reference_series(rows, "attn_diff", dtypes=("bf16", "fp16"))
    if found is None or found[0]["dtype"] == "fp32":
        return None
    where, series = found
    length = max(row["length"] for row in series)
    match = dict(where, metric="attn_diff", condition="pretrained", length=length)
    low, high = _select(rows, **match), _select(rows, **{**match, "dtype": "fp32"})
    if not low or not high:
        return None
    low_value, fp32_value = low[0]["value"], high[0]["value"]
    return {
        **where,
        "delta2": low[0]["delta2"],
        "length": length,
        "low_precision": low_value,
        "fp32": fp32_value,
        "ratio": _ratio(low_value, fp32_value),
        "holds": low_value > 0 and low_value >= PRECISION_FACTOR * fp32_value,
    }


def first_token_dominance(rows: list[Row]) -> dict | None:
    """The first key column's share of D and how far it stands above the other columns."""
    found = _reference_series(rows, "attn_diff_column")
    if found is None:
        return None
    where, series = found
    columns = sorted(series, key=lambda row: row["column"])
    values = [row["value"] for row in columns]
    first, others = values[0], values[1:]
    mean_other = sum(others) / len(others) if others else 0.0
    is_largest = first >= max(others, default=0.0)
    return {
        **where,
        "delta2": columns[0]["delta2"],
        "length": columns[0]["length"],
        "share": _ratio(first, sum(values)),
        "over_mean_other": _ratio(first, mean_other),
        "is_largest": is_largest,
        "holds": first > 0 and is_largest and first >= DOMINANCE_FACTOR * mean_other,
    }


def logit_growth(rows: list[Row]) -> dict | None:
    """D_logit at the longest length over D_logit at the shortest."""
    found = _reference_series(rows, "logit_diff_first")
    if found is None or len(found[1]) < 2:
        return None
    where, series = found
    by_length = sorted(series, key=lambda row: row["length"])
    short, long = by_length[0], by_length[-1]
    return {
        **where,
        "delta2": short["delta2"],
        "shortest": short["length"],
        "longest": long["length"],
        "at_shortest": short["value"],
        "at_longest": long["value"],
        "ratio": _ratio(long["value"], short["value"]),
        "holds": long["value"] > 0 and long["value"] >= GROWTH_FACTOR * short["value"],
    }


def pretraining_amplification(rows: list[Row]) -> dict | None:
    """D of the checkpoint over D of the same architecture freshly initialised (both BF16), where measured."""
    for metric in ("attn_diff", "logit_diff_first"):
        found = _reference_series(rows, metric, condition="random_init")
        if found is None:
            continue
        where, series = found
        match = {"metric": metric, **where, "length": max(row["length"] for row in series)}
        trained, fresh = _select(rows, condition="pretrained", **match), _select(rows, condition="random_init", **match)
        if trained and fresh:
            return {
                **match,
                "pretrained": trained[0]["value"],
                "random_init": fresh[0]["value"],
                "ratio": _ratio(trained[0]["value"], fresh[0]["value"]),
            }
    return None


def by_layer_type(rows: list[Row]) -> dict | None:
    """D, the first-token share and D_logit per layer type (and over all layers) at each length, for the
    series the summary speaks about; None when the rows have no layer types."""
    types = sorted({_layers(row) for row in rows} - {ALL_LAYERS})
    if not types:
        return None
    found: dict = {"values": {name: {} for name in [*types, ALL_LAYERS]}}
    for metric in LAYER_TYPE_METRICS:
        reference = _reference_series(over_all_layers(rows), metric)
        if reference is None:
            continue
        found |= reference[0]
        for row in _select(rows, metric=metric, condition="pretrained", **reference[0]):
            found["delta2"] = row["delta2"]
            found["values"][_layers(row)].setdefault(metric, {})[row["length"]] = row["value"]
    return found


def summarise(rows: list[Row]) -> dict:
    """The key numbers and the three observations, each None where the rows do not measure it."""
    every, rows = rows, over_all_layers(rows)
    return {
        "precision_ratio": precision_ratio(rows),
        "first_token": first_token_dominance(rows),
        "logit_growth": logit_growth(rows),
        "pretraining_amplification": pretraining_amplification(rows),
        "by_layer_type": by_layer_type(every),
        "thresholds": dict(
            precision_factor=PRECISION_FACTOR, dominance_factor=DOMINANCE_FACTOR, growth_factor=GROWTH_FACTOR
        ),
    }


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


# The paper's observations: the summary's key, the claim, and what measures it when the rows do not.
OBSERVATIONS = (
    ("precision_ratio", "BF16 breaks RoPE's relative positions (D in BF16 ≫ D in FP32)",
     "`evalkit probe shift` with `--dtypes bf16,fp32`"),
    ("first_token", "The first token carries most of the difference", "`evalkit probe tokens`"),
    ("logit_growth", "The first-token logit difference grows with length",
     "`evalkit probe length`, at least two lengths"),
)  # fmt: skip


def _precision_lines(found: dict) -> tuple[list[tuple[str, str]], str]:
    low = found["dtype"].upper()
    where = f"Δ1={found['delta1']}, Δ2={found['delta2']}, T={found['length']}, rope={found['rope']}"
    ratio = _num(found["ratio"]) if found["ratio"] is not None else "∞ (FP32 D is exactly 0)"
    row = (f"{low} / FP32 D ({where})", f"{ratio} ({_num(found['low_precision'])} / {_num(found['fp32'])})")
    return [row], f"the ratio is {ratio}, threshold {PRECISION_FACTOR:g}."


def _first_token_lines(found: dict) -> tuple[list[tuple[str, str]], str]:
    where = f"{found['dtype'].upper()}, Δ1={found['delta1']}, Δ2={found['delta2']}, T={found['length']}"
    rows = [
        (f"first-token share of D ({where})", _num(found["share"])),
        ("first column / mean other column", _num(found["over_mean_other"])),
    ]
    largest = "is" if found["is_largest"] else "is not"
    return rows, (
        f"its column {largest} the largest and stands {_num(found['over_mean_other'])}× the mean other column "
        f"(threshold {DOMINANCE_FACTOR:g}×)."
    )


def _growth_lines(found: dict) -> tuple[list[tuple[str, str]], str]:
    span = f"{found['shortest']} → {found['longest']} tokens"
    row = (
        f"D_logit growth, {span} ({found['dtype'].upper()})",
        f"{_num(found['ratio'])} ({_num(found['at_shortest'])} → {_num(found['at_longest'])})",
    )
    return [row], f"×{_num(found['ratio'])} over {span}, threshold {GROWTH_FACTOR:g}×."


def _amplification_lines(found: dict | None) -> list[tuple[str, str]]:
    if found is None:
        return []
    name = "D" if found["metric"] == "attn_diff" else "D_logit"
    label = f"pretrained / random-init {name} ({found['dtype'].upper()}, Δ1={found['delta1']})"
    return [(label, f"{_num(found['ratio'])} ({_num(found['pretrained'])} / {_num(found['random_init'])})")]


def _series_label(row: Row, with_delta1: bool = False) -> str:
    label = f"{row['condition']} {row['dtype'].upper()} rope={row['rope']}"
    return label + (f" Δ1={row['delta1']}" if with_delta1 else "")


def _value_table(rows: list[Row], metric: str, axis: str) -> list[str]:
    """Rows of `metric` as a markdown table: one line per value of `axis`, one column per series."""
    chosen = _select(rows, metric=metric)
    if not chosen:
        return []
    many_delta1 = len({row["delta1"] for row in chosen}) > 1 and axis != "delta1"
    labels = list(dict.fromkeys(_series_label(row, many_delta1) for row in chosen))
    cells = {(row[axis], _series_label(row, many_delta1)): row["value"] for row in chosen}
    header = {"delta1": "Δ1", "length": "length"}[axis]
    keys = sorted({row[axis] for row in chosen})
    table = [[key, *(_num(cells.get((key, label))) for label in labels)] for key in keys]
    return markdown_section("Values (mean over texts)", markdown_table([header, *labels], table))


def _provenance_lines(provenance: dict) -> list[str]:
    lines = [f"Command: `{provenance['command']}`", ""] if provenance.get("command") else []
    if provenance.get("seconds") is not None:
        lines += [f"Took {provenance['seconds']:.0f} s.", ""]
    return [*lines, *provenance_lines(provenance), ""]


def _layer_type_label(name: str, layer_windows: list | None) -> str:
    if name == ALL_LAYERS or layer_windows is None:
        return name
    windows = [w for w in layer_windows if (w is None) == (name == "full_attention")]
    reach = sorted({w for w in windows if w is not None})
    window = f", window {', '.join(map(str, reach))}" if reach else ""
    return f"{name} ({len(windows)} layer{'s' if len(windows) != 1 else ''}{window})"


def _layer_type_lines(found: dict | None, layer_windows: list | None) -> list[str]:
    """A table: one line per layer type and one for all layers, one column per metric and length."""
    if found is None or "dtype" not in found:
        return []
    values = found["values"]
    columns = sorted({(metric, length) for parts in values.values() for metric in parts for length in parts[metric]},
                     key=lambda pair: (list(LAYER_TYPE_METRICS).index(pair[0]), pair[1]))  # fmt: skip
    header = ["layers", *(f"{LAYER_TYPE_METRICS[metric]} (T={length})" for metric, length in columns)]
    table = [
        [_layer_type_label(name, layer_windows), *(_num(parts.get(m, {}).get(n)) for m, n in columns)]
        for name, parts in values.items()
    ]
    where = f"{found['dtype'].upper()}, rope={found['rope']}, Δ1={found['delta1']}, Δ2={found.get('delta2')}"
    return markdown_section(
        "Per layer type",
        f"Pretrained {where}. D and D_logit of the layer types add up to all layers; sliding layers are measured "
        "within their window. Global (full_attention) layers are where long-distance RoPE error can show.",
        "",
        markdown_table(header, table),
    )


def _regime_lines(provenance: dict) -> list[str]:
    regimes = provenance.get("condition_precision") or []
    if not regimes:
        return []
    trained = provenance.get("trained_precision")
    lines = []
    if trained:
        kind = {"bf16_full": "bf16 weights, buffers and residual (the released regime)", "bf16": "bf16 autocast"}
        lines += [
            f"Trained in {trained.get('dtype')} ({kind.get(str(trained.get('dtype')), 'fp32')}), RoPE rotated in "
            f"{trained.get('rope', 'fp32')}.",
            "",
        ]
    columns = ("weights", "residual", "rope_frequencies")
    table = [
        [f"{r['condition']} {r['dtype'].upper()}", *(r[c] for c in columns), "yes" if r["as_trained"] else ""]
        for r in regimes
    ]
    header = ["condition", "weights", "residual stream", "RoPE frequencies", "as trained (bf16_full)"]
    return markdown_section("Precision of each condition", *lines, markdown_table(header, table))


def _texts_used(provenance: dict) -> str:
    counts, requested = provenance["n_texts"], provenance["n_texts_requested"]  # counts: per length, in order
    lengths, found = list(counts), set(counts.values())
    size = f"{lengths[0]} tokens" if len(lengths) == 1 else f"each of {', '.join(lengths)} tokens"
    text = f"{found.pop()} texts × {size}" if len(found) == 1 else f"up to {requested} texts at {size}"
    skipped = max(provenance["texts_skipped_short"].values())
    return text + (f" ({skipped} texts too short were skipped)" if skipped else "")


def summary_markdown(payload: dict) -> str:
    """The human-readable summary of a probe's payload (as run_probe returns and stores it): what was
    measured, the key ratios, the observations, the values."""
    kind, summary, rows, provenance = payload["kind"], payload["summary"], payload["rows"], payload["provenance"]
    metric_name, metric, axis = KIND_VALUES[kind]
    key_rows, observations = [], []
    for (part, claim, measured_by), build in zip(OBSERVATIONS, (_precision_lines, _first_token_lines, _growth_lines)):
        if summary[part] is None:
            observations.append(f"- {claim}: not measured here ({measured_by}).")
            continue
        table_rows, evidence = build(summary[part])
        key_rows += table_rows
        verdict = "**holds**" if summary[part]["holds"] else "**does not hold**"
        observations.append(f"- {claim}: {verdict}: {evidence}")
    key_rows += _amplification_lines(summary["pretraining_amplification"])
    first_token = "BOS" if provenance["first_token_is_bos"] else "not a BOS (the tokenizer adds none)"
    out = [
        TITLE.format(kind=kind),
        "",
        f"{metric_name} of `{provenance['checkpoint']}` on {provenance['texts']}: {_texts_used(provenance)} on "
        f"{provenance['device']}. First token: {first_token}.",
        "",
        *_provenance_lines(provenance),
        *_regime_lines(provenance),
    ]
    notes = [f"Note: {note}." for note in payload["notes"]]
    out += [*notes, ""] if notes else []
    out += markdown_section("Key numbers", markdown_table(["quantity", "value"], key_rows)) if key_rows else []
    out += markdown_section("The paper's observations, from these numbers", *observations)
    out += _layer_type_lines(summary.get("by_layer_type"), provenance.get("layer_windows"))
    out += _value_table(over_all_layers(rows), metric, axis)
    return "\n".join(out)


def _style(row: Row, rows: list[Row]) -> dict:
    """One colour per (condition, dtype), one line style per RoPE variant: overlapping series stay visible."""
    pairs = list(dict.fromkeys((r["condition"], r["dtype"]) for r in rows))
    colour = f"C{pairs.index((row['condition'], row['dtype'])) % 10}"
    return {"color": colour, "linestyle": "-" if row["rope"] == "cast" else "--"}


def _plot_lines(axes, chosen: list[Row], x: str, with_delta1: bool = False, **line) -> list[tuple]:
    """One line per series of `chosen`, its values against row[x] (zeros left out: the axes are
    logarithmic); returns each line with its points."""
    grouped: dict[str, list[Row]] = {}
    for row in chosen:
        grouped.setdefault(_series_label(row, with_delta1), []).append(row)
    drawn = []
    for label, series in grouped.items():
        points = sorted((row[x], row["value"]) for row in series if row["value"] > 0)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        drawn.append((axes.plot(xs, ys, label=label, **line, **_style(series[0], chosen))[0], points))
    return drawn


def _plot_shift(axes, rows: list[Row]) -> None:
    chosen = _select(rows, metric="attn_diff")
    _plot_lines(axes, chosen, "delta1", marker="o", markersize=3)
    if chosen:
        axes.axvline(chosen[0]["delta2"], color="grey", linestyle=":", linewidth=1, label=f"Δ2 = {chosen[0]['delta2']}")
    axes.set_xscale("symlog", linthresh=1)  # Δ1 runs from 0 to thousands
    axes.set_xlim(left=0)
    axes.set(yscale="log", xlabel="Δ1 (position shift)", ylabel="attention difference D",
             title="Attention difference D(X, Δ1, Δ2) (Eq. 4)")  # fmt: skip


def _plot_tokens(axes, rows: list[Row]) -> None:
    chosen = _select(rows, metric="attn_diff_column")
    # One Δ1 keeps the panel readable: the first that differs from Δ2 (D(Δ2, Δ2) is all zeros).
    first_delta1 = min((row["delta1"] for row in chosen if row["delta1"] != row["delta2"]), default=None)
    for line, points in _plot_lines(axes, _select(chosen, delta1=first_delta1), "column", linewidth=0.8):
        first = [p for p in points if p[0] == 1]
        if first:  # the attention sink: highlighted with its own marker
            axes.plot(*first[0], marker="*", markersize=14, color=line.get_color(), markeredgecolor="black")
    axes.set(xscale="log", yscale="log", xlabel="key position j (1 = first token)",
             ylabel="n_j Σ |ΔATTN| over layers, heads, queries",
             title=f"Per-token attention difference (Δ1={first_delta1}; ★ first token)")  # fmt: skip


def _plot_length(axes, rows: list[Row]) -> None:
    chosen = _select(rows, metric="logit_diff_first")
    _plot_lines(axes, chosen, "length", len({row["delta1"] for row in chosen}) > 1, marker="o", markersize=4)
    axes.set_xscale("log", base=2)  # the lengths double
    axes.set(yscale="log", xlabel="sequence length T", ylabel="D_logit",
             title="First-token logit difference D_logit vs length (Eq. 5)")  # fmt: skip


def write_plots(kind: str, rows: list[Row], stem: Path) -> list[Path]:
    """The kind's panel of the paper's Figure 1 as `stem`.png and `stem`.svg; returns their paths."""
    figure, axes = new_figure(7, 4.5)
    rows = over_all_layers(rows)
    {"shift": _plot_shift, "tokens": _plot_tokens, "length": _plot_length}[kind](axes, rows)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=7, handlelength=3)  # long enough to show the dashes of rope=fp32
    axes.grid(True, which="both", alpha=0.3)
    return write_figure(figure, stem)
