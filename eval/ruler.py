"""RULER (Hsieh et al., 2024, "RULER: What's the real context size of your long-context language models?"),
generated here: the 13 subsets of the KVzap paper's RULER 4k (§4.4), at any length, with no hub.

Task definitions follow RULER's (its ``synthetic.yaml`` and task templates; the prompt wording is the
task's definition, so it is reproduced to keep scores comparable):

- ``niah_*``: needle-in-a-haystack. A needle is "One of the special magic {numbers|uuids} for {key} is:
  {value}."; haystacks are ``repeat`` (the repeated noise "The grass is green. The sky is blue. ..."),
  ``essay`` (RULER uses Paul Graham's essays; here the vendored Wikipedia text,
  ``data_prep/data/pretraining_text/wiki_demo.txt``, see its PROVENANCE.md) or ``needle`` (distractor needles
  of the same form). single 1-3, multikey 1-3, multivalue (4 values of one key), multiquery (4 keys asked).
- ``vt``: variable tracking, 1 chain of 4 hops (``VAR ABCDE = 12345``, ``VAR FGHIJ = VAR ABCDE``, ...) in
  the repeated noise, after a one-shot example; gold = the 5 variable names.
- ``cwe``: common-words extraction, a numbered list where 10 words appear 30 times and the rest 3 times
  (6 / 1 below 4K, as RULER), after a one-shot example; gold = the 10 common words.
- ``fwe``: frequent-words extraction, "coded" random 6-letter words drawn with Zipf counts (alpha 2, the
  most frequent replaced by ``...``); gold = the 3 most frequent words.
- ``qa_1`` / ``qa_2``: SQuAD v2 / HotpotQA questions over their documents plus distractors, loaded from
  the hub (:func:`qa_rows`; offline they fail fast with a message).

Lengths are counted in the model's own tokens, through ``count_tokens(input, answer_prefix)`` (the
evaluator passes the chat-templated prompt exactly as the model sees it). As in RULER, ``length`` is the
whole sequence, prompt + the task's generation budget (``count_generation=True``); the haystack size is
the largest that fits, found by a galloping binary search, so every prompt lands within a few tokens of
its target. Every random choice (keys, values, depths, word lists) comes from a generator seeded by
``(seed, subset, index)``: the same settings give the same examples, in any order and at any
``problem_limit``. Scoring (RULER's): ``string_match_all`` (share of gold strings found in the output,
case-insensitive) for the synthetic tasks, ``string_match_part`` (any gold string found) for QA.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import string
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.schemas.checks import check_types

log = logging.getLogger(__name__)

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = tuple(s.strip() + "." for s in NOISE.split(".") if s.strip())
DEPTHS = tuple(round(100 * i / 39) for i in range(40))  # RULER's 40 needle depths, 0..100 %

NIAH_TEMPLATE = (
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.\n{context}\n"
    "What are all the special magic {type_v} for {query} mentioned in the provided text?"
)
NIAH_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
# "assgined" is RULER's spelling; kept so that prompts match the benchmark's.
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
    "are assgined the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
    "the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
QA_PREFIX = " Answer:"


@dataclass(frozen=True)
class Subset:
    """One RULER subset: its task, arguments, generation budget and metric (``all`` | ``part``)."""

    task: str
    args: dict[str, Any]
    tokens_to_generate: int
    metric: str = "all"


def _niah(haystack: str, key: str, value: str, k: int = 1, v: int = 1, q: int = 1) -> Subset:
    return Subset("niah", {"haystack": haystack, "key": key, "value": value, "k": k, "v": v, "q": q}, 128)


SUBSETS: dict[str, Subset] = {
    "niah_single_1": _niah("repeat", "words", "numbers"),
    "niah_single_2": _niah("essay", "words", "numbers"),
    "niah_single_3": _niah("essay", "words", "uuids"),
    "niah_multikey_1": _niah("essay", "words", "numbers", k=4),
    "niah_multikey_2": _niah("needle", "words", "numbers"),
    "niah_multikey_3": _niah("needle", "uuids", "uuids"),
    "niah_multivalue": _niah("essay", "words", "numbers", v=4),
    "niah_multiquery": _niah("essay", "words", "numbers", q=4),
    "vt": Subset("vt", {"chains": 1, "hops": 4}, 30),
    "cwe": Subset("cwe", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}, 120),
    "fwe": Subset("fwe", {"alpha": 2.0, "word_len": 6}, 50),
    "qa_1": Subset("qa", {"dataset": "squad"}, 32, "part"),
    "qa_2": Subset("qa", {"dataset": "hotpotqa"}, 32, "part"),
}
SYNTHETIC = tuple(name for name, s in SUBSETS.items() if s.task != "qa")
QA_SUBSETS = ("qa_1", "qa_2")
QA_HUB = {  # dataset -> (hub id, config, split)
    "squad": ("rajpurkar/squad_v2", None, "validation"),
    "hotpotqa": ("hotpotqa/hotpot_qa", "distractor", "validation"),
}


@dataclass
class RulerSettings:
    """``benchmark.options`` of ``benchmark=ruler`` (plus ``benchmark.length``).

    ``samples``: examples per subset (RULER / KVzap: 500; ``benchmark.problem_limit`` takes the first N of
    each subset). ``subsets`` (``benchmark.sources``): None = the 11 synthetic ones; ``qa`` adds ``qa_1`` and
    ``qa_2`` (SQuAD / HotpotQA from the hub: the paper's 13).
    ``count_generation``: ``length`` includes the task's generation budget (RULER's rule); False = the
    prompt alone is ``length`` tokens. ``tolerance``: an example shorter than ``(1 - tolerance)`` of its
    target is an error (a haystack too short for the length).
    """

    length: int = 4096
    samples: int = 500
    seed: int = 42
    subsets: list[str] | None = None
    qa: bool = False
    haystack: str = "data_prep/data/pretraining_text/wiki_demo.txt"
    count_generation: bool = True
    tolerance: float = 0.02

    def __post_init__(self) -> None:
        check_types(self, "benchmark.options")  # an untyped dict: samples=1.5 or seed=1.5 reached the generators
        if self.length < 256:
            raise ValueError(f"benchmark.length must be >= 256 tokens, got {self.length}")
        if self.samples < 1:
            raise ValueError(f"benchmark.options.samples must be >= 1, got {self.samples}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"benchmark.options.tolerance must be in (0, 1), got {self.tolerance}")
        unknown = [s for s in self.chosen() if s not in SUBSETS]
        if unknown:
            raise ValueError(f"unknown RULER subsets {unknown}; known: {', '.join(SUBSETS)}")

    def chosen(self) -> list[str]:
        base = list(self.subsets) if self.subsets is not None else list(SYNTHETIC)
        return [*base, *(s for s in (QA_SUBSETS if self.qa else ()) if s not in base)]


@dataclass
class Example:
    """One generated prompt: the task input, the answer prefix that opens the model's reply, gold strings."""

    subset: str
    index: int
    input: str
    answer_prefix: str
    answers: list[str]
    prompt_tokens: int = 0
    target_tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


CountFn = Callable[[str, str], int]  # (task input, answer prefix) -> tokens of the prompt the model sees


# ---------------------------------------------------------------------------------------------------
# scoring (RULER's string match)


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[\x00-\x1f]", " ", text)).strip().lower()


def string_match_all(prediction: str, answers: list[str]) -> float:
    """Share of the gold strings found in the prediction (case-insensitive)."""
    pred = _clean(prediction)
    return sum(_clean(a) in pred for a in answers) / len(answers)


def string_match_part(prediction: str, answers: list[str]) -> float:
    """1.0 if any gold string is found in the prediction (case-insensitive), else 0.0."""
    pred = _clean(prediction)
    return float(any(_clean(a) in pred for a in answers))


METRICS = {"all": string_match_all, "part": string_match_part}


def score(subset: str, prediction: str, answers: list[str]) -> float:
    """RULER's score of one output in [0, 1] (the subset's metric)."""
    return METRICS[SUBSETS[subset].metric](prediction, answers)


# ---------------------------------------------------------------------------------------------------
# sources of text and words


def example_rng(seed: int, subset: str, index: int) -> random.Random:
    digest = hashlib.sha256(f"ruler/{seed}/{subset}/{index}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


@lru_cache(maxsize=4)
def essay_words(path: str) -> tuple[str, ...]:
    """The essay haystack as one word stream (documents in file order, one per line)."""
    file = resolve_repo_path(path)
    if not Path(file).is_file():  # a directory was an IsADirectoryError traceback
        raise MissingInput(f"RULER haystack text {file} not found (benchmark.options.haystack)")
    try:
        return tuple(Path(file).read_text(encoding="utf-8").split())
    except UnicodeDecodeError as e:  # was the codec's message, naming no file
        raise BadRowError(f"RULER haystack text {file} is not UTF-8 text (byte {e.start}; benchmark.options.haystack)") from None


@lru_cache(maxsize=4)
def word_list(path: str) -> tuple[str, ...]:
    """Distinct lowercase words (4-10 letters, seen at least 3 times) of the haystack text, sorted: the
    vocabulary of needle keys and of common-words extraction (RULER draws them from ``wonderwords``)."""
    counts = Counter(w.lower() for w in essay_words(path) if re.fullmatch(r"[A-Za-z]{4,10}", w))
    return tuple(sorted(w for w, c in counts.items() if c >= 3))


def key_words(settings: RulerSettings, need: int, task: str) -> tuple[str, ...]:
    """:func:`word_list`, refused (``ValueError`` naming the file) when it has fewer than ``need`` words: a short
    haystack was random's "Sample larger than population", and NIAH's multikey draw of distinct keys never ended."""
    words = word_list(settings.haystack)
    if len(words) < need:
        raise ValueError(
            f"the haystack text {resolve_repo_path(settings.haystack)} gives {len(words)} distinct words of 4-10 letters "
            f"seen at least 3 times; RULER {task} draws from {need}: use a longer benchmark.options.haystack"
        )
    return words


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _key(rng: random.Random, kind: str, words: tuple[str, ...]) -> str:
    if kind == "uuids":
        return _uuid(rng)
    a, b = rng.sample(words, 2)
    return f"{a}-{b}"


def _value(rng: random.Random, kind: str) -> str:
    return _uuid(rng) if kind == "uuids" else _number(rng)


# ---------------------------------------------------------------------------------------------------
# fitting a haystack to the target length


def largest_fitting(tokens_of: Callable[[int], int], target: int, n_max: int, guess: int = 1) -> int:
    """Largest ``n`` in ``[0, n_max]`` with ``tokens_of(n) <= target`` (tokens grow with n): gallop from
    ``guess``, then bisect. Raises if even ``n = 0`` does not fit."""
    if tokens_of(0) > target:
        raise ValueError(
            f"the task's template alone takes {tokens_of(0)} tokens, more than the target {target}: "
            "use a larger benchmark.length"
        )
    guess = min(max(guess, 1), n_max)
    step = max(1, guess // 32)
    if tokens_of(guess) <= target:
        lo, hi = guess, None
        while hi is None:
            if lo == n_max:
                return n_max
            nxt = min(n_max, lo + step)
            if tokens_of(nxt) <= target:
                lo, step = nxt, step * 2
            else:
                hi = nxt
    else:
        lo, hi = None, guess
        while lo is None:
            nxt = max(0, hi - step)
            if tokens_of(nxt) <= target:
                lo = nxt
            else:
                hi, step = nxt, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tokens_of(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _insert(units: list[str], items: list[str], fractions: list[float]) -> list[str]:
    """``units`` with ``items[i]`` inserted before unit ``round(fractions[i] * len(units))``."""
    out = list(units)
    for pos, item in sorted(
        ((round(f * len(units)), i) for i, f in enumerate(fractions)),
        key=lambda t: (t[0], t[1]),
        reverse=True,
    ):
        out.insert(pos, items[item])
    return out


# ---------------------------------------------------------------------------------------------------
# task builders: each draws its random choices once, then returns build(n) -> (input, prefix, answers)

Build = Callable[[int], tuple[str, str, list[str]]]


def _essay_sentences(words: tuple[str, ...], n: int) -> list[str]:
    """The first ``n`` words grouped into sentences (a sentence ends at a word ending in . ! or ?)."""
    sentences, start = [], 0
    for i in range(n):
        if words[i].endswith((".", "!", "?")):
            sentences.append(" ".join(words[start : i + 1]))
            start = i + 1
    if start < n:
        sentences.append(" ".join(words[start:n]))
    return sentences


def niah_builder(args: dict[str, Any], rng: random.Random, settings: RulerSettings) -> tuple[Build, int]:
    type_v = args["value"]
    n_keys = max(args["k"], args["q"])
    # word keys are ordered pairs of distinct words: more pairs than keys, so distractor keys exist too
    need = 0 if args["key"] == "uuids" else next(w for w in range(2, n_keys + 3) if w * (w - 1) > n_keys)
    words = key_words(settings, need, "niah")
    keys: list[str] = []
    while len(keys) < n_keys:
        k = _key(rng, args["key"], words)
        if k not in keys:
            keys.append(k)
    values = [[_value(rng, type_v) for _ in range(args["v"])] for _ in keys]
    needles = [NEEDLE.format(type_v=type_v, key=k, value=v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    fractions = [d / 100 for d in rng.sample(DEPTHS, len(needles))]
    queried = rng.sample(range(len(keys)), args["q"])
    names = [keys[i] for i in queried]
    query = names[0] if len(names) == 1 else ", ".join(names[:-1]) + ", and " + names[-1]
    answers = [v for i in queried for v in values[i]]
    prefix = NIAH_PREFIX.format(type_v=type_v, query=query)
    haystack = args["haystack"]

    if haystack == "essay":
        text = essay_words(settings.haystack)
        n_max = len(text)

        def units(n: int) -> tuple[list[str], str]:
            return _essay_sentences(text, n), " "

    elif haystack == "repeat":
        n_max = settings.length * 4

        def units(n: int) -> tuple[list[str], str]:
            return [NOISE_SENTENCES[i % len(NOISE_SENTENCES)] for i in range(n)], " "

    elif haystack == "needle":  # distractor needles with fresh keys (never a real key)
        distractors: list[str] = []
        n_max = settings.length  # a needle is > 10 tokens, so this is never the bound

        def units(n: int) -> tuple[list[str], str]:
            while len(distractors) < n:
                k = _key(rng, args["key"], words)
                if k not in keys:
                    distractors.append(NEEDLE.format(type_v=type_v, key=k, value=_value(rng, type_v)))
            return distractors[:n], "\n"

    else:
        raise ValueError(f"unknown RULER haystack {haystack!r}")

    def build(n: int) -> tuple[str, str, list[str]]:
        body, sep = units(n)
        context = sep.join(_insert(body, needles, fractions))
        return NIAH_TEMPLATE.format(type_v=type_v, context=context, query=query), prefix, answers

    return build, n_max


def _vt_text(rng: random.Random, n_noise: int, hops: int, name_len: int) -> tuple[str, str, list[str]]:
    names: list[str] = []
    while len(names) < hops + 1:
        v = "".join(rng.choices(string.ascii_uppercase, k=name_len))
        if v not in names:
            names.append(v)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}", *(f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(hops))]
    fractions = sorted(rng.random() for _ in chain)
    return value, " ".join(_insert([NOISE] * n_noise, chain, fractions)).replace(". \n", ".\n"), names


def vt_builder(args: dict[str, Any], rng: random.Random, settings: RulerSettings) -> tuple[Build, int]:
    hops = args["hops"]
    # the one-shot example: a short chain of 3-letter names in 10 noise blocks, with its answer
    ex_value, ex_context, ex_names = _vt_text(rng, 10, hops, 3)
    example = (
        VT_TEMPLATE.format(context=ex_context, query=ex_value)
        + VT_PREFIX.format(num_v=hops + 1, query=ex_value)
        + " ".join(ex_names)
        + "\n\n"
    )
    state = rng.getstate()

    def build(n: int) -> tuple[str, str, list[str]]:
        value, context, names = _vt_text(_restore(state), n, hops, 5)
        text = example + VT_TEMPLATE.format(context=context, query=value)
        return text, VT_PREFIX.format(num_v=hops + 1, query=value), names

    return build, settings.length


def _restore(state: Any) -> random.Random:
    r = random.Random()
    r.setstate(state)
    return r


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def cwe_builder(args: dict[str, Any], rng: random.Random, settings: RulerSettings) -> tuple[Build, int]:
    num_cw = args["num_cw"]
    short = settings.length < 4096  # RULER's lighter repetition below 4K
    freq_cw, freq_ucw = (6, 1) if short else (args["freq_cw"], args["freq_ucw"])
    ex_n, ex_cw, ex_ucw = (20, 3, 1) if short else (40, 10, 3)
    vocab = list(key_words(settings, ex_n + num_cw + 1, "cwe"))  # the example's words, the common ones, one more
    rng.shuffle(vocab)
    ex_words, vocab = vocab[:ex_n], vocab[ex_n:]

    def listing(words: list[str], cw: int, ucw: int, seed: int) -> tuple[str, list[str]]:
        common, uncommon = words[:num_cw], words[num_cw:]
        items = common * cw + uncommon * ucw
        random.Random(seed).shuffle(items)
        return _numbered(items), common

    shuffle_seed = rng.getrandbits(32)
    ex_context, ex_common = listing(ex_words, ex_cw, ex_ucw, shuffle_seed)
    example = CWE_TEMPLATE.format(context=ex_context) + CWE_PREFIX + " " + _numbered(ex_common) + "\n"

    def build(n: int) -> tuple[str, str, list[str]]:
        context, common = listing(vocab[: num_cw + n], freq_cw, freq_ucw, shuffle_seed)
        return example + CWE_TEMPLATE.format(context=context), CWE_PREFIX, common

    return build, len(vocab) - num_cw


def fwe_builder(args: dict[str, Any], rng: random.Random, settings: RulerSettings) -> tuple[Build, int]:
    from scipy.special import zeta

    alpha, size = args["alpha"], max(settings.length // 50, 10)  # RULER: vocabulary of length / 50 words
    vocab: list[str] = []
    while len(vocab) < size:
        w = "".join(rng.choices(string.ascii_lowercase, k=args["word_len"]))
        if w not in vocab:
            vocab.append(w)
    vocab[0] = "..."  # the most frequent "word" is noise
    z = float(zeta(alpha))
    shuffle_seed = rng.getrandbits(32)

    def build(n: int) -> tuple[str, str, list[str]]:
        counts = [int(n * (k + 1) ** -alpha / z) for k in range(len(vocab))]
        words = [w for w, c in zip(vocab, counts) for _ in range(c)]
        random.Random(shuffle_seed).shuffle(words)
        return FWE_TEMPLATE.format(context=" ".join(words)), FWE_PREFIX, vocab[1:4]

    return build, settings.length * 4


# -- QA (hub)


@lru_cache(maxsize=2)
def qa_rows(dataset: str) -> tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...]:
    """(gold documents, question, answers) of SQuAD v2 (answerable) or HotpotQA (distractor), from the hub."""
    import datasets

    hub_id, config, split = QA_HUB[dataset]
    try:
        ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:  # noqa: BLE001 - the hub's errors are many; say what to do instead
        raise RuntimeError(
            f"RULER {dataset} needs {hub_id} from the Hugging Face hub, which could not be loaded "
            f"({e.__class__.__name__}: {str(e)[:160]}); run the synthetic subsets only "
            "(benchmark.options.qa=false) or give the machine hub access"
        ) from e
    rows = []
    for r in ds:
        if dataset == "squad":
            answers = tuple(dict.fromkeys(r["answers"]["text"]))
            if answers:
                rows.append(((r["context"],), r["question"], answers))
        else:
            ctx = r["context"]
            docs = tuple(f"{t}\n{''.join(s)}" for t, s in zip(ctx["title"], ctx["sentences"]))
            rows.append((docs, r["question"], (r["answer"],)))
    return tuple(rows)


def qa_builder(
    args: dict[str, Any], rng: random.Random, settings: RulerSettings, index: int
) -> tuple[Build, int]:
    rows = qa_rows(args["dataset"])
    pool = list(dict.fromkeys(d for docs, _, _ in rows for d in docs))
    gold, question, answers = rows[index % len(rows)]
    others = [d for d in pool if d not in gold]
    rng.shuffle(others)
    order_seed = rng.getrandbits(32)

    def build(n: int) -> tuple[str, str, list[str]]:
        docs = [*gold, *others[:n]]
        random.Random(order_seed).shuffle(docs)
        context = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))
        return QA_TEMPLATE.format(context=context, query=question), QA_PREFIX, list(answers)

    return build, len(others)


BUILDERS = {"niah": niah_builder, "vt": vt_builder, "cwe": cwe_builder, "fwe": fwe_builder}


# ---------------------------------------------------------------------------------------------------
# generation


def generate_example(
    subset: str, index: int, settings: RulerSettings, count_tokens: CountFn, guess: int = 1
) -> tuple[Example, int]:
    """Example ``index`` of ``subset`` fitted to the target length; also the haystack size used (the
    next example's starting guess)."""
    spec = SUBSETS[subset]
    rng = example_rng(settings.seed, subset, index)
    if spec.task == "qa":
        build, n_max = qa_builder(spec.args, rng, settings, index)
    else:
        build, n_max = BUILDERS[spec.task](spec.args, rng, settings)
    target = settings.length - (spec.tokens_to_generate if settings.count_generation else 0)
    memo: dict[int, int] = {}

    def tokens_of(n: int) -> int:
        if n not in memo:
            text, prefix, _ = build(n)
            memo[n] = count_tokens(text, prefix)
        return memo[n]

    try:
        n = largest_fitting(tokens_of, target, n_max, guess)
    except ValueError as e:
        raise ValueError(f"RULER {subset} at benchmark.length={settings.length}: {e}") from None
    text, prefix, answers = build(n)
    tokens = tokens_of(n)
    if tokens < (1 - settings.tolerance) * target:
        if n == n_max:
            raise ValueError(
                f"RULER {subset}[{index}]: {tokens} tokens for a target of {target} (haystack exhausted at "
                f"{n} units): use a smaller benchmark.length or a longer benchmark.options.haystack"
            )
        # one haystack unit (a distractor needle, a noise block) is more than the tolerance at this length
        log.warning(
            "RULER %s[%d]: %d tokens for a target of %d (one haystack unit is %d tokens)",
            subset, index, tokens, target, tokens_of(n + 1) - tokens,
        )  # fmt: skip
    return (
        Example(subset, index, text, prefix, answers, tokens, target, {"haystack_units": n}),
        n,
    )


def generate(settings: RulerSettings, count_tokens: CountFn, limit: int | None = None) -> list[Example]:
    """The first ``limit`` (default ``samples``) examples of every chosen subset, subset-major."""
    n_each = settings.samples if limit is None else min(limit, settings.samples)
    out: list[Example] = []
    for subset in settings.chosen():
        guess = 1
        for i in range(n_each):
            ex, guess = generate_example(subset, i, settings, count_tokens, guess)
            out.append(ex)
    return out


def to_json(example: Example) -> str:
    return json.dumps(example.__dict__, sort_keys=True)


# ---------------------------------------------------------------------------------------------------
# the evaluator's task (eval/tasks.py): benchmark=ruler


def length_of(bench: Any) -> int:
    """``benchmark.length``, RULER's 4096 when null (0 was read as the default, 4096)."""
    return RulerSettings.length if bench.length is None else bench.length


def settings_of(bench: Any) -> RulerSettings:
    """:class:`RulerSettings` from a ``benchmark=ruler`` config (``sources`` = the subsets)."""
    options = dict(bench.options or {})
    for key, where in (("subsets", "benchmark.sources"), ("length", "benchmark.length")):
        if key in options:  # a field the benchmark config carries elsewhere
            raise ValueError(f"benchmark.options.{key}: RULER's {key} is {where} (e.g. {where}=...)")
    try:
        length = length_of(bench)
        return RulerSettings(length=length, subsets=list(bench.sources), **options)
    except TypeError as e:
        raise ValueError(f"benchmark.options for RULER: {e}") from None


def load(bench: Any, tokenizer: Any, gen: Any) -> list:
    """The RULER problems of ``bench`` with prompts rendered by the model's chat template, the answer
    prefix opening the reply (as RULER does), lengths counted in ``tokenizer``'s tokens."""
    from eval.benchmarks import Problem
    from eval.prompts import chat_text
    from eval.tasks import limit_per_subset

    settings = settings_of(bench)
    system, thinking = getattr(gen, "system_prompt", None), getattr(gen, "enable_thinking", None)

    def prompt(text: str, prefix: str) -> str:
        return chat_text(text, tokenizer, system, thinking) + prefix

    def count(text: str, prefix: str) -> int:
        return len(tokenizer(prompt(text, prefix), add_special_tokens=False).input_ids)

    examples = generate(settings, count, limit_per_subset(bench.problem_limit, settings.samples))
    return [
        Problem(
            id=f"{ex.subset}/{ex.index:04d}",
            question=ex.input,
            answer=" | ".join(ex.answers),
            competition=ex.subset,
            task="ruler",
            meta={
                "prompt": prompt(ex.input, ex.answer_prefix),
                "answers": ex.answers,
                "max_new_tokens": SUBSETS[ex.subset].tokens_to_generate,
                "prompt_tokens": ex.prompt_tokens,
                "target_tokens": ex.target_tokens,
            },
        )
        for ex in examples
    ]


def _score_problem(problem: Any, text: str) -> float:
    return score(problem.competition, text, problem.meta["answers"])


def _summarize(scores: dict[str, float]) -> dict[str, float]:
    return {"average": float(sum(scores.values()) / len(scores)) if scores else 0.0}


def _task() -> Any:
    from eval.tasks import ScoredTask

    return ScoredTask("ruler", load, _score_problem, _summarize, takes_length=True,
                      prompt_bound=lambda bench: ("benchmark.length", length_of(bench)))  # fmt: skip


TASK = _task()
