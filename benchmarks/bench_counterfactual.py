"""Fused counterfactual evaluation against K separate forward passes, side by side.

    python benchmarks/bench_counterfactual.py --threads 1

The baseline `CifarCNNHost` carries blending seeds in ``--seeds`` slots, so a counterfactual
evaluation needs K = seeds + 2 configurations (main, each slot off, all off). ``fused`` runs one
forward of the batch repeated K times with per-sample alphas (`fused_forward`); ``separate``
runs K forwards, one per configuration, with the same per-configuration alphas. Both produce the
same logits (checked). Prints medians and the ratio fused / separate (target <= 0.6).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from contextlib import ExitStack

import lightning as L
import torch

from esper_lightning.core.counterfactual import CounterfactualPlan, fused_forward, make_plan
from esper_lightning.hosts import CifarCNNHost

SLOTS = ("r0c0", "r0c1", "r0c2")


def grown_host(n_seeds: int) -> CifarCNNHost:
    torch.manual_seed(0)
    host = CifarCNNHost("baseline", slots=SLOTS[:n_seeds])
    for slot in host.slots.values():
        slot.germinate("conv_light", tempo=3)
        slot.advance()
        slot.state.metrics.epochs_in_stage = 10
        slot.state.metrics.gradient_health, slot.state.metrics.has_exploding = 1.0, False
        slot.advance()
        slot.tick()
    return host.eval()


@torch.no_grad()
def separate(host: CifarCNNHost, x: torch.Tensor, plan: CounterfactualPlan) -> torch.Tensor:
    outputs = []
    for k in range(plan.size):
        with ExitStack() as stack:
            for sid, alphas in plan.alphas.items():
                per_sample = alphas[k].expand(x.shape[0])
                stack.enter_context(host.slots[sid].alpha_override(per_sample))
            outputs.append(host(x))
    return torch.stack(outputs)


def median_seconds(fn, repeats: int) -> tuple[float, float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, choices=(1, 2, 3))
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    host = grown_host(args.seeds)
    plan = make_plan(host.slots)
    x = torch.randn(args.batch_size, 3, 32, 32)
    with torch.no_grad():
        fused_out = fused_forward(host, x, host.slots, plan)
    torch.testing.assert_close(fused_out, separate(host, x, plan), rtol=1e-4, atol=1e-4)
    timings: dict[str, list[tuple[float, float, float]]] = {"fused": [], "separate": []}
    for _ in range(3):  # interleave the two so machine noise hits both
        with torch.no_grad():
            timings["fused"].append(median_seconds(
                lambda: fused_forward(host, x, host.slots, plan), args.repeats))
        timings["separate"].append(median_seconds(lambda: separate(host, x, plan), args.repeats))
    median = {k: statistics.median(t[0] for t in v) for k, v in timings.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, lightning {L.__version__}, threads "
          f"{torch.get_num_threads()}, load {load:.2f}")
    print(f"host: baseline with {args.seeds} blending conv_light seed(s), K = {plan.size} "
          f"configurations ({', '.join(plan.configs)}), batch {args.batch_size}")
    for name in ("fused", "separate"):
        print(f"{name:>9}: median {1000 * median[name]:.1f} ms per evaluation")
    print(f"ratio fused / separate: {median['fused'] / median['separate']:.3f} (target <= 0.6)")


if __name__ == "__main__":
    main()
