"""Review of the report and figure code (2026-11-29): results that would be wrong and look right."""
from __future__ import annotations

import warnings

import pandas as pd

from analysis.report_page import Report
from analysis.report_results import MAX_GROUPS, _results


def _grid(groups: int, seeds: int = 2) -> pd.DataFrame:
    rows = [{"model.width": w, "seed": s, "status": "completed", "test_error": 0.5 - w / 100 + s / 1000,
             "wall_s": 10.0} for w in range(1, groups + 1) for s in range(seeds)]
    return pd.DataFrame(rows)


def test_results_bar_figure_says_when_it_shows_only_some_groups(tmp_path):
    """The bar figure draws the first 2 * MAX_GROUPS rows of the results table; a grid with more groups (here 30)
    must not get a figure that silently leaves the last ones (the widest, here the best) out."""
    runs = _grid(2 * MAX_GROUPS + 6)
    rep = Report(tmp_path)
    _results(rep, runs, ["model.width"])
    text = "\n".join(rep.lines)
    assert f"first {2 * MAX_GROUPS} of {2 * MAX_GROUPS + 6} groups" in text


def test_results_bar_figure_of_a_small_grid_has_no_cut_note(tmp_path):
    rep = Report(tmp_path)
    _results(rep, _grid(3), ["model.width"])
    assert "The figure below shows the first" not in "\n".join(rep.lines)


def test_results_bars_draw_no_error_bar_for_a_one_seed_group(tmp_path, monkeypatch):
    """A group with one seed has no std (the table leaves it off); the bar figure drew a zero-length error bar
    with caps at its mean, a spread of exactly 0 beside the other groups' real ones."""
    import numpy as np

    from analysis import figures
    from analysis.tables import summary_table
    from tests.helpers import captured_figure

    runs = _grid(2, seeds=3)
    runs = runs[(runs["model.width"] == 2) | (runs["seed"] == 0)]  # width 1: one seed, width 2: three
    table = summary_table(runs, ["model.width"])
    assert table["n_seeds"].tolist() == [1, 3]
    kept = captured_figure(monkeypatch)
    figures.plot_bars(table, ["model.width"], tmp_path / "bars.png")
    bars = [(ax, c) for ax in kept["fig"].axes for c in ax.containers if hasattr(c, "errorbar")]
    assert len(bars) == 2, "accuracy and wall time"
    for ax, c in bars:
        caps = c.errorbar.lines[1]
        assert all(np.isnan(cap.get_ydata()[0]) for cap in caps), "no error bar on the one-seed group"
        assert all(np.isfinite(cap.get_ydata()[1]) for cap in caps), "the three-seed group keeps its bar"
        assert "one seed" in ax.get_title()


def test_learning_curve_point_of_one_seed_draws_no_error_bar(tmp_path, monkeypatch):
    """A size with one seed has no log-space std; the figure drew it a zero-length bar with caps (``exp(0)``),
    read as a point known exactly beside the other sizes' spreads."""
    import numpy as np

    from analysis import figures
    from analysis.fits import fit_learning_curve
    from tests.helpers import captured_figure

    rows = [{"dataset.n_train": n, "seed": s, "status": "completed",
             "test_error": 2.0 * n ** -0.5 * (1 + 0.05 * (s - 1))}
            for n in (100, 200, 400, 800) for s in (range(1) if n == 800 else range(3))]
    runs = pd.DataFrame(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fit's note on the incomplete seeds
        fits = fit_learning_curve(runs, x="dataset.n_train", y="test_error", by=[], n_boot=0)
    kept = captured_figure(monkeypatch)
    figures.plot_learning_curves(runs, fits, tmp_path / "lc.png")
    (ax,) = kept["fig"].axes
    (bars,) = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    low_caps = np.asarray(bars.lines[1][0].get_ydata(), float)
    assert np.isfinite(low_caps[:3]).all(), "the three-seed sizes keep their bars"
    assert np.isnan(low_caps[3]), "no bar at the one-seed size"
