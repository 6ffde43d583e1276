import sys

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer

from esper_lightning.app.plots import curves_figure, save_figure, save_figures, vs_params_figure
from esper_lightning.app.records import METRICS, EpisodeRecord, Metric
from esper_lightning.app.report import summarize
from esper_lightning.app.stats import bootstrap_ci
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
    summaries = summarize(_records(), n_resamples=500)
    fig = vs_params_figure(summaries, "outcome")
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [bar.get_label() for bar in bars] == list(CONTROLLERS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(CONTROLLERS)
    assert ax.get_xlabel() == METRICS["total_params"].axis_label()
    assert ax.get_ylabel() == "outcome: mean validation accuracy of the last 3 epochs minus the " \
                              "parameter cost (%)"
    assert ax.get_title() == "Outcome against size (means, 95% bootstrap intervals)"
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


def test_accuracy_curves_show_mean_and_bootstrap_band(tmp_path):
    records = _records()
    fig = curves_figure(records, "accuracy_curve", n_resamples=300, rng_seed=4)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == [f"{c} (n=5)" for c in CONTROLLERS]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(CONTROLLERS)
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "validation accuracy (%)"
    for name, line, band in zip(CONTROLLERS, ax.lines, bands, strict=True):
        curves = np.array([r["accuracy_curve"] for r in records if r.controller == name])
        assert line.get_xdata() == pytest.approx(np.arange(1, 7))
        assert line.get_ydata() == pytest.approx(curves.mean(axis=0))
        vertices = band.get_paths()[0].vertices
        for t in range(curves.shape[1]):
            at_epoch = vertices[np.isclose(vertices[:, 0], t + 1), 1]
            expected = bootstrap_ci(curves[:, t], n_resamples=300, rng_seed=4)
            assert (at_epoch.min(), at_epoch.max()) == pytest.approx(expected)
    path = save_figure(fig, tmp_path / "curves.png")
    assert path.stat().st_size > 0 and path.read_bytes()[:4] == b"\x89PNG"


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
    save_figure(vs_params_figure(summarize(records, n_resamples=100)), tmp_path / "a.png")
    save_figure(curves_figure(records, n_resamples=100), tmp_path / "b.png")
    assert _raw_backend() == backend
    assert had_pyplot or "matplotlib.pyplot" not in sys.modules
    with pytest.raises(ValueError, match=r"figure path must end in \.png, got"):
        save_figure(vs_params_figure(summarize(records)), tmp_path / "a.pdf")
    with pytest.raises(ValueError, match="at least one controller summary with outcome"):
        vs_params_figure([])


def test_curves_of_an_optional_metric_leave_out_controllers_without_them():
    fig = curves_figure(_records(n_episodes=2), "loss_curve", n_resamples=100)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == ["heuristic (n=2)", "ppo (n=2)"]
    assert ax.get_ylabel() == "validation loss"
    with pytest.raises(ValueError, match="needs at least one episode with loss_curve"):
        curves_figure([r for r in _records(n_episodes=2) if r.controller == "static"],
                      "loss_curve")


def test_every_plotted_metric_is_saved_and_a_new_one_is_drawn(tmp_path, monkeypatch):
    records = _records(n_episodes=2)
    summaries = summarize(records, n_resamples=100)
    paths = save_figures(records, summaries, tmp_path)
    assert [p.name for p in paths] == ["outcome_vs_params.png", "accuracy_curves.png"]
    added = (Metric("final_loss", lambda e: e.losses[-1], "final loss", plot=True,
                    optional=True, description="validation loss of the last epoch"),
             Metric("train_loss_curve", lambda e: (), "training loss", kind="curve",
                    summary=None, optional=True, plot=True))
    for metric in added:
        monkeypatch.setitem(METRICS, metric.name, metric)
    records = [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, {
        **r.values, "final_loss": (r["loss_curve"] or (None,))[-1],
        "train_loss_curve": tuple(v + 0.5 for v in r["loss_curve"])}) for r in records]
    summaries = summarize(records, n_resamples=100)
    paths = save_figures(records, summaries, tmp_path)
    assert [p.name for p in paths][2:] == ["final_loss_vs_params.png", "train_loss_curves.png"]
    (scalar,) = vs_params_figure(summaries, "final_loss").axes
    assert scalar.get_ylabel() == "final loss: validation loss of the last epoch"
    assert [t.get_text() for t in scalar.texts] == ["heuristic", "ppo"]  # static has none
    (curves,) = curves_figure(records, "train_loss_curve").axes
    assert curves.get_title().startswith("Training loss (mean over episodes")
