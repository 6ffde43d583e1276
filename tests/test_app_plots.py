import sys

import matplotlib
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer

from esper_lightning.app.plots import accuracy_curves_figure, outcome_vs_params_figure, save_figure
from esper_lightning.app.stats import EpisodeRecord, bootstrap_ci, outcome_of, summarize

CONTROLLERS = ("static", "heuristic", "ppo")


def _records(n_episodes=5, epochs=6):
    rng = np.random.default_rng(0)
    records = []
    for k, name in enumerate(CONTROLLERS):
        for i in range(n_episodes):
            curve = tuple(40.0 + 4.0 * np.arange(epochs) + 2.0 * k + rng.normal(0.0, 1.0, epochs))
            records.append(EpisodeRecord(
                name, i, 100 + i, "baseline", outcome_of(curve), curve[-1], 1_000 * k * (i + 1),
                50_000 + 1_000 * k * (i + 1), None, curve, k, k, 0, 1.0,
            ))
    return records


def _raw_backend():
    # Reading rcParams["backend"] normally would itself resolve (and so select) a backend.
    return dict.__getitem__(matplotlib.rcParams, "backend")


def test_outcome_vs_params_has_one_errorbar_per_controller(tmp_path):
    summaries = summarize(_records(), n_resamples=500)
    fig = outcome_vs_params_figure(summaries)
    (ax,) = fig.axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [bar.get_label() for bar in bars] == list(CONTROLLERS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(CONTROLLERS)
    assert ax.get_xlabel() and ax.get_ylabel()
    for bar, s in zip(bars, summaries, strict=True):
        point, _, (x_bar, y_bar) = bar.lines
        assert (point.get_xdata()[0], point.get_ydata()[0]) == (s.total_params_mean,
                                                                 s.outcome_mean)
        (x_segment,) = x_bar.get_segments()
        (y_segment,) = y_bar.get_segments()
        assert x_segment[:, 0] == pytest.approx(s.total_params_ci)
        assert y_segment[:, 1] == pytest.approx(s.outcome_ci)
    path = save_figure(fig, tmp_path / "plots" / "outcome.png")
    assert path.stat().st_size > 0 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_accuracy_curves_show_mean_and_bootstrap_band(tmp_path):
    records = _records()
    fig = accuracy_curves_figure(records, n_resamples=300, rng_seed=4)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.lines] == [f"{c} (n=5)" for c in CONTROLLERS]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(CONTROLLERS)
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "validation accuracy (%)"
    for name, line, band in zip(CONTROLLERS, ax.lines, bands, strict=True):
        curves = np.array([r.accuracy_curve for r in records if r.controller == name])
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
    records[0] = EpisodeRecord(**{**short.__dict__, "accuracy_curve": short.accuracy_curve[:4]})
    with pytest.raises(ValueError, match=r"controller 'static' has accuracy curves of lengths"):
        accuracy_curves_figure(records)


def test_figures_leave_the_global_backend_alone(tmp_path):
    backend, had_pyplot = _raw_backend(), "matplotlib.pyplot" in sys.modules
    records = _records(n_episodes=2)
    save_figure(outcome_vs_params_figure(summarize(records, n_resamples=100)), tmp_path / "a.png")
    save_figure(accuracy_curves_figure(records, n_resamples=100), tmp_path / "b.png")
    assert _raw_backend() == backend
    assert had_pyplot or "matplotlib.pyplot" not in sys.modules
    with pytest.raises(ValueError, match=r"figure path must end in \.png, got"):
        save_figure(outcome_vs_params_figure(summarize(records)), tmp_path / "a.pdf")
    with pytest.raises(ValueError, match="at least one controller summary"):
        outcome_vs_params_figure([])
