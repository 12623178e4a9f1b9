"""The LightThinker serving benchmark runs, writes JSON, and its measured rows equal the layout's prediction."""

from __future__ import annotations

import json


def test_bench_lightthinker_small(tmp_path, cache_dir):
    from analysis.bench_lightthinker import main

    out = tmp_path / "bench.json"
    argv = ["--lengths", "96", "--thought-tokens", "16", "--num-cache-tokens", "3", "--prompt-tokens", "8"]
    report = main([*argv, "--repeats", "1", "--batch", "2", "--cache-dir", cache_dir, "--out", str(out)])
    r = report["results"][0]
    assert r["thoughts"] == 5 and r["lightthinker"]["forced_tokens"] == 2 * 5 * 4
    assert r["lightthinker"]["final_rows"] == r["predicted_final_rows"] == 8 + 5 * 4 + 15
    assert r["full"]["final_rows"] == 8 + 95 and r["final_rows_ratio"] < 0.5
    assert json.loads(out.read_text())["num_cache_tokens"] == 3
