#!/usr/bin/env bash
# Every frontier table and figure of docs/results.md and docs/evidence.md, and each study's
# report.md, regenerated from the committed rows (results/frontier/*/rows.csv) alone:
#
#     bash scripts/frontier_docs.sh        # about 3 minutes on one core; no training
#
# The final tables (width 32: two folders of the same episodes joined; width 64), the widths
# side by side, the frontier across widths (each size's rate read against its tuning grid) and
# the literature's measures beside the frontier's, the final with curves and sizes of both
# widths (its literature table in its own section), the widening arms' final at width 64 (its
# literature and along-the-run tables in their own sections) and its follow-up joined to it,
# then the tuning studies of the evidence appendix. Each command writes its study's marked
# sections (<!-- frontier:NAME:begin/end -->) and copies its figures to docs/images/.
set -euo pipefail
cd "$(dirname "$0")/.."
F=results/frontier
run() { echo "+ esper-lightning frontier $*" >&2; esper-lightning frontier "$@" > /dev/null; }
run report $F/w32-final-growth --with $F/w32-final-sizes --docs docs/results.md
run report $F/w64-final --docs docs/results.md
run widths $F/w32-final-growth+$F/w32-final-sizes $F/w64-final \
    --tuning $F/w32-tuning --tuning $F/w64-tuning --docs docs/results.md
run report $F/w32-growth-final --docs docs/results.md
run report $F/w64-width-final --docs docs/results.md
run report $F/w64-width-final-8x --with $F/w64-width-final --docs docs/results.md
run report $F/w32-tuning --docs docs/evidence.md
run report $F/w64-tuning --docs docs/evidence.md
run report $F/w128-tuning --docs docs/evidence.md
run report $F/w64-depth-width-tuning --with $F/w64-tuning
run report $F/w32-late-tuning --with $F/w32-tuning
run report $F/w64-clone-tuning --with $F/w64-tuning
run report $F/w64-8x-tuning --with $F/w64-tuning
run report $F/w64-s6-tuning --with $F/w64-tuning --with $F/w64-8x-tuning
run report $F/w64-s5-tuning --with $F/w64-tuning --with $F/w64-8x-tuning --with $F/w64-s6-tuning
run report $F/w64-wide-tuning --with $F/w64-tuning --with $F/w64-8x-tuning \
    --with $F/w64-s5-tuning --with $F/w64-s6-tuning
run report $F/w64-w16-tuning --with $F/w64-tuning --with $F/w64-depth-width-tuning
run report $F/w64-multi-tuning --with $F/w64-tuning --with $F/w64-depth-width-tuning
run report $F/w64-tau-tuning
