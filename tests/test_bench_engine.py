"""The decode / policy-overhead benchmarks and the prepared GPU check run and write what they promise."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from analysis import bench_decode, bench_policy_overhead, gpu_check

TINY_DECODE = ["--contexts", "80", "--batches", "1", "2", "--budget", "24", "--decode-steps", "2", "--repeats", "1",
               "--prefill-chunk", "32", "--prompt-tokens", "16", "--policies", "full", "streaming", "h2o",
               "--e2e-prompt", "12", "--e2e-new", "3"]  # fmt: skip


def test_bench_decode_writes_the_rows_under_the_working_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    report = bench_decode.main(TINY_DECODE)
    err = capsys.readouterr().err  # a bar per cell: the caches filled, then the steps (minutes at 8K x 8, silent)
    assert "ctx 80 B1: fill, then timed steps" in err and "ctx 80 B2: fill, then timed steps" in err and "/7 " in err
    written = list((tmp_path / "runs" / "bench_decode").glob("*/bench_decode.json"))
    assert len(written) == 1 and (written[0].parent / "bench_decode.md").exists()
    rows = json.loads(written[0].read_text())["rows"]
    assert rows == report["rows"] and len(rows) == 2 * 5  # 2 batches × (3 policies + 2 references)
    for r in rows:
        for key in (
            "policy",
            "context",
            "batch",
            "step_ms",
            "ratio_vs_full",
            "ratio_vs_hf_dynamic",
            "rows_over_full",
        ):
            assert key in r, key
        assert r["step_ms"] > 0 and r["context"] == 80
        assert ("ratio_vs_hf_sliding_window" in r) == (r["policy"] in ("streaming", "h2o"))
    by = {(r["policy"], r["batch"]): r for r in rows}
    assert by["full", 1]["ratio_vs_full"] == 1.0 and by["hf_dynamic", 2]["ratio_vs_hf_dynamic"] == 1.0
    assert by["streaming", 1]["rows_over_full"] < 0.5  # the budget holds: 24 of ~80 rows
    assert by["hf_sliding_window", 1]["rows"] == by["streaming", 1]["rows"]  # the same rows as the reference
    assert [e["batch"] for e in report["e2e"]] == [1, 2] and all(e["same_tokens"] for e in report["e2e"])


def test_bench_decode_rejects_bad_settings(capsys):
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--contexts", "100", "--budget", "512"])
    assert "must exceed --budget" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--policies", "nope"])
    assert "unknown policies ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a FileNotFoundError traceback once the policies were set up
        bench_decode.parse_args(["--model", "nope"])
    assert "--model nope: no conf/model/nope.yaml" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_policy_overhead.parse_args(["--policies", "full", "nope"])
    assert "unknown policies ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a batch of 0 crashed deep in the model; the others ran on nonsense
        bench_decode.parse_args(["--batches", "1", "0", "--threads", "0"])
    assert "--batches, --threads must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [(["--bandwidth-tbs", "-3"], "--bandwidth-tbs must be a positive number of TB/s, got -3.0"),
     (["--bandwidth-tbs", "0"], "--bandwidth-tbs must be a positive number of TB/s, got 0.0"),
     (["--launch-us", "nan"], "--launch-us must be a number of µs >= 0, got nan"),
     (["--threads", "0"], "--threads must be >= 1"),
     (["--warmup", "-1"], "--warmup must be >= 0")],
)  # fmt: skip
def test_policy_overhead_refuses_an_impossible_projection_before_timing(argv, message, capsys):
    """A negative bandwidth projected negative step times and ratios into the table (exit 0), 0 a ZeroDivisionError
    after the timing, a NaN launch cost a table of nan, --threads 0 torch's RuntimeError traceback."""
    with pytest.raises(SystemExit):
        bench_policy_overhead.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--samples", "0"], ["--repeats", "0"], ["--pathological", "-1"]])
def test_bench_grading_rejects_bad_sizes_before_starting_workers(argv, capsys):
    from eval import bench_grading

    with pytest.raises(SystemExit):  # --repeats 0 crashed with an IndexError after the samples were built
        bench_grading.main([*argv, "--out", "unused"])
    assert "--samples and --repeats must be >= 1" in capsys.readouterr().err


def test_policy_overhead_simulation(tmp_path):
    report = bench_policy_overhead.main([
        "--batch", "2", "--context", "300", "--prompt", "20", "--budget", "64", "--kv-heads", "2", "--q-heads", "4",
        "--head-dim", "8", "--steps", "6", "--warmup", "2", "--policies", "full", "streaming", "h2o", "rkv",
        "evict_recency", "kvzap", "--out", str(tmp_path)])  # fmt: skip
    rows = {r["policy"]: r for r in report["rows"]}
    assert json.loads((tmp_path / "policy_overhead.json").read_text())["rows"] == report["rows"]
    assert rows["full"]["rows"] == 300 and rows["streaming"]["rows"] == 64
    assert rows["evict_recency"]["rows"] == 20 + (280 // 512) * 128 + 280 % 512
    for r in rows.values():
        assert r["mean_us_per_layer"] > 0 and r["ops_per_layer"] > 0 and r["h100_step_ms"] > 0
    # an evicting policy does more work per step than full KV's single append, H2O most (it scores every row)
    assert rows["streaming"]["ops_per_layer"] > rows["full"]["ops_per_layer"]
    assert rows["h2o"]["ops_per_layer"] > rows["streaming"]["ops_per_layer"]
    # KVzap: the window (128) and a 0.3-0.7 share of the 172 older rows per (b, h), scored by its surrogate
    assert 128 + 0.3 * 172 <= rows["kvzap"]["rows"] <= 128 + 0.7 * 172
    assert rows["kvzap"]["ops_per_layer"] > rows["full"]["ops_per_layer"]


def test_policy_overhead_kvzap_evicts_rows_leaving_the_window():
    """The simulated KVzap drops about half of the rows that leave its window each step."""
    args = bench_policy_overhead.parse_args(["--batch", "2", "--context", "300", "--prompt", "20", "--kv-heads", "2",
                                             "--q-heads", "4", "--head-dim", "8", "--policies", "kvzap"])  # fmt: skip
    sim = bench_policy_overhead.Simulation("kvzap", args)
    store = sim.cache.layers[0].store
    before = int(store.n.sum())
    for _ in range(40):
        sim.step()
    dropped = before + 40 * 2 * 2 - int(store.n.sum())  # 40 steps x 2 sequences x 2 KV heads appended
    assert 0.25 * 160 <= dropped <= 0.75 * 160


def test_gpu_check_dry_run_memory_section(tmp_path, capsys):
    report = gpu_check.main(["--dry-run", "--only", "memory", "--out", str(tmp_path)])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  memory ")]
    assert len(lines) == 3  # each arm's line at 4 significant digits ('seconds': 0.4866371740026807 before)
    assert all(float(x) == float(f"{float(x):.4g}") for x in re.findall(r"\d+\.\d+(?:e-?\d+)?", "".join(lines)))
    sec = report["sections"]["memory"]
    assert "error" not in sec, sec.get("error")
    rows = {r["arm"]: r for r in sec["rows"]}
    assert set(rows) == {"full", "zoomr", "abridge_4to1"}
    assert rows["abridge_4to1"]["kv_bytes_per_seq_device"] < rows["full"]["kv_bytes_per_seq_device"]
    assert rows["zoomr"]["device_bytes_held"] < rows["full"]["device_bytes_held"]  # its full KV is on host
    assert json.loads((tmp_path / "gpu_check.json").read_text())["sections"]["memory"]["rows"] == sec["rows"]


def test_gpu_check_exits_non_zero_when_a_section_failed(tmp_path, monkeypatch, capsys):
    """A section that raised was recorded in the report and the run exited 0, even when every section had failed:
    a batch job on a GPU machine saw success. The report still holds every section; the status is 1 now."""

    def broken(args, tok):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(gpu_check, "section_memory", broken)
    argv = ["--dry-run", "--only", "memory", "--out", str(tmp_path)]
    assert gpu_check.cli(argv) == 1
    assert "[gpu_check] failed: memory" in capsys.readouterr().err
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["sections"]["memory"]["error"] == "RuntimeError: CUDA out of memory"
    monkeypatch.undo()
    assert gpu_check.cli(argv) == 0


@pytest.mark.slow
def test_gpu_check_dry_run_every_section(tmp_path):
    report = gpu_check.main(["--dry-run", "--out", str(tmp_path)])
    assert set(report["sections"]) == set(gpu_check.SECTIONS)
    for name, sec in report["sections"].items():
        assert "error" not in sec, (name, sec.get("error"))
        assert sec["rows"], name


def test_gpu_check_dry_run_writes_under_runs_not_into_the_committed_gpu_results(tmp_path, monkeypatch):
    """A dry run without --out wrote its tiny-shape CPU numbers into analysis/results/gpu/, where the GPU run's
    results are kept (and read as such); now into runs/gpu_check/dry_run/ under the working directory."""
    monkeypatch.chdir(tmp_path)
    out = Path(gpu_check.parse_args(["--dry-run"]).out)
    assert out == Path("runs/gpu_check/dry_run") and gpu_check.RESULTS_DIR not in (out.resolve(), *out.resolve().parents)
    assert gpu_check.parse_args(["--dry-run", "--out", str(tmp_path / "g")]).out == str(tmp_path / "g")


def test_gpu_check_refuses_the_full_run_without_a_gpu(capsys):
    if gpu_check.torch.cuda.is_available():
        assert gpu_check.parse_args([]).device.startswith("cuda")
        return
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])
    assert "needs a GPU" in capsys.readouterr().err


def test_gpu_check_dry_run_keeps_the_sizes_given_and_refuses_impossible_ones(capsys):
    """--dry-run replaced every size by its tiny one, also those given on the command line (--flex-blocks 128 ran 32
    and 64 without a word), and no size was checked (--repeats 0, --tp-batches 0 ran into per-section errors)."""
    args = gpu_check.parse_args(["--dry-run", "--flex-blocks", "128", "--repeats", "3"])
    assert args.flex_blocks == [128] and args.repeats == 3
    assert args.flex_layers == gpu_check.DRY_SIZES["flex_layers"] and args.tp_batches == [1, 2]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--dry-run", "--repeats", "0", "--tp-batches", "1", "0"])
    assert "--repeats, --tp-batches must be >= 1" in capsys.readouterr().err


def test_policy_overhead_counts_what_a_scatter_writes_not_its_whole_buffer():
    """An in-place scatter returns its whole destination; the bytes it writes are the indexed elements only."""
    dest, mask, ones = torch.zeros(10, 4), torch.arange(40).view(10, 4) % 6 == 0, torch.ones(2, 4)
    rows, cols, rows2, flat = torch.tensor([1, 2, 3]), torch.tensor([0, 1]), torch.tensor([0, 5]), torch.tensor([3, 9, 11])
    cases = [
        (lambda: dest.__setitem__(rows, 1.0), 3 * 4),  # 3 rows of 4
        (lambda: dest.__setitem__((slice(None), cols), 2.0), 10 * 2),  # a column pair, every row
        (lambda: dest.__setitem__(mask, 3.0), 7),  # a mask with 7 Trues
        (lambda: dest.index_add_(0, rows2, ones), 2 * 4),
        (lambda: dest.view(-1).scatter_(0, flat, 4.0), 3),
        (lambda: dest[2:4].fill_(5.0), 2 * 4),  # a view: its own size
    ]
    for op, elements in cases:  # the index tensors are built outside: only the write is counted
        counter = bench_policy_overhead._CountOps()
        with counter:
            op()
        assert counter.bytes_written == elements * 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workers", "1", "0"], "--workers must be >= 1, got 0"),
        (["--timeout", "nan"], "--timeout must be > 0 and finite, got nan"),
        (["--start-method", "bogus"], "--start-method must be forkserver|spawn, got 'bogus'"),
    ],
)
def test_bench_grading_rejects_a_pool_it_cannot_start(argv, message, capsys):
    """Each was the pool's ValueError traceback (a NaN timeout: int(nan) while building the plain loop)."""
    from eval import bench_grading

    with pytest.raises(SystemExit):
        bench_grading.main([*argv, "--out", "unused"])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("device", ["mps", "bogus", "cuda:x", "auto", "cuda:99"])
@pytest.mark.parametrize("script", ["gpu_check", "bench_decode", "bench_lightthinker"])
def test_a_device_this_machine_lacks_is_refused_before_the_run(script, device, tmp_path, monkeypatch, capsys):
    """``--device mps`` (or a typo, or a cuda:N past this machine's GPUs) ran: gpu_check --dry-run wrote a report of
    one torch error per section and exited 0; the benches failed with torch's traceback (a list of 20 device types).
    Now one line naming the option and what this machine has, before anything is written."""
    import importlib

    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"analysis.{script}")
    argv = ["--device", device] + (["--dry-run", "--out", str(tmp_path / "g")] if script == "gpu_check" else [])
    with pytest.raises(SystemExit):
        module.main(argv)
    err = capsys.readouterr().err
    assert f"--device {device}: " + ("this machine has" if device == "cuda:99" else "give cpu, cuda or cuda:N") in err
    assert not list(tmp_path.iterdir())  # no report, no runs/
