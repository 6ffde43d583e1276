import sys
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.text import Text

from esper_lightning.app.compare import plots
from esper_lightning.app.compare.growth import GrowthRow
from esper_lightning.app.compare.plots import (
    curves_figure,
    differences_figure,
    dodge,
    growth_figure,
    regret_figure,
    save_figure,
    save_figures,
    vs_params_figure,
)
from esper_lightning.app.compare.records import METRICS, EpisodeRecord, Metric
from esper_lightning.app.compare.regret import regrets
from esper_lightning.app.compare.report import paired_differences, summarize
from esper_lightning.app.compare.stats import mean_ci
from esper_lightning.core.outcome import accuracy_outcome

CONTROLLERS = ("static", "heuristic", "ppo")


def _records(n_episodes=5, epochs=6):
    rng = np.random.default_rng(0)
    records = []
    for k, name in enumerate(CONTROLLERS):
        for i in range(n_episodes):
            curve = tuple(40.0 + 4.0 * np.arange(epochs) + 2.0 * k + rng.normal(0.0, 1.0, epochs))
            losses = tuple(3.0 - 0.1 * np.arange(epochs) - 0.05 * k)
            records.append(EpisodeRecord(name, i, 100 + i, "baseline", {
                "outcome": accuracy_outcome(curve), "final_accuracy": curve[-1],
                "seed_params": 1_000 * k * (i + 1), "total_params": 50_000 + 1_000 * k * (i + 1),
                "accuracy_curve": curve, "loss_curve": losses if name != "static" else (),
                "seeds_germinated": k, "seeds_fossilized": k, "seeds_pruned": 0,
                "wall_seconds": 1.0}))
    return records


def _raw_backend():
    # Reading rcParams["backend"] normally would itself resolve (and so select) a backend.
    return dict.__getitem__(matplotlib.rcParams, "backend")


def test_outcome_vs_params_has_one_errorbar_per_controller(tmp_path):
    summaries = summarize(_records())
    fig = vs_params_figure(summaries, "outcome", param_cost=0.5)
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [bar.get_label() for bar in bars] == list(CONTROLLERS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(CONTROLLERS)
    assert ax.get_xlabel() == METRICS["total_params"].axis_label()
    # The label and its unit only (the report's section says what it is): one short line.
    assert ax.get_ylabel() == "outcome (%); param_cost = 0.5"
    assert ax.get_title().startswith("Outcome against size (means, 95% t intervals)")
    assert len({bar.lines[0].get_marker() for bar in bars}) == len(CONTROLLERS)
    for bar, s in zip(bars, summaries, strict=True):
        size, outcome = s.metrics["total_params"], s.metrics["outcome"]
        point, _, (x_bar, y_bar) = bar.lines
        assert (point.get_xdata()[0], point.get_ydata()[0]) == (size.mean, outcome.mean)
        (x_segment,) = x_bar.get_segments()
        (y_segment,) = y_bar.get_segments()
        assert x_segment[:, 0] == pytest.approx(size.ci)
        assert y_segment[:, 1] == pytest.approx(outcome.ci)
    path = save_figure(fig, tmp_path / "plots" / "outcome.png")
    assert path.stat().st_size > 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _nudged(record, name, by):
    """``record`` of controller ``name``, its outcome moved by ``by``: a point drawn at the
    same spot that is not the same point."""
    return EpisodeRecord(name, record.episode_index, record.episode_rng_seed, record.host,
                         {**record.values, "outcome": record["outcome"] + by})


def test_labels_of_points_at_one_spot_do_not_overprint():
    records = _records()
    twins = [_nudged(r, f"{r.controller}-twin", 1e-9) for r in records]
    fig = vs_params_figure(summarize(records + twins), "outcome")
    (ax,) = fig.axes
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text, not its leader
    assert [t.get_text() for t in ax.texts] == [*CONTROLLERS, *(f"{c}-twin" for c in CONTROLLERS)]
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1:])


def test_eight_labels_at_one_spot_step_down_evenly_and_the_figure_saves(tmp_path):
    # Eight arms of one size (a growth comparison): each label that moves down one line must
    # move by the text's height, not by its leader line's, which grew without bound once.
    base = _records()
    records = [_nudged(r, f"arm-{k}", 1e-9 * k)
               for k in range(8) for r in base if r.controller == "static"]
    fig = vs_params_figure(summarize(records), "outcome")
    offsets = [t.xyann[1] for t in fig.axes[0].texts]
    steps = np.diff(offsets)
    assert len(offsets) == 8 and np.all(steps < 0)
    assert np.ptp(steps[1:]) < 1e-6 * abs(steps[1])  # one line height each, after the first
    assert save_figure(fig, tmp_path / "arms.png").stat().st_size > 0


def test_paired_differences_are_a_forest_plot_with_zero_line_and_verdicts():
    rng = np.random.default_rng(7)
    reference = rng.normal(60.0, 3.0, 10)
    records = []
    for name, shift in (("static", 0.0), ("good", 2.0), ("bad", -2.0), ("same", 0.0)):
        records += [EpisodeRecord(name, i, 100 + i, "baseline", {
            "outcome": float(v + shift + (0.3 * rng.normal() if shift else 0.0)),
            "final_accuracy": 50.0, "seed_params": 0, "total_params": 1_000,
            "accuracy_curve": (50.0,), "seeds_germinated": 0, "seeds_fossilized": 0,
            "seeds_pruned": 0, "wall_seconds": 1.0}) for i, v in enumerate(reference)]
    comparisons = paired_differences(records)
    assert [c.verdict for c in comparisons] == ["better", "worse",
                                               "no detectable difference at 10 episodes"]
    fig = differences_figure(comparisons, "outcome", param_cost=1.0)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        f"{c.controller} − static\n(n = 10)" for c in comparisons]
    assert list(ax.get_yticks()) == [2, 1, 0]  # the first comparison on top
    zero_lines = [line for line in ax.lines if list(line.get_xdata()) == [0.0, 0.0]]
    assert len(zero_lines) == 1
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    for bar, c in zip(bars, comparisons, strict=True):
        (segment,) = bar.lines[2][0].get_segments()
        assert segment[:, 0] == pytest.approx(c.differences["outcome"].ci)
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"better\nHolm p = {comparisons[0].p_holm:.2g}",
                     f"worse\nHolm p = {comparisons[1].p_holm:.2g}",
                     "no detectable difference\nHolm p = 1"]
    colours = [t.get_color() for t in ax.texts]
    assert colours[:2] == ["tab:green", "tab:red"] and colours[2] not in colours[:2]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    mde = comparisons[0].mde
    assert bands[0].get_paths()[0].vertices[:, 0].min() == pytest.approx(-mde)
    assert "param_cost = 1" in ax.get_xlabel().replace("\n", " ")
    with pytest.raises(ValueError, match="at least one comparison with val_loss"):
        differences_figure(comparisons, "val_loss")


def test_accuracy_curves_show_mean_and_band_distinguishably(tmp_path):
    records = _records()
    # The twin is a hair off static: close curves stay apart (identical ones share a line:
    # the next test).
    twins = [EpisodeRecord("twin", r.episode_index, r.episode_rng_seed, r.host, {
        **r.values, "accuracy_curve": tuple(v + 1e-9 for v in r["accuracy_curve"])})
        for r in records if r.controller == "static"]
    fig = curves_figure(records + twins, "accuracy_curve")
    (ax,) = fig.axes
    names = [*CONTROLLERS, "twin"]
    assert [line.get_label() for line in ax.lines] == [f"{c} (n=5)" for c in names]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(names)
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "validation accuracy (%)"
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax.lines}
    assert len(styles) == len(names)  # no two controllers drawn alike
    static, twin = ax.lines[0], ax.lines[-1]
    assert static.get_ydata() == pytest.approx(twin.get_ydata())  # identical curves ...
    assert not np.allclose(static.get_xdata(), twin.get_xdata())  # ... both visible
    fig.draw_without_rendering()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    for k, (name, line, band) in enumerate(zip(names, ax.lines, bands, strict=True)):
        curves = np.array([r["accuracy_curve"] for r in records + twins if r.controller == name])
        shift = dodge(k, len(names), 6)
        assert abs(shift) < 0.1
        assert line.get_xdata() == pytest.approx(np.arange(1, 7) + shift)
        assert line.get_ydata() == pytest.approx(curves.mean(axis=0))
        vertices = band.get_paths()[0].vertices
        for t in range(curves.shape[1]):
            at_epoch = vertices[np.isclose(vertices[:, 0], t + 1 + shift), 1]
            assert (at_epoch.min(), at_epoch.max()) == pytest.approx(mean_ci(curves[:, t]))
    path = save_figure(fig, tmp_path / "curves.png")
    assert path.stat().st_size > 0 and path.read_bytes()[:4] == b"\x89PNG"


def test_controllers_identical_in_every_episode_share_one_named_line():
    records = _records()
    idle = [EpisodeRecord("idle", r.episode_index, r.episode_rng_seed, r.host, r.values)
            for r in records if r.controller == "static"]
    fig = curves_figure(records + idle, "accuracy_curve")
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == [
        "static (n=5) = idle, identical in every episode", "heuristic (n=5)", "ppo (n=5)"]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 3
    # Equal in all but one episode is not identical: drawn apart.
    late = [*idle[:-1], EpisodeRecord("idle", 4, idle[-1].episode_rng_seed, "baseline", {
        **idle[-1].values, "accuracy_curve": (0.0,) * 6})]
    (ax,) = curves_figure(records + late, "accuracy_curve").axes
    assert len(ax.lines) == 4
    # At one spot in a scatter, too.
    (ax,) = vs_params_figure(summarize(records + idle), "outcome").axes
    assert [t.get_text() for t in ax.texts] == ["static = idle", "heuristic", "ppo"]


def test_loss_against_flops_has_engineering_ticks_and_no_offset_text():
    records = [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, {
        **r.values, "train_flops_curve": tuple(2e9 * (t + 1) for t in range(6))})
        for r in _records() if r.controller != "static"]
    fig = curves_figure(records, "loss_curve", x="train_flops_curve")
    (ax,) = fig.axes
    fig.draw_without_rendering()
    assert ax.xaxis.get_offset_text().get_text() == ""  # the "1e10" that overlapped the label
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text() not in ("", "0")]
    assert "2 G" in labels and all(text.endswith(" G") for text in labels)
    assert ax.get_xlabel() == "training FLOPs (mean over episodes)"


def test_short_episodes_have_whole_epoch_ticks_and_one_episode_no_band():
    records = [r for r in _records(n_episodes=1, epochs=3)]
    fig = curves_figure(records, "accuracy_curve")
    (ax,) = fig.axes
    fig.draw_without_rendering()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert all(float(t).is_integer() for t in ticks)  # no tick at 1.5
    assert not [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_curves_of_different_lengths_are_refused():
    records = _records(n_episodes=2)
    short = records[0]
    records[0] = EpisodeRecord(short.controller, 0, short.episode_rng_seed, short.host, {
        **short.values, "accuracy_curve": short["accuracy_curve"][:4]})
    with pytest.raises(ValueError, match=r"controller 'static' has accuracy_curves of lengths"):
        curves_figure(records, "accuracy_curve")


def test_figures_leave_the_global_backend_alone(tmp_path):
    backend, had_pyplot = _raw_backend(), "matplotlib.pyplot" in sys.modules
    records = _records(n_episodes=2)
    save_figure(vs_params_figure(summarize(records)), tmp_path / "a.png")
    save_figure(curves_figure(records), tmp_path / "b.png")
    save_figure(differences_figure(paired_differences(records)), tmp_path / "c.png")
    assert _raw_backend() == backend
    assert had_pyplot or "matplotlib.pyplot" not in sys.modules
    with pytest.raises(ValueError, match=r"figure path must end in \.png, got"):
        save_figure(vs_params_figure(summarize(records)), tmp_path / "a.pdf")
    with pytest.raises(ValueError, match="at least one controller summary with outcome"):
        vs_params_figure([])


def test_curves_of_an_optional_metric_leave_out_controllers_without_them():
    fig = curves_figure(_records(n_episodes=2), "loss_curve")
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["heuristic (n=2)", "ppo (n=2)"]
    assert ax.get_ylabel() == "validation loss"
    with pytest.raises(ValueError, match="needs at least one episode with loss_curve"):
        curves_figure([r for r in _records(n_episodes=2) if r.controller == "static"],
                      "loss_curve")


def test_every_plotted_metric_is_saved_and_a_new_one_is_drawn(tmp_path, monkeypatch):
    records = _records(n_episodes=2)
    summaries, comparisons = summarize(records), paired_differences(records)
    # Which figures, by name: each is built and handed to save_figure, which writes it below
    # (with the new metrics', the same three are rendered there).
    built: list[Figure] = []
    with monkeypatch.context() as patch:
        patch.setattr(plots, "save_figure", lambda fig, path: built.append(fig) or Path(path))
        paths = save_figures(records, summaries, comparisons, tmp_path)
    assert [p.name for p in paths] == ["outcome_differences.png", "outcome_vs_params.png",
                                       "accuracy_curves.png"]
    assert len(built) == 3 and all(isinstance(fig, Figure) for fig in built)
    added = (Metric("final_loss", lambda e: e.losses[-1], "final loss", plot=True,
                    optional=True, description="validation loss of the last epoch"),
             Metric("train_loss_curve", lambda e: (), "training loss", kind="curve",
                    summary=None, optional=True, plot=True))
    for metric in added:
        monkeypatch.setitem(METRICS, metric.name, metric)
    records = [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, {
        **r.values, "final_loss": (r["loss_curve"] or (None,))[-1],
        "train_loss_curve": tuple(v + 0.5 for v in r["loss_curve"])}) for r in records]
    summaries, comparisons = summarize(records), paired_differences(records)
    paths = save_figures(records, summaries, comparisons, tmp_path)
    assert [p.name for p in paths] == [
        "outcome_differences.png", "outcome_vs_params.png", "final_loss_vs_params.png",
        "accuracy_curves.png", "train_loss_curves.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    (scalar,) = vs_params_figure(summaries, "final_loss").axes
    assert scalar.get_ylabel() == "final loss"
    assert [t.get_text() for t in scalar.texts] == ["heuristic", "ppo"]  # static has none
    (curves,) = curves_figure(records, "train_loss_curve").axes
    assert curves.get_title().startswith("Training loss (mean over episodes")


def _budgeted_records():
    """Two budgets of 4 episodes: growing early (tau 0.2) wins the small one, late (0.8) the
    large one; static loses 0.1 bits to the better arm everywhere."""
    rng = np.random.default_rng(3)
    offsets = {1e12: {"static": 0.1, "stack:2@0.2": 0.0, "stack:2@0.8": 0.05},
               4e12: {"static": 0.1, "stack:2@0.2": 0.05, "stack:2@0.8": 0.0}}
    records = []
    for i in range(8):
        budget = 1e12 if i < 4 else 4e12
        base = rng.normal(2.0, 0.2)
        for name, offset in offsets[budget].items():
            records.append(EpisodeRecord(name, i, 100 + i, "gpt", {
                "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0, "total_params": 1,
                "accuracy_curve": (50.0,), "seeds_germinated": 0, "seeds_fossilized": 0,
                "seeds_pruned": 0, "wall_seconds": 1.0, "budget_flops": budget,
                "final_bits": base + offset + rng.normal(0.0, 0.001)}))
    return records


def test_regret_is_a_forest_plot_of_every_controller_overall_and_per_budget(tmp_path):
    _, rows = regrets(_budgeted_records(), "final_bits")
    fig = regret_figure(rows, "final_bits")
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 3 * (1 + 2)  # every controller: all budgets, then each budget
    points = [(bar.lines[0].get_xdata()[0], bar.lines[0].get_ydata()[0]) for bar in bars]
    for row, start in zip(rows, range(0, 9, 3), strict=True):
        (x, y), *budgets = points[start:start + 3]
        assert x == pytest.approx(row.overall.mean)
        assert [bx for bx, _ in budgets] == pytest.approx(
            [row.per_budget[b][1].mean for b in (1e12, 4e12)])
        assert all(by < y for _, by in budgets)  # the budgets sit under their controller
    by_name = dict(zip((r.controller for r in rows), range(0, 9, 3), strict=True))
    # Each tau arm is the oracle (regret 0) on the budget it wins; static loses 0.1 on both.
    assert points[by_name["stack:2@0.2"] + 1][0] == 0.0
    assert points[by_name["stack:2@0.8"] + 2][0] == 0.0
    assert points[by_name["static"]][0] == pytest.approx(0.1, abs=0.01)
    assert [t.get_text() for t in ax.get_yticklabels()] == [r.controller for r in rows]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "all budgets", "budget 1e+12 FLOPs", "budget 4e+12 FLOPs"]
    assert save_figure(fig, tmp_path / "regret.png").stat().st_size > 0
    with pytest.raises(ValueError, match="at least one controller"):
        regret_figure([], "final_bits")


def test_growth_times_are_drawn_against_the_budget(tmp_path):
    rows = [GrowthRow("lookup", 1e12, 4, (0, 4, 0), 0.5, None, True),
            GrowthRow("lookup", 4e12, 4, (0, 0, 4), 0.1, 0.3, True),
            GrowthRow("policy", 1e12, 4, (1, 3, 0), 0.45, None, True),
            GrowthRow("policy", 4e12, 4, (0, 2, 2), 0.2, 0.6, True),
            GrowthRow("static", 1e12, 4, (4, 0, 0), None, None, True),
            GrowthRow("static", 4e12, 4, (4, 0, 0), None, None, True)]
    fig = growth_figure(rows)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["lookup, first growth", "lookup, second growth",
                           "policy, first growth", "policy, second growth"]
    assert list(lines["policy, first growth"].get_xdata()) == [1e12, 4e12]
    assert list(lines["policy, first growth"].get_ydata()) == [0.45, 0.2]
    # A second growth only where one was made, dashed and hollow.
    second = lines["lookup, second growth"]
    assert list(second.get_xdata()) == [4e12] and list(second.get_ydata()) == [0.3]
    assert second.get_linestyle() == "--" and second.get_markerfacecolor() == "white"
    assert ax.get_xscale() == "log" and "never grew: static" in ax.get_title()
    assert list(ax.get_xticks()) == [1e12, 4e12]  # ticks at the budgets played
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1e+12", "4e+12"]
    assert save_figure(fig, tmp_path / "growth_times.png").stat().st_size > 0
    with pytest.raises(ValueError, match="a controller that grew under a budget"):
        growth_figure(rows[4:])
    with pytest.raises(ValueError, match="a controller that grew under a budget"):
        growth_figure([GrowthRow("stack", None, 2, (0, 2, 0), 0.5, None, True)])
