#!/usr/bin/env bash
# The tiny real runs behind the committed example output (analysis/results/paper/): CPU, random-weight tiny
# model, 3 problems x 2 samples per benchmark. About 35 min on this shared 2-core machine
# (22 eval runs of ~20-60 s each, dominated by process start). Usage (from the repo root):
#   bash analysis/results/paper/make_runs.sh [ROOT=runs/paper_example]
#   python -m analysis +task=paper_tables 'task.runs=[ROOT/**]' task.out=analysis/results/paper
set -euo pipefail
R=${1:-runs/paper_example}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TINY_ABRIDGE=(method.max_steps=8 method.per_device_batch_size=2 method.max_response_tokens=40 method.block_size=8
  method.num_pause=4 method.heldout_examples=2 method.logging_steps=1 method.eval_steps=4 method.save_steps=4
  data.max_samples=8 logger=none)
# AbridgeKV: a uniform-quota model, then the per-layer allocation (Figure 6)
[ -f "$R/train/abridge/final/abridge.json" ] || python -m train +method=abridge "${TINY_ABRIDGE[@]}" run_dir="$R/train/abridge"
[ -f "$R/train/abridge_allocate/schedule.json" ] || python -m train +method=abridge_allocate \
  method.checkpoint="$R/train/abridge/final" data.max_samples=8 logger=none run_dir="$R/train/abridge_allocate"
# KVzap: training pairs and the linear + MLP surrogates (Table 1)
[ -f "$R/kvzap/fit/r2.json" ] || {
  python -m data_prep +pipeline=kvzap_pairs pipeline.out_dir="$R/kvzap/pairs" run_dir="$R/kvzap/dp" logger=none \
    pipeline.min_tokens=60 pipeline.max_tokens=90 pipeline.max_docs_per_subset=5 pipeline.val_docs_per_subset=2 \
    pipeline.tokens_per_doc=40 pipeline.docs_per_shard=8
  python -m train +method=kvzap method.pairs_dir="$R/kvzap/pairs" method.surrogate_dir="$R/kvzap/surrogates" \
    run_dir="$R/kvzap/fit" logger=none
}
EV=(benchmark.problem_limit=3 generation.n_samples=2 generation.max_new_tokens=64 grading.workers=1 logger=none)
for B in math500 aime25; do
  ev() { local name=$1; shift; python -m eval benchmark=$B "${EV[@]}" run_name="$name" run_dir="$R/eval/$B/$name" "$@"; }
  ev full
  ev streaming +method=streaming method.budget_rows=96
  ev h2o +method=h2o method.budget_rows=96
  ev sumr +method=sumr
  ev zoomr +method=zoomr method.window=32
  ev abridge +method=abridge model.tiny=null model.hf_id="$R/train/abridge/final" model.name=tiny-qwen2
  # thresholds for this random tiny model's surrogate (analysis.kvzap_compression), window 16 < the 82-token prompts
  for T in -7.8 -7.5 -7.2; do
    ev "kvzap_t$T" +method=kvzap method.surrogate_dir="$R/kvzap/surrogates" method.threshold=$T method.window=16
  done
  ev kvzap_oracle_r0.5 +method=kvzip method.ratio=0.5
  ev kvzap_oracle_t-9.6 +method=kvzip method.mode=threshold method.threshold=-9.6 method.window=16
done
# decode throughput and time to finish at each arm's own generation lengths (Figures 3b, 3d)
python -m analysis.bench_throughput --quick --eval-runs "$R"/eval/math500/* --out "$R/bench"
# ZoomR resident rows vs the MS formula and per-recompute agreeability on a summary-structured stream
python -m analysis.bench_zoomr --prompt 64 --generate 512 --para 48 --summary 8 --window 64 --out "$R/bench/zoomr_rows.json"
