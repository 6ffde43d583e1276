#!/usr/bin/env bash
# What only a GPU shows, in one short run (one lent GPU, 15 minutes all in):
#   1. bench_env_pool.py on CUDA: pool vs sequential envs, per-env CUDA streams on vs off,
#      fp32 vs bf16-mixed vs 16-mixed (each env's own GradScaler), the host's epoch time;
#   2. bench_counterfactual.py on CUDA: fused counterfactual validation vs K separate passes;
#   3. the tests that skip without CUDA;
#   1b. (pool512, runs after 1) bench_env_pool.py again at batch 512: whether kernels then
#      outlast their launches;
#   grown (runs after 2): bench_grown_step.py on CUDA, fp32 and bf16: whether a fossilized
#      growth's hook costs a launch-bound GPU step what it does not cost a CPU one;
#   overhead (runs after grown): bench_callback_overhead.py on the GPU: the callback's share of a
#      fit whose steps are short;
#   4. the width-128 frontier tuning study (resumable; whatever units finish are kept).
#
#   bash benchmarks/gpu_checks.sh DATA_DIR TEXT OUT_DIR SECONDS [PARTS]
#
# DATA_DIR: a CIFAR-10 folder; TEXT: the frontier's text; OUT_DIR: logs and the study's rows;
# SECONDS: the wall-clock deadline of the whole script (each part gets what is left of it).
# PARTS: which parts run, in this order whatever the order given (default
# "pool counterfactual tests frontier"; add pool512, grown or overhead, or leave parts out).
# The timed benchmarks run first, on a quiet machine; the frontier study runs last with one
# worker process per CPU core but one, all on the one GPU.
set -u
DATA_DIR=$1 TEXT=$2 OUT_DIR=$3 DEADLINE=$(( $(date +%s) + $4 ))
# Split on any whitespace, newlines too, without globbing (read stops at the end: status 1).
read -ra asked -d '' <<< "${5:-pool counterfactual tests frontier}" || true
declare -A PARTS=()
for p in "${asked[@]}"; do
    case $p in pool|pool512|counterfactual|grown|overhead|tests|frontier) PARTS[$p]=1 ;;
    *) echo "gpu_checks.sh: unknown part '$p' (accepted: pool pool512 counterfactual grown" \
            "overhead tests frontier)" >&2; exit 2 ;;
    esac
done
wants() { [[ -n ${PARTS[$1]:-} ]]; }
mkdir -p "$OUT_DIR"
left() { echo $(( DEADLINE - $(date +%s) )); }
part() {  # part SECONDS LOG COMMAND...: run COMMAND for at most SECONDS (and what is left)
    local limit=$1 log=$2; shift 2
    (( limit > $(left) )) && limit=$(left)
    (( limit <= 0 )) && { echo "skipped: no time left" > "$OUT_DIR/$log"; return; }
    echo "== $* (limit ${limit}s)" | tee -a "$OUT_DIR/$log"
    timeout --signal=INT --kill-after=10 "$limit" "$@" >> "$OUT_DIR/$log" 2>&1
    echo "== exit $? after $SECONDS s of the script" | tee -a "$OUT_DIR/$log"
}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's package
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
  nproc; } > "$OUT_DIR/machine.txt" 2>&1
wants pool && part 170 bench_env_pool.log python3 benchmarks/bench_env_pool.py --device cuda \
    --data-dir "$DATA_DIR" --train-subset 0 --val-subset 0
wants pool512 && part 150 bench_env_pool_b512.log python3 benchmarks/bench_env_pool.py \
    --device cuda --data-dir "$DATA_DIR" --train-subset 0 --val-subset 0 --batch-size 512
wants counterfactual && part 50 bench_counterfactual.log python3 \
    benchmarks/bench_counterfactual.py --device cuda --seeds 1 2 3 --batch-sizes 500 2000
wants grown && part 90 bench_grown_step.log python3 benchmarks/bench_grown_step.py \
    --device cuda --widths 128 512 1024
wants grown && part 90 bench_grown_step_bf16.log python3 benchmarks/bench_grown_step.py \
    --device cuda --precision bf16 --widths 128 512 1024
wants overhead && part 120 bench_callback_overhead.log python3 \
    benchmarks/bench_callback_overhead.py --accelerator gpu --repeats 7
wants tests && part 150 gpu_tests.log python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests
wants frontier || exit 0
STUDY="$OUT_DIR/w128-tuning"
mkdir -p "$STUDY" && cp results/frontier/w128-tuning/plan.json "$STUDY/"
[ -f results/frontier/w128-tuning/rows.csv ] && cp results/frontier/w128-tuning/rows.csv "$STUDY/"
part 100000 frontier.log python3 -c "import sys; from esper_lightning.app.frontier.command \
import main; sys.exit(main(sys.argv[1:]))" run "$STUDY" --text "$TEXT" --device cuda \
    --workers $(( $(nproc) - 1 )) --no-progress
