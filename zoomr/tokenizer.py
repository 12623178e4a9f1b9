"""A byte-level BPE tokenizer trained locally, for the tiny models (no hub needed).

Pre-tokenisation is Qwen2's own (NFC + Split on Qwen2's regex + ByteLevel without regex), so that
``AutoTokenizer`` resolving to ``Qwen2Tokenizer`` for ``model_type="qwen2"`` yields the same ids as
``PreTrainedTokenizerFast`` (see STACK_NOTES "Tiny models and tokenizers").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from zoomr import tokens

# Bump when the corpus, the vocabulary or the special tokens change: cached tiny models are keyed on it.
TOKENIZER_VERSION = "bpe-v1"

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = [
    PACKAGE_ROOT / "data_prep" / "data" / "traces" / "sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl",
    PACKAGE_ROOT / "data_prep" / "data" / "pretraining_text" / "c4_demo.jsonl",
    PACKAGE_ROOT / "data_prep" / "data" / "pretraining_text" / "wiki_demo.txt",
    PACKAGE_ROOT / "data_prep" / "data" / "pretraining_text" / "human_eval.jsonl",
    PACKAGE_ROOT / "eval" / "data" / "benchmarks" / "math500" / "test.jsonl",
]


def _qwen2_pretokenize_regex() -> str:
    from transformers.models.qwen2 import tokenization_qwen2

    return tokenization_qwen2.PRETOKENIZE_REGEX


def iter_corpus_texts(paths: Iterable[Path], max_chars_per_doc: int = 20_000) -> Iterator[str]:
    """Yield the text fields of JSONL rows (every string value) and the lines of text files."""
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"tokenizer corpus file missing: {path}")
        with path.open(encoding="utf-8") as f:
            for line in f:
                if path.suffix == ".jsonl":
                    row = json.loads(line)
                    for value in row.values():
                        if isinstance(value, str):
                            yield value[:max_chars_per_doc]
                        elif isinstance(value, list):
                            yield from (v[:max_chars_per_doc] for v in value if isinstance(v, str))
                else:
                    yield line[:max_chars_per_doc]


def train_bpe_tokenizer(
    vocab_size: int = 4096, corpus: Iterable[Path] | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the vendored corpus and wrap it with every special token we need."""
    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_qwen2_pretokenize_regex()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(iter_corpus_texts(corpus or DEFAULT_CORPUS), trainer=trainer)
    bpe.add_special_tokens(tokens.ALL_SPECIAL_TOKENS)
    return wrap_tokenizer(bpe)


def wrap_tokenizer(backend: Any, unk_token: str | None = None) -> PreTrainedTokenizerFast:
    """A ``tokenizers`` backend as the project's tokenizer: EOS/PAD special tokens, no BOS, the ChatML template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=tokens.EOS,
        pad_token=tokens.PAD,
        bos_token=None,
        unk_token=unk_token,
        model_max_length=1 << 17,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = tokens.CHAT_TEMPLATE
    return tok


def special_token_ids(tokenizer) -> dict[str, int]:
    """Id of every special token; raises naming the first one the tokenizer lacks."""
    ids = {}
    for t in tokens.ALL_SPECIAL_TOKENS:
        i = tokenizer.convert_tokens_to_ids(t)
        if i is None or i == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer lacks the special token {t!r}")
        ids[t] = i
    return ids
