#!/usr/bin/env bash
# The learned-controller study (a timing policy against a tuned per-budget lookup), stage by
# stage. Every stage resumes where it stopped (compare and ppo resume their own folders), so an
# interrupted session reruns the same line. Sizes and CPU times: docs/evidence.md, "A learned
# controller against a tuned lookup: the tools and a sizing pilot".
#
#   bash scripts/controller_study.sh tune-lookup    # tuning episodes, one comparison per budget
#   bash scripts/controller_study.sh lookup         # the lookup and the best single schedule
#   bash scripts/controller_study.sh train SEED     # one PPO training seed of the timing policy
#   bash scripts/controller_study.sh ship SEED      # that policy, small, into policies/
#   bash scripts/controller_study.sh train-all SEED # every blueprint, started from that policy
#   bash scripts/controller_study.sh ship-all SEED  # the curriculum's policy into policies/
#   bash scripts/controller_study.sh decide-all     # prior 0.1 or none, on tuning episodes
#   bash scripts/controller_study.sh chosen-all     # its choice: "0.1" or "none" (PRIOR=...)
#   bash scripts/controller_study.sh final-budgets  # the pre-registered tables
#   bash scripts/controller_study.sh final-oracle   #   (results/controller/final-plan.md),
#   bash scripts/controller_study.sh final-text     #   each once the lookup and the three
#   bash scripts/controller_study.sh final-host     #   shipped timing policies exist
#   bash scripts/controller_study.sh dev-sampled    # the timing policies sampled, a dev check
#   bash scripts/controller_study.sh reproduce STAGE N  # a final stage's first N episodes
#                                                   #   again, compared with its rows
#   bash scripts/controller_study.sh status         # what each stage has done so far
set -euo pipefail

TEXT=${TEXT:-../shared/data/shakespeare/shakespeare.txt}
RESULTS=results/controller
#: Where PPO training writes its checkpoints and TensorBoard logs (CHECKPOINTS=DIR: e.g. a
#: folder that outlives the machine, for a training longer than one sitting).
CHECKPOINTS=${CHECKPOINTS:-runs}
#: The tuning episodes' root rng seed, used by nothing else.
TUNING_ROOT=30301
#: The budgets the policies train over (log-uniform 0.25-4 x) and the lookup is tuned at.
TUNING_SCALES="0.25 0.5 1 2 4"
#: The final tables' budgets: none a tuning budget, none a training one (those are continuous).
FINAL_SCALES="0.35 0.7 1.4 2.8"
LOOKUP=lookup:$RESULTS/lookup-grow124.json
TIMING=(policy:policies/grow124-timing-s1.pt policy:policies/grow124-timing-s2.pt
        policy:policies/grow124-timing-s3.pt)
#: The nine-blueprint policies (the curriculum from the timing policy of the same seed), set
#: by all_group: they join final-budgets once all three are shipped (final-plan.md, item 5).
ALL=()
#: Item 6's choice between the curriculum with an action prior and without (decide-all):
#: tuning episodes on the validation split, a root used by nothing else (balanced_root.py
#: --scales 0.25 0.5 1 2 4 --episodes 20 --start 33100).
DECIDE_ROOT=33184
DECIDE_EPISODES=20
#: The two seed-1 curricula decide-all plays: with the action prior (0.1) and without.
CURRICULA=(policy:policies/grow124-all-s1.pt policy:policies/grow124-all-none-s1.pt)
#: dev-sampled's tuning episodes (validation split, the training budgets, 4 each), a root used
#: by nothing else (balanced_root.py --scales 0.25 0.5 1 2 4 --episodes 20 --start 35000).
DEV_ROOT=35034
#: The unseen text: the Python standard library's source (Python 3.11.7: 4,932,584 bytes).
STDLIB=${STDLIB:-runs/stdlib.txt}
STDLIB_SHA256=b63203f55f9e0c7c5c3d393a0d833d9f4baddb0aedea63f40bd1a355cd3183b4
#: The unseen host's base budget: the same 1,500 steps of its four-block host (FlopMeter:
#: w64l4, batch 32, 32 tokens: 1,409,286,144 FLOPs a step), so a scale means what it means
#: on the host the policies trained on.
W64_BASE=2113929216000

# The group `all`: the three seeds of the curriculum decide-all chose, with the action prior
# (grow124-all-sN) or without (grow124-all-none-sN), once all three of one are shipped; none
# before; both complete is ambiguous and refused.
all_group() {
  local variant complete=()
  for variant in all all-none; do
    if [ -f "policies/grow124-$variant-s1.pt" ] && [ -f "policies/grow124-$variant-s2.pt" ] &&
       [ -f "policies/grow124-$variant-s3.pt" ]; then
      complete+=("$variant")
    fi
  done
  if [ "${#complete[@]}" -gt 1 ]; then
    echo "policies/ holds three seeds of both curricula (all, all-none); keep the one" \
         "decide-all chose (final-plan.md, item 5)" >&2
    exit 2
  fi
  ALL=()
  [ "${#complete[@]}" -eq 1 ] && ALL=(policy:policies/grow124-"${complete[0]}"-s{1,2,3}.pt)
  return 0
}

# Two growth events (1 -> 2 -> 4 blocks, host grow124) on a 0.1 grid, the first no later than
# the second: 45 schedules; one growth only (1 -> 2, the second slot's time 1: never): 9; and
# static for "never" (55 arms: everything a timing policy can do, at the grid's resolution).
grid() {
  local arms="static" first second
  for first in 1 2 3 4 5 6 7 8 9; do
    for second in $(seq "$first" 9) never; do
      if [ "$second" = never ]; then
        arms+=" stack:4@0.$first,1:identity"
      else
        arms+=" stack:4@0.$first,0.$second:identity"
      fi
    done
  done
  echo "$arms"
}

# The final tables' episodes (final-plan.md); final-oracle's are the first 16 of final-budgets.
declare -A FINAL_EPISODES=([final-budgets]=40 [final-oracle]=16 [final-text]=24 [final-host]=16)

# play_final STAGE EPISODES OUT: a pre-registered final table (results/controller/final-plan.md:
# arms, budgets, episodes and roots fixed in its commit before any episode) on its first
# EPISODES episodes, its rows into OUT. The lookup is the reference; the three timing policies
# are pooled as one arm (their mean, episode by episode) and reported one by one with their
# spread.
play_final() {
  local stage=$1 episodes=$2 out=$3 file group read_best best_single first second
  local -a common args schedules
  for file in "${LOOKUP#lookup:}" "${TIMING[@]#policy:}"; do
    [ -f "$file" ] || { echo "missing $file: the final tables play it" >&2; exit 2; }
  done
  group="timing=$(IFS=,; echo "${TIMING[*]}")"
  # The budget-blind rival: the best single schedule over every tuning episode.
  read_best='import json, sys; print(json.load(open(sys.argv[1]))["tuning"]["best_single"])'
  best_single=$(python -c "$read_best" "${LOOKUP#lookup:}")
  common=(--preset lm-grow124-cpu --budget_scales $FINAL_SCALES --envs 2 --progress false
          --reference "$LOOKUP")
  case "$stage" in
    final-budgets)  # unseen budgets on the training host and text
      args=(--seeds "$episodes" --rng_seed 32676 --data_dir "$TEXT"
            --controllers "$LOOKUP" "${TIMING[@]}" "$best_single" heuristic
                          stack:4@random:identity static)
      all_group
      if [ "${#ALL[@]}" -eq 3 ]; then
        args+=("${ALL[@]}" --arm_groups "$group" "all=$(IFS=,; echo "${ALL[*]}")"
               --group_pairs all=timing)
      else
        args+=(--arm_groups "$group")
      fi ;;
    final-oracle)  # the per-budget oracle: a 0.2 grid and never, on the first 16 of those
      schedules=()
      for first in 2 4 6 8; do
        for second in $(seq "$first" 2 8) 10; do
          [ "$second" = 10 ] && schedules+=("stack:4@0.$first,1:identity") \
            || schedules+=("stack:4@0.$first,0.$second:identity")
        done
      done
      args=(--seeds "$episodes" --rng_seed 32676 --data_dir "$TEXT" --arm_groups "$group"
            --controllers "$LOOKUP" "${TIMING[@]}" "${schedules[@]}" static) ;;
    final-text)  # the unseen text, neither retrained nor retuned
      [ -f "$STDLIB" ] || python -m esper_lightning.data.stdlib_text "$STDLIB"
      echo "$STDLIB_SHA256  $STDLIB" | sha256sum --check --quiet || {
        echo "$STDLIB is not the pre-registered text (sha256 $STDLIB_SHA256)" >&2; exit 2; }
      args=(--seeds "$episodes" --rng_seed 31160 --data_dir "$STDLIB" --arm_groups "$group"
            --controllers "$LOOKUP" "${TIMING[@]}" "$best_single" static) ;;
    final-host)  # the unseen host (width 64), neither retrained nor retuned
      args=(--seeds "$episodes" --rng_seed 32004 --data_dir "$TEXT" --host_preset grow124-w64
            --budget_flops "$W64_BASE" --transfer_policies true --arm_groups "$group"
            --controllers "$LOOKUP" "${TIMING[@]}" "$best_single" static) ;;
  esac
  OMP_NUM_THREADS=1 esper-lightning compare "${common[@]}" "${args[@]}" --out "$out"
}

case "${1:-}" in
  tune-lookup)
    # LANES comparisons at once (default 2, one thread each), one per budget, smallest first;
    # SCALES picks the budgets (default all), e.g. to start a lane beside one still running.
    for scale in ${SCALES:-$TUNING_SCALES}; do
      OMP_NUM_THREADS=1 esper-lightning compare --preset lm-grow124-cpu \
        --budget_scales "$scale" --controllers $(grid) --seeds 2 --envs 2 \
        --rng_seed "$TUNING_ROOT" --data_dir "$TEXT" --progress false \
        --out "$RESULTS/tune-lookup-$scale" &
      while [ "$(jobs -rp | wc -l)" -ge "${LANES:-2}" ]; do sleep 10; done
    done
    wait
    ;;
  lookup)
    esper-lightning lookup "$RESULTS"/tune-lookup-* --out "$RESULTS/lookup-grow124.json"
    ;;
  train)
    seed=${2:?the PPO training seed (1, 2, 3)}
    checkpoint=$CHECKPOINTS/grow124-timing-s$seed.pt
    mkdir -p "$CHECKPOINTS"
    resume=()
    [ -f "$checkpoint" ] && resume=(--resume "$checkpoint")
    esper-lightning ppo --preset lm-grow124-cpu --blueprints '[block_identity]' \
      --rng_seed "$seed" --data_dir "$TEXT" --strategy ddp --devices 2 \
      --save "$checkpoint" --logdir "$CHECKPOINTS/logs" "${resume[@]}"
    ;;
  ship)
    seed=${2:?the PPO training seed}
    esper-lightning ship "$CHECKPOINTS/grow124-timing-s$seed.pt" \
      --out "policies/grow124-timing-s$seed.pt"
    ;;
  train-all)
    # The curriculum for the full action space: every blueprint the growth slots accept, the
    # policy started from the shipped timing policy of the same seed (its cost and command
    # carried; the file every checkout has, where the training checkpoint may be gone),
    # the blueprints new to it at PRIOR together (default 0.1; PRIOR=none: no action prior,
    # the control, saved as grow124-all-none-sSEED).
    seed=${2:?the PPO training seed (1, 2, 3)}
    prior=${PRIOR:-0.1}
    name=grow124-all-s$seed
    start=(--init_policy "policies/grow124-timing-s$seed.pt")
    if [ "$prior" = none ]; then
      name=grow124-all-none-s$seed
    else
      start+=(--new_blueprint_share "$prior")
    fi
    mkdir -p "$CHECKPOINTS"
    [ -f "$CHECKPOINTS/$name.pt" ] && start=(--resume "$CHECKPOINTS/$name.pt")
    esper-lightning ppo --preset lm-grow124-cpu --rng_seed "$seed" --data_dir "$TEXT" \
      --strategy ddp --devices 2 --save "$CHECKPOINTS/$name.pt" --logdir "$CHECKPOINTS/logs" \
      "${start[@]}"
    ;;
  ship-all)
    seed=${2:?the PPO training seed}
    name=grow124-all-s$seed
    [ "${PRIOR:-0.1}" = none ] && name=grow124-all-none-s$seed
    esper-lightning ship "$CHECKPOINTS/$name.pt" --out "policies/$name.pt"
    ;;
  decide-all)
    # Which curriculum trains seeds 2 and 3 (issue item 6, decided before either plays): the
    # seed-1 curriculum with the action prior (0.1) and without, beside the timing policy both
    # started from, on 20 tuning episodes at the training budgets (4 each); the one with the
    # lower mean validation loss at the budget (final_bits) continues, whatever the intervals.
    OMP_NUM_THREADS=1 esper-lightning compare --preset lm-grow124-cpu \
      --budget_scales $TUNING_SCALES --seeds "$DECIDE_EPISODES" --envs 2 \
      --rng_seed "$DECIDE_ROOT" --data_dir "$TEXT" --progress false --reference "${TIMING[0]}" \
      --controllers "${TIMING[0]}" "${CURRICULA[@]}" --out "$RESULTS/decide-all"
    ;;
  dev-sampled)
    # A development check after the final tables, deciding nothing they decided: the three
    # timing policies played by argmax (as the tables play them) and sampled (as PPO trained
    # them; seeded by the episode), beside the lookup, on 20 tuning episodes at the training
    # budgets. Read on the validation loss at the budget (final_bits); a sampled arm that
    # earns a final table gets one of its own, pre-registered on a fresh root.
    sampled=("${TIMING[@]/#policy:/sampled:}")
    OMP_NUM_THREADS=1 esper-lightning compare --preset lm-grow124-cpu \
      --budget_scales $TUNING_SCALES --seeds "$DECIDE_EPISODES" --envs 2 \
      --rng_seed "$DEV_ROOT" --data_dir "$TEXT" --progress false --reference "$LOOKUP" \
      --controllers "$LOOKUP" "${TIMING[@]}" "${sampled[@]}" \
      --arm_groups "timing=$(IFS=,; echo "${TIMING[*]}")" "sampled=$(IFS=,; echo "${sampled[*]}")" \
      --group_pairs sampled=timing --out "$RESULTS/dev-sampled"
    ;;
  chosen-all)
    # decide-all's choice, as the plan fixed it: the curriculum whose seed-1 policy had the
    # lower mean validation loss at the budget over decide-all's episodes, whatever the
    # intervals. Prints its PRIOR for train-all 2 and 3: PRIOR=$(bash $0 chosen-all).
    summary=$RESULTS/decide-all/summary.json
    [ -f "$summary" ] || { echo "no $summary: run decide-all first" >&2; exit 2; }
    python - "$summary" "$DECIDE_EPISODES" "${CURRICULA[@]}" <<'PY'
import json, sys
summary, episodes, with_prior, without = sys.argv[1:]
rows = {r["controller"]: r for r in json.load(open(summary))["controllers"]}
arms = {"0.1": with_prior, "none": without}
played = {prior: rows.get(arm, {}).get("n_episodes", 0) for prior, arm in arms.items()}
if any(n != int(episodes) for n in played.values()):
    sys.exit(f"decide-all has not played both curricula on its {episodes} episodes: {played}")
bits = {prior: rows[arm]["final_bits_mean"] for prior, arm in arms.items()}
print(f"mean validation bits: prior 0.1 {bits['0.1']:.4f}, none {bits['none']:.4f}",
      file=sys.stderr)
print(min(bits, key=bits.get))
PY
    ;;
  final-budgets|final-oracle|final-text|final-host)
    play_final "$1" "${FINAL_EPISODES[$1]}" "$RESULTS/$1"
    ;;
  reproduce)
    # A final stage's pre-registered command rerun from the shipped policies and lookup on its
    # first N episodes (an episode's seed and budget depend on its index alone, so they are
    # the stage's own), into runs/reproduce/STAGE, then compared with the committed rows bit
    # for bit (controller_targets.py --replay: exit 1 where any differs).
    stage=${2:-} n=${3:-}
    [[ -n "$stage" && -v "FINAL_EPISODES[$stage]" ]] || {
      echo "reproduce: unknown stage '$stage'; accepted:" \
           $(printf '%s\n' "${!FINAL_EPISODES[@]}" | sort) >&2; exit 2; }
    [[ "$n" =~ ^[1-9][0-9]*$ ]] && (( n <= FINAL_EPISODES[$stage] )) || {
      echo "reproduce: N must be a number of $stage's episodes, 1 to" \
           "${FINAL_EPISODES[$stage]}, got '$n'" >&2; exit 2; }
    [ -f "$RESULTS/$stage/episodes.csv" ] || {
      echo "no $RESULTS/$stage/episodes.csv: nothing committed to reproduce" >&2; exit 2; }
    # A fresh folder: compare resumes what it finds, and a reproduction must play every row.
    rm -rf "runs/reproduce/$stage"
    # In a subshell with -e of its own (a function called under || would run without it).
    set +e
    (set -e; play_final "$stage" "$n" "runs/reproduce/$stage")
    played=$?
    set -e
    (( played == 0 )) || {
      echo "reproduce: the rerun of $stage failed (above); nothing compared" >&2; exit 2; }
    python "$(dirname "$0")/controller_targets.py" "$RESULTS" --replay "runs/reproduce/$stage" \
      --episodes "$n"
    ;;
  status)
    expected=$(( $(grid | wc -w) * 2 ))  # every schedule on 2 tuning episodes
    for scale in $TUNING_SCALES; do
      rows=$RESULTS/tune-lookup-$scale/episodes.csv
      done_=0
      [ -f "$rows" ] && done_=$(( $(wc -l < "$rows") - 1 ))
      echo "tune-lookup $scale x: $done_ of $expected episodes"
    done
    for stage in decide-all final-budgets final-oracle final-text final-host dev-sampled; do
      rows=$RESULTS/$stage/episodes.csv
      [ -f "$rows" ] && echo "$stage: $(( $(wc -l < "$rows") - 1 )) episode rows"
    done
    for file in "$RESULTS/lookup-grow124.json" \
                {"$CHECKPOINTS",policies}/grow124-timing-s{1,2,3}.pt \
                {"$CHECKPOINTS",policies}/grow124-{all,all-none}-s{1,2,3}.pt; do
      [ -f "$file" ] && echo "present: $file" || echo "missing: $file"
    done
    ;;
  *)
    sed -n '2,22p' "$0"
    exit 2
    ;;
esac
