"""Special tokens every method needs, in one place.

- Chat (ChatML, as Qwen2/Qwen3 use): ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` (pad/eos).
- Reasoning tags of Bespoke-Stratos / Sky-T1 traces (ZoomR paper §4.1) and R1-style ``<think>``.
- ZoomR summary delimiters (ZoomR paper §3.2).
- AbridgeKV pause tokens ``<|pause_i|>``, i < ``ABRIDGE_MAX_PAUSE`` (= K_max at paper scale, 256).
- LightThinker: ``<|splitter|>``, cache tokens ``<|o_i|>`` (9 for Qwen, 7 for Llama) and ``<|continue|>``.
"""

from __future__ import annotations

PAD = EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

BEGIN_THOUGHT = "<|begin_of_thought|>"
END_THOUGHT = "<|end_of_thought|>"
BEGIN_SOLUTION = "<|begin_of_solution|>"
END_SOLUTION = "<|end_of_solution|>"
THINK = "<think>"
END_THINK = "</think>"

BEGIN_SUMMARY = "<|begin_of_summary|>"
END_SUMMARY = "<|end_of_summary|>"

ABRIDGE_MAX_PAUSE = 256
LIGHTTHINKER_CACHE_TOKENS = 9
SPLITTER = "<|splitter|>"
CONTINUE = "<|continue|>"


def pause_token(i: int) -> str:
    """The i-th AbridgeKV pause token (its KV becomes code row i of a block)."""
    return f"<|pause_{i}|>"


def lightthinker_cache_token(i: int) -> str:
    return f"<|o_{i}|>"


REASONING_TAGS = [BEGIN_THOUGHT, END_THOUGHT, BEGIN_SOLUTION, END_SOLUTION, THINK, END_THINK]
SUMMARY_TAGS = [BEGIN_SUMMARY, END_SUMMARY]
PAUSE_TOKENS = [pause_token(i) for i in range(ABRIDGE_MAX_PAUSE)]
LIGHTTHINKER_TOKENS = [SPLITTER, CONTINUE] + [
    lightthinker_cache_token(i) for i in range(LIGHTTHINKER_CACHE_TOKENS)
]

# Order matters: ids are assigned in this order right after the BPE vocabulary.
ALL_SPECIAL_TOKENS = [EOS, IM_START, IM_END, *REASONING_TAGS, *SUMMARY_TAGS, *LIGHTTHINKER_TOKENS, *PAUSE_TOKENS]

# ChatML with generation markers so TRL's assistant_only_loss can find the assistant turns.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def read_as_special(tokenizer) -> list[str]:
    """The strings ``tokenizer`` reads as one special token wherever they stand in a text: its special added tokens
    (``<|im_end|>``, ``<|endoftext|>``, a Llama's ``<|eot_id|>``) and the project's tokens it holds as added tokens
    (e.g. a non-special ``<think>``). A text that holds one literally is not tokenized as its characters."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    project = set(ALL_SPECIAL_TOKENS)
    return [t.content for t in decoder.values() if t.content.strip() and (t.special or t.content in project)]


def specials_in(text: str, strings: list[str] | None = None) -> list[str]:
    """The ``strings`` (default: :data:`ALL_SPECIAL_TOKENS`) that ``text`` holds literally, in the order they first
    appear, the longer first where two start at one place."""
    strings = ALL_SPECIAL_TOKENS if strings is None else strings
    heads = {h for h in {s[:2] for s in strings} if h in text}  # a few scans of a long text, not one per string
    found = [s for s in strings if s[:2] in heads and s in text]
    return sorted(found, key=lambda s: (text.find(s), -len(s)))


def describe_specials(found: list[str]) -> str:
    shown = ", ".join(repr(s) for s in found[:5])
    return shown + (f" and {len(found) - 5} more" if len(found) > 5 else "")
