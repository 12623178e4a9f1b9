"""KVzap training pairs: document cutting, held-out split, determinism, resume (KVzap paper §4.1)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors import safe_open

from data_prep.kvzap_pairs import cut_documents, make_pairs, plan_documents
from tests.conftest import tiny_spec
from zoomr.kvzap.pairs import load_layer, read_manifest
from zoomr.kvzap.pretext import build_repeat_pretext
from zoomr.kvzap.scoring import kvzip_scores
from zoomr.models import describe, load_model_and_tokenizer
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.kvzap import KVzapPairsPipeline, TextSource


def test_cut_documents_lengths_and_packing():
    rng = np.random.default_rng(0)
    docs = [(0, list(range(1000))), (1, [7] * 30), (2, [8] * 30), (3, [9] * 50), (4, list(range(130)))]
    pieces = cut_documents(docs, sep=[-1], lo=100, hi=150, rng=rng)
    assert all(100 <= len(ids) <= 150 for _, _, ids in pieces)
    long = [ids for j, _, ids in pieces if j == 0]
    flat = [t for ids in long for t in ids]
    assert flat == list(range(len(flat))) and 1000 - len(flat) < 100  # consecutive, only a short tail dropped
    packed = [(o, ids) for j, o, ids in pieces if o.startswith("packed")]
    assert packed and packed[0][0] == "packed 1,2,3"
    assert packed[0][1][:31] == [7] * 30 + [-1]  # short documents joined by the separator
    assert [o for j, o, _ in pieces if j == 4] == ["4[0:130]"]


def test_plan_tokenizes_only_the_source_documents_its_kept_pieces_need(tmp_path):
    """The plan takes at most val + max_docs pieces per subset; a source of 300 lines was tokenized whole (every line
    held as a token list) before the first piece was kept. Capped, it reads no further than the pieces it keeps, and
    keeps the same documents as a plan that reads every line."""
    (tmp_path / "t.txt").write_text("".join(" ".join(f"w{i}x{k}" for k in range(40)) + "\n" for i in range(300)))
    tokenized = []

    def tokenizer(text, **kw):
        tokenized.append(text)
        return {"input_ids": [len(w) for w in text.split()]}

    source = [TextSource(name="t", path=str(tmp_path / "t.txt"), format="lines")]
    kw = dict(sources=source, min_tokens=15, max_tokens=20, val_docs_per_subset=2, tokens_per_doc=10)
    capped = plan_documents(source, tokenizer, KVzapPairsPipeline(max_docs_per_subset=4, **kw), seed=3)
    assert len(tokenized) - 1 <= 6  # the separator, then about one line per two pieces: not all 300 lines
    tokenized.clear()
    every = plan_documents(source, tokenizer, KVzapPairsPipeline(max_docs_per_subset=10**6, **kw), seed=3)
    assert len(tokenized) == 301
    assert capped == every[:6] and [d.split for d in capped] == ["val"] * 2 + ["train"] * 4


@pytest.fixture(scope="module")
def model_tok(cache_dir):
    return load_model_and_tokenizer(tiny_spec("qwen2"), cache_dir)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two small subsets: one of long documents, one of short ones (packed)."""
    root = tmp_path_factory.mktemp("text")
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    rng = np.random.default_rng(1)
    long = [" ".join(rng.choice(words, 400)) for _ in range(6)]
    (root / "long.txt").write_text("\n".join(long) + "\n")
    short = [{"q": " ".join(rng.choice(words, 25)), "a": f"answer {i}"} for i in range(40)]
    (root / "short.jsonl").write_text("".join(json.dumps(r) + "\n" for r in short))
    return [
        TextSource(name="long", path=str(root / "long.txt"), format="lines"),
        TextSource(
            name="short", path=str(root / "short.jsonl"), format="jsonl", fields=["q", "a"], joiner=" => "
        ),
    ]


def settings(out_dir, sources, **kw):
    base = dict(
        sources=sources, out_dir=str(out_dir), min_tokens=60, max_tokens=90, max_docs_per_subset=6,
        val_docs_per_subset=2, tokens_per_doc=40, chunk_size=64, docs_per_shard=4, store_dtype="float32",
    )  # fmt: skip
    base.update(kw)
    return KVzapPairsPipeline(**base)


def test_plan_separates_val_sources(model_tok, sources):
    _, tok = model_tok
    docs = plan_documents(sources, tok, settings("unused", sources), seed=3)
    for subset in ("long", "short"):
        mine = [d for d in docs if d.subset == subset]
        val = [d for d in mine if d.split == "val"]
        train = [d for d in mine if d.split == "train"]
        assert len(val) == 2 and 1 <= len(train) <= 6
        assert all(60 <= len(d.ids) <= 90 for d in mine)
        if subset == "long":  # pieces of a held-out source document never reach the training split
            val_src = {d.origin.split(":")[1].split("[")[0] for d in val}
            train_src = {d.origin.split(":")[1].split("[")[0] for d in train}
            assert not val_src & train_src
    assert plan_documents(sources, tok, settings("unused", sources), seed=3) == docs
    assert plan_documents(sources, tok, settings("unused", sources), seed=4) != docs


def test_pairs_deterministic_resumable_and_correct(model_tok, sources, tmp_path):
    model, tok = model_tok
    info = {"name": "tiny-qwen2", **describe(model)}
    p = settings(tmp_path / "a", sources)
    manifest = make_pairs(model, tok, p, seed=5, model_info=info)
    n_docs = len(manifest["documents"])
    assert manifest["n_pairs"]["train"] + manifest["n_pairs"]["val"] == 40 * n_docs
    assert read_manifest(tmp_path / "a")["n_pairs"] == manifest["n_pairs"]

    # rerun in another directory: byte-identical shards
    make_pairs(model, tok, replace(p, out_dir=str(tmp_path / "b")), seed=5, model_info=info)
    files = sorted(f.name for f in (tmp_path / "a").glob("shard-*"))
    assert files and all(
        (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files
    )

    # resume: a missing shard is rebuilt identically, the others are kept
    victim = tmp_path / "b" / files[0]
    victim.unlink()
    again = make_pairs(model, tok, replace(p, out_dir=str(tmp_path / "b")), seed=5, model_info=info)
    assert again["skipped_shards"] == len(files) - 1
    assert victim.read_bytes() == (tmp_path / "a" / files[0]).read_bytes()

    # a truncated shard is named to the trainer, and the rerun rebuilds it identically
    victim.write_bytes(victim.read_bytes()[:500])
    with pytest.raises(FileNotFoundError, match=f"1 shard\\(s\\) listed in manifest.json missing or truncated \\({files[0]}\\)"):
        read_manifest(tmp_path / "b")  # was a SafetensorError traceback in +method=kvzap, after its run state
    make_pairs(model, tok, replace(p, out_dir=str(tmp_path / "b")), seed=5, model_info=info)
    assert victim.read_bytes() == (tmp_path / "a" / files[0]).read_bytes()

    # a different plan in the same directory is refused
    with pytest.raises(SettingsError, match="different plan"):
        make_pairs(model, tok, replace(p, out_dir=str(tmp_path / "b")), seed=6, model_info=info)

    # the stored pairs are the scorer's outputs at the stored positions
    with safe_open(str(tmp_path / "a" / files[0]), framework="pt") as f:
        doc_ids, pos = f.get_tensor("doc"), f.get_tensor("pos")
        doc = manifest["documents"][int(doc_ids[0])]
        rows = doc_ids == doc_ids[0]
        from data_prep.kvzap_pairs import plan_documents as plan

        ids = plan(sources, tok, p, seed=5)[doc["index"]].ids
        scores = kvzip_scores(model, build_repeat_pretext(tok, ids), keep_hidden=True)
        for layer in (0, 3):
            torch.testing.assert_close(f.get_tensor(f"h.{layer}")[rows], scores.hidden[layer, pos[rows]])
            torch.testing.assert_close(f.get_tensor(f"y.{layer}")[rows], scores.log()[layer][:, pos[rows]].T)
            torch.testing.assert_close(
                f.get_tensor(f"y_kvzip.{layer}")[rows], scores.log(plus=False)[layer][:, pos[rows]].T
            )
    assert len(set(pos[rows].tolist())) == 40  # sampled without replacement

    X, y = load_layer(tmp_path / "a", 2, "val")
    assert X.shape == (manifest["n_pairs"]["val"], 256) and y.shape == (manifest["n_pairs"]["val"], 2)
    assert torch.isfinite(y).all()


def test_pairs_that_overflow_their_store_dtype_are_refused_before_a_shard(model_tok, sources, tmp_path):
    """Hidden states past float16's range were stored as inf and written; the fit then refused the shard (or, before
    that, fitted NaN surrogates). The pipeline now names the document and the cause before writing the shard."""
    import copy

    model, tok = model_tok
    loud = copy.deepcopy(model)
    with torch.no_grad():
        for layer in loud.model.layers:  # the surrogate's input is the attention's: past 65,504, float16's largest
            layer.input_layernorm.weight.mul_(1e6)
    p = settings(tmp_path / "a", sources, store_dtype="float16")
    with pytest.raises(SettingsError, match=r"non-finite values in its h pairs \(pipeline.store_dtype=float16 overflows"):
        make_pairs(loud, tok, p, seed=5, model_info={"name": "tiny-qwen2", **describe(model)})
    assert not list((tmp_path / "a").glob("shard-*"))
