"""Word-level tokenizer of the recall testbed: one word = one token, plus every project special token.

A byte-level BPE would split ``k137`` into several pieces and make the task needlessly hard for a
0.4 M-parameter model; a word-level vocabulary (keys, values, filler words, a few structural words)
is learnable in minutes. The tokenizer still carries
:data:`zoomr.tokens.ALL_SPECIAL_TOKENS` (summary delimiters, AbridgeKV pause tokens, LightThinker
tokens, ChatML) and the project chat template, so every method runs on it unchanged.

Built with the ``tokenizers`` library (``WordLevel`` model, whitespace pre-tokenisation, the
paragraph break ``"\\n\\n"`` as an added token) and wrapped as ``PreTrainedTokenizerFast``; saved and
loaded with ``save_pretrained`` / ``from_pretrained``. A model names it with
``extra: {tokenizer: zoomr.testbed.vocab:build_tokenizer}`` (see ``zoomr.models``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from zoomr import tokens
from zoomr.schemas.checks import SettingsError
from zoomr.tokenizer import wrap_tokenizer

# Bump when the vocabulary changes: tiny models built on the tokenizer are keyed on it.
TOKENIZER_VERSION = "testbed-v3"

N_KEYS = 256  # distinct keys; a key is defined at most once per trace
N_VALUES = 32
N_FILLER = 64  # filler words w0..w63 (carry nothing)

UNK = "[UNK]"
BREAK = "\n\n"  # paragraph break (ZoomR segments; a semantic boundary)
BOXED = "\\boxed{"
CLOSE = "}"
QUERY = "?"  # "? k : = v": a query of key k (the cue), answered by its value
QUERY_END = ":"  # ends the cue: a semantic boundary (ZoomR A.3) placed after the key, so a recompute sees it
ANSWER_MARK = "="  # one step between the boundary and the value (a selection applies from the next step)
PROMPT_WORD = "recall"
ROLE_WORDS = ["system", "user", "assistant"]


def key(i: int) -> str:
    return f"k{i}"


def value(i: int) -> str:
    return f"v{i}"


def filler(n: int) -> str:
    return f"w{n}"


def vocabulary() -> list[str]:
    """Every word in id order (special tokens last, in :data:`zoomr.tokens.ALL_SPECIAL_TOKENS` order)."""
    words = [UNK, BREAK, BOXED, CLOSE, QUERY, PROMPT_WORD, *ROLE_WORDS]
    words += [key(i) for i in range(N_KEYS)]
    words += [value(i) for i in range(N_VALUES)]
    words += [filler(n) for n in range(N_FILLER)]
    words += list(tokens.ALL_SPECIAL_TOKENS)
    words += [QUERY_END, ANSWER_MARK]  # added in testbed-v3, last: earlier ids unchanged
    if len(set(words)) != len(words):
        raise AssertionError("testbed vocabulary has duplicate words")
    return words


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The testbed tokenizer (deterministic: same ids on every machine)."""
    words = vocabulary()
    wl = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
    wl.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wl.add_special_tokens(list(tokens.ALL_SPECIAL_TOKENS))  # already in the vocabulary: ids unchanged
    wl.add_tokens([AddedToken(BREAK, normalized=False, special=False)])
    return wrap_tokenizer(wl, unk_token=UNK)


class FastEncoder:
    """Word lists → ids without the tokenizer's text round trip (for the training stream).

    :meth:`chat` reproduces ``apply_chat_template`` of a user/assistant pair exactly (tested).
    """

    def __init__(self, tokenizer=None):
        if tokenizer is not None:
            check_tokenizer(tokenizer)
        vocab = (tokenizer or build_tokenizer()).get_vocab()
        self.ids = vocab
        self.im_start = vocab[tokens.IM_START]
        self.im_end = vocab[tokens.IM_END]
        self.user = vocab["user"]
        self.assistant = vocab["assistant"]

    def words(self, words: Sequence[str]) -> list[int]:
        try:
            return [self.ids[w] for w in words]
        except KeyError as e:
            raise ValueError(f"word {e.args[0]!r} is not in the testbed vocabulary") from None

    def prompt(self, prompt_words: Sequence[str]) -> list[int]:
        """Chat prompt up to and including the assistant header (``add_generation_prompt=True``)."""
        return [self.im_start, self.user, *self.words(prompt_words), self.im_end, self.im_start, self.assistant]

    def chat(self, prompt_words: Sequence[str], response_words: Sequence[str]) -> tuple[list[int], int]:
        """(ids of the whole conversation, index of the first response token). The response ends with ``<|im_end|>``."""
        head = self.prompt(prompt_words)
        return head + self.words(response_words) + [self.im_end], len(head)


def check_tokenizer(tokenizer) -> None:
    """Refuse (:class:`SettingsError`) a tokenizer that lacks any word of :func:`vocabulary`: the testbed's
    problems and scripts cannot be written with it (e.g. the default ``model=tiny-qwen2``'s BPE)."""
    have = tokenizer.get_vocab()
    missing = [w for w in vocabulary() if w not in have]
    if missing:
        shown = ", ".join(repr(w) for w in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise SettingsError(
            f"the model's tokenizer lacks {len(missing)} testbed words ({shown}): use model=tiny-testbed, a checkpoint "
            "trained on the testbed (model.hf_id=runs/train/<run>/final), or a model config with extra.tokenizer: "
            "zoomr.testbed.vocab:build_tokenizer"
        )
