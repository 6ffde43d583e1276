"""Fused counterfactual evaluation against K separate forward passes, side by side.

    python benchmarks/bench_counterfactual.py --threads 1 --seeds 1 2 3 --batch-sizes 128 500

The baseline `CifarCNNHost` carries blending seeds in ``seeds`` slots, so a counterfactual
evaluation needs K configurations (main, each slot off, and all off when more than one seed is
measured). ``fused`` runs one forward whose batch fans out K times at the first measured slot
(per-sample alphas); ``separate`` runs K forwards of the unchanged batch with scalar alphas.
Both are timed end to end as the callback runs them (`CounterfactualAccumulator.update`), after
checking that they give the same logits, accuracies and contributions. Prints one Markdown row
per case: medians and the ratio fused / separate (below 1: fused is faster). The default mode
per device type (`core.counterfactual.DEFAULT_MODES`) is chosen from these numbers.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import lightning as L
import torch

from esper_lightning.core.counterfactual import (
    CounterfactualAccumulator,
    fused_forward,
    make_plan,
    separate_forward,
)
from esper_lightning.hosts import CifarCNNHost

SLOTS = ("r0c0", "r0c1", "r0c2")


def grown_host(n_seeds: int, device: torch.device) -> CifarCNNHost:
    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=SLOTS[:n_seeds])
    for slot in host.slots.values():
        slot.germinate("conv_light", tempo=3)
        slot.advance()
        slot.state.metrics.epochs_in_stage = 10
        slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
        slot.advance()
        slot.tick()
    return host.eval().to(device)


def median_seconds(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check_equal(host: CifarCNNHost, x: torch.Tensor, y: torch.Tensor) -> None:
    plan = make_plan(host.slots)
    with torch.no_grad():
        fused = fused_forward(host, x, host.slots, plan)
        separate = separate_forward(host, x, host.slots, plan)
    torch.testing.assert_close(fused, separate, rtol=1e-4, atol=1e-4)
    results = []
    for mode in ("fused", "separate"):
        acc = CounterfactualAccumulator(plan, mode)
        acc.update(host, x, y, host.slots)
        results.append((acc.accuracies(), acc.contributions()))
    assert results[0] == results[1], results


def measure(n_seeds: int, batch: int, repeats: int, device: torch.device) -> dict[str, float]:
    host = grown_host(n_seeds, device)
    plan = make_plan(host.slots)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, 32, 32, generator=generator).to(device)
    y = torch.randint(0, 10, (batch,), generator=generator).to(device)
    check_equal(host, x, y)
    runs: dict[str, list[float]] = {"fused": [], "separate": []}
    for _ in range(3):  # interleave the two so machine noise hits both
        for mode in runs:
            def evaluate(mode: str = mode) -> None:
                CounterfactualAccumulator(plan, mode).update(host, x, y, host.slots)
            runs[mode].append(median_seconds(evaluate, repeats, device))
    result = {mode: statistics.median(values) for mode, values in runs.items()}
    result["k"] = plan.size
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[2], choices=(1, 2, 3))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[500])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        platform.processor() or platform.machine())
    print(f"machine: {name}, {os.cpu_count()} CPUs, torch {torch.__version__}, lightning "
          f"{L.__version__}, threads {torch.get_num_threads()}, load {load:.2f}")
    print("| seeds | K | batch | fused (ms) | separate (ms) | fused / separate |")
    print("|---|---|---|---|---|---|")
    for n_seeds in args.seeds:
        for batch in args.batch_sizes:
            r = measure(n_seeds, batch, args.repeats, device)
            print(f"| {n_seeds} | {r['k']} | {batch} | {1000 * r['fused']:.1f} | "
                  f"{1000 * r['separate']:.1f} | {r['fused'] / r['separate']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
