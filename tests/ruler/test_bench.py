from perf.ruler_data import run, to_markdown


def test_bench_rows_and_table(tokenizer):
    rows = run(["niah_single_1", "qa_1"], [2048], 5, tokenizer)
    assert [(r.task, r.length, r.samples) for r in rows] == [("niah_single_1", 2048, 5), ("qa_1", 2048, 0)]
    assert rows[0].samples_per_second > 0 and "qa_dir=" in rows[1].skipped
    table = to_markdown(rows)
    assert table.splitlines()[0].startswith("| task | length | samples |") and "skipped:" in table
