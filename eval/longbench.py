"""LongBench (Bai et al., 2024): the 21 subsets of the KVzap paper's §4.5, loaded from the hub or a local
directory, prompted and scored as LongBench defines them.

Prompts and generation budgets are LongBench's own files (``config/dataset2prompt.json`` and
``config/dataset2maxlen.json``, vendored byte-identical in ``eval/data/longbench/``, MIT; see
``eval/data/PROVENANCE.md``). As LongBench's ``pred.py``: a prompt longer than ``max_prompt_tokens``
(None = never) keeps its first and last halves; the few-shot and code subsets (trec, triviaqa, samsum,
lsht, lcc, repobench-p) are fed without the chat template, the others through it.

Metrics (LongBench's ``metrics.py``, reimplemented here): token F1 after SQuAD normalisation (QA),
ROUGE-L F (summaries; pltrdy ``rouge``'s summary-level union-LCS over "."-split sentences with word sets),
classification accuracy with LongBench's partial credit (trec, lsht), retrieval and count precision of the
numbers in the output, and edit similarity of the first code line (fuzzywuzzy ``fuzz.ratio`` with
difflib's ``SequenceMatcher``, fuzzywuzzy's behaviour without python-Levenshtein). A sample's score is
the best over its gold answers; subset scores are means x 100. Chinese subsets cut words with ``jieba``
(``pip install jieba``), as LongBench; the summary reports the average over subsets with and without TREC
(the KVzap paper reports both).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable
from difflib import SequenceMatcher
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError, read_jsonl
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.schemas.checks import is_integer

CONFIG_DIR = "eval/data/longbench"
HUB_ID = "THUDM/LongBench"
RAW_SUBSETS = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")  # no chat template (pred.py)
FIRST_LINE = ("trec", "triviaqa", "samsum", "lsht")  # scored on the first line of the output
CN_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."


# ---------------------------------------------------------------------------------------------------
# normalisation and metrics


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def normalize_zh_answer(s: str) -> str:
    """Lower case, no (ASCII or Chinese) punctuation, no whitespace."""
    drop = set(string.punctuation + CN_PUNCTUATION)
    return "".join("".join(ch for ch in s.lower() if ch not in drop).split())


def f1_tokens(prediction: list[str], ground_truth: list[str]) -> float:
    """F1 of the multiset overlap of two token lists."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, ground_truth: str, **_: Any) -> float:
    return f1_tokens(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def jieba_cut(text: str) -> list[str]:
    try:
        import jieba
    except ImportError:
        raise ImportError(
            "LongBench's Chinese subsets cut words with jieba: pip install jieba (or leave out multifieldqa_zh, "
            "dureader, vcsum)"
        ) from None
    return list(jieba.cut(text, cut_all=False))


def qa_f1_zh(
    prediction: str, ground_truth: str, cut: Callable[[str], list[str]] = jieba_cut, **_: Any
) -> float:
    pred = [t for t in (normalize_zh_answer(w) for w in cut(prediction)) if t]
    gold = [t for t in (normalize_zh_answer(w) for w in cut(ground_truth)) if t]
    return f1_tokens(pred, gold)


def _lcs_words(x: list[str], y: list[str]) -> set[str]:
    """Words of one longest common subsequence of x and y (backtracking prefers dropping from y on ties,
    as pltrdy ``rouge``'s reconstruction)."""
    n, m = len(x), len(y)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        xi, row, prev = x[i - 1], table[i], table[i - 1]
        for j in range(1, m + 1):
            row[j] = prev[j - 1] + 1 if xi == y[j - 1] else max(prev[j], row[j - 1])
    out, i, j = set(), n, m
    while i > 0 and j > 0:
        if x[i - 1] == y[j - 1]:
            out.add(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out


def _sentences(text: str) -> list[str]:
    return [" ".join(s.split()) for s in text.split(".") if len(s) > 0]


def rouge_l(prediction: str, ground_truth: str, **_: Any) -> float:
    """ROUGE-L F as pltrdy ``rouge`` (``Rouge().get_scores(...)["rouge-l"]["f"]``, exclusive word sets,
    summary level); 0.0 where it raises (an empty text), as LongBench catches it."""
    hyp, ref = _sentences(prediction), _sentences(ground_truth)
    if not hyp or not ref:
        return 0.0
    words = [w for s in ref for w in s.split(" ")]
    m, n = len(set(words)), len(set(w for s in hyp for w in s.split(" ")))
    union: set[str] = set()
    total = 0
    for r in ref:
        before = len(union)
        for h in hyp:
            union |= _lcs_words(r.split(" "), h.split(" "))
        total += len(union) - before
    r_lcs, p_lcs = total / m, total / n
    return 2.0 * p_lcs * r_lcs / (p_lcs + r_lcs + 1e-8)


def rouge_zh(
    prediction: str, ground_truth: str, cut: Callable[[str], list[str]] = jieba_cut, **_: Any
) -> float:
    return rouge_l(" ".join(cut(prediction)), " ".join(cut(ground_truth)))


def classification(
    prediction: str, ground_truth: str, all_classes: list[str] | None = None, **_: Any
) -> float:
    """1 / (classes named in the output) if the gold class is among them; a named class that is a proper
    substring of the gold is not counted. LongBench removes those while iterating over the same list
    (so a second such class right after a removed one stays); kept for identical scores."""
    matches = [c for c in all_classes or [] if c in prediction]
    for term in matches:  # noqa: B909 - LongBench's loop, removal during iteration included
        if term in ground_truth and term != ground_truth:
            matches.remove(term)
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _number_precision(prediction: str, gold: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    return sum(n == gold for n in numbers) / len(numbers) if numbers else 0.0


GOLD_PARAGRAPH = {"passage_retrieval_en": r"Paragraph (\d+)", "passage_retrieval_zh": r"段落(\d+)"}


def retrieval(prediction: str, ground_truth: str, **_: Any) -> float:
    """Share of the numbers in the output that are the gold paragraph's ("Paragraph N")."""
    return _number_precision(prediction, re.findall(GOLD_PARAGRAPH["passage_retrieval_en"], ground_truth)[0])


def retrieval_zh(prediction: str, ground_truth: str, **_: Any) -> float:
    return _number_precision(prediction, re.findall(GOLD_PARAGRAPH["passage_retrieval_zh"], ground_truth)[0])


def count(prediction: str, ground_truth: str, **_: Any) -> float:
    """Share of the numbers in the output equal to the gold count."""
    return _number_precision(prediction, str(ground_truth))


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` (difflib backend): 100 if equal, 0 if one is empty, else
    round(100 x SequenceMatcher ratio)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * SequenceMatcher(None, a, b).ratio()))


def code_sim(prediction: str, ground_truth: str, **_: Any) -> float:
    """Edit similarity of the first output line that is not a comment or a code fence."""
    line = next(
        (x for x in prediction.lstrip("\n").split("\n") if not any(c in x for c in ("`", "#", "//"))), ""
    )
    return fuzz_ratio(line, ground_truth) / 100


METRICS: dict[str, Callable[..., float]] = {
    "narrativeqa": qa_f1,
    "qasper": qa_f1,
    "multifieldqa_en": qa_f1,
    "multifieldqa_zh": qa_f1_zh,
    "hotpotqa": qa_f1,
    "2wikimqa": qa_f1,
    "musique": qa_f1,
    "dureader": rouge_zh,
    "gov_report": rouge_l,
    "qmsum": rouge_l,
    "multi_news": rouge_l,
    "vcsum": rouge_zh,
    "trec": classification,
    "triviaqa": qa_f1,
    "samsum": rouge_l,
    "lsht": classification,
    "passage_retrieval_en": retrieval,
    "passage_count": count,
    "passage_retrieval_zh": retrieval_zh,
    "lcc": code_sim,
    "repobench-p": code_sim,
}
SUBSETS = tuple(METRICS)


def score(subset: str, prediction: str, answers: list[str], all_classes: list[str] | None = None) -> float:
    """LongBench's score of one output in [0, 1]: the best over the gold answers."""
    if subset in FIRST_LINE:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = METRICS[subset]
    return max((metric(prediction, gt, all_classes=all_classes) for gt in answers), default=0.0)


def averages(scores: dict[str, float]) -> dict[str, float | None]:
    """Mean subset score, and the mean without TREC (KVzap paper, Fig. 12)."""
    rest = [v for k, v in scores.items() if k != "trec"]
    return {
        "average": sum(scores.values()) / len(scores) if scores else None,
        "average_without_trec": sum(rest) / len(rest) if rest else None,
    }


# ---------------------------------------------------------------------------------------------------
# data and prompts


@lru_cache(maxsize=1)
def prompts() -> dict[str, str]:
    return json.loads((resolve_repo_path(CONFIG_DIR) / "dataset2prompt.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def budgets() -> dict[str, int]:
    return json.loads((resolve_repo_path(CONFIG_DIR) / "dataset2maxlen.json").read_text(encoding="utf-8"))


def row_problem(subset: str, row: dict[str, Any]) -> str | None:
    """Why a row of ``subset`` cannot be prompted and scored, or None. The gold ``answers`` must be a non-empty
    list of strings or numbers (a string was scored character by character, ``[]`` always 0, ``[null]`` against
    "None"); every field the subset's prompt names must be there and not null."""
    answers = row.get("answers")
    if not isinstance(answers, list) or not answers:
        return f"'answers' is {json.dumps(answers)[:80]}, not a non-empty list of gold answers"
    if bad := [a for a in answers if not isinstance(a, str | int | float) or isinstance(a, bool)]:
        return f"'answers' holds {json.dumps(bad[0])[:80]}, not a gold answer"
    fields = [name for _, name, _, _ in string.Formatter().parse(prompts()[subset]) if name]
    if missing := [f for f in fields if row.get(f) is None]:
        return f"no field {missing[0]!r} (or it is null); the {subset} prompt needs it"
    classes = row.get("all_classes")  # without them every output scored 0
    if METRICS[subset] is classification and not (
        isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes)
    ):
        return f"'all_classes' is {json.dumps(classes)[:80]}, not the list of class names {subset} is scored against"
    paragraph = GOLD_PARAGRAPH.get(subset)  # without one, scoring the output was an IndexError after decoding
    if paragraph and (bad := [a for a in answers if not re.search(paragraph, str(a))]):
        return f"the gold answer {json.dumps(bad[0], ensure_ascii=False)[:80]} names no paragraph (the {subset} metric reads {paragraph!r})"
    return None


def load_rows(subset: str, data_dir: str | None = None, hub_id: str = HUB_ID) -> list[dict[str, Any]]:
    """Rows of one subset: ``<data_dir>/<subset>.jsonl`` (the layout of LongBench's ``data.zip``), or the
    hub's ``load_dataset(hub_id, subset, split="test")``; a row :func:`row_problem` rejects is refused
    (:class:`zoomr.jsonl.BadRowError` naming the file and line, or the hub row)."""
    if subset not in METRICS:
        raise ValueError(f"unknown LongBench subset {subset!r}; known: {', '.join(SUBSETS)}")
    if data_dir is not None:
        path = Path(resolve_repo_path(data_dir)) / f"{subset}.jsonl"
        if not path.exists():
            raise MissingInput(f"LongBench {subset}: {path} not found (benchmark.options.data_dir)")
        rows = read_jsonl(path, lambda row: row_problem(subset, row))  # a bad line is refused naming file and line
        if not rows:  # an empty file left the subset out of the averages without a word
            raise BadRowError(f"LongBench {subset}: {path} holds no rows")
        return rows
    import datasets

    try:
        rows = list(datasets.load_dataset(hub_id, subset, split="test"))
    except Exception as e:  # noqa: BLE001 - the hub's errors are many; say what to do instead
        raise RuntimeError(
            f"could not load LongBench {subset} from the hub ({hub_id}; {e.__class__.__name__}: {str(e)[:160]}); "
            "download LongBench's data.zip, unzip it and set benchmark.options.data_dir=<dir with <subset>.jsonl>"
        ) from e
    for i, row in enumerate(rows):
        if (reason := row_problem(subset, row)) is not None:
            raise BadRowError(f"{hub_id} {subset} row {i}: {reason}")
    if not rows:
        raise BadRowError(f"LongBench {subset}: {hub_id} holds no rows")
    return rows


def truncate_middle(prompt: str, tokenizer: Any, max_tokens: int | None) -> str:
    """LongBench's truncation: a prompt over ``max_tokens`` keeps its first and last ``max_tokens // 2``."""
    if max_tokens is None:
        return prompt
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    if len(ids) <= max_tokens:
        return prompt
    half = max_tokens // 2
    return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
        ids[-half:], skip_special_tokens=True
    )


# ---------------------------------------------------------------------------------------------------
# the evaluator's task (eval/tasks.py): benchmark=longbench


def check_word_cutter(subsets: list[str]) -> None:
    """Refuse (``ValueError``) Chinese ``subsets`` scored with jieba's words when jieba is not installed, before any
    decoding: the first of their samples was an ImportError after every subset before it had been decoded."""
    if not subsets:
        return
    try:
        import jieba  # noqa: F401
    except ImportError:
        raise ValueError(f"LongBench subsets {subsets} are scored on words cut by jieba, which is not installed: pip "
                         "install jieba, or leave them out of benchmark.sources") from None  # fmt: skip


def load(bench: Any, tokenizer: Any, gen: Any) -> list:
    """LongBench problems of ``bench`` (``sources`` = subsets; ``options``: ``data_dir``, ``hub_id``,
    ``max_prompt_tokens``), prompts rendered as LongBench's ``pred.py``."""
    from eval.benchmarks import Problem
    from eval.prompts import SpecialTokenInText, chat_text, check_plain_text
    from eval.tasks import limit_per_subset

    options = dict(bench.options or {})
    unknown = set(options) - {"data_dir", "hub_id", "max_prompt_tokens"}
    if unknown:
        raise ValueError(f"benchmark.options for LongBench: unknown keys {sorted(unknown)}")
    bad = [s for s in bench.sources if s not in METRICS]
    if bad:
        raise ValueError(f"unknown LongBench subsets {bad}; known: {', '.join(SUBSETS)}")
    check_word_cutter([s for s in bench.sources if METRICS[s] in (qa_f1_zh, rouge_zh)])
    limit = options.get("max_prompt_tokens")
    if limit is not None and not (is_integer(limit) and limit >= 2):  # 0 or 1 kept all (ids[-0:]), < 0 doubled
        raise ValueError(f"benchmark.options.max_prompt_tokens={limit!r}: give an integer >= 2 (a longer prompt keeps "
                         "its first and last max_prompt_tokens // 2 tokens) or null")  # fmt: skip
    system, thinking = getattr(gen, "system_prompt", None), getattr(gen, "enable_thinking", None)
    problems = []
    for subset in bench.sources:
        rows = load_rows(subset, options.get("data_dir"), options.get("hub_id") or HUB_ID)
        for i, row in enumerate(rows[: limit_per_subset(bench.problem_limit, len(rows))]):
            text = prompts()[subset].format(**row)
            try:  # a context quoting '<|endoftext|>' was read as the token (or dropped by truncate_middle's decode)
                check_plain_text(text, tokenizer, "the prompt")
            except SpecialTokenInText as e:
                raise ValueError(f"LongBench {subset} row {i} (id {row.get('_id') or i}): {e}") from None
            text = truncate_middle(text, tokenizer, options.get("max_prompt_tokens"))
            prompt = text if subset in RAW_SUBSETS else chat_text(text, tokenizer, system, thinking)
            answers = [str(a) for a in row["answers"]]
            problems.append(
                Problem(
                    id=f"{subset}/{row.get('_id') or i}",
                    question=row.get("input") or "",
                    answer=" | ".join(answers),
                    competition=subset,
                    task="longbench",
                    meta={
                        "prompt": prompt,
                        "answers": answers,
                        "all_classes": row.get("all_classes"),
                        "max_new_tokens": budgets()[subset],
                        "length": row.get("length"),
                    },
                )
            )
    return problems


def _score_problem(problem: Any, text: str) -> float:
    return score(problem.competition, text, problem.meta["answers"], problem.meta.get("all_classes"))


def _prompt_bound(bench: Any) -> tuple[str, int] | None:
    """``benchmark.options.max_prompt_tokens`` (None: prompts are not truncated, their lengths unknown until read)."""
    limit = dict(bench.options or {}).get("max_prompt_tokens")
    return ("benchmark.options.max_prompt_tokens", limit) if is_integer(limit) else None


def _task() -> Any:
    from eval.tasks import ScoredTask

    return ScoredTask("longbench", load, _score_problem, averages, prompt_bound=_prompt_bound)


TASK = _task()
