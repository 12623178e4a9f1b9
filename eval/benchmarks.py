"""Benchmark problems: vendored files (``eval/data/benchmarks``, see its PROVENANCE.md) or the hub.

Every source is one file with its hub id and a row parser that yields :class:`Problem` records with
stable ids (``aime_2024/I-01``, ``hmmt_feb_2025/07``, ``math500/test/algebra/1.json``, ...), so the same
problem has the same id in every arm and paired comparisons can match them.

The competition ``suite`` (AbridgeKV §4 / App. B.2, minus the sets not available offline) pools
AIME 2022-2025, HMMT Feb 2025, BRUMO 2025, CMIMC 2025 and AMC 12 2022-2023. Overlaps between the
vendored files are resolved by choosing sources, and :func:`load_problems` refuses duplicate ids:
``aime_2024`` (HuggingFaceH4) is the 2024 third of ``aime_2022_2024`` (AI-MO), and ``amc23`` (math-ai)
is the 2023 half of ``amc12_2022_2023`` (AI-MO); both were checked identical problem by problem.

GPQA-Diamond is read from the authors' password-protected zip in memory only (no plain text on disk);
its four options are shuffled per question with a seeded generator, identical in every arm.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import random
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError, JsonlReader
from zoomr.paths import MissingInput, resolve_repo_path

LETTERS = "ABCD"
GPQA_PASSWORD = b"deserted-untie-orchid"  # published by the GPQA authors in their README
GPQA_MEMBER = "dataset/gpqa_diamond.csv"


@dataclass(frozen=True)
class Problem:
    """One question. ``answer`` is the gold LaTeX (math) or the correct letter (gpqa)."""

    id: str
    question: str
    answer: str
    competition: str
    task: str = "math"
    choices: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Source:
    """A vendored file, the hub dataset it copies, and how to turn its rows into problems."""

    path: str
    hub_id: str
    hub_split: str
    parse: Callable[[dict[str, Any]], Problem]
    hub_config: str | None = None
    task: str = "math"
    sort: bool = True  # order problems by id (AIME I-01..II-15); False keeps the file's canonical order


def _answer_str(value: Any) -> str:
    """The gold answer as a string; a missing, null or empty answer is an error, never a gold ``"None"``/``""``."""
    if value is None or isinstance(value, bool | dict | list) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"the answer is {json.dumps(value)}, not a gold answer")  # NaN was the gold "nan"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if not text:
        raise ValueError("the answer is empty")
    return text


def _question_str(value: Any) -> str:
    """The problem statement; a missing, null, non-text or empty one is an error (it was rendered as ``"None"``)."""
    if not isinstance(value, str):
        raise ValueError(f"the problem is {json.dumps(value)}, not a problem statement")
    if not value.strip():
        raise ValueError("the problem is empty")
    return value


def _problem_number(value: Any) -> int:
    """MathArena's ``problem_idx``, a number >= 1: 1.7 and true were read as problem 1, 0 as AIME I-15."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"problem_idx is {json.dumps(value)}, not a problem number (1, 2, ...)")
    return value


def _problem_key(value: Any, name: str) -> str:
    """A row's own id (MATH-500's ``unique_id``): null or empty was the problem id ``math500/None`` / ``math500/``."""
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise ValueError(f"{name} is {json.dumps(value)}, not an id")
    return str(value)


_AOPS_AIME = re.compile(r"(\d{4})_AIME_(I{1,2})_Problems/Problem_(\d+)")
_AOPS_AMC = re.compile(r"(\d{4})_AMC_(12[AB])_Problems/Problem_(\d+)")
AOPS_PROBLEMS = {"AIME": 15, "AMC": 25}  # problems per paper (AIME I / II, AMC 12A / 12B)


def _paper_number(num: int, contest: str, row: dict[str, Any]) -> int:
    """The problem number of an AoPS url: Problem_16 of an AIME paper was the id I-16, Problem_0 I-00."""
    if not 1 <= num <= AOPS_PROBLEMS[contest]:
        raise ValueError(f"{contest} url names problem {num}, not one of 1-{AOPS_PROBLEMS[contest]}: {row['url']!r}")
    return num


def _aime_from_url(row: dict[str, Any]) -> Problem:
    m = _AOPS_AIME.search(row["url"])
    if not m:
        raise ValueError(f"AIME row without an AoPS problem url: {row.get('url')!r}")
    year, part, num = m.group(1), m.group(2), _paper_number(int(m.group(3)), "AIME", row)
    return Problem(
        id=f"aime_{year}/{part}-{num:02d}",
        question=_question_str(row["problem"]),
        answer=_answer_str(row["answer"]),
        competition=f"aime_{year}",
        meta={"url": row["url"]},
    )


def _amc_from_url(row: dict[str, Any]) -> Problem:
    m = _AOPS_AMC.search(row["url"])
    if not m:
        raise ValueError(f"AMC row without an AoPS problem url: {row.get('url')!r}")
    year, paper, num = m.group(1), m.group(2), _paper_number(int(m.group(3)), "AMC", row)
    return Problem(
        id=f"amc12_{year}/{paper}-{num:02d}",
        question=_question_str(row.get("problem") or row["question"]),
        answer=_answer_str(row["answer"]),
        competition=f"amc12_{year}",
        meta={"url": row["url"]},
    )


def _matharena(competition: str, problems: int) -> Callable[[dict[str, Any]], Problem]:
    """MathArena's rows of ``competition``, numbered 1..``problems`` (``problem_idx``; the vendored files hold each)."""

    def parse(row: dict[str, Any]) -> Problem:
        idx = _problem_number(row["problem_idx"])
        if idx > problems:  # AIME 2025's 31 was the id II-01, HMMT's 31 a problem 31 of 30, without a word
            raise ValueError(f"problem_idx is {idx}, past the {problems} problems of {competition}")
        if competition == "aime_2025":  # MathArena numbers AIME I as 1-15 and AIME II as 16-30
            pid = f"{'I' if idx <= 15 else 'II'}-{(idx - 1) % 15 + 1:02d}"
        else:
            pid = f"{idx:02d}"
        return Problem(
            id=f"{competition}/{pid}",
            question=_question_str(row["problem"]),
            answer=_answer_str(row["answer"]),
            competition=competition,
        )

    return parse


def _math500(row: dict[str, Any]) -> Problem:
    return Problem(
        id=f"math500/{_problem_key(row['unique_id'], 'unique_id')}",
        question=_question_str(row["problem"]),
        answer=_answer_str(row["answer"]),
        competition="math500",
        meta={"solution": row.get("solution", ""), "subject": row.get("subject"), "level": row.get("level")},
    )


def gpqa_problem(row: dict[str, Any], seed: int) -> Problem:
    """A GPQA row with its options shuffled by a generator seeded from (seed, Record ID)."""
    keys = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    for key in keys:  # a CSV row cut short reads None there (was an AttributeError traceback)
        if not isinstance(row[key], str):
            raise ValueError(f"{key!r} is {json.dumps(row[key])}, not an option (a row with fewer columns?)")
    options = [row[key].strip() for key in keys]
    record = _problem_key(row["Record ID"], "Record ID")  # an empty one was the id gpqa_diamond/
    if empty := [key for key, option in zip(keys, options) if not option]:  # was a blank choice the model could pick
        raise ValueError(f"question {record}: {empty[0]!r} is empty, not an option")
    if same := [key for key, option in zip(keys[1:], options[1:]) if option == options[0]]:
        raise ValueError(f"question {record}: {same[0]!r} is the correct answer again ({options[0][:60]!r}), so "
                         "two letters are right and the grader accepts only one")  # fmt: skip
    digest = hashlib.sha256(f"{seed}/{record}".encode()).hexdigest()
    order = random.Random(int(digest[:16], 16)).sample(range(4), 4)
    return Problem(
        id=f"gpqa_diamond/{record}",
        question=_question_str(row["Question"]).strip(),
        answer=LETTERS[order.index(0)],
        competition="gpqa_diamond",
        task="gpqa",
        choices=tuple(options[i] for i in order),
        meta={"domain": row.get("High-level domain"), "subdomain": row.get("Subdomain")},
    )


SOURCES: dict[str, Source] = {
    "math500": Source("math500/test.jsonl", "HuggingFaceH4/MATH-500", "test", _math500, sort=False),
    "aime_2024": Source("aime_2024/train.jsonl", "HuggingFaceH4/aime_2024", "train", _aime_from_url),
    "aime_2022_2024": Source(
        "aimo_validation_aime_2022_2024/train.jsonl", "AI-MO/aimo-validation-aime", "train", _aime_from_url
    ),
    "aime_2025": Source("aime_2025/train.jsonl", "MathArena/aime_2025", "train", _matharena("aime_2025", 30)),
    "hmmt_feb_2025": Source(
        "matharena_hmmt_feb_2025/train.jsonl", "MathArena/hmmt_feb_2025", "train", _matharena("hmmt_feb_2025", 30)
    ),
    "brumo_2025": Source(
        "matharena_brumo_2025/train.jsonl", "MathArena/brumo_2025", "train", _matharena("brumo_2025", 30)
    ),
    "cmimc_2025": Source(
        "matharena_cmimc_2025/train.jsonl", "MathArena/cmimc_2025", "train", _matharena("cmimc_2025", 40)
    ),
    "amc12_2022_2023": Source(
        "aimo_validation_amc_2022_2023/train.jsonl", "AI-MO/aimo-validation-amc", "train", _amc_from_url
    ),
    "amc23": Source("amc_2023/test.jsonl", "math-ai/amc23", "test", _amc_from_url),
    "gpqa_diamond": Source(
        "gpqa_diamond/dataset.zip",
        "Idavidrein/gpqa",
        "train",
        lambda row: row,
        "gpqa_diamond",
        "gpqa",
        sort=False,
    ),
}


def _parse_rows(
    rows: Iterable[tuple[str, dict[str, Any]]], parse: Callable[[dict[str, Any]], Problem]
) -> list[Problem]:
    """Parse ``(where, row)`` pairs; a row the parser cannot use refuses the source, naming the row."""
    problems = []
    for where, row in rows:
        try:
            problems.append(parse(row))
        except KeyError as e:
            raise BadRowError(f"{where}: no field {e.args[0]!r}; a benchmark row needs it") from None
        except (ValueError, TypeError) as e:
            raise BadRowError(f"{where}: {e}") from None
    return problems


def read_gpqa_zip(path: Path, member: str = GPQA_MEMBER) -> list[dict[str, Any]]:
    """Rows of a GPQA CSV decrypted in memory from the authors' zip (nothing is written to disk)."""
    try:  # each of these was a traceback (BadZipFile, KeyError, UnicodeDecodeError)
        with zipfile.ZipFile(path) as z:
            data = z.read(member, pwd=GPQA_PASSWORD)
        return list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    except zipfile.BadZipFile as e:
        raise BadRowError(f"{path}: not a readable zip ({e}); expected the GPQA authors' dataset.zip") from None
    except KeyError:
        raise BadRowError(f"{path}: no {member} in the zip; expected the GPQA authors' dataset.zip") from None
    except UnicodeDecodeError as e:
        raise BadRowError(f"{path}: {member} is not UTF-8 text (byte {e.start})") from None


def _hub_rows(source: Source) -> Iterable[dict[str, Any]]:
    import datasets

    try:
        return datasets.load_dataset(source.hub_id, source.hub_config, split=source.hub_split)
    except Exception as e:  # noqa: BLE001 - the hub's errors are many; say what to do instead
        raise RuntimeError(
            f"could not load {source.hub_id} from the Hugging Face hub ({e.__class__.__name__}: {str(e)[:200]}); "
            "use benchmark.source=local to read the vendored copy"
        ) from e


def load_source(
    name: str,
    data_dir: str | Path,
    source: str = "local",
    option_seed: int = 1234,
) -> list[Problem]:
    """Problems of one named source, from the vendored file (``local``) or the hub (``hub``)."""
    if name not in SOURCES:
        known = ", ".join(sorted(SOURCES))
        raise ValueError(f"unknown benchmark source {name!r}; known: {known}")
    src = SOURCES[name]
    if source == "local":
        path = resolve_repo_path(data_dir) / src.path
        if not path.is_file():  # a directory was an IsADirectoryError traceback
            raise MissingInput(f"benchmark source {name!r}: {path} not found")
        if src.task == "gpqa":
            rows = [(f"{path} row {i}", r) for i, r in enumerate(read_gpqa_zip(path), 2)]  # row 1: header
        else:
            rows = [(f"{path} line {n}", r) for n, r in JsonlReader(path, on_bad="refuse")]
    elif source == "hub":
        rows = [(f"{src.hub_id} row {i}", r) for i, r in enumerate(_hub_rows(src))]
    else:
        raise ValueError(f"benchmark.source must be local|hub, got {source!r}")
    if not rows:  # an empty (e.g. truncated) file dropped its competition from a suite without a word
        where = path if source == "local" else src.hub_id
        raise BadRowError(f"benchmark source {name!r}: {where} holds no problems")
    parse = (lambda row: gpqa_problem(row, option_seed)) if src.task == "gpqa" else src.parse
    problems = _parse_rows(rows, parse)
    return sorted(problems, key=lambda p: p.id) if src.sort else problems


def load_problems(
    sources: list[str],
    data_dir: str | Path = "eval/data/benchmarks",
    source: str = "local",
    option_seed: int = 1234,
    limit: int | None = None,
) -> list[Problem]:
    """Problems of several sources in order; duplicate ids across sources are an error."""
    if limit is not None and limit < 1:
        raise ValueError(f"problem limit must be >= 1 (or None for every problem), got {limit}")
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for name in sources:
        for p in load_source(name, data_dir, source, option_seed):
            if seen.get(p.id) == name:  # was reported as two overlapping sources, both this one
                where = resolve_repo_path(data_dir) / SOURCES[name].path if source == "local" else SOURCES[name].hub_id
                raise BadRowError(f"problem {p.id} appears twice in {where} (benchmark source {name!r}): each row "
                                  "must be its own problem")  # fmt: skip
            if p.id in seen:
                raise ValueError(
                    f"problem {p.id} appears in sources {seen[p.id]!r} and {name!r}: "
                    "a benchmark must not list overlapping sources"
                )
            seen[p.id] = name
            problems.append(p)
    return problems[:limit] if limit is not None else problems


def load_benchmark(cfg: Any) -> list[Problem]:
    """Problems of a :class:`zoomr.schemas.eval.BenchmarkConfig` (or any object with its fields)."""
    problems = load_problems(
        cfg.sources, cfg.data_dir, cfg.source, cfg.option_seed, cfg.problem_limit
    )
    wrong = {p.task for p in problems} - {cfg.task}
    if wrong:
        raise ValueError(f"benchmark {cfg.name!r} has task {cfg.task!r} but its sources hold {sorted(wrong)}")
    return problems
