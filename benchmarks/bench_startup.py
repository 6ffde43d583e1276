"""How long ``esper-lightning`` takes to start: its imports against ``import torch``, and how
soon a bad path on the command line comes back as an error, measured side by side.

    python benchmarks/bench_startup.py                # this checkout, 5 repeats
    python benchmarks/bench_startup.py --repeats 3 --root /tmp/old-checkout

Every measurement is a fresh interpreter (``python -c`` or ``python -m``), run in interleaved
repeats so machine noise hits every command alike; the medians are printed. Two ratios:

* imports: ``import esper_lightning.app.ppo.trainer`` (what ``esper-lightning ppo`` imports to
  run) over ``import torch`` (target: <= 1.5). The row ``import lightning`` is the floor under
  it: the hosts are LightningModules and the envs run under Fabric, and any ``lightning.*``
  import runs ``lightning/__init__``, which imports the Trainer package, torchmetrics (with
  scipy, matplotlib and, when installed, transformers) and ``torch._dynamo``;
* error latency: the seconds a command with a bad data path, text file or checkpoint (or a
  ``--save`` that would replace an earlier run's checkpoint) takes to print its one-line error
  (target: <= 2 s), and that time over ``import torch``.

Each error command must exit with status 2 and one line on stderr, or the script stops: a
latency of the wrong outcome would mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Import-time commands: name -> the ``python -c`` code.
IMPORTS = {
    "import torch": "import torch",
    "ppo imports": "import esper_lightning.app.ppo.trainer",
    "import lightning": "import lightning",
}


def error_commands(missing: Path, earlier: Path, short: Path) -> dict[str, list[str]]:
    """Name -> ``esper-lightning`` arguments that must fail on a path under ``missing`` (a
    folder that does not exist), on ``earlier``, an earlier run's checkpoint that a new run
    would replace, or on ``short``, a text too short for one block in each split."""
    return {
        "ppo --data-dir (cifar)": ["ppo", "--data-dir", str(missing / "cifar")],
        "ppo lm-smoke --data-dir": ["ppo", "--preset", "lm-smoke",
                                    "--data-dir", str(missing / "missing.txt")],
        "ppo lm-smoke --data-dir SHORT": ["ppo", "--preset", "lm-smoke",
                                          "--data-dir", str(short)],
        "ppo --resume": ["ppo", "--resume", str(missing / "missing.pt")],
        "ppo --save EXISTING": ["ppo", "--data-dir", str(missing / "cifar"), "--download",
                                "--save", str(earlier)],
        "compare --data_dir": ["compare", "--controllers", "static", "heuristic",
                               "--data_dir", str(missing / "nope")],
    }


def timed(argv: list[str], root: Path, expect_error: bool) -> float:
    """Seconds ``argv`` takes in a fresh process run from ``root`` (whose package it imports)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=root, env=env, timeout=600)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if expect_error and (done.returncode != 2 or len(lines) != 1):
        sys.exit(f"{argv[3:]} gave status {done.returncode} and {len(lines)} lines on stderr; "
                 f"expected 2 and one line:\n{done.stderr}")
    if not expect_error and done.returncode != 0:
        sys.exit(f"{argv} failed:\n{done.stderr}")
    return seconds


def machine() -> str:
    """The CPU model (from /proc/cpuinfo where there is one) and the cores Python sees."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def measure(root: Path, repeats: int) -> dict[str, list[float]]:
    """Every command's times over ``repeats`` interleaved rounds (one of each per round)."""
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        earlier = Path(tmp) / "ckpt.pt"
        earlier.write_bytes(b"an earlier run's checkpoint")
        short = Path(tmp) / "short.txt"
        short.write_text("A text shorter than one block.\n")
        errors = error_commands(Path(tmp) / "absent", earlier, short)
        for _ in range(repeats):
            for name, code in IMPORTS.items():
                times.setdefault(name, []).append(
                    timed([sys.executable, "-c", code], root, expect_error=False))
            for name, args in errors.items():
                times.setdefault(name, []).append(timed(
                    [sys.executable, "-m", "esper_lightning.app.cli", *args], root,
                    expect_error=True))
    return times


def report(times: dict[str, list[float]]) -> str:
    """A Markdown table: each command's median seconds and its ratio to ``import torch``."""
    torch_s = statistics.median(times["import torch"])
    rows = ["| command | median s | min s | / import torch |", "|---|---:|---:|---:|"]
    for name, values in times.items():
        median = statistics.median(values)
        rows.append(f"| {name} | {median:.2f} | {min(values):.2f} | {median / torch_s:.2f}x |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout to measure (default: this one)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    root = args.root.resolve()
    if not (root / "esper_lightning" / "app" / "cli.py").is_file():
        parser.error(f"--root {str(root)!r} holds no esper_lightning/app/cli.py; accepted: a "
                     "checkout of this repository")
    print(f"{machine()}; Python {platform.python_version()}; {args.repeats} repeats; {root}")
    times = measure(root, args.repeats)
    print(report(times))
    ratio = statistics.median(times["ppo imports"]) / statistics.median(times["import torch"])
    slowest = max(statistics.median(v) for k, v in times.items() if k not in IMPORTS)
    print(f"import ratio {ratio:.2f} (target <= 1.5); slowest bad-path error {slowest:.2f} s "
          f"(target <= 2)")


if __name__ == "__main__":
    main()
