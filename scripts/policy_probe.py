"""Why a timing policy grows when it does: the probability its op head gives GERMINATE at
every decision of episodes it plays by argmax (as the final tables play it).

A policy played by argmax germinates only where GERMINATE is the most probable op; sampled,
as in its PPO training, it germinates with that probability. Until the first germination both
plays see the same host, observations and LSTM state (the host's training does not depend on
the controller's draws), so along an argmax episode that never grows, the chance that sampled
play would have grown at least once is exactly ``1 - prod(1 - p_germinate)``; where argmax
grows, the same product over the decisions before its first germination is the chance that
sampled play waits that long. Decides nothing (a diagnostic of the final tables' policies, on
episodes of its own root)::

    python scripts/policy_probe.py policies/grow124-timing-s{1,2,3}.pt \\
        --budget_scales 0.35 0.7 1.4 2.8 --episodes 4 --rng_seed 34103 \\
        --data_dir ../shared/data/shakespeare/shakespeare.txt \\
        --csv results/controller/probe-timing/decisions.csv \\
        > results/controller/probe-timing/table.md

writes one row per decision (policy, episode, budget, decision, share of the budget spent,
P(wait), P(germinate), the op played and its probability, the probability that a germination
there would be of a growth blueprint, and the blueprint argmax germinated) and prints per
policy and budget the largest P(germinate) before argmax's first germination (of any
blueprint), the chance that sampled play germinates before it, the largest P(germinate) after
it where argmax waited, the mean P(a growth blueprint | germinate) over the decisions (1 for
a timing policy, whose only blueprint grows) and the growth blueprints' share of argmax's
germinations;
``python scripts/policy_probe.py --table results/controller/probe-timing/decisions.csv
--plot docs/images/probe-timing.png`` prints that table again from the rows and draws
P(germinate) at every decision.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from esper_lightning.app.cli import parse_config
from esper_lightning.app.compare.arms import EpisodePlan
from esper_lightning.app.compare.plots import save_figure
from esper_lightning.app.compare.runner import evaluation_rng_seed, play_episodes
from esper_lightning.app.config import CompareConfig
from esper_lightning.app.task import env_spec, load_splits, make_task
from esper_lightning.blueprints.growth import operator_of
from esper_lightning.controllers import PolicyController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.report import EpochReport
from esper_lightning.envs import EnvPool
from esper_lightning.errors import ConfigError
from esper_lightning.rl.distributions import MaskedCategorical

FIELDS = ("policy", "episode", "rng_seed", "budget_scale", "decision", "budget_spent",
          "p_wait", "p_germinate", "op", "p_op", "p_growth", "blueprint")


class ProbedPolicy(PolicyController):
    """A `PolicyController` (argmax) that records its op head's probabilities before each
    decision."""

    def __init__(self, path: str) -> None:
        super().__init__(path, deterministic=True)
        #: Per decision: P(wait), P(germinate), the op played, its probability, budget spent,
        #: P(a growth blueprint | germinate), the blueprint germinated ("" for another op).
        self.probes: list[tuple[float, float, str, float, float, float, str]] = []
        self.scale = math.nan  # the episode's budget over the base, read off its reports
        #: Which indices of the policy's blueprint head a growth operator makes.
        self._growth = torch.tensor([name is not None and operator_of(name) is not None
                                     for name in self.policy.config.blueprints])

    def decide(self, report: EpochReport) -> Action:
        probs, blueprint_probs = self._probabilities(report)
        action = super().decide(report)
        self.scale = report.budget_scale
        spent = report.budget_fraction
        self.probes.append((float(probs[LifecycleOp.WAIT]), float(probs[LifecycleOp.GERMINATE]),
                            action.op.name, float(probs[action.op]),
                            math.nan if spent is None else spent,
                            float(blueprint_probs[self._growth].sum()),
                            action.blueprint if action.op == LifecycleOp.GERMINATE else ""))
        return action

    @torch.no_grad()
    def _probabilities(self, report: EpochReport) -> tuple[torch.Tensor, torch.Tensor]:
        """What `PolicyController.decide` computes, up to the op head's distribution and the
        blueprint head's where the op is GERMINATE; the LSTM state is read, not advanced
        (decide advances it)."""
        obs, blueprints, masks = self.inputs(report)
        starts = torch.tensor([[self._episode_start]])
        core, _ = self.policy._core(self.policy._embed(obs, blueprints)[:, None], self.hidden,
                                    starts)
        logits = self.policy._logits(core[:, 0])
        op = MaskedCategorical(logits["op"], masks.op)
        germinate = torch.tensor([int(LifecycleOp.GERMINATE)])
        blueprint = MaskedCategorical(logits["blueprint"], masks.head("blueprint", germinate))
        return op.log_probs_all.exp()[0], blueprint.log_probs_all.exp()[0]  # 0 where masked


def episodes_config(args: argparse.Namespace, compare_flags: Sequence[str]) -> CompareConfig:
    """The episodes' configuration, built and checked as ``esper-lightning compare`` builds it
    (the policies as its arms; nothing is written)."""
    with tempfile.TemporaryDirectory() as out:
        return parse_config("compare", [
            "--preset", args.preset, "--budget_scales", *map(str, args.budget_scales),
            "--seeds", str(args.episodes), "--rng_seed", str(args.rng_seed), "--envs", "1",
            "--data_dir", args.data_dir, "--progress", "false", "--out", out,
            "--reference", f"policy:{args.policies[0]}",
            "--controllers", *(f"policy:{p}" for p in args.policies), *compare_flags])


def make_pool(config: CompareConfig) -> EnvPool:
    """One env on the data and test split `compare` would play the episodes on."""
    train, val = load_splits(config, False)
    test = make_task(config).load_test(config.data_dir, rng_seed=config.rng_seed)
    return EnvPool(env_spec(config), train, val, config.devices_for(1), test)


def probe(argv: Sequence[str]) -> list[dict[str, object]]:
    args, compare_flags = build_parser().parse_known_args(argv)
    config = episodes_config(args, compare_flags)
    pool = make_pool(config)
    rows: list[dict[str, object]] = []
    for path in args.policies:
        for index in range(args.episodes):
            rng_seed = evaluation_rng_seed(args.rng_seed, index)
            controller = ProbedPolicy(path)
            play_episodes(pool, [EpisodePlan(path, index, rng_seed)], [controller], config)
            scale = controller.scale
            for decision, probe_row in enumerate(controller.probes):
                p_wait, p_germinate, op, p_op, spent, p_growth, blueprint = probe_row
                rows.append({"policy": path, "episode": index, "rng_seed": rng_seed,
                             "budget_scale": scale, "decision": decision,
                             "budget_spent": spent, "p_wait": p_wait,
                             "p_germinate": p_germinate, "op": op, "p_op": p_op,
                             "p_growth": p_growth, "blueprint": blueprint})
            grew = sum(probe_row[2] == "GERMINATE" for probe_row in controller.probes)
            print(f"{path} episode {index}: budget {scale}x, {grew} germination(s) by argmax",
                  file=sys.stderr)
    return rows


def first_growth(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Per policy and budget: the decisions before each episode's first argmax germination
    (all of them where it never grows), the largest P(germinate) there and the mean chance
    that sampled play germinates somewhere in them."""
    episodes: dict[tuple, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        # Read off a CSV every value is text: the keys as numbers, so budgets sort as such.
        episodes[(row["policy"], float(row["budget_scale"]), int(row["episode"]))].append(row)
    table: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (policy, scale, _), decisions in episodes.items():
        ordered = sorted(decisions, key=lambda r: int(r["decision"]))
        ops = [row["op"] for row in ordered]
        first = ops.index("GERMINATE") if "GERMINATE" in ops else len(ops)
        before = [float(row["p_germinate"]) for row in ordered[:first]]
        cell = table[(policy, scale)]
        cell["grew"].append(float(first < len(ops)))
        if before:  # else it grew at the first decision
            cell["max"].append(max(before))
        # After it: the chance of growing again (argmax grows again only above the rest).
        cell["after"].extend(float(row["p_germinate"]) for row in ordered[first + 1:]
                             if row["op"] != "GERMINATE")
        cell["sampled"].append(1 - math.prod(1 - p for p in before))
        # What it would germinate (rows of probes older than these columns have none).
        cell["p_growth"].extend(float(r["p_growth"]) for r in ordered
                                if r.get("p_growth") not in (None, ""))  # 0.0 counts
        cell["growth"].extend(float(operator_of(str(r["blueprint"])) is not None)
                              for r in ordered if r["op"] == "GERMINATE" and r.get("blueprint"))
    return [{"policy": policy, "budget_scale": scale, "episodes": len(cell["grew"]),
             "argmax_grew": sum(cell["grew"]) / len(cell["grew"]),
             "max_p_germinate": max(cell["max"], default=None),
             "max_p_germinate_after": max(cell["after"], default=None),
             "sampled_grows_first": sum(cell["sampled"]) / len(cell["sampled"]),
             "mean_p_growth": _mean(cell["p_growth"]),
             "argmax_growth_share": _mean(cell["growth"])}
            for (policy, scale), cell in sorted(table.items())]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Other flags go to the episodes' compare configuration (e.g. --budget_steps 60).")
    parser.add_argument("policies", nargs="+", help="shipped policies or PPO checkpoints")
    parser.add_argument("--preset", default="lm-grow124-cpu")
    parser.add_argument("--budget_scales", nargs="+", type=float, required=True)
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--rng_seed", type=int, required=True,
                        help="the episodes' root random-number seed")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--csv", type=Path, help="write every decision's row here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Probe and print the table, or (``--table CSV``) print it from a probe's rows."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--table"]:
        plot = argv[3] if len(argv) == 4 and argv[2] == "--plot" else None
        if len(argv) not in (2, 4) or not Path(argv[1]).is_file() or (
                len(argv) == 4 and (plot is None or not plot.endswith(".png"))):
            print(f"policy_probe.py: --table takes one probe CSV and optionally --plot PNG, "
                  f"got {argv[1:]}", file=sys.stderr)
            return 2
        with open(argv[1], newline="") as handle:
            rows = list(csv.DictReader(handle))
        print_table(rows)
        if plot is not None:
            save_figure(probability_figure(rows), plot)
        return 0
    try:
        rows = probe(argv)
    except ConfigError as err:
        print(f"policy_probe.py: {err}", file=sys.stderr)
        return 2
    args, _ = build_parser().parse_known_args(argv)
    if args.csv is not None:
        with args.csv.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    print_table(rows)
    return 0


def probability_figure(rows: Sequence[dict[str, object]]) -> Figure:
    """P(germinate) against the share of the budget spent, a panel per budget and a line per
    policy and episode; a dot where argmax germinated."""
    scales = sorted({float(r["budget_scale"]) for r in rows})
    policies = sorted({str(r["policy"]) for r in rows})
    fig = Figure(figsize=(3.2 * len(scales), 3.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(scales), sharey=True, squeeze=False)[0]
    for ax, scale in zip(axes, scales, strict=True):
        for colour, policy in enumerate(policies):
            mine = [r for r in rows if r["policy"] == policy and float(r["budget_scale"]) == scale]
            for episode in sorted({int(r["episode"]) for r in mine}):
                line = sorted((r for r in mine if int(r["episode"]) == episode),
                              key=lambda r: int(r["decision"]))
                x = [float(r["budget_spent"]) for r in line]
                y = [float(r["p_germinate"]) for r in line]
                first = episode == min(int(r["episode"]) for r in mine)  # labelled once
                ax.plot(x, y, color=f"C{colour}", label=Path(policy).stem if first else None)
                grew = [(a, b) for a, b, r in zip(x, y, line, strict=True)
                        if r["op"] == "GERMINATE"]
                if grew:
                    ax.plot(*zip(*grew, strict=True), "o", color=f"C{colour}")
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"budget {scale:g}x base")
        ax.set_xlabel("share of the budget spent")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("P(germinate) before the decision")
    axes[0].legend(fontsize="small", title="dot: argmax germinated", title_fontsize="small")
    return fig


def print_table(rows: Sequence[dict[str, object]]) -> None:
    print("| policy | budget (x base) | episodes | argmax grew | max P(germinate) before the "
          "first argmax growth | P(sampled play germinates before it) | max P(germinate) after "
          "it, where argmax waited | mean P(a growth blueprint \\| germinate) | growth share "
          "of argmax germinations |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")

    def shown(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    for cell in first_growth(rows):
        print(f"| {cell['policy']} | {cell['budget_scale']} | {cell['episodes']} | "
              f"{cell['argmax_grew']:.2f} | {shown(cell['max_p_germinate'])} | "
              f"{cell['sampled_grows_first']:.3f} | {shown(cell['max_p_germinate_after'])} | "
              f"{shown(cell['mean_p_growth'])} | {shown(cell['argmax_growth_share'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
