"""Summary augmentation of reasoning traces (ZoomR §3.2, A.1): ``python -m data_prep +pipeline=summarize``.

For every trace: split the thought into paragraphs (:mod:`zoomr.segments`), ask an instruct LLM behind
an OpenAI-compatible endpoint for a summary of each paragraph given ONLY the problem and that
paragraph, and insert ``<|begin_of_summary|>…<|end_of_summary|>`` after it. Summaries are cached in a
:class:`~data_prep.summary_store.SummaryStore` as they arrive, so the pipeline resumes after a crash.

Outputs in ``out_dir``: ``summarized.jsonl`` (Bespoke-Stratos schema: ``system`` + ``conversations``,
loadable by ``data_prep.traces`` with ``format=bespoke``), ``dataset/`` (the same rows as an HF dataset
on disk), ``stats.json`` (rows, paragraphs, summary lengths, compression ratio, requests, failures).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from data_prep.llm_client import ChatClient, FatalRequestError, RequestFailed, Validator
from data_prep.summary_store import (
    StoredSummary,
    StoreUnavailable,
    SummaryStore,
    check_request_settings,
    paragraph_hash,
)
from data_prep.traces import TraceRow
from zoomr import tokens
from zoomr.jsonl import BadRowError
from zoomr.rundir import write_json
from zoomr.runlock import hold_run_lock
from zoomr.schemas.endpoint import EndpointSettings
from zoomr.schemas.zoomr import SummarizePipeline
from zoomr.segments import Paragraph, ThoughtSplit, insert_summaries, split_paragraphs, split_thought

log = logging.getLogger(__name__)

# The paper's Figure 4 prompt is an image we cannot read; this one asks for the same thing (a concise,
# self-contained summary of one paragraph, given only the problem). Bump the version when editing it:
# stored summaries are keyed on it.
PROMPT_VERSION = "zoomr-summary-v1"
SYSTEM_PROMPT = (
    "You summarize one paragraph of a step-by-step solution to a math or science problem. "
    "Write one or two short sentences stating what the paragraph does and the results it reaches "
    "(keep key numbers, equations and conclusions). Output only the summary."
)


def summary_messages(problem: str, paragraph: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Problem:\n{problem.strip()}\n\nParagraph:\n{paragraph.strip()}\n\nSummary:",
        },
    ]


_LABEL = re.compile(r"^\s*(\*\*)?summary(\*\*)?\s*:\s*(\*\*)?\s*", re.IGNORECASE)
_SPECIAL = re.compile(r"<\|[A-Za-z0-9_]+\|>")


def clean_summary(text: str) -> str:
    """Strip whitespace and a leading ``Summary:`` label; join lines (a summary is one block)."""
    text = _LABEL.sub("", text.strip())
    return " ".join(text.split())


def summary_validator(reject_truncated: bool, max_tokens: int | None = None) -> Validator:
    """Reject empty answers, answers with special-token strings, and (optionally) those that do not fit ``max_tokens``:
    cut by it (``finish_reason`` "length"), or longer than it by the server's own count (``usage.completion_tokens``)
    while reported as finished (a server that ignores or caps ``max_tokens`` otherwise)."""

    def validate(text: str, finish_reason: str | None, completion_tokens: int | None = None) -> str | None:
        cleaned = clean_summary(text)
        if not cleaned:
            return "empty"
        if _SPECIAL.search(cleaned) or any(t in cleaned for t in tokens.SUMMARY_TAGS + tokens.REASONING_TAGS):
            return "special_token"
        if reject_truncated and finish_reason == "length":
            return "truncated"
        if reject_truncated and max_tokens is not None and completion_tokens is not None and completion_tokens > max_tokens:
            return "too_long"
        return None

    return validate


@dataclass
class SummarizeSettings:
    """What :func:`summarize_traces` does (the ``pipeline`` config minus entry-point glue)."""

    endpoint: EndpointSettings = field(default_factory=EndpointSettings)
    min_paragraph_chars: int = 400  # merge shorter blank-line paragraphs forward (see zoomr.segments)
    keep_truncated: bool = False  # traces without <|end_of_thought|>: drop (default) or summarise anyway
    reject_truncated_answers: bool = True  # a summary cut by max_tokens, or longer than it, is retried
    progress: bool = True

    @classmethod
    def from_pipeline(cls, pipe: SummarizePipeline) -> SummarizeSettings:
        """The settings of a ``pipeline=summarize`` config (its entry-point fields dropped)."""
        names = [f.name for f in fields(cls)]
        return cls(**{name: getattr(pipe, name) for name in names})


@dataclass
class PlannedRow:
    row: TraceRow
    split: ThoughtSplit
    paragraphs: list[Paragraph]
    keys: list[str]


SKIP_REASONS = {
    "no_thought": "no <|begin_of_thought|> section",
    "truncated_thought": "trace cut before <|end_of_thought|>; keep them with pipeline.keep_truncated=true",
    "already_summarized": "already carries summaries",
    "empty_thought": "no paragraph to summarise (pipeline.min_paragraph_chars)",
}


def describe_skipped(skipped: dict[str, int]) -> str:
    """The run summary's line on rows that were not summarised, with why (and how to keep them)."""
    if not skipped:
        return "none"
    return "; ".join(f"{n} {SKIP_REASONS.get(k, k)}" for k, n in sorted(skipped.items()))


def check_unique_ids(rows: list[TraceRow], where: str | None = None) -> None:
    """Refuse traces that share an id (:class:`BadRowError` naming the ids and their rows: a JSONL file's line
    numbers): the output's rows are keyed by it, and each copy was written with the same id (summarised once)."""
    lines: dict[str, list[str]] = {}
    for n, row in enumerate(rows, 1):
        lines.setdefault(row.id, []).append(str(row.line if row.line is not None else f"#{n}"))
    repeated = {i: at for i, at in lines.items() if len(at) > 1}
    if repeated:
        shown = "; ".join(f"id {i!r} on rows {', '.join(at)}" for i, at in list(repeated.items())[:5])
        more = f" (and {len(repeated) - 5} more ids)" if len(repeated) > 5 else ""
        raise BadRowError(f"{where or 'the traces'}: {len(repeated)} trace id(s) appear more than once: {shown}{more}; "
                          "each row must be its own trace (remove the copies or give each row its own id)")  # fmt: skip


def plan_rows(rows: list[TraceRow], settings: SummarizeSettings) -> tuple[list[PlannedRow], Counter]:
    """Split every usable row into paragraphs; count the rows skipped and why."""
    planned, skipped = [], Counter()
    for row in rows:
        split = split_thought(row.response)
        if split is None:
            skipped["no_thought"] += 1
            continue
        if not split.closed and not settings.keep_truncated:
            skipped["truncated_thought"] += 1
            continue
        if tokens.BEGIN_SUMMARY in row.response:
            skipped["already_summarized"] += 1
            continue
        paras = split_paragraphs(split.thought, settings.min_paragraph_chars)
        if not paras:
            skipped["empty_thought"] += 1
            continue
        keys = [paragraph_hash(row.question, p.text) for p in paras]
        planned.append(PlannedRow(row, split, paras, keys))
    return planned, skipped


@dataclass
class FetchReport:
    requested: int = 0
    done: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    attempts: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    fatal: str | None = None  # why the whole fetch stopped (unreachable, stalled, bad key / model …)

    @property
    def throughput(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


async def fetch_summaries(
    jobs: dict[str, tuple[str, str]],
    store: SummaryStore,
    settings: SummarizeSettings,
    transport: Any = None,
) -> FetchReport:
    """Summarise every ``key -> (problem, paragraph)`` missing from ``store``; persist each on arrival."""
    from tqdm.auto import tqdm

    todo = store.missing(list(jobs))
    report = FetchReport(requested=len(todo))
    if not todo:
        return report
    queue: asyncio.Queue[str] = asyncio.Queue()
    for key in todo:
        queue.put_nowait(key)
    validate = summary_validator(settings.reject_truncated_answers, settings.endpoint.max_tokens)
    bar = tqdm(
        total=len(todo), unit="summary", desc="summarising", disable=not settings.progress, smoothing=0.1
    )
    t0 = time.perf_counter()

    async def worker(client: ChatClient) -> None:
        while True:
            try:
                key = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            problem, paragraph = jobs[key]
            try:
                c = await client.complete(summary_messages(problem, paragraph), validate)
            except RequestFailed as e:
                report.failed[key] = str(e)
            else:
                store.put(
                    key,
                    StoredSummary(
                        clean_summary(c.text),
                        c.finish_reason,
                        c.prompt_tokens,
                        c.completion_tokens,
                        c.attempts,
                    ),
                )
                report.done += 1
            bar.update(1)
            retries = sum(v for k, v in client.stats.items() if k != "ok")
            bar.set_postfix(failed=len(report.failed), retries=retries, refresh=False)

    async with ChatClient(settings.endpoint, transport=transport) as client:
        n = min(settings.endpoint.concurrency, len(todo))
        tasks = [asyncio.create_task(worker(client)) for _ in range(n)]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in pending:
                t.cancel()
            for t in done:
                try:
                    t.result()
                except (FatalRequestError, StoreUnavailable) as e:  # every request would fail the same way: stop
                    report.fatal = str(e)
        finally:
            for t in tasks:
                t.cancel()
            bar.close()
            report.seconds = time.perf_counter() - t0
            report.attempts = Counter(client.stats)
    return report


class SummarizeFailed(RuntimeError):
    """The summariser could not do its job (fatal endpoint error, or every request failed); the outputs
    and ``stats.json`` of what did finish are written first and every finished summary stays stored."""

    def __init__(self, message: str, stats: dict[str, Any]):
        super().__init__(message)
        self.stats = stats


def failure_message(stats: dict[str, Any], endpoint: str, store: Path) -> str | None:
    """Why the run failed, naming the endpoint and the failure counts (None: it did not)."""
    requested, new, failed = stats["summaries_requested"], stats["summaries_new"], stats["summaries_failed"]
    fatal = stats.get("fatal_error")
    if fatal is None and not (requested and new == 0):
        return None
    attempts = ", ".join(f"{k}: {v}" for k, v in sorted(stats["attempts"].items())) or "none"
    head = fatal or f"{endpoint}: every request failed"
    return (
        f"summaries failed: {head}\n  {new} of {requested} summaries done, {failed} failed after retries, "
        f"{requested - new - failed} not finished; attempts by outcome: {attempts}\n"
        f"  finished summaries are kept in {store}; a rerun asks only for the missing ones"
    )


def assemble(planned: list[PlannedRow], store: SummaryStore) -> tuple[list[dict[str, Any]], list[str], int]:
    """Rows with every summary inserted (Bespoke schema), their original responses, and the number of
    rows still missing a summary (left out; a rerun fills them)."""
    records, originals, incomplete = [], [], 0
    for p in planned:
        stored = [store.get(k) for k in p.keys]
        if any(s is None for s in stored):
            incomplete += 1
            continue
        summaries = [s.summary for s in stored]  # type: ignore[union-attr]
        originals.append(p.row.response)
        records.append(
            {
                "id": p.row.id,
                "system": p.row.system or "",
                "conversations": [
                    {"from": "user", "value": p.row.question},
                    {"from": "assistant", "value": insert_summaries(p.split, p.paragraphs, summaries)},
                ],
                "paragraphs": [x.text for x in p.paragraphs],
                "summaries": summaries,
                "thought_closed": p.split.closed,
            }
        )
    return records, originals, incomplete


COUNT_BATCH = 32  # texts tokenized at once by length_stats (a 32k-token trace holds ~16 MB of encoding)


def length_stats(records: list[dict[str, Any]], originals: list[str], tokenizer=None) -> dict[str, Any]:
    """Paragraph/summary lengths (tokens with a tokenizer, else chars), compression and response growth."""

    def count(texts: list[str]) -> list[int]:
        if tokenizer is None:
            return [len(t) for t in texts]
        # COUNT_BATCH texts at a time: every response tokenized in one call held all their encodings at once (2 GB
        # for 1,000 traces of 4,000 tokens; a 17k-row Bespoke-Stratos run died there before writing its outputs)
        return [len(ids) for i in range(0, len(texts), COUNT_BATCH)
                for ids in tokenizer(texts[i : i + COUNT_BATCH], add_special_tokens=False)["input_ids"]]  # fmt: skip

    unit = "tokens" if tokenizer is not None else "chars"
    pl = count([t for r in records for t in r["paragraphs"]])
    sl = count([t for r in records for t in r["summaries"]])
    n = max(len(pl), 1)
    after = sum(count([r["conversations"][1]["value"] for r in records]))
    return {
        "unit": unit,
        "paragraphs": len(pl),
        "paragraphs_per_row": len(pl) / max(len(records), 1),
        f"mean_paragraph_{unit}": sum(pl) / n,  # L̄_R of the memory model (ZoomR §3.5)
        f"mean_summary_{unit}": sum(sl) / n,  # L̄_S
        "compression_ratio": sum(pl) / max(sum(sl), 1),  # paragraph length / summary length, pooled
        "median_compression_ratio": _median([p / max(s, 1) for p, s in zip(pl, sl)]),
        "response_growth": after / max(sum(count(originals)), 1),  # augmented / original response length
    }


def _median(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def write_outputs(out_dir: Path, records: list[dict[str, Any]], stats: dict[str, Any]) -> None:
    """``summarized.jsonl``, ``dataset/`` and ``stats.json``, each written under a temporary name and moved into
    place, the dataset (the slow part) first: a kill leaves the earlier run's outputs, or this run's, or no
    ``dataset/``, never this run's rows beside an earlier run's dataset."""
    import datasets

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "summarized.jsonl.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    dataset, new_dataset = out_dir / "dataset", out_dir / "dataset.tmp"
    if new_dataset.exists():  # left by a killed run
        shutil.rmtree(new_dataset)
    if records:
        datasets.Dataset.from_list(records).save_to_disk(str(new_dataset))
    if dataset.is_dir():  # an earlier run's rows (removed also when this run wrote none)
        shutil.rmtree(dataset)
    if records:
        new_dataset.rename(dataset)
    tmp.replace(out_dir / "summarized.jsonl")
    write_json(out_dir / "stats.json", stats)


REQUEST_FIELDS = ("max_tokens", "temperature", "seed", "extra_body")  # what shapes a summary besides model and prompt


def request_settings(settings: SummarizeSettings) -> dict[str, Any]:
    """The endpoint settings a stored summary was asked for under (:data:`REQUEST_FIELDS`)."""
    return {k: getattr(settings.endpoint, k) for k in REQUEST_FIELDS}


def summarize_traces(
    rows: list[TraceRow],
    settings: SummarizeSettings,
    out_dir: str | Path,
    store_path: str | Path | None = None,
    tokenizer=None,
    load_report: dict[str, Any] | None = None,
    transport: Any = None,
) -> dict[str, Any]:
    """The whole pipeline on parsed rows; returns the stats it writes to ``out_dir/stats.json``."""
    out_dir = Path(out_dir)
    check_unique_ids(rows)
    hold_run_lock(out_dir, "summarize pipeline")  # two at once wrote summarized.jsonl.tmp together
    store_path = Path(store_path) if store_path else out_dir / "store.sqlite"
    planned, skipped = plan_rows(rows, settings)
    jobs = {k: (p.row.question, para.text) for p in planned for k, para in zip(p.keys, p.paragraphs)}
    validate = summary_validator(settings.reject_truncated_answers, settings.endpoint.max_tokens)
    accept = lambda stored: validate(stored.summary, stored.finish_reason, stored.completion_tokens) is None  # noqa: E731
    with SummaryStore(store_path, settings.endpoint.model, PROMPT_VERSION, accept,  # rejected: asked again
                      request_settings(settings)) as store:  # fmt: skip
        cached = len(jobs) - len(store.missing(list(jobs)))
        report = asyncio.run(fetch_summaries(jobs, store, settings, transport=transport))
        records, originals, incomplete = assemble(planned, store)
    stats = {
        "model": settings.endpoint.model,
        "prompt_version": PROMPT_VERSION,
        "rows_in": len(rows),
        "load_defects": load_report or {},
        "rows_skipped": dict(skipped),
        "rows_planned": len(planned),
        "rows_written": len(records),
        "rows_incomplete": incomplete,
        "unique_paragraphs": len(jobs),
        "summaries_cached": cached,
        "summaries_requested": report.requested,
        "summaries_new": report.done,
        "summaries_failed": len(report.failed),
        "attempts": dict(report.attempts),
        "seconds": round(report.seconds, 2),
        "summaries_per_second": round(report.throughput, 2),
        "concurrency": settings.endpoint.concurrency,
        **length_stats(records, originals, tokenizer),
    }
    if report.failed:
        stats["failure_examples"] = dict(list(report.failed.items())[:5])
    if report.fatal:
        stats["fatal_error"] = report.fatal
    write_outputs(out_dir, records, stats)
    message = failure_message(stats, settings.endpoint.base_url, store_path)
    if message:
        raise SummarizeFailed(message, stats)
    return stats


def run(cfg) -> dict[str, Any]:
    """Entry point of ``python -m data_prep +pipeline=summarize [data=...]``."""
    from data_prep.traces import load_trace_rows
    from zoomr.entry import model_spec, start_run, to_plain
    from zoomr.models import load_tokenizer
    from zoomr.rundir import write_summary
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.checks import SettingsError
    from zoomr.schemas.sft import TracesData

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    pipe: SummarizePipeline = to_dataclass(SummarizePipeline, cfg.pipeline)
    if cfg.get("data") is None:
        raise SystemExit("summarize needs trace data: add data=traces (or +data=...; e.g. bespoke_stratos)")
    data = to_plain(cfg.data)
    if data.get("loader", TracesData.loader) != TracesData.loader:  # data=testbed was a KeyError traceback ('source')
        raise SettingsError(f"data={data.get('name')}: summarize reads reasoning traces (data=traces, bespoke_stratos "
                            f"or zoomr_summaries), not data read by {data['loader']}")  # fmt: skip
    traces = to_dataclass(TracesData, data)  # the schema's checks, which Hydra skips: data.max_samples=0 read a row
    rows, load = load_trace_rows(  # an unusable input is refused before the run directory is written
        source=traces.source,
        path=traces.path,
        hub_id=traces.hub_id,
        split=traces.split,
        format=traces.format,
        max_samples=pipe.max_rows if pipe.max_rows is not None else traces.max_samples,
    )
    check_unique_ids(rows, traces.path if traces.source == "local" else f"{traces.hub_id} [{traces.split}]")
    tokenizer = load_tokenizer(model_spec(cfg), cfg.cache_dir) if pipe.count_tokens else None
    out_dir = Path(pipe.out_dir).expanduser().absolute()  # relative: the working directory, never the repo
    settings = SummarizeSettings.from_pipeline(pipe)
    settings.endpoint.api_key()  # a key no header can carry is refused here, not at the first request
    check_request_settings(pipe.store or out_dir / "store.sqlite", settings.endpoint.model, PROMPT_VERSION,
                           request_settings(settings))  # before the run directory is written  # fmt: skip
    # one W&B run per output directory, resumed by a rerun (the run directory is shared by every data set's run)
    run_dir, logger = start_run(cfg, job_type="data_prep", same_run=True, run_key=str(out_dir))
    try:
        stats = summarize_traces(
            rows,
            settings,
            out_dir,
            store_path=pipe.store,
            tokenizer=tokenizer,
            load_report={"rows": load.rows, "kept": load.kept, **dict(load.defects)},
        )
    except SummarizeFailed as e:
        logger.finish()
        raise SystemExit(str(e)) from None
    shown = {k: v for k, v in stats.items() if not isinstance(v, dict)}
    shown["rows_skipped"] = describe_skipped(stats["rows_skipped"])
    shown["out_dir"] = str(out_dir)
    write_summary(run_dir, shown, f"summaries: {stats['rows_written']}/{stats['rows_in']} rows written")
    logger.summary({k: v for k, v in shown.items() if isinstance(v, int | float)})
    logger.finish()
    if stats["summaries_failed"]:
        log.warning("%d summaries failed; rerun to retry only those", stats["summaries_failed"])
    return stats


__all__ = ["PROMPT_VERSION", "SummarizeFailed", "SummarizeSettings", "asdict", "run", "summarize_traces"]
