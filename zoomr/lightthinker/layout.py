"""LightThinker token layout (zjunlp/LightThinker; METHODS.md "Baselines", LightThinker).

Thought segmentation (text level). A trace's thoughts are the blank-line paragraphs inside its thought
tags (``<|begin_of_thought|>`` / ``<think>``); the opening tag joins the first thought and the blank
line before the closing tag joins the last one, so every thought ends where a paragraph ends. Text after
the thoughts (closing tag, solution) is the *tail*: never compressed. A response without thought tags
(the testbed format) is cut into paragraphs too; its last paragraph (the answer) is the tail.

The stream the model reads, in training and serving alike::

    prompt | t_0 … <|splitter|> | <|o_0|> … <|o_{n-1}|> <|continue|> | t'_0 … <|splitter|> | o … c | tail

- After every ``<|splitter|>`` that more response tokens follow, the n cache tokens and ``<|continue|>``
  run (a response ending on a splitter gets none: nobody would read them).
- The model learns to emit the splitter (it is a response token with a loss); the cache tokens and
  ``<|continue|>`` are forced, so nothing predicts them; ``<|continue|>`` predicts the next thought's
  first token. RoPE positions run over the whole stream, cache tokens included, as in serving.
- Per token: ``kind`` (PROMPT / RAW for thought, splitter and tail tokens / CACHE / CONTINUE / PAD),
  ``block`` = the thought index (the thought a cache or continue token compresses) and ``slot`` = the
  cache index i, laid out as an AbridgeKV :class:`~zoomr.abridge.layout.Stream`, so the project's
  collator, CE and mask machinery serve both methods.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from zoomr import tokens
from zoomr.abridge.layout import (
    PAUSE,
    PROMPT,
    RAW,
    Stream,
    add_special_token_rows,
    next_token_labels,
    special_token_ids,
)
from zoomr.jsonl import BadRowError, read_json_object
from zoomr.rundir import write_json
from zoomr.schemas.checks import is_integer
from zoomr.segments import split_paragraphs, split_thought

CACHE = PAUSE  # the same role as an AbridgeKV pause token: a learned compression token, no loss
CONTINUE = PAUSE + 1
PAPER_CACHE_TOKENS = {"qwen": 9, "llama": 7}  # LightThinker's n for Qwen2.5-7B and Llama-3.1-8B
FILENAME = "lightthinker.json"


def paper_cache_tokens(model_type: str) -> int:
    """The paper's n for a model family (``model.config.model_type``: qwen2, qwen3, llama, ...)."""
    for family, n in PAPER_CACHE_TOKENS.items():
        if model_type.startswith(family):
            return n
    raise ValueError(
        f"no paper value of num_cache_tokens for model_type {model_type!r} (known: {sorted(PAPER_CACHE_TOKENS)}); "
        "set method.num_cache_tokens"
    )


@dataclass(frozen=True)
class ThoughtTokens:
    """Ids of ``<|splitter|>``, the n cache tokens ``<|o_i|>`` and ``<|continue|>``."""

    splitter: int
    cache: tuple[int, ...]
    cont: int

    @property
    def n(self) -> int:
        return len(self.cache)

    @classmethod
    def from_tokenizer(cls, tokenizer, num_cache_tokens: int) -> ThoughtTokens:
        if num_cache_tokens < 1:
            raise ValueError(f"num_cache_tokens must be >= 1, got {num_cache_tokens}")
        names = [tokens.SPLITTER, tokens.CONTINUE, *wanted_cache_tokens(num_cache_tokens)]
        hint = f"call zoomr.lightthinker.layout.add_lightthinker_tokens(model, tokenizer, {num_cache_tokens}) first"
        ids = special_token_ids(tokenizer, names, "LightThinker tokens", hint)
        return cls(ids[0], tuple(ids[2:]), ids[1])


def wanted_cache_tokens(n: int) -> list[str]:
    return [tokens.lightthinker_cache_token(i) for i in range(n)]


def add_lightthinker_tokens(model, tokenizer, num_cache_tokens: int) -> int:
    """Add the LightThinker tokens a real checkpoint lacks (mean-initialised rows); returns how many."""
    wanted = [tokens.SPLITTER, tokens.CONTINUE, *wanted_cache_tokens(num_cache_tokens)]
    return add_special_token_rows(model, tokenizer, wanted)


# ---------------------------------------------------------------- text level


def segment_response(response: str, min_chars: int = 0) -> tuple[list[str], str]:
    """``(thoughts, tail)`` with ``"".join(thoughts) + tail == response`` (module docstring)."""
    split = split_thought(response)
    if split is None:
        paragraphs = split_paragraphs(response, min_chars)
        texts = [p.text + p.sep for p in paragraphs]
        return (texts[:-1], texts[-1]) if len(texts) > 1 else ([], response)
    paragraphs = split_paragraphs(split.thought, min_chars)
    if not paragraphs:
        return [], response
    texts = [p.text + p.sep for p in paragraphs]
    texts[0] = split.prefix + texts[0]
    lead = len(split.suffix) - len(split.suffix.lstrip())
    texts[-1] += split.suffix[:lead]
    return texts, split.suffix[lead:]


def response_ids(thoughts: list[str], tail: str, tokenizer, splitter_id: int) -> list[int]:
    """The response as the model writes it: each thought's tokens, then the splitter; then the tail."""
    out: list[int] = []
    for text in thoughts:
        out += tokenizer(text, add_special_tokens=False)["input_ids"] + [splitter_id]
    return out + (tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else [])


# ---------------------------------------------------------------- token level


def interleave(
    prompt_ids: list[int], response: list[int], tt: ThoughtTokens, loss_positions: Collection[int] | None = None
) -> Stream:
    """The stream of the module docstring from prompt ids and the written response (splitters included).

    ``loss_positions``: response indices that carry loss (default: every response token); the recall testbed
    trains only on what the model writes (answers and splitters), never on the environment's tokens.
    """
    if not prompt_ids:
        raise ValueError("empty prompt: the first response token needs a prompt token to be predicted from")
    n_p = len(prompt_ids)
    s = Stream(list(prompt_ids), [], [PROMPT] * n_p, [-1] * n_p, [-1] * n_p, [])
    thought = 0
    for j, tok in enumerate(response):
        s.input_ids.append(tok)
        s.kind.append(RAW)
        s.block.append(thought)
        s.slot.append(-1)
        if tok == tt.splitter and j + 1 < len(response):
            s.input_ids += [*tt.cache, tt.cont]
            s.kind += [CACHE] * tt.n + [CONTINUE]
            s.block += [thought] * (tt.n + 1)
            s.slot += list(range(tt.n)) + [-1]
            thought += 1
    s.position_ids = list(range(len(s)))
    s.labels = next_token_labels(s, len(response), loss_positions)
    return s


# ---------------------------------------------------------------- checkpoint record


def save_config(directory: str | Path, num_cache_tokens: int, **extra) -> Path:
    """Write ``lightthinker.json`` (n and how the run segmented its data) next to a checkpoint."""
    path = Path(directory) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"num_cache_tokens": num_cache_tokens, **extra})
    return path


def checkpoint_cache_tokens(model_config) -> int | None:
    """n recorded by the checkpoint the model was loaded from, if it is a LightThinker one."""
    path = getattr(model_config, "_name_or_path", None)
    if path and (Path(path) / FILENAME).exists():
        n = read_json_object(Path(path) / FILENAME, "LightThinker layout").get("num_cache_tokens")
        if not (is_integer(n) and n >= 1):
            raise BadRowError(f"{Path(path) / FILENAME}: num_cache_tokens must be an integer >= 1, got {n!r}")
        return n
    return None
