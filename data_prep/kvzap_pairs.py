"""KVzap training pairs (KVzap paper §4.1): ``python -m data_prep +pipeline=kvzap_pairs``.

For every document: build the KVzip repeat pretext, score its tokens (KVzip and KVzip+, one chunked
eager forward), sample ``tokens_per_doc`` token positions, and keep per layer the attention-input
hidden state h_i with log s⁺_i (and log s_i) per KV head. Output: shards + manifest
(:mod:`zoomr.kvzap.pairs`). Deterministic for a seed; rerunning resumes (complete shards are kept).

Documents (the paper filters Nemotron prompts to 750-1,250 tokens; the vendored stand-ins are
either much longer or much shorter): a source document of at least ``min_tokens`` tokens is cut into
consecutive pieces of a length drawn uniformly in [min_tokens, max_tokens] (a shorter tail is
dropped); shorter documents are packed, separated by a blank line, and cut the same way. Source
documents are shuffled with the seed; the first ones feed the held-out split, the rest the training
split, so no source document contributes to both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoomr.jsonl import BadRowError, read_json_object
from zoomr.kvzap.pairs import FORMAT, shard_name, write_shard
from zoomr.kvzap.pretext import RepeatPretext, build_repeat_pretext
from zoomr.kvzap.scoring import LOG_FLOOR, kvzip_scores
from zoomr.models import DTYPES
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.rundir import safetensors_whole, write_json
from zoomr.runlock import hold_run_lock
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.kvzap import KVzapPairsPipeline, TestbedPairsSource, TextSource

log = logging.getLogger(__name__)


@dataclass
class Document:
    index: int  # global, in plan order
    subset: str
    split: str  # train | val
    origin: str  # where the piece comes from, e.g. "12[0:980]" or "packed 3,4,9"
    ids: list[int]

    def meta(self) -> dict[str, Any]:
        d = asdict(self)
        ids = d.pop("ids")
        d["n_tokens"] = len(ids)
        d["ids_sha1"] = hashlib.sha1(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]
        return d


def load_texts(source: TextSource) -> list[str]:
    """The documents of one subset as strings (empty ones dropped); a line that cannot be read is refused
    (:class:`BadRowError`, printed alone by the entry point) naming the file and the line."""
    path = resolve_repo_path(source.path)
    if not path.exists():
        raise MissingInput(f"source {source.name!r}: no file {path}")
    texts, n = [], 0
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    texts.append(line.rstrip("\n") if source.format == "lines" else row_text(source, line, f"{path} line {n}"))
    except UnicodeDecodeError:
        raise BadRowError(f"source {source.name!r}: {path} is not UTF-8 text (at or after line {n + 1})") from None
    return [t for t in texts if t.strip()]


def row_text(source: TextSource, line: str, where: str) -> str:
    """The text of one JSONL row: ``source.fields`` joined with ``source.joiner``."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRowError(f"source {source.name!r}: {where} is not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise BadRowError(f"source {source.name!r}: {where} is not a JSON object")
    if missing := [k for k in source.fields if k not in row]:
        raise BadRowError(f"source {source.name!r}: {where}: missing fields {missing} (has {sorted(row)}); "
                          "set the source's fields")  # fmt: skip
    return source.joiner.join(str(row[k]) for k in source.fields)


def cut_documents(
    token_docs: Iterable[tuple[int, list[int]]], sep: list[int], lo: int, hi: int, rng: np.random.Generator
) -> list[tuple[int, str, list[int]]]:
    """Pieces of [lo, hi] tokens as (first source doc, origin, ids), in the given document order."""
    return list(iter_pieces(token_docs, sep, lo, hi, rng))


def iter_pieces(
    token_docs: Iterable[tuple[int, list[int]]], sep: list[int], lo: int, hi: int, rng: np.random.Generator
) -> Iterator[tuple[int, str, list[int]]]:
    """:func:`cut_documents`' pieces one at a time, taking from ``token_docs`` only as many documents as they need
    (a caller that stops early leaves the rest untokenized)."""
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < min_tokens <= max_tokens, got {lo}, {hi}")
    pack: list[int] = []
    packed: list[int] = []
    target = int(rng.integers(lo, hi + 1))
    for j, ids in token_docs:
        if len(ids) >= lo:
            pos = 0
            while len(ids) - pos >= lo:
                n = min(int(rng.integers(lo, hi + 1)), len(ids) - pos)
                yield j, f"{j}[{pos}:{pos + n}]", ids[pos : pos + n]
                pos += n
            continue
        pack += (sep if pack else []) + ids
        packed.append(j)
        if len(pack) >= lo:
            n = min(target, len(pack))
            yield packed[0], "packed " + ",".join(map(str, packed)), pack[:n]
            pack, packed, target = [], [], int(rng.integers(lo, hi + 1))


def plan_documents(sources: list[TextSource], tokenizer, p: KVzapPairsPipeline, seed: int) -> list[Document]:
    """Deterministic list of documents (val first, then train, per subset)."""
    sep = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    docs: list[Document] = []
    for s_idx, source in enumerate(sources):
        rng = np.random.default_rng([seed, s_idx])
        texts = load_texts(source)
        order = rng.permutation(len(texts))
        # as text: a document quoting '<|endoftext|>' or '<|im_end|>' (a GPT-2 style dump's separator) was read as the
        # special token, so KVzip scored, and the surrogate learned from, contexts ended mid-document
        # one at a time, as the pieces need them: a source of 50,000 lines tokenized all of them (78 s, 1.7 GB of
        # token lists) to keep the 505 documents of the first few hundred
        token_docs = ((int(j), tokenizer(texts[j], add_special_tokens=False, split_special_tokens=True)["input_ids"])
                      for j in order)  # fmt: skip
        pieces = iter_pieces(token_docs, sep, p.min_tokens, p.max_tokens, rng)
        val_sources: set[int] = set()
        n_val = n_train = 0
        for j, origin, ids in pieces:  # pieces of one source document are consecutive
            if n_val < p.val_docs_per_subset:
                val_sources.add(j)
                docs.append(Document(len(docs), source.name, "val", f"{source.name}:{origin}", ids))
                n_val += 1
            elif j not in val_sources and n_train < p.max_docs_per_subset:
                docs.append(Document(len(docs), source.name, "train", f"{source.name}:{origin}", ids))
                n_train += 1
            if n_val == p.val_docs_per_subset and n_train == p.max_docs_per_subset:
                break  # both splits full: no later piece is kept
        if n_val + n_train == 0:
            log.warning("source %s: no document reaches %d tokens", source.name, p.min_tokens)
    return docs


def shard_plan(docs: list[Document], per_shard: int) -> list[dict[str, Any]]:
    shards = []
    for split in ("train", "val"):
        idx = [d.index for d in docs if d.split == split]
        for k in range(0, len(idx), per_shard):
            shards.append(
                {"file": shard_name(split, k // per_shard), "split": split, "docs": idx[k : k + per_shard]}
            )
    return shards


def sample_positions(n: int, k: int, seed: int, doc_index: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, doc_index]).integers(2**62)))
    return torch.randperm(n, generator=gen)[:k].sort().values


@torch.no_grad()
def score_document(model, pretext: RepeatPretext, doc: Document, p: KVzapPairsPipeline, seed: int, store_dtype) -> dict:
    """Sampled pairs of one document scored on ``pretext``: per layer h (k, D), log s⁺ and log s (k, H_kv)."""
    if pretext.n_context != len(doc.ids):
        raise ValueError(f"document {doc.index}: pretext context of {pretext.n_context} tokens, not {len(doc.ids)}")
    scores = kvzip_scores(model, pretext, chunk_size=p.chunk_size, keep_hidden=True)
    pos = sample_positions(len(doc.ids), p.tokens_per_doc, seed, doc.index)
    pairs = {
        "h": scores.hidden[:, pos].to(store_dtype),  # (L, k, D)
        "y": scores.log(plus=True)[:, :, pos].transpose(1, 2),  # (L, k, H_kv)
        "y_kvzip": scores.log(plus=False)[:, :, pos].transpose(1, 2),
    }
    for name, values in pairs.items():  # the fit refuses such shards; say so here, naming the cause, before writing
        if bad := int((~torch.isfinite(values)).sum()):
            overflow = f" (pipeline.store_dtype={p.store_dtype} overflows; try float32)" if name == "h" else ""
            raise SettingsError(f"document {doc.index}: {bad} non-finite values in its {name} pairs{overflow}; "
                                "nothing of this shard was written")  # fmt: skip
    return {**pairs, "pos": pos, "floored": int((scores.kvzip_plus[:, :, pos] <= LOG_FLOOR).sum())}


def write_shards(
    model, pretext_of: Callable[[Document], RepeatPretext], docs, shards, p: KVzapPairsPipeline, out_dir: Path,
    seed: int,
) -> dict[str, Any]:
    """Score (on ``pretext_of(doc)``) and write every missing or truncated shard; returns pair counts and target
    statistics."""
    from tqdm.auto import tqdm

    store_dtype = DTYPES[p.store_dtype]
    todo = [s for s in shards if not safetensors_whole(out_dir / s["file"])]
    stats = {"pairs": {"train": 0, "val": 0}, "floored": 0, "skipped_shards": len(shards) - len(todo)}
    bar = tqdm(total=sum(len(s["docs"]) for s in todo), desc="kvzap pairs", unit="doc")
    for shard in todo:
        bar.set_postfix(shard=shard["file"])
        parts = []
        for i in shard["docs"]:
            parts.append(score_document(model, pretext_of(docs[i]), docs[i], p, seed, store_dtype))
            bar.update()
        tensors = {}
        for layer in range(model.config.num_hidden_layers):
            tensors[f"h.{layer}"] = torch.cat([q["h"][layer] for q in parts])
            tensors[f"y.{layer}"] = torch.cat([q["y"][layer] for q in parts]).float()
            tensors[f"y_kvzip.{layer}"] = torch.cat([q["y_kvzip"][layer] for q in parts]).float()
        tensors["doc"] = torch.cat([torch.full((len(q["pos"]),), i) for q, i in zip(parts, shard["docs"])])
        tensors["pos"] = torch.cat([q["pos"] for q in parts])
        stats["floored"] += sum(q["floored"] for q in parts)
        # one metadata key: safetensors orders several keys differently from run to run
        write_shard(
            out_dir / shard["file"], tensors, {"zoomr": json.dumps({"format": FORMAT, "docs": shard["docs"]})}
        )
    bar.close()
    return stats


def count_pairs(out_dir: Path, shards: list[dict]) -> None:
    from safetensors import safe_open

    for s in shards:
        with safe_open(str(out_dir / s["file"]), framework="pt") as f:
            s["n_pairs"] = int(f.get_slice("pos").get_shape()[0])


Plan = tuple[list[Document], dict[str, Any], Callable[[Document], RepeatPretext]]


def text_plan(tokenizer, p: KVzapPairsPipeline, seed: int) -> Plan:
    """Documents cut from ``p.sources``, scored on KVzip's repeat pretext (the paper's setting)."""
    if p.tokens_per_doc > p.min_tokens:
        raise SettingsError(f"tokens_per_doc ({p.tokens_per_doc}) must be <= min_tokens ({p.min_tokens})")
    if not p.sources:
        raise SettingsError("pipeline.sources is empty")
    sources = [s if isinstance(s, TextSource) else TextSource(**s) for s in p.sources]
    docs = plan_documents(sources, tokenizer, p, seed)
    if not docs:
        raise SettingsError("no documents: every source is shorter than min_tokens")
    skip = ("out_dir", "overwrite", "name", "module", "testbed")
    settings = {k: v for k, v in asdict(p).items() if k not in skip}
    settings["sources"] = [asdict(s) for s in sources]
    return docs, settings, lambda doc: build_repeat_pretext(tokenizer, doc.ids, p.instruction)


def testbed_plan(tokenizer, p: KVzapPairsPipeline, model_dir: str | None) -> Plan:
    """Testbed traces (:mod:`data_prep.kvzap_pairs_testbed`), scored on the testbed pretext."""
    from data_prep import kvzap_pairs_testbed as tb

    source: TestbedPairsSource = p.testbed  # a schema since to_dataclass (refused there, before any run state)
    data = tb.testbed_data(source, model_dir)
    pieces = tb.testbed_pieces(source, data, tokenizer)
    docs = [Document(i, "testbed", split, origin, ids) for i, (split, origin, ids) in enumerate(pieces)]
    keep = ("tokens_per_doc", "chunk_size", "docs_per_shard", "store_dtype")
    settings = {"testbed": tb.settings(source, data), **{k: getattr(p, k) for k in keep}}
    return docs, settings, lambda doc: tb.build_testbed_pretext(source, data, tokenizer, doc.index)


@dataclass
class PairsPlan:
    """What a pairs run will write (``plan``: recorded as ``plan.json``), its documents and their pretexts."""

    plan: dict[str, Any]
    docs: list[Document]
    pretext_of: Callable[[Document], RepeatPretext]


def plan_pairs(
    tokenizer, p: KVzapPairsPipeline, seed: int, model_info: dict[str, Any], model_dir: str | None = None
) -> PairsPlan:
    """The documents of ``p.sources`` or, when ``p.testbed`` is set, of testbed traces (the model directory
    ``model_dir``'s ``testbed_data.json`` is checked against them), and the plan they make; writes nothing."""
    docs, settings, pretext_of = (
        testbed_plan(tokenizer, p, model_dir) if p.testbed is not None else text_plan(tokenizer, p, seed)
    )
    plan = {
        "format": FORMAT,
        "seed": seed,
        "model": model_info,
        "settings": settings,
        "documents": [d.meta() for d in docs],
        "shards": shard_plan(docs, p.docs_per_shard),
    }
    return PairsPlan(plan, docs, pretext_of)


def make_pairs(
    model,
    tokenizer,
    p: KVzapPairsPipeline,
    seed: int,
    model_info: dict[str, Any],
    model_dir: str | None = None,
    planned: PairsPlan | None = None,
) -> dict[str, Any]:
    """Plan (:func:`plan_pairs`, unless ``planned``), score and write the pairs into ``p.out_dir``; returns the
    manifest."""
    out_dir = Path(p.out_dir)
    planned = planned or plan_pairs(tokenizer, p, seed, model_info, model_dir)
    plan, shards = planned.plan, planned.plan["shards"]
    out_dir.mkdir(parents=True, exist_ok=True)
    hold_run_lock(out_dir, "KVzap pairs pipeline")  # one writer of the shards and the manifest
    _check_plan(out_dir, plan, p.overwrite)
    t0 = time.time()
    stats = write_shards(model, planned.pretext_of, planned.docs, shards, p, out_dir, seed)
    count_pairs(out_dir, shards)
    manifest = {**plan, "seconds": round(time.time() - t0, 1), "floored_targets": stats["floored"]}
    manifest["n_pairs"] = {
        sp: sum(s["n_pairs"] for s in shards if s["split"] == sp) for sp in ("train", "val")
    }
    write_json(out_dir / "manifest.json", manifest)
    manifest["skipped_shards"] = stats["skipped_shards"]
    return manifest


def refuse_other_plan(out_dir: Path, plan: dict, overwrite: bool) -> bool:
    """Whether ``out_dir`` holds pairs of another plan than ``plan``; refused unless ``overwrite``."""
    path = out_dir / "plan.json"
    other = path.exists() and read_json_object(path, "KVzap pairs plan") != json.loads(json.dumps(plan))
    if other and not overwrite:
        raise SettingsError(
            f"{out_dir} holds pairs of a different plan (seed, model, settings or data differ); "
            "choose another pipeline.out_dir or set pipeline.overwrite=true"
        )
    return other


def _check_plan(out_dir: Path, plan: dict, overwrite: bool) -> None:
    if refuse_other_plan(out_dir, plan, overwrite):  # overwrite=true: the other plan's shards go
        for f in out_dir.glob("shard-*.safetensors"):
            f.unlink()
        (out_dir / "manifest.json").unlink(missing_ok=True)
    write_json(out_dir / "plan.json", plan)


def check_context(p: KVzapPairsPipeline, model_config: Any) -> None:
    """Refuse documents whose repeat pretext (the document, the instruction, the document again) cannot fit the
    model's context: ``pipeline.min_tokens=100000`` packed documents past 32,768 positions on the tiny model and
    scored them for hours (pairs from positions the model never saw). Testbed documents are sized by their data."""
    context = getattr(model_config, "max_position_embeddings", None)
    if p.testbed is None and context and 2 * p.max_tokens > context:
        raise SettingsError(
            f"pipeline.max_tokens={p.max_tokens}: the repeat pretext holds each document twice "
            f"({2 * p.max_tokens} tokens and the instruction), past the model's {context} positions "
            f"(max_position_embeddings); give pipeline.max_tokens (and min_tokens) below {context // 2}"
        )


def run(cfg) -> dict[str, Any]:
    """Entry glue: config → model, tokenizer → :func:`make_pairs` → summary."""
    from collections import Counter

    from zoomr.entry import model_spec, pick_device, start_run
    from zoomr.models import describe, load_model, load_tokenizer
    from zoomr.rundir import write_summary
    from zoomr.schemas import to_dataclass

    p: KVzapPairsPipeline = to_dataclass(KVzapPairsPipeline, cfg.pipeline)
    spec = model_spec(cfg)
    tokenizer = load_tokenizer(spec, cfg.cache_dir)
    model = load_model(spec, cfg.cache_dir, device=pick_device(cfg.device), attn_implementation="eager")
    check_context(p, model.config)
    info = {"name": spec.name, **{k: v for k, v in describe(model).items() if k != "params"}}
    planned = plan_pairs(tokenizer, p, int(cfg.seed), info, model_dir=spec.hf_id)  # documents that cannot be made,
    refuse_other_plan(Path(p.out_dir), planned.plan, p.overwrite)  # or another plan there: before any run state
    # one W&B run per pairs directory and plan, resumed by a rerun (which keeps its complete shards; pairs of another
    # plan written over them, pipeline.overwrite=true, are another run); in W&B under the pipeline's name, not the
    # data=traces default, which the pairs do not read
    plan_digest = hashlib.sha256(json.dumps(planned.plan, sort_keys=True, default=str).encode()).hexdigest()
    key = f"{Path(p.out_dir).expanduser().absolute()} {plan_digest}"
    run_dir, logger = start_run(cfg, job_type="data_prep", same_run=True, run_key=key, target=p.name)
    manifest = make_pairs(model, tokenizer, p, int(cfg.seed), info, model_dir=spec.hf_id, planned=planned)
    per_subset = Counter((d["subset"], d["split"]) for d in manifest["documents"])
    summary = {
        "pipeline": p.name,
        "model": spec.name,
        "out_dir": str(p.out_dir),
        "documents": ", ".join(
            f"{s}: {per_subset[(s, 'train')]}+{per_subset[(s, 'val')]}"
            for s in dict.fromkeys(d["subset"] for d in manifest["documents"])
        )
        + "  (train+val)",
        "pairs_train": manifest["n_pairs"]["train"],
        "pairs_val": manifest["n_pairs"]["val"],
        "shards": f"{len(manifest['shards'])} ({manifest['skipped_shards']} already there)",
        "floored_targets": manifest["floored_targets"],
        "seconds": manifest["seconds"],
        "run_dir": str(run_dir),
    }
    write_summary(run_dir, summary, f"KVzap pairs: {cfg.run_name}")
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary
