"""Review of the report and figure code (2026-11-29): results that would be wrong and look right."""
from __future__ import annotations

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
