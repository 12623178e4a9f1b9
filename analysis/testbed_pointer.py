"""Offline (teacher-forced, full KV) selection hit rate of ZoomR's rule on the recall testbed (issue 13).

    python -m analysis.testbed_pointer --model <testbed summaries checkpoint> --n 256 --test-seed 2000003 \\
        --out runs/testbed_pointer

For every query's boundary ``:`` of ``--n`` test problems: every (layer, query head) scores the completed
summaries with q · k̄_i (post-RoPE, mean over the summary's content keys), votes for its top-k, and I_c is
the top-c by votes (:func:`zoomr.summary_pointer.selection_hits`, built on the policy's own
``head_votes``/``consensus``). A hit: I_c holds the paragraph that defined the queried fact. Reported for
the paper's rule (every layer) and per layer, overall and for facts outside the recent window, beside
chance (c / summaries so far). ``--cue-view`` runs the forward under ZoomR's decoding-time view at each
cue's key and boundary rows (:mod:`zoomr.testbed.cue_view`: the prompt and the window only), the
condition the decoded selection meets; a model whose boundary query finds the summary by attending to it
scores far lower there. This is the check to run before spending time on ZoomR accuracy arms
(shared/specs/MINIATURE_NOTES.md): until the rule beats chance, the arms are uninformative. Where the rule
misses (``misses`` in the JSON, :class:`MissTally`): the miss rate by how many summaries back the defining one
lies, and how many misses are unanimous (no head that can see the key votes for the target: a shared error,
such as another summary's keys lying close to the cue's key, that more heads voting cannot outvote), and
per (layer >= 1, head) at the misses the score q · k of the target summary's word that the cue names, of its
other words, and of the best and mean word of the winning wrong summary (``at_misses``): whether the mean over
a summary's words, not the match itself, loses the target (analysis/results/zoomr_testbed/HISTORY.md, attempt 9 m).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from analysis.cli import require_at_least, require_checkpoint, require_testbed_data
from zoomr.paths import output_dir
from zoomr.rundir import write_text_atomic


@torch.no_grad()
def teacher_forced_hit_rate(
    model, data, n: int, top_k: int = 2, c: int = 2, window: int = 64, batch: int = 8, cue_view: bool = False
) -> dict[str, Any]:
    """Hit rates of the rule over ``n`` problems of ``data`` (its test seed), every layer and each layer alone,
    and where it misses (``misses``: :class:`MissTally`);
    ``cue_view``: with the cue rows under :func:`zoomr.testbed.cue_view.batch_cue_view`'s mask."""
    from zoomr.summary_pointer import capture_qk, count_hits
    from zoomr.testbed import vocab as tt
    from zoomr.testbed.cue_view import batch_cue_view
    from zoomr.testbed.curriculum import collate, encode_problem
    from zoomr.testbed.task import problems

    enc = tt.FastEncoder()
    rows = [encode_problem(p, enc, window) for p in problems(data, n, data.test_seed)]
    variants: dict[str, list[int] | None] = {"paper": None, **{f"layer{i}": [i] for i in range(model.config.num_hidden_layers)}}
    totals = {v: {"hits": 0, "cues": 0, "far_hits": 0, "far_cues": 0, "chance": 0.0} for v in variants}
    misses = MissTally(top_k, content_layers=list(range(1, model.config.num_hidden_layers)))
    with capture_qk(model) as qk:
        for i in range(0, len(rows), batch):
            b = collate(rows[i : i + batch], enc.ids[tt.tokens.PAD], "trace", data.trace_tokens)
            model(input_ids=b.input_ids, attention_mask=batch_cue_view(b, window) if cue_view else None)
            for name, layers in variants.items():
                counts = count_hits(qk, b.spans, b.cues, top_k, c, layers)
                totals[name] = {k: totals[name][k] + counts[k] for k in counts}
            misses.add(qk, b.spans, b.cues, c, b.input_ids)
    out: dict[str, Any] = {}
    for name, t in totals.items():
        out[name] = {
            "hit_rate": t["hits"] / max(1, t["cues"]),
            "hit_rate_far": t["far_hits"] / max(1, t["far_cues"]),
            "chance": t["chance"] / max(1, t["cues"]),
            "cues": t["cues"],
            "cues_far": t["far_cues"],
        }
    out["misses"] = misses.summary()
    return out


BACK_BUCKETS = ((0, 1, "0"), (1, 4, "1-3"), (4, 10, "4-9"), (10, 10**9, "10+"))


class MissTally:
    """Where the paper's rule misses: the miss rate by how many summaries back the defining one lies, and how
    many misses are unanimous (no head of the layers that can see the key, 1 and up, votes for the target: the
    others' summaries outscore it in every head, i.e. the heads share the error rather than split)."""

    def __init__(self, top_k: int, content_layers: list[int]) -> None:
        self.top_k, self.layers = top_k, content_layers
        self.by_back = {name: [0, 0] for *_, name in BACK_BUCKETS}
        self.unanimous = 0
        self.misses = 0
        self.word_scores: list[tuple[float, float, float, float]] = []  # per miss and head: word_scores_at()

    def add(self, qk, spans, cues, c: int, input_ids: torch.Tensor | None = None) -> None:
        from zoomr.summary_pointer import selection_hits, target_ranks

        for b, (sp, cs) in enumerate(zip(spans, cues)):
            if not cs or not sp:
                continue
            ranks = target_ranks(qk, sp, cs, self.layers, b=b) if self.layers else None
            for n, s in enumerate(selection_hits(qk, sp, cs, self.top_k, c, b=b)):
                back = s.n_summaries - 1 - cs[n].target
                name = next(name for lo, hi, name in BACK_BUCKETS if lo <= back < hi)
                self.by_back[name][0] += not s.hit
                self.by_back[name][1] += 1
                if not s.hit:
                    self.misses += 1
                    self.unanimous += ranks is not None and bool((ranks[n] >= self.top_k).all())
                    if input_ids is not None:
                        wrong = next(i for i in s.zoomed if i != cs[n].target)
                        self.word_scores += self.word_scores_at(qk, input_ids[b], sp, cs[n], wrong, b)

    def word_scores_at(self, qk, ids: torch.Tensor, spans, cue, wrong: int, b: int) -> list[tuple[float, ...]]:
        """Per (content layer, query head): q · k of the target summary's word that the cue names, the mean of its
        other words (nan if none), the best and the mean word of the ``wrong`` summary that won."""
        (a, e), (wa, we) = spans[cue.target], spans[wrong]
        named = set(ids[cue.start : cue.pos].tolist())
        match = [p for p in range(a, e) if int(ids[p]) in named]
        if not match:
            return []
        rest = [p for p in range(a, e) if p not in match]
        out = []
        for layer in self.layers:
            query, key = qk[layer]
            group = query.shape[1] // key.shape[1]
            for h in range(query.shape[1]):
                q, k = query[b, h, cue.pos].float(), key[b, h // group].float()
                own, others, won = k[match[0]] @ q, k[rest] @ q, k[wa:we] @ q
                out.append((float(own), float(others.mean()) if rest else float("nan"), float(won.max()), float(won.mean())))
        return out

    def summary(self) -> dict[str, Any]:
        scores = torch.tensor(self.word_scores) if self.word_scores else torch.full((1, 4), float("nan"))
        return {
            "miss_rate_by_summaries_back": {k: m / n if n else None for k, (m, n) in self.by_back.items()},
            "cues_by_summaries_back": {k: n for k, (_, n) in self.by_back.items()},
            "misses": self.misses,
            "unanimous_misses": self.unanimous,
            "at_misses": {  # per (layer >= 1, query head) at each miss: where the mean loses the target
                "heads": len(self.word_scores),
                "named_word": scores[:, 0].nanmean().item(),
                "target_other_words": scores[:, 1].nanmean().item(),
                "winner_best_word": scores[:, 2].nanmean().item(),
                "winner_mean": scores[:, 3].nanmean().item(),
                "named_word_beats_every_winner_word": (scores[:, 0] > scores[:, 2]).float().mean().item(),
            },
        }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a testbed checkpoint trained with summaries")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--test-seed", type=int, default=None, help="default: the data's test seed")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--consensus", type=int, default=2)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--cue-view", action="store_true", help="cue rows see only the prompt and the window (decoding)")
    p.add_argument("--out", type=output_dir, default="runs/testbed_pointer")
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "n", "top_k")
    require_at_least(p, args, 0, "window", "consensus")
    require_checkpoint(p, args.model)

    from zoomr.testbed.checkpoint import load_testbed_model

    data = require_testbed_data(p, args.model, test_seed=args.test_seed)
    if not data.summaries:
        raise SystemExit(f"{args.model} was trained without summaries: there is nothing to point at")
    model, _ = load_testbed_model(args.model)
    res = teacher_forced_hit_rate(model, data, args.n, args.top_k, args.consensus, args.window, cue_view=args.cue_view)
    print(f"{'rule':<8}{'hit':>8}{'far':>8}{'chance':>8}{'cues':>7}{'far cues':>9}")
    for name, r in res.items():
        if name == "misses":
            continue
        print(f"{name:<8}{r['hit_rate']:>8.3f}{r['hit_rate_far']:>8.3f}{r['chance']:>8.3f}{r['cues']:>7}{r['cues_far']:>9}")
    m = res["misses"]
    print("miss rate by summaries back: " + ", ".join(
        f"{k} {v:.3f} ({m['cues_by_summaries_back'][k]} cues)" for k, v in m["miss_rate_by_summaries_back"].items() if v is not None))
    print(f"unanimous misses (no head of layers >= 1 votes for the target): {m['unanimous_misses']} of {m['misses']}")
    w = m["at_misses"]
    if w["heads"]:
        print(f"at the misses, per head (q · k): the named word of the target summary {w['named_word']:.1f}, its other "
              f"words {w['target_other_words']:.1f}; the winning summary's best word {w['winner_best_word']:.1f}, its "
              f"mean {w['winner_mean']:.1f}; the named word beats every winner word in "
              f"{w['named_word_beats_every_winner_word']:.0%}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {**vars(args), "test_seed": data.test_seed, "query_form": data.query_form}
    write_text_atomic(out / "pointer_hit_rate.json", json.dumps({"meta": meta, "results": res}, indent=2))  # whole
    print(f"written {out / 'pointer_hit_rate.json'}")
    return res


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
