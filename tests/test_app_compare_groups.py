"""Groups of arms (`CompareConfig.arm_groups`, `report.group_differences`): one method trained
several times (PPO training seeds) compared as one, episode by episode, with its spread."""

from __future__ import annotations

import re

import numpy as np
import pytest

from esper_lightning.app.compare.records import EpisodeRecord
from esper_lightning.app.compare.report import (
    group_differences,
    group_json,
    group_markdown,
    seed_and_episode_interval,
)
from esper_lightning.app.compare.stats import holm, mean_ci
from esper_lightning.app.config import CompareConfig
from esper_lightning.errors import ConfigError

SEEDS = ("policy:a.pt", "policy:b.pt", "policy:c.pt")
#: Each seed's mean offset from the lookup (bits): the method is 0.01 better on average.
OFFSETS = {"lookup:l.json": 0.0, SEEDS[0]: -0.02, SEEDS[1]: -0.01, SEEDS[2]: 0.0}


def _records(n: int = 12, offsets: dict[str, float] = OFFSETS) -> list[EpisodeRecord]:
    rng = np.random.default_rng(5)
    records = []
    for i in range(n):
        base = rng.normal(2.5, 0.1)
        for arm, offset in offsets.items():
            bits = base + offset + rng.normal(0.0, 0.002)
            records.append(EpisodeRecord(arm, i, 100 + i, "grow2", {
                "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0,
                "total_params": 1000, "accuracy_curve": (50.0,), "seeds_germinated": 0,
                "seeds_fossilized": 0, "seeds_pruned": 0, "wall_seconds": 1.0,
                "final_bits": bits, "test_bits": bits}))
    return records


def test_a_group_is_its_members_mean_paired_by_episode_with_their_spread():
    records = _records()
    (row,) = group_differences(records, {"ppo": SEEDS}, "lookup:l.json", "test_bits")
    by = {(r.controller, r.episode_index): r["test_bits"] for r in records}
    pooled = [np.mean([by[(a, i)] for a in SEEDS]) - by[("lookup:l.json", i)]
              for i in range(12)]
    assert row.n_pairs == 12 and row.difference.mean == pytest.approx(np.mean(pooled))
    assert row.difference.mean == pytest.approx(-0.01, abs=0.002)
    # These three members are better than the reference, episode by episode; the method is
    # not shown to be: one training seed in three gains nothing (its draws of seeds reach 0).
    assert row.difference.ci[1] < 0  # type: ignore[index]
    assert row.seed_ci is not None and row.seed_ci[0] < -0.017 and row.seed_ci[1] > -0.002
    assert row.verdict.startswith("no detectable difference at 12 episodes")
    agreeing = {**OFFSETS, SEEDS[0]: -0.011, SEEDS[1]: -0.01, SEEDS[2]: -0.009}
    (firm,) = group_differences(_records(offsets=agreeing), {"ppo": SEEDS}, "lookup:l.json",
                                "test_bits")
    assert firm.verdict == "better" and firm.seed_ci[1] < -0.005  # type: ignore[index]
    assert row.member_means[SEEDS[0]] == pytest.approx(-0.02, abs=0.002)
    assert row.spread == pytest.approx(np.std(list(row.member_means.values()), ddof=1))
    assert row.spread == pytest.approx(0.01, abs=0.002)
    lines = group_markdown([row], "test_bits")
    assert "## Groups of arms" in lines and any(
        line.startswith("| ppo − lookup:l.json | policy:a.pt -0.02") for line in lines)
    assert group_json([row])[0]["members"] == list(SEEDS)
    assert group_differences(records, {}, "lookup:l.json", "test_bits") == []
    # Only the episodes every member played are paired.
    fewer = [r for r in records if not (r.controller == SEEDS[1] and r.episode_index < 4)]
    assert group_differences(fewer, {"ppo": SEEDS}, "lookup:l.json", "test_bits")[0].n_pairs == 8


@pytest.mark.parametrize(("seed_spread", "episode_sd"), [
    (0.0, 0.0075), (0.005, 0.0075), (0.01, 0.0075),
    (0.0, 0.0), (0.01, 0.0)])  # episodes that differ less than the noise: few df
def test_the_seeds_and_episodes_interval_covers_a_method_trained_anew(seed_spread, episode_sd):
    # Three training seeds crossed with 40 episodes, the method's true mean 0: its interval
    # must cover 0 near 95 % of the time however much the seeds disagree (a percentile
    # bootstrap over the three covered about 78 % at a seed spread of 0.01; this one 92-95 %,
    # Satterthwaite's degrees of freedom a little liberal with three seeds).
    rng = np.random.default_rng(11)
    covered = 0
    trials = 400
    for _ in range(trials):
        d = (rng.normal(0.0, seed_spread, (3, 1)) + rng.normal(0.0, episode_sd, (1, 40))
             + rng.normal(0.0, 0.003, (3, 40)))
        low, high = seed_and_episode_interval(d)
        covered += low <= 0.0 <= high
    assert 0.88 <= covered / trials <= 0.99


def test_the_seeds_and_episodes_interval_is_the_episodes_one_when_seeds_agree_exactly():
    rng = np.random.default_rng(3)
    episodes = rng.normal(-0.01, 0.0075, 40)
    d = np.stack([episodes, episodes, episodes])  # three identical members
    low, high = seed_and_episode_interval(d)
    assert (low, high) == pytest.approx(mean_ci(episodes))


def test_a_pair_of_groups_compares_member_i_with_member_i():
    # A curriculum's seed i started from the timing policy's seed i: the contrast is seed by
    # seed. Each "all" seed is 0.004 better than the timing seed it started from, whatever
    # that seed's own offset (-0.02, -0.01, 0): member by member, the difference is exact.
    started = {f"policy:all-{k}.pt": OFFSETS[seed] - 0.004 for k, seed in enumerate(SEEDS)}
    records = _records(offsets={**OFFSETS, **started})
    groups = {"timing": SEEDS, "all": tuple(started)}
    rows = group_differences(records, groups, "lookup:l.json", "test_bits",
                             pairs=[("all", "timing")])
    assert [(r.group, r.reference) for r in rows] == [
        ("timing", "lookup:l.json"), ("all", "lookup:l.json"), ("all", "timing")]
    pair = rows[2]
    assert pair.difference.mean == pytest.approx(-0.004, abs=0.002)
    assert list(pair.member_means) == [f"{a} − {b}" for a, b in zip(started, SEEDS, strict=True)]
    assert pair.spread < 0.002  # the seeds' own offsets cancel, seed by seed
    assert pair.verdict == "better" and pair.seed_ci[1] < 0  # type: ignore[index]
    assert [r.p_holm for r in rows] == holm([r.p_value for r in rows])  # one family of three
    assert [g["paired"] for g in group_json(rows)] == [False, False, True]
    lines = group_markdown(rows, "test_bits")
    assert any(line.startswith("| all − timing | policy:all-0.pt − policy:a.pt -0.00")
               for line in lines)


def test_the_seeds_and_episodes_interval_in_degenerate_samples():
    # Differences that vary are never given a zero-width interval (which a verdict would read
    # as excluding 0), and the interval is never narrower than the episodes-only one.
    latin = ((np.arange(3)[:, None] + np.arange(3)[None, :]) % 3) + 0.1
    low, high = seed_and_episode_interval(latin)
    assert low < 1.1 < high
    x = np.array([-1.0, 0.0, 1.0])
    d = x[:, None] + x[None, :] + 0.5
    low, high = seed_and_episode_interval(d)
    t_low, t_high = mean_ci(d.mean(axis=0))
    assert low <= t_low and high >= t_high
    assert seed_and_episode_interval(np.full((3, 4), 0.25)) == (0.25, 0.25)


@pytest.mark.parametrize(("pairs", "message"), [
    (["all"], "bad group_pairs 'all'; accepted: A=B naming two of the arm_groups (timing, all)"),
    (["all=lookup"], "bad group_pairs 'all=lookup'"),
    (["all=all"], "bad group_pairs 'all=all'"),
])
def test_bad_group_pairs_are_one_line(pairs, message):
    controllers = ("static", *SEEDS, "policy:x.pt", "policy:y.pt", "policy:z.pt")
    groups = (f"timing={','.join(SEEDS)}", "all=policy:x.pt,policy:y.pt,policy:z.pt")
    with pytest.raises(ConfigError, match=re.escape(message)):
        CompareConfig(controllers=controllers, arm_groups=groups, group_pairs=pairs)
    with pytest.raises(ConfigError, match="all has 2 members and timing 3; accepted: groups "
                                          "whose members pair up"):
        CompareConfig(controllers=controllers, group_pairs=["all=timing"],
                      arm_groups=(groups[0], "all=policy:x.pt,policy:y.pt"))
    with pytest.raises(ConfigError, match=re.escape("'policy:a.pt' is in both groups")):
        CompareConfig(controllers=controllers, group_pairs=["all=timing"],
                      arm_groups=(groups[0], "all=policy:a.pt,policy:y.pt,policy:z.pt"))


@pytest.mark.parametrize(("groups", "message"), [
    (["ppo"], "bad arm_groups 'ppo'; accepted: NAME=ARM,ARM,... with two or more distinct arms"),
    (["ppo=policy:a.pt"], "bad arm_groups 'ppo=policy:a.pt'"),
    (["ppo=policy:a.pt,policy:a.pt"], "bad arm_groups"),
    (["ppo=policy:a.pt,policy:z.pt"], "arm_groups 'ppo=policy:a.pt,policy:z.pt' names "
     "'policy:z.pt', which is not a controller"),
    (["static=policy:a.pt,policy:b.pt"], "reuses the name 'static'"),
    (["ppo=static,policy:b.pt"], "holds the reference 'static', which every group is compared"),
])
def test_bad_groups_are_one_line(groups, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        CompareConfig(controllers=("static", "policy:a.pt", "policy:b.pt"), arm_groups=groups)


def test_a_group_of_arms_whose_labels_hold_commas():
    two = ("stack:4@0.1,0.4:identity", "stack:4@0.2,0.5:identity")
    config = CompareConfig(controllers=("static", *two), arm_groups=(f"events={','.join(two)}",))
    assert config.groups() == {"events": two}


def test_the_comparison_report_has_the_groups_section(text_file, tmp_path, monkeypatch):
    import json

    from esper_lightning.app.compare import runner

    monkeypatch.setattr(runner.plots, "save_figures", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_log_tensorboard", lambda *args, **kwargs: None)
    names = {"lookup:l.json": "static", SEEDS[0]: "stack:2@0.2:identity",
             SEEDS[1]: "stack:2@0.4:identity", SEEDS[2]: "stack:2@0.6:identity"}
    records = [EpisodeRecord(names[r.controller], r.episode_index, r.episode_rng_seed, r.host,
                             r.values) for r in _records()]
    config = CompareConfig(task="lm", host_preset="grow2", slots=("r1c0",), budget_steps=8,
                           controllers=tuple(names.values()), data_dir=str(text_file),
                           arm_groups=("stacks=" + ",".join(list(names.values())[1:]),),
                           out=str(tmp_path / "out"), progress=False)
    (tmp_path / "out").mkdir()
    text = runner.Comparison(config).report(records)
    assert "## Groups of arms" in text and "| stacks − static | stack:2@0.2:identity -0.02" in text
    (group,) = json.loads((tmp_path / "out" / "summary.json").read_text())["groups"]
    assert group["group"] == "stacks" and group["verdict"].startswith("no detectable")
    assert group["ci"][1] < 0 and group["seed_ci"][1] > group["ci"][1]
