"""Print the first root rng seed whose first N evaluation episodes draw each budget equally often.

A pre-registered table fixes its root before its first episode; this reads budget draws only.

    python scripts/balanced_root.py --scales 0.35 0.7 1.4 2.8 --episodes 40 --start 30400
"""

from __future__ import annotations

import argparse

from esper_lightning.app.compare.runner import balanced_root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", required=True,
                        help="the budget scales of the comparison (its --budget_scales)")
    parser.add_argument("--episodes", type=int, required=True,
                        help="evaluation episodes (its --seeds), a multiple of the scales")
    parser.add_argument("--start", type=int, required=True, help="the first root to try")
    args = parser.parse_args()
    try:
        print(balanced_root(args.scales, args.episodes, args.start))
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
