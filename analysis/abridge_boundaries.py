"""Recall at AbridgeKV block boundaries: where a block-compressed model's testbed misses sit.

    python -m analysis.abridge_boundaries runs/miniature/arms/abridge runs/miniature/arms/full \\
        --block-size 256 --out runs/abridge_boundaries.json

For every query of every evaluated testbed run given (``python -m eval benchmark=testbed …`` run directories),
the query is classed by where the response's C-token block grid cuts it (positions 0, C, 2C, … of the
response, the grid the policy compresses on):

* ``fact_straddle``: the fact's key is a block's last token and its value opens the next block, so once the
  key's block is compressed the value's token cannot see its key;
* ``query_straddle``: (cue queries ``? k : = v``) the query's key is one of a block's last two tokens, so the
  value is predicted from the next block, where the key is already compressed;
* ``inside``: neither.

It reports each class's miss rate (intermediate and final queries apart: only the final ones decide the answer),
and answer accuracy on the problems with and without a straddling final fact. A 1,024-token trace's final
``\\boxed{}`` lies in its last block, so final queries do not straddle; ~6% of problems have a final fact
that does at C = 128. The miniature's C = 128 per-layer model missed ~93% of the straddling items and 1 in
6,419 of the others (README, miniature; ``data.boundary_rate`` trains on more of them).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from analysis.cli import require_at_least
from zoomr.jsonl import read_json_object
from zoomr.paths import output_file
from zoomr.rundir import write_text_atomic

CLASSES = ("fact_straddle", "query_straddle", "inside")


def query_class(query: dict[str, Any], block_size: int, cue_form: bool = True) -> str:
    """The class of one test record query (:meth:`zoomr.testbed.task.Problem.record`) on a ``block_size`` grid."""
    from zoomr.testbed.task import CUE_READ_OFFSET, crosses_block

    value = query["answer_pos"] - query["distance"]  # the definition's value token; its key just before
    if crosses_block(value - 1, value, block_size):
        return "fact_straddle"
    reader = query["answer_pos"] - 1  # the token the value is predicted from ("=")
    if cue_form and crosses_block(reader - CUE_READ_OFFSET, reader, block_size):
        return "query_straddle"
    return "inside"


def boundary_report(run_dir: str | Path, block_size: int) -> dict[str, Any]:
    """Miss rates by class and answer accuracy with / without a straddling final fact, for one run."""
    from eval.results import ResultStore
    from zoomr.testbed.grading import load_test_problems

    run = Path(run_dir)
    config = run / "config.json"
    if not config.is_file():
        raise SystemExit(f"{run}: no config.json (not an evaluator run directory)")
    bench = read_json_object(config, "run config").get("benchmark")
    if not isinstance(bench, dict):
        raise SystemExit(f"{run}: its config.json has no benchmark section (not an evaluator run config)")
    if bench.get("task", "testbed") != "testbed":
        raise SystemExit(f"{run}: not a testbed evaluation run (benchmark.task={bench['task']!r})")
    options = bench.get("options") or {}
    rows = {pid: row for (pid, sample), row in ResultStore(run).load(repair=False).items() if sample == 0}
    if not rows:
        raise SystemExit(f"{run}: no finished samples in results.jsonl")
    queries, misses = Counter(), Counter()
    problems = Counter()
    limit = bench.get("problem_limit")
    tests = load_test_problems(options)[: limit if isinstance(limit, int) and limit > 0 else None]
    unfinished = [rec["id"] for rec in tests if rec["id"] not in rows]
    for rec in tests:
        row = rows.get(rec["id"])
        if row is None:
            continue
        recalled = {f["key"]: f["correct"] for f in row.get("recall") or []}
        if not recalled:
            raise SystemExit(f"{run}: row {rec['id']} has no per-fact recall (a slim copy? use the full run)")
        cue = rec["query_form"] == "cue"
        straddling_final = False
        for q in rec["queries"]:
            key = (query_class(q, block_size, cue), "final" if q["final"] else "intermediate")
            queries[key] += 1
            misses[key] += recalled.get(q["key"]) is False
            straddling_final |= q["final"] and key[0] == "fact_straddle"
        problems[(straddling_final, bool(row["correct"]))] += 1
    if not problems:  # every row skipped: a report of zeros would read as "nothing missed"
        raise SystemExit(f"{run}: none of its {len(rows)} finished rows is a test problem of the benchmark options in "
                         "its config.json (an edited config, or rows of another run)")  # fmt: skip
    if unfinished:  # a run still writing, or killed: its misses would be reported over the problems it reached
        raise SystemExit(f"{run}: incomplete run, {len(tests) - len(unfinished)} of {len(tests)} test problems done "
                         f"(first missing {unfinished[0]}); rerun the same command to finish it")  # fmt: skip
    by_class = {
        f"{c}/{part}": {"queries": queries[(c, part)], "missed": misses[(c, part)],
                        "miss_rate": misses[(c, part)] / queries[(c, part)] if queries[(c, part)] else None}
        for c in CLASSES for part in ("intermediate", "final")
    }  # fmt: skip

    def accuracy(straddling: bool) -> dict[str, Any]:
        n = problems[(straddling, True)] + problems[(straddling, False)]
        return {"problems": n, "answer_accuracy": problems[(straddling, True)] / n if n else None}

    return {
        "run": str(run),
        "block_size": block_size,
        "problems": sum(problems.values()),
        "answer_accuracy": sum(v for (_, ok), v in problems.items() if ok) / max(1, sum(problems.values())),
        "by_class": by_class,
        "with_straddling_final_fact": accuracy(True),
        "without": accuracy(False),
    }


def _rate(entry: dict[str, Any]) -> str:
    return "–" if entry["miss_rate"] is None else f"{entry['missed']}/{entry['queries']} ({entry['miss_rate']:.3f})"


def render(reports: list[dict[str, Any]]) -> str:
    """A markdown table, one row per run; a class no run has (final query straddles in 1,024-token traces) is left out."""
    classes = [k for k in reports[0]["by_class"] if any(r["by_class"][k]["queries"] for r in reports)]
    head = ["run", "answer acc", *(f"missed: {k}" for k in classes), "acc w/ straddling final", "acc w/o"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        with_, without = r["with_straddling_final_fact"], r["without"]
        cells = [Path(r["run"]).name, f"{r['answer_accuracy']:.3f}", *(_rate(r["by_class"][k]) for k in classes),
                 f"{with_['answer_accuracy'] or 0:.3f} of {with_['problems']}", f"{without['answer_accuracy'] or 0:.3f} of {without['problems']}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="evaluated testbed run directories")
    ap.add_argument("--block-size", type=int, required=True, help="C of the block grid (the AbridgeKV model's)")
    ap.add_argument("--out", type=output_file, default=None, help="JSON file for the reports")
    args = ap.parse_args(argv)
    require_at_least(ap, args, 2, "block_size")
    reports = [boundary_report(r, args.block_size) for r in args.runs]
    print(render(reports))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(reports, indent=1))  # a kill leaves the old reports or the new ones
        print(f"\nwritten: {out}")


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
