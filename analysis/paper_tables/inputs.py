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

from analysis.slim_runs import DROPPED
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


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _objects(rows: Any, fields: dict[str, Any]) -> str | None:
    """Why ``rows`` is not a list of objects whose ``fields`` pass their checks (None when it is)."""
    if not isinstance(rows, list):
        return f"a {type(rows).__name__}, not a list"
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"entry {i} is not an object"
        if bad := [k for k, ok in fields.items() if not ok(row.get(k))]:
            return f"entry {i}: {', '.join(bad)} missing or of another type"
    return None


def schedule_problem(data: dict[str, Any]) -> str | None:
    """Why an abridge_allocate ``schedule.json`` cannot be drawn as Fig. 6 (None when it can)."""
    quotas, costs = data.get("quotas"), data.get("costs")
    if not (isinstance(quotas, list) and quotas and all(map(_int, quotas))):
        return "quotas is not a list of integers"
    if not (isinstance(costs, list) and len(costs) == len(quotas) and all(map(_number, costs))):
        return f"costs is not a list of {len(quotas)} numbers (one per layer)"
    if not _int(data.get("base_quota")):
        return "base_quota is not an integer"
    if "base_heldout_ce" in data and not _number(data["base_heldout_ce"]):
        return "base_heldout_ce is not a number"
    return None


def r2_problem(data: Any) -> str | None:
    """Why a KVzap fit's ``r2.json`` cannot feed KVzap Table 1 (None when it can)."""
    if isinstance(data, list) and not data:
        return "no heads"
    return _objects(data, {"kind": lambda v: isinstance(v, str), "layer": _int, "head": _int, "r2": _number,
                           "det": _number})  # fmt: skip


def throughput_problem(data: dict[str, Any]) -> str | None:
    """Why a bench_throughput JSON cannot feed Fig. 3b/3d (None when it can)."""
    tp = data["throughput"]
    if not isinstance(data.get("meta"), dict):
        return "meta is not an object"
    if not isinstance(tp, dict):
        return "throughput is not an object of policies"
    for policy, per in tp.items():
        if not (isinstance(per, dict) and all(isinstance(v, dict) and _number(v.get("tokens_per_s"))
                                              and _number(v.get("ratio_vs_full")) for v in per.values())):  # fmt: skip
            return f"throughput of {policy!r} is not an object of batch sizes with tokens_per_s and ratio_vs_full"
    if problem := _objects(data["finish"], {"run_dir": lambda v: isinstance(v, str), "seconds": _number,
                                            "seconds_per_request": _number, "requests": _int, "batch": _int}):  # fmt: skip
        return f"finish: {problem}"
    return None


def zoomr_bench_problem(data: dict[str, Any]) -> str | None:
    """Why a bench_zoomr / agreeability JSON cannot feed the ZoomR figures (None when it can)."""
    ag = data.get("agreeability")
    if ag is not None and not (isinstance(ag, list) and all(v is None or _number(v) for v in ag)):
        return "agreeability is not a list of numbers"
    for key in ("meta", "formula"):
        if key in data and not isinstance(data[key], dict):
            return f"{key} is not an object"
    meta, formula = data.get("meta") or {}, data.get("formula") or {}
    if bad := [f"meta.{k}" for k in ("para", "summary", "generate") if k in meta and not _number(meta[k])]:
        return f"{', '.join(bad)} not a number"
    if "n_all" in formula and not _number(formula["n_all"]):
        return "formula.n_all is not a number"
    if _number(meta.get("generate")) and meta["generate"] <= 0:
        return "meta.generate is not positive"
    return None


def _add(inputs: Inputs, target: list[JsonInput], item: JsonInput, problem: str | None, what: str,
         file: Path | None = None) -> None:  # fmt: skip
    """``item`` into ``target``, or its ``problem`` into the unusable inputs (naming ``file``, else its path)."""
    if problem:
        inputs.problems.append(f"{file or item.path}: not a usable {what} ({problem})")
    else:
        target.append(item)


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
                _add(inputs, inputs.throughput, JsonInput(path, data), throughput_problem(data), "throughput bench")
            elif isinstance(data, dict) and ("formula" in data and "measured" in data or "agreeability" in data):
                # bench_zoomr, or zoomr_testbed's agreeability_<arm>
                _add(inputs, inputs.zoomr_bench, JsonInput(path, data), zoomr_bench_problem(data), "ZoomR bench")
            else:
                return False
            return True
        if (path / "results.jsonl").exists() and (path / "config.json").exists():
            add_eval(path, inputs)
        elif (path / "schedule.json").exists():
            data = read_json_object(path / "schedule.json", "quota schedule")
            _add(inputs, inputs.allocations, JsonInput(path, data, _config(path)), schedule_problem(data),
                 "quota schedule", path / "schedule.json")  # fmt: skip
        elif (path / "r2.json").exists():
            data = read_json(path / "r2.json", "KVzap fit report")
            _add(inputs, inputs.kvzap_fits, JsonInput(path, data, _config(path)), r2_problem(data),
                 "KVzap fit report", path / "r2.json")  # fmt: skip
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
    # without the per-row texts no table reads (the fields slim copies drop): every run's were held until the end,
    # 47 MiB per 480-row run of 100k-character samples, gigabytes over a paper's sweep of arms
    run.rows = [{k: v for k, v in r.items() if k not in DROPPED} for r in run.rows]
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
