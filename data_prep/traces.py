"""Reasoning traces (Bespoke-Stratos / Sky-T1 tag format) as chat conversations.

Real traces are messy: truncated generations, missing ``<|end_of_thought|>`` or solution tags, empty
rows. :func:`load_trace_rows` keeps every usable row, counts each defect, and never crashes on one.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoomr import tokens
from zoomr.jsonl import BadRowError, JsonlReader
from zoomr.paths import MissingInput, resolve_repo_path

log = logging.getLogger(__name__)

MALFORMED = "__malformed__"  # marker row for an unreadable JSONL line: {MALFORMED: reason, "line": n}


@dataclass
class TraceRow:
    """One problem with its reasoning trace (the assistant response, tags included)."""

    id: str
    question: str
    response: str
    system: str | None = None
    defects: list[str] = field(default_factory=list)
    line: int | None = None  # where it was read: a JSONL file's line, a dataset's row (from 1); None when made by hand

    def messages(self, include_system: bool = True) -> list[dict[str, str]]:
        msgs = []
        if include_system and self.system:
            msgs.append({"role": "system", "content": self.system})
        msgs.append({"role": "user", "content": self.question})
        msgs.append({"role": "assistant", "content": self.response})
        return msgs


@dataclass
class LoadReport:
    rows: int = 0
    kept: int = 0
    defects: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.defects.items())) or "none"
        return f"{self.kept}/{self.rows} rows kept; defects: {parts}"


def trace_defects(response: str) -> list[str]:
    """Which tags of the thought/solution format are missing (truncated traces lack the closing ones)."""
    defects = []
    for tag, name in [
        (tokens.BEGIN_THOUGHT, "missing_begin_thought"),
        (tokens.END_THOUGHT, "missing_end_thought"),
        (tokens.BEGIN_SOLUTION, "missing_begin_solution"),
        (tokens.END_SOLUTION, "missing_end_solution"),
    ]:
        if tag not in response:
            defects.append(name)
    return defects


def _from_skythought_eval(row: dict[str, Any], i: int) -> TraceRow | str:
    question = row.get("question") or row.get("problem")
    code = row.get("code")
    response = code[0] if isinstance(code, list) and code else code
    if not isinstance(question, str) or not question.strip():
        return "no_question"
    if not isinstance(response, str) or not response.strip():
        return "no_response"
    return TraceRow(id=str(row.get("idx", i)), question=question, response=response)


def _from_bespoke(row: dict[str, Any], i: int) -> TraceRow | str:
    conv = row.get("conversations")
    if not isinstance(conv, list) or len(conv) < 2:
        return "no_conversations"
    turns = [c for c in conv if isinstance(c, dict)]
    if len(turns) < len(conv):
        return "turn_not_an_object"
    user = next((c.get("value") for c in turns if c.get("from") in ("user", "human")), None)
    assistant = next((c.get("value") for c in turns if c.get("from") in ("assistant", "gpt")), None)
    if not isinstance(user, str) or not user.strip():
        return "no_question"
    if not isinstance(assistant, str) or not assistant.strip():
        return "no_response"
    system = row.get("system")
    if system is not None and not isinstance(system, str):  # went into the chat as a message's content
        return "system_not_text"
    return TraceRow(id=str(row.get("id", i)), question=user, response=assistant, system=system)


PARSERS = {"skythought_eval": _from_skythought_eval, "bespoke": _from_bespoke}


def iter_raw_rows(source: str, path: str | None, hub_id: str | None, split: str):
    """``(line, row)`` of every input row: a JSONL file's line number, a dataset's row number (from 1)."""
    if source == "local":
        if not path:
            raise ValueError("data.source=local needs data.path")
        p = resolve_repo_path(path)
        if not p.exists():
            raise MissingInput(f"trace file not found: {path} (looked at {p})")
        if p.suffix == ".parquet" or p.is_dir():
            yield from enumerate(local_dataset(p, path), 1)
            return
        reader = JsonlReader(p, on_bad="skip")  # not UTF-8 / not JSON / not an object: counted, logged
        seen = 0
        for line, row in reader:
            yield from ((b.line, {MALFORMED: b.reason, "line": b.line}) for b in reader.bad[seen:])
            seen = len(reader.bad)
            yield line, row
        yield from ((b.line, {MALFORMED: b.reason, "line": b.line}) for b in reader.bad[seen:])
    elif source == "hub":
        import datasets

        try:
            rows = datasets.load_dataset(hub_id, split=split)
        except Exception as e:  # noqa: BLE001 - the hub's errors are many (offline, no access, a wrong id or split)
            raise MissingInput(
                f"data.hub_id={hub_id} (split {split}): could not load it from the Hugging Face hub "
                f"({e.__class__.__name__}: {str(e)[:200]}); on a machine without the hub use data.source=local and "
                "data.path=<a local JSONL, parquet or save_to_disk copy>"
            ) from None
        yield from enumerate(rows, 1)
    else:
        raise ValueError(f"data.source must be local or hub, got {source!r}")


def local_dataset(p: Path, given: str):
    """The rows of a parquet file or of a directory written with ``save_to_disk`` (e.g. data_prep.summarize's
    ``dataset/``); one that is neither is a :class:`BadRowError` naming it (were pyarrow's ``ArrowInvalid`` and
    datasets' ``FileNotFoundError`` tracebacks)."""
    import datasets
    import pyarrow

    try:
        if p.is_dir():
            return datasets.load_from_disk(str(p))
        return datasets.Dataset.from_parquet(str(p))
    except (FileNotFoundError, pyarrow.ArrowException) as e:
        kind = "a directory written with datasets' save_to_disk" if p.is_dir() else "a parquet file"
        raise BadRowError(
            f"data.path={given}: not {kind} ({e.__class__.__name__}: {str(e)[:200]}); give a JSONL file, a parquet "
            "file or such a directory"
        ) from None


def load_trace_rows(
    source: str = "local",
    path: str | None = None,
    hub_id: str | None = None,
    split: str = "train",
    format: str = "skythought_eval",
    max_samples: int | None = None,
    special: list[str] | None = None,
) -> tuple[list[TraceRow], LoadReport]:
    """Parse trace rows, skipping (and counting) unusable ones; tag defects are counted but kept. A row whose text
    holds a special token's string (:func:`quoted_specials`; ``special``: a tokenizer's own, beside the project's)
    is skipped with a warning naming it."""
    if format not in PARSERS:
        raise ValueError(f"data.format must be one of {sorted(PARSERS)}, got {format!r}")
    parse = PARSERS[format]
    report = LoadReport()
    rows: list[TraceRow] = []
    for i, (line, raw) in enumerate(iter_raw_rows(source, path, hub_id, split)):
        report.rows += 1
        if MALFORMED in raw:  # a line the JSONL reader could not read (logged there with file and line)
            reason = raw[MALFORMED].split(" (")[0]
            report.defects["malformed_json" if reason == "bad_json" else reason] += 1
            continue
        parsed = parse(raw, i)
        if isinstance(parsed, str):
            report.defects[parsed] += 1
            continue
        if not _unicode(parsed.question, parsed.response, parsed.system):
            report.defects["lone_surrogate"] += 1
            continue
        if quoted := quoted_specials(parsed, special):
            report.defects[quoted[0]] += 1
            if sum(n for k, n in report.defects.items() if k.startswith("special_token_in_")) <= 5:  # the first few
                log.warning("traces: row %s (id %r) skipped: %s (a tokenizer reads it as the special token, not as "
                            "text)", line, parsed.id, quoted[1])  # fmt: skip
            continue
        if not summaries_paired(parsed.response):
            report.defects["unpaired_summary_tags"] += 1
            continue
        parsed.defects = trace_defects(parsed.response)
        parsed.line = line
        report.defects.update(parsed.defects)
        rows.append(parsed)
        if max_samples is not None and len(rows) >= max_samples:
            break
    report.kept = len(rows)
    if not rows:
        where = path if source == "local" else f"{hub_id} [{split}]"
        raise MissingInput(f"{where}: no usable trace rows in format {format!r} ({report.summary()})")
    log.info("traces: %s", report.summary())
    return rows, report


# the tags a trace's response writes itself (its thought and solution, and the summaries data_prep.summarize inserts)
RESPONSE_TAGS = frozenset(tokens.REASONING_TAGS + tokens.SUMMARY_TAGS)


def quoted_specials(row: TraceRow, special: list[str] | None = None) -> tuple[str, str] | None:
    """(defect, what) when the row's text holds a special token's string literally (None: it holds none): the
    question or system prompt any of :data:`zoomr.tokens.ALL_SPECIAL_TOKENS` (and ``special``), the response any
    but its own tags (:data:`RESPONSE_TAGS`). The tokenizer reads each as the token, not as text: a question quoting
    ``<|im_end|>`` ended the user turn, a response quoting it taught an end of turn mid-response, a literal
    ``<|pause_3|>`` became a pause token (an AbridgeKV code row) and ``<|splitter|>`` a LightThinker thought end."""
    strings = [*tokens.ALL_SPECIAL_TOKENS, *(s for s in special or () if s not in tokens.ALL_SPECIAL_TOKENS)]
    for field_name, text in (("question", row.question), ("system", row.system), ("response", row.response)):
        allowed = RESPONSE_TAGS if field_name == "response" else ()
        found = [s for s in tokens.specials_in(text or "", strings) if s not in allowed]
        if found:
            return f"special_token_in_{field_name}", f"its {field_name} holds {tokens.describe_specials(found)} literally"
    return None


_SUMMARY_TAG = re.compile("|".join(re.escape(t) for t in tokens.SUMMARY_TAGS))


def summaries_paired(response: str) -> bool:
    """Whether the summary delimiters of ``response`` open and close in turn (``<|begin_of_summary|>`` … then
    ``<|end_of_summary|>``; none at all is paired), as data_prep.summarize writes them. A stray one (a trace
    quoting a delimiter, a summary block cut by hand) trained the ZoomR model to write malformed summaries."""
    tags = _SUMMARY_TAG.findall(response)
    return tags == [tokens.BEGIN_SUMMARY, tokens.END_SUMMARY] * (len(tags) // 2) and len(tags) % 2 == 0


def _unicode(*texts: str | None) -> bool:
    """Whether every text is valid Unicode: a JSON line may escape a lone surrogate (``"\\ud800"``), which no file,
    hash or tokenizer can encode (the summariser's paragraph hash failed on it with a UnicodeEncodeError traceback)."""
    try:
        for text in texts:
            if isinstance(text, str):
                text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sft_dataset(data: dict[str, Any], tokenizer=None):
    """``datasets.Dataset`` of chat ``messages`` for TRL's SFTTrainer (the ``data.loader`` protocol)."""
    import datasets

    rows, report = load_trace_rows(
        source=data["source"],
        path=data.get("path"),
        hub_id=data.get("hub_id"),
        split=data.get("split", "train"),
        format=data.get("format", "skythought_eval"),
        max_samples=data.get("max_samples"),
        special=tokens.read_as_special(tokenizer) if tokenizer is not None else None,
    )
    ds = datasets.Dataset.from_list([{"messages": r.messages(), "id": r.id} for r in rows])
    ds.info.description = report.summary()
    return ds
