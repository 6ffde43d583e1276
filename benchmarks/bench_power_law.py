"""What the frontier's power-law fit costs (`app.frontier.fit.PowerLaw.fit`), in this checkout
and in others, side by side.

    python benchmarks/bench_power_law.py                                 # this checkout
    python benchmarks/bench_power_law.py --root /tmp/before --repeats 5  # and another one

Every report fits each fixed size's episode-mean curve and, for the jackknife interval, each
curve with one episode left out, so a report of a final table runs hundreds of fits. The curves
here are the same in every checkout: ``--curves`` random decreasing power laws with noise (3 to
7 budgets over a 150× span; one in seven reversed, a rising curve the fit must refuse), drawn
from a fixed seed. Each checkout fits them all in a fresh interpreter of its own (its package
first on ``sys.path``), the checkouts interleaved over the repeats; the medians are printed,
with each other checkout's median over this one's, and the largest relative difference of any
fitted parameter against this checkout's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs in a fresh interpreter with a checkout first on ``sys.path``: fits every curve of
#: ``argv[1]`` (JSON) and prints the seconds it took and the fitted parameters (JSON).
FIT = """
import json, sys, time
import numpy as np
from esper_lightning.app.frontier.fit import Curve, PowerLaw
curves = [Curve(np.array(f), np.array(l)) for f, l in json.loads(sys.argv[1])]
began = time.perf_counter()
laws = [PowerLaw.fit(c) for c in curves]
seconds = time.perf_counter() - began
print(json.dumps([seconds, [[w.offset, w.scale, w.exponent] for w in laws]]))
"""


def curves(count: int, rng_seed: int = 0) -> list[tuple[list[float], list[float]]]:
    """``count`` noisy power-law curves, ``(flops, loss)``, the same for every checkout."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    drawn = []
    for index in range(count):
        points = int(rng.integers(3, 8))
        flops = np.sort(rng.choice(np.exp(np.linspace(0, 5, 40)), points, replace=False)) * 1e12
        loss = (1.5 + rng.uniform(0.1, 2) * (flops / flops[0]) ** -rng.uniform(0.05, 1.5)
                + rng.normal(0, 0.01, points))
        drawn.append((flops.tolist(), (loss[::-1] if index % 7 == 0 else loss).tolist()))
    return drawn


def fit_in(root: Path, data: str) -> tuple[float, list[list[float]]]:
    """Seconds and parameters of fitting ``data``'s curves with ``root``'s package."""
    code = f"import sys; sys.path.insert(0, {str(root)!r})\n" + FIT
    done = subprocess.run([sys.executable, "-c", code, data], capture_output=True, text=True,
                          check=True)
    seconds, laws = json.loads(done.stdout)
    return seconds, laws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", default=[], type=Path,
                        help="another checkout to time beside this one (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--curves", type=int, default=300)
    args = parser.parse_args()
    data = json.dumps(curves(args.curves))
    roots = [ROOT, *args.root]
    seconds: dict[Path, list[float]] = {root: [] for root in roots}
    laws: dict[Path, list[list[float]]] = {}
    for _ in range(args.repeats):
        for root in roots:
            taken, laws[root] = fit_in(root, data)
            seconds[root].append(taken)
    mine = statistics.median(seconds[ROOT])
    print(f"{args.curves} curves, {args.repeats} repeats; median seconds to fit them all")
    for root in roots:
        median = statistics.median(seconds[root])
        worst = max(abs(a - b) / max(abs(a), 1e-12) for ours, theirs in
                    zip(laws[ROOT], laws[root], strict=True) for a, b in zip(ours, theirs,
                                                                             strict=True))
        print(f"{root}: {median:.3f} s, {median / mine:.2f}x this checkout's; parameters "
              f"within {worst:.1e} relative of this checkout's")


if __name__ == "__main__":
    main()
