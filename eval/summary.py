"""The end-of-run console summary of ``python -m eval``: accuracy beside the memory it cost, and whether the
policy did anything.

- :func:`eviction_report`: per sample, did the cache hold fewer rows than full KV would (prompt + every
  generated token that entered the cache)? A compressing policy that never did produced exactly full KV's
  rows, bytes and texts (e.g. a baseline whose ``budget_rows`` exceeds every sequence): the run says so.
- :func:`console_table`: per competition and pooled, avg@k, pass@k, truncation, tokens, mean / peak
  resident rows per (layer, KV head) and KV/512 (AbridgeKV's unit: rows kept per 512 generated tokens per KV
  head; 512 = full KV; it counts rows beyond the prompt, so a policy that also evicts prompt rows —
  SnapKV, KVzip — can read 0 there: ``KV/512 all`` = 512 x resident share of the whole sequence).
"""

from __future__ import annotations

from typing import Any

from zoomr.cache import has_row_budget

FULL_POLICIES = (None, "full", "offload")


def evicted(row: dict[str, Any]) -> bool | None:
    """Whether the sample ended with fewer resident rows than full KV (None: no KV statistics)."""
    kv = row.get("kv") or {}
    if "rows_final" not in kv:
        return None
    full_rows = row["prompt_tokens"] + max(row["n_tokens"] - 1, 0)
    return kv["rows_final"] < full_rows - 0.5


def eviction_report(rows: list[dict[str, Any]], method: dict[str, Any] | None) -> dict[str, Any]:
    """``metrics.json["eviction"]``: samples whose cache ended below full KV's rows, and a note when a
    compressing policy never got there."""
    flags = [e for e in (evicted(r) for r in rows) if e is not None]
    policy = (method or {}).get("policy")
    out: dict[str, Any] = {"samples": len(flags), "evicted_samples": sum(flags)}
    peaks = [r["kv"]["rows_peak"] for r in rows if "rows_peak" in (r.get("kv") or {})]
    if policy in FULL_POLICIES or not flags or any(flags):
        return out
    if has_row_budget(method):
        budget = method.get("budget_rows")
        limit = f"budget_rows={budget}" if budget is not None else f"compression_ratio={method.get('compression_ratio')}"
        why = f"its peak resident rows ({max(peaks, default=0):.0f} per layer and KV head) never exceeded {limit}"
        fix = (
            "Set a budget the run reaches: method.budget_fraction=0.5 (of full KV's rows, from the full-KV run of "
            "this benchmark and model), method.budget_match=<run dir> (another arm's mean rows) or a smaller "
            "method.budget_rows"
        )
    else:
        why = "its own rule never removed a row"
        fix = (
            "Its rule decides: ZoomR / SumR compress only at summary segments the model writes (a zoomr_sft "
            "checkpoint), AbridgeKV after each completed block (method.block_size), KVzap below "
            "method.threshold, the evict_* ablation per method.block_size"
        )
    out["note"] = (
        f"policy {method.get('name', policy)!r} never evicted: {why}, so every sample held exactly full KV's "
        f"rows and this arm equals full KV. {fix}"
    )
    return out


def console_table(metrics: dict[str, Any]) -> str:
    """Readable per-competition table (accuracy in %), pooled last, with the resident KV beside it."""
    pooled = metrics["pooled"]
    k = pooled.get("samples_per_problem", 1)
    # unequal samples per problem ("2-4", e.g. rows of an earlier n_samples): pass@ its smallest, which every
    # problem has (summarize's pass@k needs k <= n)
    pass_k = int(str(k).split("-")[0])
    cols = ["problems", f"avg@{k}", f"pass@{pass_k}", "trunc %", "tokens", "rows", "peak", "KV/512", "KV/512 all"]
    head = f"{'competition':<16} " + " ".join(f"{c:>8}" for c in cols[:-1]) + f" {cols[-1]:>10}"
    lines = [head, "-" * len(head)]

    def num(m: dict[str, Any], key: str, width: int = 8) -> str:
        value = m.get(key)
        return f"{'—':>{width}}" if value is None else f"{value:>{width}.0f}"

    def line(name: str, m: dict[str, Any]) -> str:
        if not m.get("problems"):
            return f"{name:<16} {0:>8}"
        pk = m.get(f"pass@{pass_k}")  # a competition whose fewest samples are more has no pass@ that k
        return (
            f"{name:<16} {m['problems']:>8} {100 * m['accuracy']:>8.1f} {'—' if pk is None else f'{100 * pk:.1f}':>8} "
            f"{100 * m['truncation_rate']:>8.1f} {m['mean_tokens']:>8.0f} {num(m, 'rows_mean')} "
            f"{num(m, 'rows_peak_max')} {num(m, 'kv_per_512')} {num(m, 'kv_per_512_all', 10)}"
        )

    if len(metrics["by_competition"]) > 1:
        lines += [line(name, m) for name, m in metrics["by_competition"].items()]
        lines.append("-" * len(head))
    lines.append(line("pooled", pooled))
    lines.append(
        "rows: mean resident KV rows per (layer, KV head) over decoding; peak: the largest; KV/512: rows kept "
        "beyond the prompt per 512 generated tokens (512 = full KV); KV/512 all: 512 x resident share of "
        "prompt + generation"
    )
    eviction = metrics.get("eviction") or {}
    if eviction.get("samples"):
        lines.append(f"evicted: {eviction['evicted_samples']} of {eviction['samples']} samples ended below full KV's rows")
    if eviction.get("note"):
        lines.append(f"NOTE: {eviction['note']}")
    if incomplete := pooled.get("kv_incomplete"):
        fields = ", ".join(f"{k} ({n})" for k, n in incomplete["recorded_by"].items())
        lines.append(f"NOTE: only some of the {incomplete['samples_with_kv']} samples with KV statistics recorded "
                     f"{fields} (rows of an older version, resumed?): left out, not averaged over those alone")  # fmt: skip
    if metrics.get("budget"):
        lines.append(f"budget: {metrics['budget']}")
    return "\n".join(lines)
