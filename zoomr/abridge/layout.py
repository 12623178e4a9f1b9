"""AbridgeKV token layout (AbridgeKV §3, "layout"; METHODS.md "AbridgeKV").

The stream the model reads, in training and in serving alike::

    prompt | r_0 … r_{C-1} | p_0 … p_{K-1} | r_C … r_{2C-1} | p_0 … p_{K-1} | r_2C … (open block, raw)

- The prompt is never compressed.
- After every *completed* block of C response tokens that is followed by more response tokens, the K
  pause tokens ``<|pause_0|> … <|pause_{K-1}|>`` run; their KV at every layer are the block's code rows.
  A block completing the response (nothing follows) gets no pauses: nobody would read its codes.
- The first token of block b+1 is predicted by the last pause token of block b (in serving: the
  sampled token after the pause forward), so the stream is an ordinary next-token stream.

RoPE positions (``code_positions``). Raw tokens keep the positions they would have without pauses
(prompt length + response index), so a served sequence and a full-KV one give a raw token the same
position. Code rows take positions INSIDE the span they replace (the paper's default):

- ``spread`` (default): code row i of a block starting at position s sits at ``s + ⌊(i+1)·C/K⌋ − 1``,
  the last position of the i-th of K equal sub-spans; the last code row shares the block's last
  position (so the token predicting the next block reads from where the raw stream ended).
- ``tail``: the last K positions of the block, ``s + C − K + i``.
- ``appended`` (the paper's ablation): pause tokens are ordinary stream tokens with their own
  positions after the block, and every later token is shifted by K per completed block.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from zoomr import tokens
from zoomr.schemas.checks import is_integer

PAD, PROMPT, RAW, PAUSE = 0, 1, 2, 3
CODE_POSITIONS = ("spread", "tail", "appended")
IGNORE = -100


@dataclass(frozen=True)
class AbridgeLayout:
    """Block size C, pause tokens per block K (= K_max) and where code rows sit in RoPE space."""

    block_size: int = 64
    num_pause: int = 16
    code_positions: str = "spread"

    def __post_init__(self) -> None:
        for name in ("block_size", "num_pause"):
            if not is_integer(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 1 <= self.num_pause <= tokens.ABRIDGE_MAX_PAUSE:
            raise ValueError(f"num_pause must be in [1, {tokens.ABRIDGE_MAX_PAUSE}], got {self.num_pause}")
        if self.code_positions not in CODE_POSITIONS:
            raise ValueError(f"code_positions must be one of {CODE_POSITIONS}, got {self.code_positions!r}")
        if self.code_positions != "appended" and self.num_pause > self.block_size:
            raise ValueError(
                f"{self.num_pause} code rows cannot sit inside a block of {self.block_size} positions; "
                "use code_positions=appended or num_pause <= block_size"
            )

    @property
    def ratio(self) -> float:
        """C / K: compression of a completed block when every code row is kept."""
        return self.block_size / self.num_pause

    def pause_positions(self, block_start: int) -> list[int]:
        """RoPE positions of a block's K code rows; ``block_start`` = position of its first raw token."""
        c, k = self.block_size, self.num_pause
        if self.code_positions == "spread":
            return [block_start + ((i + 1) * c) // k - 1 for i in range(k)]
        if self.code_positions == "tail":
            return [block_start + c - k + i for i in range(k)]
        return [block_start + c + i for i in range(k)]

    def position_shift(self) -> int:
        """How far each completed block pushes later positions (K when appended, else 0)."""
        return self.num_pause if self.code_positions == "appended" else 0


@dataclass
class Stream:
    """One interleaved sequence, per token: id, RoPE position, kind, block, code slot, next-token label.

    ``block`` is the response block index of raw and pause tokens (−1 for the prompt); ``slot`` is the
    pause index i for pause tokens (−1 otherwise). ``labels[s]`` is the next token when that token is a
    response token carrying loss, else −100: each such token is predicted exactly once, no pause token is.
    """

    input_ids: list[int]
    position_ids: list[int]
    kind: list[int]
    block: list[int]
    slot: list[int]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def interleave(
    prompt_ids: list[int],
    response_ids: list[int],
    layout: AbridgeLayout,
    pause_ids: list[int],
    loss_positions: Collection[int] | None = None,
) -> Stream:
    """Build the stream of :mod:`this module <zoomr.abridge.layout>`'s docstring.

    ``loss_positions``: response indices whose prediction carries loss (default: every response token). A
    task whose environment writes most of the response (the recall testbed) trains only on what the model
    writes; the other raw tokens are still read, and predicted by nobody.
    """
    if len(pause_ids) != layout.num_pause:
        raise ValueError(f"need {layout.num_pause} pause token ids, got {len(pause_ids)}")
    if not prompt_ids:
        raise ValueError("empty prompt: the first response token needs a prompt token to be predicted from")
    n_p = len(prompt_ids)
    s = Stream(list(prompt_ids), list(range(n_p)), [PROMPT] * n_p, [-1] * n_p, [-1] * n_p, [])
    c = layout.block_size
    pos = n_p
    for start in range(0, len(response_ids), c):
        chunk = response_ids[start : start + c]
        b = start // c
        s.input_ids += chunk
        s.position_ids += list(range(pos, pos + len(chunk)))
        s.kind += [RAW] * len(chunk)
        s.block += [b] * len(chunk)
        s.slot += [-1] * len(chunk)
        if len(chunk) == c and start + c < len(response_ids):
            s.input_ids += list(pause_ids)
            s.position_ids += layout.pause_positions(pos)
            s.kind += [PAUSE] * layout.num_pause
            s.block += [b] * layout.num_pause
            s.slot += list(range(layout.num_pause))
            pos += layout.position_shift()
        pos += len(chunk)
    s.labels = next_token_labels(s, len(response_ids), loss_positions)
    return s


def next_token_labels(s: Stream, n_response: int, loss_positions: Collection[int] | None = None) -> list[int]:
    """``labels[i]`` = the next token when it is a raw response token whose response index is in
    ``loss_positions`` (default: every raw token), else −100. Raw tokens are the stream's response tokens in
    order (AbridgeKV's blocks, LightThinker's thoughts); pause, cache and continue tokens are never targets."""
    wanted = [True] * n_response if loss_positions is None else [False] * n_response
    for j in loss_positions or ():
        if not 0 <= j < n_response:
            raise ValueError(f"loss position {j} outside the response of {n_response} tokens")
        wanted[j] = True
    raw_index = iter(range(n_response))  # response index of each raw token, in stream order
    target = [s.kind[i] == RAW and wanted[next(raw_index)] for i in range(len(s))]
    return [s.input_ids[i + 1] if target[i + 1] else IGNORE for i in range(len(s) - 1)] + [IGNORE]


def pause_token_ids(tokenizer, num_pause: int) -> list[int]:
    """Ids of ``<|pause_0|> … <|pause_{K-1}|>``; a clear error when the tokenizer lacks them."""
    return special_token_ids(
        tokenizer,
        [tokens.pause_token(i) for i in range(num_pause)],
        "AbridgeKV pause tokens",
        f"call zoomr.abridge.layout.add_pause_tokens(model, tokenizer, {num_pause}) first",
    )


def special_token_ids(tokenizer, names: list[str], what: str, hint: str) -> list[int]:
    """Ids of the special tokens ``names``; a clear error naming the first missing one."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in names]
    unk = getattr(tokenizer, "unk_token_id", None)
    missing = [t for t, i in zip(names, ids) if i is None or i == unk]
    if missing:
        raise ValueError(f"tokenizer lacks {len(missing)} {what} (first: {missing[0]}); {hint}")
    return ids


def add_pause_tokens(model, tokenizer, num_pause: int) -> int:
    """Add missing pause tokens to a real checkpoint's tokenizer and embeddings (mean-initialised).

    Returns the number added. Tiny models already carry all 256 (see :mod:`zoomr.tokens`).
    """
    return add_special_token_rows(model, tokenizer, [tokens.pause_token(i) for i in range(num_pause)])


def add_special_token_rows(model, tokenizer, wanted: list[str]) -> int:
    """Add the tokens of ``wanted`` the tokenizer lacks, with embedding (and untied output) rows set to
    the mean of the existing ones. Returns the number added."""
    import torch

    vocab = tokenizer.get_vocab()
    new = [t for t in wanted if t not in vocab]
    if not new:
        return 0
    tokenizer.add_tokens(new, special_tokens=True)
    old = model.get_input_embeddings().weight.shape[0]
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        emb[old:] = emb[:old].mean(0, keepdim=True)
        out = model.get_output_embeddings()
        if out is not None and out.weight is not emb:
            out.weight[old:] = out.weight[:old].mean(0, keepdim=True)
    return len(new)


def block_start(layout: AbridgeLayout, prompt_len: int, block: int) -> int:
    """RoPE position of the first raw token of response block ``block``."""
    return prompt_len + block * (layout.block_size + layout.position_shift())


def roles_from_order(order, prompt_len, layout: AbridgeLayout):
    """``(kind, block, slot)`` of stream tokens from their feed index (vectorised; the serving side).

    ``order`` is any ``[B, ...]`` LongTensor of stream indices (-1 = no token, reported as PAD) and
    ``prompt_len`` a ``[B]`` tensor. Equals what :func:`interleave` lays out for the same stream.
    """
    import torch

    shape = (-1,) + (1,) * (order.dim() - 1)
    j = order - prompt_len.to(order.device).view(shape)
    period = layout.block_size + layout.num_pause
    blk = torch.div(j, period, rounding_mode="floor")
    r = j - blk * period
    kind = torch.where(j < 0, PROMPT, torch.where(r < layout.block_size, RAW, PAUSE))
    kind = torch.where(order < 0, PAD, kind)
    block = torch.where(kind >= RAW, blk, -1)
    slot = torch.where(kind == PAUSE, r - layout.block_size, -1)
    return kind, block, slot
