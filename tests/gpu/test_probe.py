"""The BF16 RoPE probe on a GPU: `probe tokens` and `probe length` on the shipped tiny base
checkpoint, the bf16 condition against fp32, on CUDA (the paper's Figure 1, middle and right).

The probe measures how far attention moves when every position shifts (Δ1 = 0 against Δ2 = 16):
exact arithmetic moves nothing (RoPE is relative), fp32 almost nothing, bf16 much more. Passes
when every measurement is finite and bf16's exceeds fp32's tenfold at every length (on a CPU it
is over a hundredfold: tests/probe/test_run.py); the values, the first token's share included,
are recorded.
"""

import pytest

from evalkit.package_data import shipped_folder

pytestmark = pytest.mark.gpu

METRIC = {"tokens": "attn_diff", "length": "logit_diff_first"}


@pytest.mark.parametrize("kind", ["tokens", "length"])
def test_bf16_against_fp32_on_the_tiny_base(kind, device, sizes, record, tmp_path):
    from evalkit.probe import run_probe

    options = {"n_texts": sizes.probe["n_texts"], "dtypes": "bf16,fp32", "device": device}
    options |= {"seq_len": sizes.probe["seq_len"]} if kind == "tokens" else {"lengths": sizes.probe_lengths}
    result = run_probe(kind, shipped_folder("checkpoints") / "tiny-base", tmp_path, **options)
    rows = [r for r in result["rows"] if r["layers"] == "all" and r["delta1"] == 0]
    value = {(r["metric"], r["dtype"], r["length"]): r["value"] for r in rows if r["column"] is None}
    lengths = sorted({length for _, _, length in value})
    ratios = {n: value[METRIC[kind], "bf16", n] / value[METRIC[kind], "fp32", n] for n in lengths}
    record(
        "bf16_probe",
        probe=kind,
        metric=METRIC[kind],
        bf16={n: value[METRIC[kind], "bf16", n] for n in lengths},
        fp32={n: value[METRIC[kind], "fp32", n] for n in lengths},
        bf16_per_fp32=ratios,
        # probe tokens: the first key column's share of the difference (the paper's Figure 1, middle)
        first_token_share={
            d: value[key] for d in ("bf16", "fp32") if (key := ("first_token_share", d, lengths[-1])) in value
        },
        seconds=result["provenance"]["seconds"],
        device=result["provenance"]["device"],
        passed=all(ratio >= 10 for ratio in ratios.values()),
    )
    assert result["provenance"]["device"].startswith(device)
    assert all(ratio >= 10 for ratio in ratios.values()), ratios
