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


def test_bench_lightthinker_refuses_impossible_sizes_and_writes_under_the_working_directory(
    tmp_path, monkeypatch, capsys, cache_dir
):
    import pytest

    from analysis.bench_lightthinker import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["--num-cache-tokens", "0"])  # reached the cache as a ValueError traceback
    assert "--num-cache-tokens must be >= 1" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):
        main(["--model", "bogus"])  # a FileNotFoundError traceback
    assert "--model bogus: no conf/model/bogus.yaml" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    main(["--lengths", "48", "--thought-tokens", "16", "--num-cache-tokens", "3", "--prompt-tokens", "8",
          "--repeats", "1", "--cache-dir", cache_dir])  # fmt: skip
    assert len(list((tmp_path / "runs" / "bench_lightthinker").glob("bench-*.json"))) == 1  # not under the repo
