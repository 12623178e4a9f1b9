"""The miniature reproduction (issue 15): every method and baseline on the CPU recall testbed, one command.

    python -m analysis +task=miniature [task.arms=[full,streaming,abridge]] [task.n=256]
        [task.test_seed=2000003] [task.trace_tokens=1024] [task.out=analysis/results/miniature]

Trains or reuses every model the chosen arms need (``python -m train``, runs under ``runs/train/mini-*``,
resumable; :mod:`analysis.miniature_plan`), then evaluates every arm through the evaluator (``python -m
eval benchmark=testbed``, greedy, one run directory per arm under ``<out>/arms/``, resumable) on the same
held-out problems (``task.test_seed``, disjoint from the training streams). Baselines get the measured
mean resident rows of the arm they are compared with. Writes ``table.md``, ``table.csv``, ``results.json``
(``{"meta": …, "arms": [{"name", "method", "rows_over_full", "answer_accuracy", "recall", "ci_vs_full",
…}]}``) and the figures (:mod:`analysis.miniature_report`). Paired 95% bootstrap intervals of answer
accuracy against the full-KV arm of the same model family (eval/bootstrap.py, one index matrix).
A rerun does only what is missing: a finished model or arm is reused when its command is unchanged (a model
also when its dependencies are the ones it was trained on; :func:`ensure_model`).
``task.train=false`` trains nothing: the table is rebuilt from finished arm directories (e.g. the committed slim
copies, no checkpoint needed) and the arms still missing run on the checkpoints already under ``runs/train``
(:func:`check_checkpoints` refuses, before anything runs, an arm whose checkpoint is not there).
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any

from analysis.miniature_plan import (
    ARM_MINUTES,
    ARMS,
    MEASURED_AT,
    MODELS,
    TRAIN_MINUTES,
    Arm,
    full_arm,
    plan,
    renamed_hint,
    training_seeds,
)
from eval.arms import COMMAND_FILE, arm_done, experiment, load_arm, run_arm, run_command, testbed_command
from zoomr.jsonl import BadRowError, read_json, read_json_object
from zoomr.paths import output_dir, output_problem
from zoomr.rundir import write_json
from zoomr.schemas.checks import SettingsError


def checkpoint(model: str, trace_tokens: int) -> Path:
    """The checkpoint the arms of ``model`` load (KVzap serves its base model with the surrogates)."""
    m = MODELS[model]
    if m.serves:
        return checkpoint(m.serves, trace_tokens)
    return Path("runs/train") / m.run_name(trace_tokens) / "final"


def substitutions(model: str, trace_tokens: int) -> dict[str, str]:
    """``{name}`` -> checkpoint of each model ``model`` needs, ``{name_name}`` -> its run name."""
    subs = {}
    for dep in MODELS[model].needs:
        subs[dep] = str(checkpoint(dep, trace_tokens))
        subs[f"{dep}_name"] = checkpoint(dep, trace_tokens).parent.name
    return subs


def done_file(model: str, trace_tokens: int) -> Path:
    m = MODELS[model]
    if m.done:
        return Path(m.done.format(**substitutions(model, trace_tokens)))
    return Path("runs/train") / m.run_name(trace_tokens) / "summary.json"


def train_command(model: str, trace_tokens: int) -> list[str]:
    m = MODELS[model]
    args = [o.format(**substitutions(model, trace_tokens)) for o in m.overrides]
    if m.entry != "train":
        return [sys.executable, "-m", m.entry, *args, "logger=none"]
    length = [f"data.trace_tokens={trace_tokens}"] if "data=" in " ".join(args) else []
    if m.overrides[0] == "+method=abridge":  # the whole trace fits (prompt + response + end of turn)
        length.append(f"method.max_response_tokens={trace_tokens + 16}")
    return [sys.executable, "-m", "train", *args, *length, f"run_name={m.run_name(trace_tokens)}", "logger=none"]


def benchmark_options(model: str, task: Any) -> dict[str, Any]:
    """The testbed the model was trained on, at the task's length, on the held-out problems."""
    summaries = MODELS[model].summaries or any(MODELS[d].summaries for d in MODELS[model].needs)
    return {"trace_tokens": task.trace_tokens, "summaries": summaries, "model_writes_summaries": summaries,
            "paragraph_topics": summaries, "n_test": task.n, "test_seed": task.test_seed}  # fmt: skip


def arm_dir(task: Any, name: str) -> Path:
    return Path(task.out) / "arms" / name.replace("@", "_at_")


def eval_command(arm: Arm, task: Any, match_rows: float | None) -> list[str]:
    method = [f"+method={arm.yaml}", *arm.overrides] if arm.yaml else []
    if match_rows is not None:
        method.append(f"method.budget_rows={max(8, round(match_rows * arm.match_scale))}")
    ckpt = checkpoint(arm.model, task.trace_tokens)
    return testbed_command(ckpt, arm_dir(task, arm.name), benchmark_options(arm.model, task), method, task.batch_size)


MODEL_RECORD = "miniature_model.json"  # beside a model's done file: the command that made it, its inputs' digests
ARM_RECORD = "miniature_arm.json"  # in an arm's directory: the digest of its model's done file when it was evaluated


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def model_record(name: str, trace_tokens: int) -> dict[str, Any]:
    """What a finished model was made from: its command line and the digest of each dependency's done file
    (a retrained dependency writes a new ``summary.json`` / manifest / surrogate, so its digest changes)."""
    cmd = train_command(name, trace_tokens)
    return {"command": cmd[1:], "needs": {d: _digest(done_file(d, trace_tokens)) for d in MODELS[name].needs}}


def ensure_model(name: str, task: Any) -> Path:
    """Train ``name`` unless it is finished from the same command and the same dependencies.

    A finished model whose record (:data:`MODEL_RECORD`) names another command goes back to its entry point,
    whose own guard (:func:`zoomr.rundir.prepare_run`, the pairs' ``plan.json``) finishes at once if the settings
    are equal and refuses, naming them, if the recipe changed; one trained on an older dependency is refused
    here, since retraining it silently would discard it and reusing it would mislabel every arm on it."""
    cmd = train_command(name, task.trace_tokens)
    if task.dry_run:
        print(f"{MODELS[name].entry}: " + shlex.join(cmd[1:]))
        return checkpoint(name, task.trace_tokens)
    done = done_file(name, task.trace_tokens)
    record_path = done.parent / MODEL_RECORD
    record = model_record(name, task.trace_tokens)
    if done.exists() and record_path.exists():
        old = read_json_object(record_path, "miniature model record")
        stale = [d for d, h in old.get("needs", {}).items() if record["needs"].get(d) != h]
        if stale:
            raise SystemExit(
                f"miniature: {name} ({done.parent}) was made from an earlier {', '.join(stale)} than the one now in "
                f"runs/ ({', '.join(str(done_file(d, task.trace_tokens).parent) for d in stale)}); move {done.parent} "
                "aside to retrain it on the new one"
            )
        if old.get("command") == record["command"]:
            return checkpoint(name, task.trace_tokens)
    run_command(cmd, task.threads, what=f"{MODELS[name].entry} {name}")
    if not done.exists():
        raise SystemExit(f"miniature: {MODELS[name].entry} {name} exited without writing {done}")
    write_json(record_path, record)
    return checkpoint(name, task.trace_tokens)


def arm_finished(name: str, task: Any) -> bool:
    """Whether arm ``name``'s directory holds a finished run of the command it would run now, which
    :func:`eval.arms.run_arm` reuses (an arm matched to another's rows: only once that arm is finished too)."""
    arm, directory = ARMS[name], arm_dir(task, name)
    saved = directory / COMMAND_FILE
    if not ((directory / "metrics.json").exists() and saved.exists()):
        return False
    match_rows = None
    if arm.match:
        if not arm_finished(arm.match, task):
            return False
        match_rows = load_arm(arm_dir(task, arm.match)).rows.mean()
    return experiment(read_json(saved, "arm command")) == experiment(eval_command(arm, task, match_rows)[1:])


def check_checkpoints(arms: list[str], task: Any) -> None:
    """``task.train=false``: refuse, before anything runs, an arm that must be evaluated on a checkpoint that is
    not there (an arm directory holding a finished run of the same command needs none; one of another command,
    e.g. another ``task.n``, is evaluated again)."""
    unfinished = [a for a in arms if not arm_finished(a, task)]
    missing = {a: c for a in unfinished if not (c := checkpoint(ARMS[a].model, task.trace_tokens)).exists()}
    if missing and not task.dry_run:
        raise SystemExit(
            "miniature: task.train=false, but these arms have no finished run of the command they would run now "
            "(task.n, task.test_seed, ... as given) and their checkpoints are missing: "
            + "; ".join(f"{a} ({c})" for a, c in missing.items())
            + ". Train them (task.train=true) or copy the checkpoints there."
        )


def expected_time(models: list[str], arms: list[str], task: Any) -> str:
    """What is left to do and, at the sizes it was measured at (:data:`MEASURED_AT`), how long it should take here:
    the models not trained yet (``task.train``) and the arms not evaluated yet."""
    todo = [m for m in models if task.train and not done_file(m, task.trace_tokens).exists()]
    left = [a for a in arms if not arm_finished(a, task)]
    what = f"to do: {len(todo)} models to train, {len(left)} arms to evaluate"
    if {k: getattr(task, k) for k in MEASURED_AT} != MEASURED_AT:
        return f"{what} (times were measured at {', '.join(f'task.{k}={v}' for k, v in MEASURED_AT.items())} only)"
    unknown = [m for m in todo if m not in TRAIN_MINUTES]
    train, evaluate = sum(TRAIN_MINUTES.get(m, 0.0) for m in todo), ARM_MINUTES * len(left)
    more = f" + {len(unknown)} models never timed" if unknown else ""
    return f"{what}; expect ≈ {train + evaluate:.0f} min{more} on 2 CPU cores ({train:.0f} training, {evaluate:.0f} arms)"


def check_arm_models(arms: list[str], task: Any) -> None:
    """Refuse, before anything trains, an arm whose directory holds a finished run of another model than the plan
    evaluates (e.g. a run made under the arm names before 2026-12-06): its evaluation would be refused only after
    every model trained, by the evaluator's settings check inside the arm's log."""
    stale = []
    for a in arms:
        saved = arm_dir(task, a) / COMMAND_FILE
        if not ((arm_dir(task, a) / "metrics.json").exists() and saved.exists()):
            continue
        was = [x for x in read_json(saved, "arm command") if str(x).startswith("model.hf_id=")]
        now = f"model.hf_id={checkpoint(ARMS[a].model, task.trace_tokens)}"
        if was and was[0] != now:
            stale.append(f"{a}: {arm_dir(task, a)} holds a run of {was[0].split('=', 1)[1]}, the arm evaluates "
                         f"{now.split('=', 1)[1]}{renamed_hint(a)}")  # fmt: skip
    if stale:
        raise SystemExit("miniature: finished arm directories of other models; move them aside (or give another task.out):\n  "
                         + "\n  ".join(stale))


def ensure_arm(name: str, task: Any, threads: int | None = None, quiet: bool = False) -> None:
    """Evaluate arm ``name`` unless its directory holds a finished run of the same command. The digest of its
    model's done file is recorded (:data:`ARM_RECORD`) before it runs: an arm evaluated (also in part, by a run that was
    killed) on an earlier version of the model (trained again at the same path, so the command is unchanged) is
    refused, naming the directory to move aside."""
    arm = ARMS[name]
    match_rows = load_arm(arm_dir(task, arm.match)).rows.mean() if arm.match and not task.dry_run else None
    cmd = eval_command(arm, task, match_rows)
    if task.dry_run:
        print("eval:  " + shlex.join(cmd[1:]))
        return
    directory, model_done = arm_dir(task, name), done_file(arm.model, task.trace_tokens)
    digest = _digest(model_done) if model_done.exists() else None  # None: no model here (slim copies)
    record = directory / ARM_RECORD
    if digest and record.exists() and read_json_object(record, "miniature arm record").get("model_digest") != digest:
        raise SystemExit(
            f"miniature: arm {name} ({directory}) was evaluated on an earlier {arm.model} than the one now in runs/ "
            f"({model_done.parent}); move {directory} aside to evaluate the new one"
        )
    if digest and not arm_done(cmd, directory):  # before the eval: wherever it is killed, its rows' model is recorded
        directory.mkdir(parents=True, exist_ok=True)
        write_json(record, {"model": arm.model, "model_digest": digest})
    run_arm(cmd, directory, threads or task.threads, quiet)


def ensure_arms(arms: list[str], task: Any) -> None:
    """Evaluate ``arms`` (in plan order), ``task.arm_lanes`` at a time with ``threads // arm_lanes`` threads each
    and their output in ``<arm dir>/arm.log``; an arm given another arm's rows (``match``) starts once that arm
    is finished. Decoding the tiny testbed models is bound by Python overhead, not arithmetic: on 2 cores two
    1-thread lanes finish a pair of arms in 0.71 of the time of one 2-thread run after the other."""
    if task.dry_run or task.arm_lanes == 1:
        for a in arms:
            ensure_arm(a, task)
        return
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from tqdm import tqdm

    threads = max(1, task.threads // task.arm_lanes)
    pending, running, finished = list(arms), {}, set()
    bar = tqdm(total=len(arms), desc=f"miniature arms ({task.arm_lanes} at a time, output in <arm>/arm.log)")
    with ThreadPoolExecutor(task.arm_lanes) as pool:
        while pending or running:
            for a in [a for a in pending if ARMS[a].match is None or ARMS[a].match in finished]:
                if len(running) == task.arm_lanes:
                    break
                pending.remove(a)
                running[pool.submit(ensure_arm, a, task, threads, True)] = a
            if not running:  # a match outside the plan cannot happen (plan() adds it); guard against a hang
                raise SystemExit(f"miniature: arms {pending} wait for arms that are not planned")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                future.result()  # a failed arm stops the run (the arms already finished stay on disk)
                finished.add(name)
                bar.update(1)
                bar.set_postfix_str(name)
    bar.close()


def summarize(arms: list[str], task: Any) -> list[dict[str, Any]]:
    """One results.json entry per arm: rows over its family's full KV, accuracy, recall, paired CI."""
    from eval.bootstrap import index_matrix, paired_bootstrap

    loaded = {a: load_arm(arm_dir(task, a)) for a in arms}
    idx = index_matrix(task.n, task.n_resamples)
    out = []
    for name in arms:
        arm, r = ARMS[name], loaded[name]
        full = loaded[full_arm(arm)]
        if r.ids != full.ids:
            raise SystemExit(f"miniature: arm {name} and {full_arm(arm)} ran different problems; rerun both")
        if len(r.ids) != task.n:  # a finished arm holds every problem of its command unless its files were edited
            raise SystemExit(f"miniature: arm {name} ({arm_dir(task, name)}) holds {len(r.ids)} problems, not "
                             f"task.n={task.n}; move it aside and rerun")
        ci = paired_bootstrap(r.correct, full.correct, idx)
        recall_ci = paired_bootstrap(r.recall, full.recall, idx)
        testbed = r.metrics.get("testbed", {})
        out.append(
            {
                "name": name,
                "method": arm.method,
                "model": MODELS[arm.model].run_name(task.trace_tokens),
                "paired_with": full_arm(arm),
                "rows_over_full": float(r.rows.mean() / full.rows.mean()),
                "rows_mean": float(r.rows.mean()),
                "answer_accuracy": r.accuracy,
                "recall": float(r.recall.mean()),
                "ci_vs_full": [ci.low, ci.high],
                "delta_vs_full": ci.delta,
                "recall_ci_vs_full": [recall_ci.low, recall_ci.high],
                "recall_by_distance": {k[len("recall_"):]: v for k, v in testbed.items()
                                       if k.startswith("recall_") and not k.endswith("_n") and k != "recall_all"},
                "compression": float(r.metrics["pooled"].get("compression", 0.0)),
                **({"matched_to": arm.match, "match_scale": arm.match_scale} if arm.match else {}),
                # the selection run measures the paper's rule (k = c = 2): the arm named as its method, not variants
                **(selection(task) if name == "zoomr" else {}),
                **arm.extra,
            }
        )  # fmt: skip
    return out


SELECTION_DIR = "zoomr_selection"  # analysis.zoomr_testbed --arms zoomr_writes --out <out>/zoomr_selection


def selection(task: Any) -> dict[str, Any]:
    """ZoomR's selection hit rate at every cue (the paper's rule; is the defining paragraph in I_c?), from
    ``analysis.zoomr_testbed`` on the same model and problems (it reads the policy's recompute log), if run:
    ``python -m analysis.zoomr_testbed --model <base_sum> --n <n> --test-seed <seed> --window 64
    --arms zoomr_writes --out <out>/zoomr_selection``."""

    path = Path(task.out) / SELECTION_DIR / "results.json"
    if not path.exists():
        return {}
    sel = (read_json_object(path, "zoomr_testbed results.json").get("results") or {}).get("zoomr_writes", {}).get("selection")
    if not isinstance(sel, dict) or not {"hit_rate", "hit_rate_far", "chance"} <= set(sel):
        raise BadRowError(f"{path}: no zoomr_writes selection (hit_rate, hit_rate_far, chance) in it; rerun "
                          "analysis.zoomr_testbed with --arms zoomr_writes, or move it aside")
    out = {"selection_hit_rate": sel["hit_rate"], "selection_hit_rate_far": sel["hit_rate_far"],
           "selection_chance": sel["chance"], "selection_source": str(path)}  # fmt: skip
    for key in ("hit_rate_by_distance", "miss_votes"):  # absent from runs made before they were measured
        if key in sel:
            out[f"selection_{key}"] = sel[key]
    return out


def run_task(task_cfg: dict[str, Any], logger: dict[str, Any] | None = None) -> dict[str, Any]:
    from analysis.miniature_report import write_report
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.analysis import MiniatureTask

    task = to_dataclass(MiniatureTask, task_cfg)
    models, arms = plan(task.arms)  # an unknown arm is refused before anything runs
    trained_on = training_seeds(list(MODELS))  # every model's stream: a cached model may be any of them
    if task.test_seed in trained_on:
        raise SettingsError(f"task.test_seed={task.test_seed} is the training stream of {trained_on[task.test_seed]}: "
                         f"the test problems would be training problems; use a seed outside {sorted(trained_on)}")  # fmt: skip
    if problem := output_problem(task.out, directory=True):  # else found only after every model trained
        raise SettingsError(f"task.out={problem}")
    t0 = time.perf_counter()
    print(f"miniature: {len(models)} models ({', '.join(models)}), {len(arms)} arms, {task.n} problems, "
          f"test seed {task.test_seed}, {task.trace_tokens}-token traces -> {task.out}\n"
          f"miniature: {expected_time(models, arms, task)}", flush=True)  # fmt: skip
    check_arm_models(arms, task)
    if task.train:
        for m in models:
            ensure_model(m, task)
    else:
        check_checkpoints(arms, task)
    ensure_arms(arms, task)
    if task.dry_run:
        return {}
    results = {
        "meta": {
            "test_seed": task.test_seed,
            "n_problems": task.n,
            "trace_tokens": task.trace_tokens,
            "models": {m: str(checkpoint(m, task.trace_tokens)) for m in models},
            "threads": task.threads,
            "arm_lanes": task.arm_lanes,
            "seconds": round(time.perf_counter() - t0, 1),
        },
        "arms": summarize(arms, task),
    }
    write_report(results, Path(task.out))
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="the miniature reproduction (see python -m analysis +task=miniature)")
    p.add_argument("--arms", nargs="*", default=[])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--test-seed", type=int, default=2_000_003)
    p.add_argument("--trace-tokens", type=int, default=1024)
    p.add_argument("--out", type=output_dir, default="runs/miniature")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    run_task({"arms": a.arms, "n": a.n, "test_seed": a.test_seed, "trace_tokens": a.trace_tokens, "out": a.out,
              "dry_run": a.dry_run})  # fmt: skip


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
