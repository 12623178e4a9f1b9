"""data_prep.bench_summarize refuses settings it cannot bench when reading its command line, before a server starts."""

from __future__ import annotations

import pytest

from data_prep.bench_summarize import main


@pytest.mark.parametrize(("argv", "message"), [
    (["--servers", "fake", "vllm"], "invalid choice: 'vllm'"),  # a KeyError traceback after the fake server's runs
    (["--concurrency", "1", "0"], "--concurrency must be >= 1, got 1 0"),  # EndpointSettings' traceback after c=1
    (["--rows", "-1"], "--rows must be >= 1"),  # benched every row but one
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--latency", "nan"], "--latency must be a number of seconds >= 0"),
])  # fmt: skip
def test_unusable_settings_are_refused_by_flag(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out", str(tmp_path / "bench.json")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()
