"""Find and read the run directories that feed the paper tables; every unusable input is kept with its reason.

Recognised (a directory is searched recursively, skipping ``wandb/``, ``checkpoints/``, ``final/``):
- evaluation run: ``config.json`` + ``results.jsonl`` (``python -m eval``), read with :func:`eval.compare.load_run`;
  its arm is named from its config: ``run_name`` (defaults to the method name), method ``full`` without one;
- AbridgeKV allocation: ``schedule.json`` (``python -m train +method=abridge_allocate``);
- KVzap surrogate fit: ``r2.json`` + ``config.json`` (``python -m train +method=kvzap``);
- throughput bench: a JSON with ``throughput`` and ``finish``, e.g. ``bench_throughput.json``
  (``python -m analysis.bench_throughput``);
- ZoomR bench: a JSON with ``formula`` and ``measured`` (``python -m analysis.bench_zoomr``), or with the
  ``agreeability`` of every recompute (``analysis.zoomr_testbed``'s ``agreeability_<arm>.json``);
- training run (``summary.json`` + ``config.json``): recognised, used by no table (listed as such).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.compare import CompareError, Run, load_run
from eval.metrics import compute_metrics
from zoomr.jsonl import BadRowError, read_json, read_json_object

PRUNE = {"wandb", "checkpoints", "final", ".hydra", "pairs", "surrogates"}
# JSON files of run directories (read through their directory, never as benches)
RUN_FILES = {"config.json", "metrics.json", "summary.json", "fingerprint.json", "schedule.json", "r2.json",
             "manifest.json", "table.json", "abridge.json"}  # fmt: skip


@dataclass
class EvalArm:
    """One evaluation run: the arm (named from its config), its method and its pooled metrics."""

    run: Run
    config: dict[str, Any]
    model: str
    label: str
    method: str  # method name; "full" when the run had no +method=
    metrics: dict[str, Any]  # eval.metrics.compute_metrics: pooled + by_competition

    @property
    def benchmark(self) -> str:
        return self.run.benchmark

    @property
    def method_config(self) -> dict[str, Any]:
        return self.config.get("method") or {}

    @property
    def pooled(self) -> dict[str, Any]:
        return self.metrics["pooled"]


@dataclass
class JsonInput:
    path: Path
    data: Any
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inputs:
    evals: list[EvalArm] = field(default_factory=list)
    allocations: list[JsonInput] = field(default_factory=list)
    kvzap_fits: list[JsonInput] = field(default_factory=list)
    throughput: list[JsonInput] = field(default_factory=list)
    zoomr_bench: list[JsonInput] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)  # recognised, feeds no table
    problems: list[str] = field(default_factory=list)  # "<input>: <why it could not be used>"

    def models(self) -> list[str]:
        return list(dict.fromkeys(a.model for a in self.evals))

    def arms(self, model: str, benchmark: str | None = None) -> list[EvalArm]:
        return [a for a in self.evals if a.model == model and (benchmark is None or a.benchmark == benchmark)]


def _config(run_dir: Path) -> dict[str, Any]:
    f = run_dir / "config.json"
    return read_json_object(f, "run config") if f.exists() else {}


def candidates(path: Path) -> list[Path]:
    """Every directory at or under ``path`` (pruned) and the JSON files in them that may be benches, or the file."""
    if path.is_file():
        return [path]
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in PRUNE and not d.startswith("."))
        out.append(Path(root))
        out += [Path(root) / f for f in sorted(files) if f.endswith(".json") and f not in RUN_FILES]
    return out


def classify(path: Path, inputs: Inputs) -> bool:
    """Add ``path`` to ``inputs`` if it is a recognised run or JSON; True when it was."""
    try:
        if path.is_file():
            if path.suffix != ".json" or path.name in RUN_FILES:
                return False
            data = read_json(path, "bench report")
            if isinstance(data, dict) and "throughput" in data and "finish" in data:
                inputs.throughput.append(JsonInput(path, data))
            elif isinstance(data, dict) and ("formula" in data and "measured" in data or "agreeability" in data):
                inputs.zoomr_bench.append(JsonInput(path, data))  # bench_zoomr, or zoomr_testbed's agreeability_<arm>
            else:
                return False
            return True
        if (path / "results.jsonl").exists() and (path / "config.json").exists():
            add_eval(path, inputs)
        elif (path / "schedule.json").exists():
            inputs.allocations.append(JsonInput(path, read_json_object(path / "schedule.json", "quota schedule"), _config(path)))
        elif (path / "r2.json").exists():
            inputs.kvzap_fits.append(JsonInput(path, read_json(path / "r2.json", "KVzap fit report"), _config(path)))
        elif (path / "summary.json").exists() and (path / "config.json").exists():
            inputs.unused.append(f"{path}: training/data run ({_config(path).get('run_name', '?')}), feeds no table")
        else:
            return False
    except BadRowError as e:  # names the file and where the parser stopped
        inputs.problems.append(f"{path}: unreadable ({e})")
    except (OSError, KeyError) as e:
        inputs.problems.append(f"{path}: unreadable ({type(e).__name__}: {e})")
    return True


def base_model_name(model: dict[str, Any]) -> str:
    """The model an arm is compared within: a checkpoint fine-tuned from another (AbridgeKV, LightThinker:
    its training run's ``method.init_from``, followed to the start) is grouped with the model it started from,
    so its full-KV reference and matched baselines are the base model's arms (AbridgeKV Table 1)."""
    from zoomr.models import checkpoint_name
    from zoomr.rundir import started_from

    name, hf_id, seen = model["name"], model.get("hf_id"), set()
    while hf_id and hf_id not in seen:
        seen.add(hf_id)
        if (start := started_from(str(hf_id).rstrip("/"))) is None:
            break
        hf_id = os.path.realpath(start)  # a run directory reached through a link is named as itself
        name = checkpoint_name(name, hf_id)
    return name


def add_eval(path: Path, inputs: Inputs) -> None:
    config = _config(path)
    model, method_config = config.get("model"), config.get("method") or {}
    if not (isinstance(model, dict) and isinstance(model.get("name"), str) and isinstance(method_config, dict)):
        inputs.problems.append(f"{path / 'config.json'}: not an evaluation run config (needs a 'model' object with "
                               "a 'name', and a 'method' object if any)")  # fmt: skip
        return
    method = method_config.get("name") or "full"
    label = str(config.get("run_name") or method)
    model = base_model_name(model)
    try:
        run = load_run(path, label)
    except CompareError as e:
        inputs.problems.append(str(e))
        return
    for other in inputs.evals:
        if (other.model, other.label, other.benchmark) == (model, label, run.benchmark):
            inputs.problems.append(
                f"{path}: arm {label!r} of {model} on {run.benchmark} already read from {other.run.path}; "
                "this one is not used (give one of them another run_name)"
            )
            return
    inputs.evals.append(EvalArm(run, config, model, label, method, compute_metrics(run.rows)))


def discover(patterns: list[str]) -> Inputs:
    """Read every recognised input under the patterns (``**`` recurses); a pattern or path that yields
    nothing is reported in ``problems`` by name."""
    inputs = Inputs()
    seen: set[Path] = set()
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(str(pattern)), recursive=True))
        if not matches:
            inputs.problems.append(f"{pattern}: matches no file or directory")
            continue
        found = 0
        for match in map(Path, matches):
            for c in candidates(match):
                key = c.resolve()
                if key in seen:
                    continue
                seen.add(key)
                found += classify(c, inputs)
        if not found:
            inputs.problems.append(f"{pattern}: holds no run directory or bench JSON that paper_tables reads")
    return inputs
