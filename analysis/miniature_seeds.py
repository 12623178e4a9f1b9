"""The miniature across test seeds: each arm's paired difference per seed and pooled over seeds (issue 15).

    python -m analysis.miniature_seeds runs/miniature runs/miniature_s3 runs/extra_seeds/s6000007 \\
        --out analysis/results/miniature/seeds

Every input is a ``python -m analysis +task=miniature`` output directory: its ``results.json`` names the test
seed and each arm's paired full-KV arm, ``arms/<arm>/`` holds the evaluated runs (an arm named in ``--arms`` or
``--vs`` that ``results.json`` does not list is read from ``arms/<arm>/`` too: :func:`adopt_extra_arms`). An arm is compared with its
full-KV arm, and ``--vs A:B`` adds other pairs (A − B; defaults: the issue's per-layer-vs-uniform and
evictor bars, ZoomR vs SumR). Per seed the interval is the miniature table's paired bootstrap; pooled, problems
are resampled within their seed (:func:`eval.bootstrap.stratified_paired_bootstrap`), so the pooled row weighs
every problem of every seed once and says what to expect on an unseen seed, where one seed's 256 problems
leave about ±2 points. Writes ``table.md``, ``results.json`` and ``forest.png``.

``--committed RESULTS.json`` makes the arms of an earlier run of this script available as ``committed/<arm>``
in ``--vs`` (e.g. a new variant against the committed default arm, whose models are not at hand): its
per-problem correctness is read from that file, on the seeds where its full-KV arm's correctness equals this
seed's own full-KV run problem for problem (else refused: other problems or another full KV).
``--keep-committed ARM|A:B …`` carries those arms' rows against full KV (or those pairs) over unchanged (e.g. the
arms a change of the default AbridgeKV family left as they were), marked ``(committed)``, once the committed full
KV's correctness equals this run's on every seed. An output made under the arm names before 2026-12-06
(``abridge_perlayer`` for the paper's AbridgeKV, ``abridge`` for uniform 4:1) is read under the new ones
(``analysis.miniature_plan.RENAMED``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from analysis.miniature_plan import ARMS, RENAMED
from eval.arms import load_arm
from eval.bootstrap import paired_bootstrap, stratified_paired_bootstrap
from zoomr.jsonl import BadRowError, read_json_object
from zoomr.paths import output_dir
from zoomr.rundir import replace_file, write_text_atomic

DEFAULT_VS = (
    "abridge_perlayer_1500steps:abridge_uniform",  # per-layer vs uniform at the same steps and mean quota
    "abridge:evict_recency",  # AbridgeKV 4:1 vs the ablation evictors at its rows (>= 10 points)
    "abridge:evict_random",
    "abridge:evict_attention",
    "zoomr:sumr",
)
DEFAULT_FOREST = ("abridge", "kvzap@-5.75", "kvzap_linear@-5.75", "zoomr")


def load_seed(out: Path) -> dict[str, Any]:
    """One miniature output: its test seed and arms (results.json entries by name)."""
    path = out / "results.json"
    if not path.is_file():
        raise SystemExit(f"miniature_seeds: {out} has no results.json; give python -m analysis +task=miniature outputs")
    results = read_json_object(path, "miniature results.json")
    meta, arms = results.get("meta"), results.get("arms")
    if not (isinstance(meta, dict) and "test_seed" in meta and isinstance(arms, list)
            and all(isinstance(a, dict) and "name" in a for a in arms)):  # fmt: skip
        raise BadRowError(f"{path}: not a miniature results.json (needs meta.test_seed and named arms)")
    names = [a["name"] for a in arms]
    folders = {n: n for n in names}  # arm name -> its folder under arms/
    if old := [n for n in names if n in RENAMED and n not in ARMS]:  # made under the names before 2026-12-06
        folders = {RENAMED.get(n, n): n for n in names}
        new_only = sorted(set(names) & (set(RENAMED.values()) - set(RENAMED)))  # names that exist only since then
        if len(folders) < len(names) or new_only:
            raise SystemExit(f"miniature_seeds: {path} mixes the arm names before 2026-12-06 ({old}) with the new ones "
                             f"({new_only}): rename its arms one way")
        print(f"miniature_seeds: {out} uses the arm names before 2026-12-06; read as "
              + ", ".join(f"{n} -> {RENAMED[n]}" for n in names if n in RENAMED), flush=True)  # fmt: skip
    by_name = {new: {**a, "name": new} for new, a in zip(folders, arms)}
    return {"dir": out, "test_seed": meta["test_seed"], "trace_tokens": meta.get("trace_tokens"), "arms": by_name,
            "folders": folders, "runs": {}}  # fmt: skip


def arm_run(seed: dict[str, Any], name: str):
    """The evaluated run of arm ``name`` on ``seed``, read once (every arm is paired with the same full KV)."""
    if name not in seed["runs"]:
        run = seed["dir"] / "arms" / seed.get("folders", {}).get(name, name).replace("@", "_at_")
        if not (run / "results.jsonl").is_file():
            raise SystemExit(f"miniature_seeds: {seed['dir']}/results.json lists {name}, but {run} has no results.jsonl")
        seed["runs"][name] = load_arm(run)
    return seed["runs"][name]


def adopt_extra_arms(seeds: list[dict[str, Any]], names: list[str]) -> None:
    """Arms named on the command line that a seed's ``results.json`` does not list but whose evaluated run is in
    its ``arms/`` folder (an ablation evaluated there by hand with ``python -m eval … run_dir=<out>/arms/<arm>``)
    join that seed, paired with its full-KV arm, their rows over full KV's measured from both runs."""
    for seed in seeds:
        for name in names:
            run = seed["dir"] / "arms" / name.replace("@", "_at_")
            if name in seed["arms"] or "full" not in seed["arms"] or not (run / "results.jsonl").is_file():
                continue
            rows = arm_run(seed, name).rows.mean() / arm_run(seed, "full").rows.mean()
            seed["arms"][name] = {"name": name, "rows_over_full": float(rows), "paired_with": "full", "extra": True}


COMMITTED = "committed/"  # --vs A:committed/B: B's per-problem correctness from the --committed results.json


def load_committed(path: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """An earlier run's arms against full KV: arm -> test seed -> its per-seed entry (with the 0/1 strings)."""
    if not path.is_file():
        raise SystemExit(f"miniature_seeds: --committed {path}: no such file")
    comparisons = read_json_object(path, "miniature_seeds results.json").get("comparisons")
    if not isinstance(comparisons, list):
        raise SystemExit(f"miniature_seeds: --committed {path} is not a miniature_seeds results.json (no comparisons)")
    return {c["arm"]: {s["test_seed"]: s for s in c["per_seed"]} for c in comparisons if c["vs"] == "full KV"}


def committed_run(seed: dict[str, Any], name: str):
    """Arm ``name`` of the --committed results on ``seed`` (None if it has none there), paired problem by problem
    with this seed's full-KV run, whose correctness must equal the committed full KV's."""
    entry = seed.get("committed", {}).get(name, {}).get(seed["test_seed"])
    if entry is None or "full" not in seed["arms"]:
        return None
    full = arm_run(seed, "full")
    if _bits(full.correct) != entry["vs_correct"]:
        raise SystemExit(f"miniature_seeds: seed {seed['test_seed']}: the committed {name} was paired with another "
                         "full KV (its correctness differs problem by problem): other problems or another model")
    return SimpleNamespace(ids=full.ids, correct=_unbits(entry["correct"]))


def keep_committed(seeds: list[dict[str, Any]], committed: Path, arms: list[str]) -> list[dict[str, Any]]:
    """The committed rows of ``arms`` ("A": A against full KV; "A:B": the pair A − B), unchanged but marked; refused
    unless the committed run has the same seeds and its full KV's correctness equals each seed's own full-KV run
    problem for problem."""
    rows = {(c["arm"], c["vs"]): c for c in json.loads(committed.read_text())["comparisons"]}
    keys = [(a.split(":")[0], a.split(":")[1] if ":" in a else "full KV") for a in arms]
    if missing := [a for a, k in zip(arms, keys) if k not in rows]:
        raise SystemExit(f"miniature_seeds: --keep-committed {missing}: not in {committed}; it has "
                         f"{sorted(a if v == 'full KV' else f'{a}:{v}' for a, v in rows)}")
    full = {s["test_seed"]: s["correct"] for s in rows[("full", "full KV")]["per_seed"]}
    for seed in seeds:
        if full.get(seed["test_seed"]) != _bits(arm_run(seed, "full").correct):
            raise SystemExit(f"miniature_seeds: seed {seed['test_seed']}: the committed full KV differs from "
                             f"{seed['dir']}'s (other problems or another model); its arms cannot be kept")
    if sorted(full) != sorted(s["test_seed"] for s in seeds):
        raise SystemExit(f"miniature_seeds: {committed} has seeds {sorted(full)}, this run "
                         f"{sorted(s['test_seed'] for s in seeds)}: keep committed arms only over the same seeds")
    return [{**rows[k], "committed": str(committed)} for k in keys]


def compare(seeds: list[dict[str, Any]], arm: str, vs: str | None) -> dict[str, Any] | None:
    """``arm`` against ``vs`` (None: its paired full-KV arm) on every seed that has both; None if none has."""
    per_seed, strata = [], []
    for seed in seeds:
        entry = seed["arms"].get(arm)
        other = vs or (entry or {}).get("paired_with")
        if entry is None:
            continue
        if other and other.startswith(COMMITTED):
            b = committed_run(seed, other[len(COMMITTED):])
        else:
            b = arm_run(seed, other) if other in seed["arms"] else None
        if b is None:
            continue
        a = arm_run(seed, arm)
        if a.ids != b.ids:
            raise SystemExit(f"miniature_seeds: seed {seed['test_seed']}: {arm} and {other} ran different problems")
        if len(a.ids) < 2:  # numpy's ValueError traceback inside the bootstrap
            raise SystemExit(f"miniature_seeds: seed {seed['test_seed']} ({seed['dir']}): {arm} and {other} ran "
                             f"{len(a.ids)} problem; a paired interval needs at least 2")  # fmt: skip
        ci = paired_bootstrap(a.correct, b.correct)
        per_seed.append({
            "test_seed": seed["test_seed"], "n": len(a.ids), "vs": other, "accuracy": float(a.correct.mean()),
            "vs_accuracy": float(b.correct.mean()), "delta": ci.delta, "ci": [ci.low, ci.high],
            "rows_over_full": entry["rows_over_full"], "correct": _bits(a.correct), "vs_correct": _bits(b.correct),
        })  # fmt: skip
        strata.append((a.correct, b.correct))
    if not per_seed:
        return None
    pooled = stratified_paired_bootstrap(strata)
    n = sum(s["n"] for s in per_seed)
    weighted = lambda key: sum(s[key] * s["n"] for s in per_seed) / n  # noqa: E731
    return {
        "arm": arm, "vs": vs or "full KV", "per_seed": per_seed, "worst_delta": min(s["delta"] for s in per_seed),
        "pooled": {"n": n, "accuracy": weighted("accuracy"), "vs_accuracy": weighted("vs_accuracy"),
                   "delta": pooled.delta, "ci": [pooled.low, pooled.high], "rows_over_full": weighted("rows_over_full")},
    }  # fmt: skip


def _bits(correct: np.ndarray) -> str | list[float]:
    """Per-problem correctness as a compact '0'/'1' string (what the pooled bootstrap resamples), a list if
    some problem scored in between (avg@k)."""
    if np.isin(correct, (0.0, 1.0)).all():
        return "".join("1" if c else "0" for c in correct)
    return [float(c) for c in correct]


def _unbits(correct: str | list[float]) -> np.ndarray:
    """Per-problem correctness back from :func:`_bits`."""
    return np.array([c == "1" for c in correct] if isinstance(correct, str) else correct, dtype=float)


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def markdown(results: dict[str, Any]) -> str:
    seeds = results["meta"]["test_seeds"]
    lines = [
        f"Miniature across {len(seeds)} test seeds ({', '.join(f'{s:,}' for s in seeds)}; "
        f"{results['meta']['n_problems']} problems in all). Δ in points, paired 95% CI; pooled: resampled "
        "within each seed.",
        "",
        "| arm | vs | seeds | Δ per seed | worst | pooled acc (arm / vs) | pooled Δ [95% CI] | rows / full |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in results["comparisons"]:
        p = c["pooled"]
        lines.append(
            f"| {c['arm']}{' (committed)' if 'committed' in c else ''} | {c['vs']} | {len(c['per_seed'])} | {' / '.join(_points(s['delta']) for s in c['per_seed'])} "
            f"| {_points(c['worst_delta'])} | {p['accuracy']:.3f} / {p['vs_accuracy']:.3f} "
            f"| {_points(p['delta'])} [{_points(p['ci'][0])}, {_points(p['ci'][1])}] | {p['rows_over_full']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def forest_figure(results: dict[str, Any], arms: list[str], path: Path) -> None:
    """Δ vs full KV per seed (dots, 95% CI) and pooled (diamond) for ``arms``: where an unseen seed would fall."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [c for c in results["comparisons"] if c["vs"] == "full KV" and c["arm"] in arms]
    if not shown:
        return
    height = 0.45 * sum(len(c["per_seed"]) + 2 for c in shown) + 1.5
    fig, ax = plt.subplots(figsize=(8, height))
    y, ticks, labels = 0.0, [], []
    for c in shown:
        for s in c["per_seed"]:
            ax.errorbar(100 * s["delta"], y, xerr=[[100 * (s["delta"] - s["ci"][0])], [100 * (s["ci"][1] - s["delta"])]],
                        fmt="o", color="tab:blue", capsize=3)  # fmt: skip
            ticks.append(y), labels.append(f"{c['arm']}  seed {s['test_seed']:,} (n={s['n']})")
            y -= 1
        p = c["pooled"]
        ax.errorbar(100 * p["delta"], y, xerr=[[100 * (p["delta"] - p["ci"][0])], [100 * (p["ci"][1] - p["delta"])]],
                    fmt="D", color="tab:red", capsize=3, markersize=8)  # fmt: skip
        ticks.append(y), labels.append(f"{c['arm']}  pooled (n={p['n']}, {p['rows_over_full']:.2f} of the rows)")
        y -= 2
    ax.axvline(0, color="grey", lw=1)
    ax.axvline(-2, color="grey", lw=1, ls="--", label="−2 points (the issue's bar)")
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel("Δ answer accuracy vs full KV (points, paired 95% CI)")
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", fontsize=8)  # below the x-label: clear of every point
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1))
    replace_file(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def run(outs: list[Path], arms: list[str] | None, vs: list[str] | None = None, committed: Path | None = None,
        keep: list[str] = ()) -> dict[str, Any]:
    """Every comparison over the miniature outputs ``outs``: ``arms`` (None: every arm found) against their
    full-KV arms, the committed rows of ``keep`` (:func:`keep_committed`), then the pairs ``vs`` ("A:B"; B may be
    ``committed/<arm>`` of ``committed``) wherever both ran. ``vs`` None: the default pairs, each where it ran; a
    pair the user gave that ran on no seed is refused."""
    given_vs = vs is not None
    vs = list(vs) if given_vs else list(DEFAULT_VS)
    seeds = [load_seed(o) for o in outs]
    if committed is not None:
        earlier = load_committed(committed)
        for s in seeds:
            s["committed"] = earlier
    elif any(p.split(":")[1].startswith(COMMITTED) for p in vs) or keep:
        raise SystemExit(f"miniature_seeds: --vs {COMMITTED}<arm> and --keep-committed need the file: give --committed")
    seen: dict[int, Path] = {}
    for s in seeds:
        if s["test_seed"] in seen:
            raise SystemExit(f"miniature_seeds: test seed {s['test_seed']} twice ({seen[s['test_seed']]}, {s['dir']})")
        seen[s["test_seed"]] = s["dir"]
    lengths = {s["trace_tokens"] for s in seeds if s["trace_tokens"] is not None}
    if len(lengths) > 1:  # the seeds are pooled as one experiment: only the test problems may differ
        raise SystemExit("miniature_seeds: the outputs were run at different trace lengths ("
                         + ", ".join(f"{s['dir']}: {s['trace_tokens']}" for s in seeds) + "); pool one length at a time")
    adopt_extra_arms(seeds, [*(arms or []), *(side for pair in vs for side in pair.split(":"))])
    present = {a for s in seeds for a in s["arms"]}
    absent = [a for a in arms or [] if a not in present]
    if absent:
        raise SystemExit(f"miniature_seeds: arm(s) {absent} ran on none of the seeds; found: {sorted(present)}")
    wanted = arms or [a for a in ARMS if a in present] + sorted(present - set(ARMS))
    comparisons = [c for a in wanted if (c := compare(seeds, a, None))]
    if keep:
        comparisons += keep_committed(seeds, committed, list(keep))
    for pair in vs:
        a, b = pair.split(":")
        if c := compare(seeds, a, b):
            comparisons.append(c)
        elif given_vs:
            raise SystemExit(f"miniature_seeds: --vs {pair}: the two arms ran together on none of the seeds; "
                             f"found: {sorted(present)}")
    n = {s["test_seed"]: len(arm_run(s, "full").ids) for s in seeds if "full" in s["arms"]}
    return {"meta": {"test_seeds": [s["test_seed"] for s in seeds], "inputs": [str(o) for o in outs],
                     "n_problems": sum(n.values()), "n_by_seed": n,
                     **({"committed": str(committed)} if committed else {})}, "comparisons": comparisons}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outs", nargs="+", type=Path, help="python -m analysis +task=miniature output directories")
    ap.add_argument("--arms", nargs="*", default=None, help="arms compared with full KV (default: every arm found)")
    ap.add_argument("--vs", nargs="*", default=None, help=f"extra pairs A:B (A − B; default: {' '.join(DEFAULT_VS)})")
    ap.add_argument("--forest", nargs="*", default=None, help="arms drawn in forest.png (default: the main arms found)")
    ap.add_argument("--committed", type=Path, default=None,
                    help="an earlier miniature_seeds results.json whose arms --vs may name as committed/<arm>")
    ap.add_argument("--keep-committed", nargs="*", default=[], metavar="ARM",
                    help="arms (vs full KV) or pairs A:B whose rows are taken unchanged from --committed")
    ap.add_argument("--out", type=lambda v: Path(output_dir(v)), default=Path("runs/miniature_seeds"))
    args = ap.parse_args(argv)
    bad = [p for p in args.vs or [] if p.count(":") != 1 or "" in p.split(":")]
    if bad:
        ap.error(f"--vs {bad[0]}: give pairs as ARM:OTHER")
    missing = [str(o) for o in args.outs if not (o / "results.json").is_file()]
    if missing:
        ap.error(f"not miniature outputs (no results.json): {', '.join(missing)}")
    if onto := [str(o) for o in args.outs if o.resolve() == args.out.resolve()]:  # its results.json was replaced
        ap.error(f"--out {args.out} is the input {onto[0]}: this table would replace its results.json and table.md; "
                 "give another directory")  # fmt: skip
    results = run(args.outs, args.arms, args.vs, args.committed, args.keep_committed)
    compared = [c["arm"] for c in results["comparisons"] if c["vs"] == "full KV"]
    if args.forest is not None and (absent := [a for a in args.forest if a not in compared]):
        raise SystemExit(f"miniature_seeds: --forest {absent}: not compared with full KV here; compared: {compared}")
    args.out.mkdir(parents=True, exist_ok=True)
    # through a rename: a kill leaves each file old or new (a torn results.json was a lost --committed input)
    write_text_atomic(args.out / "results.json", json.dumps(results, indent=1))
    write_text_atomic(args.out / "table.md", markdown(results))
    forest_figure(results, list(DEFAULT_FOREST) if args.forest is None else args.forest, args.out / "forest.png")
    print(markdown(results))
    print(f"written {args.out}/table.md, results.json, forest.png")


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
