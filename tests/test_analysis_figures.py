"""The figures and the tables they share numbers with (review of 2026-11-29, session 53, figures review): every
group its own colour, history means honest about runs that stopped, spiked runs counted and marked, and no two
recipes pooled into one curve."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from analysis import figures  # noqa: E402
from tests.helpers import captured_figure  # noqa: E402

MAX_GROUPS = 12  # analysis.report.MAX_GROUPS: the curves a report figure draws at most


def _look(line) -> tuple:
    return mcolors.to_hex(line.get_color()), line.get_linestyle(), line.get_marker()


@pytest.mark.parametrize("n", [MAX_GROUPS, 20])
def test_every_history_group_has_its_own_look(tmp_path, monkeypatch, n):
    """Groups 11 and 12 of a 12-group figure drew in groups 1 and 2's colour and style (``C{i % 10}``)."""
    hist = pd.DataFrame([{"epoch": e, "model.width": w, "run_dir": f"r{w}", "test_error": 0.5, "test_loss": 1.0,
                          "train_error": 0.4, "train_loss": 0.9} for w in range(1, n + 1) for e in (1, 2, 3)])
    kept = captured_figure(monkeypatch)
    figures.plot_history(hist, ["model.width"], tmp_path / "h.png")
    for ax in kept["fig"].axes:
        looks = {}
        for line in ax.get_lines():
            if line.get_label().startswith("_"):
                continue
            looks.setdefault(_look(line), []).append(line.get_label())
        assert len(looks) == 2 * n, {k: v for k, v in looks.items() if len(v) > 1}


def test_a_history_legend_hides_no_curve_and_shows_every_entry(tmp_path, monkeypatch):
    """Review 2026-11-29 (session 53): a 12-group history figure's legends (24 entries) sat inside the axes, over
    the curves, and ran off the bottom of the figure (the last entries cut off)."""
    hist = pd.DataFrame([{"epoch": e, "model.width": w, "run_dir": f"r{w}", "test_error": 0.5, "test_loss": 1.0,
                          "train_error": 0.4, "train_loss": 0.9} for w in range(1, MAX_GROUPS + 1) for e in (1, 2, 3)])
    kept = captured_figure(monkeypatch)
    figures.plot_history(hist, ["model.width"], tmp_path / "h.png")
    fig = kept["fig"]  # laid out and saved; closed, so drawn again on a canvas of its own
    renderer = FigureCanvasAgg(fig).get_renderer()
    page = fig.bbox
    for ax in fig.axes:
        box, plot = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert len(ax.get_legend().get_texts()) == 2 * MAX_GROUPS
        assert box.y1 <= plot.y0, "the legend overlaps its axes"
        assert box.y0 >= page.y0 and box.x0 >= page.x0 and box.x1 <= page.x1, "the legend runs off the figure"


def test_every_double_descent_group_has_its_own_colour(tmp_path, monkeypatch):
    from analysis.double_descent import descent_curves, descent_summary

    rows = [{"model.width": w, "label_noise.p": p / 100, "seed": s, "status": "completed",
             "test_error": 0.5 - 0.01 * w, "train_error": 0.3 / w}
            for p in range(MAX_GROUPS) for w in (1, 2, 4) for s in (0, 1)]
    curves = descent_curves(pd.DataFrame(rows))
    kept = captured_figure(monkeypatch)
    figures.plot_double_descent(curves, descent_summary(curves), tmp_path / "dd.png")
    test_ax = kept["fig"].axes[1]
    means = [ln for ln in test_ax.get_lines() if not ln.get_label().startswith("_") and "peak" not in
             ln.get_label() and "bump" not in ln.get_label()]
    assert len(means) == MAX_GROUPS
    assert len({_look(ln) for ln in means}) == MAX_GROUPS


def test_every_bar_level_has_its_own_colour(tmp_path, monkeypatch):
    table = pd.DataFrame({"model.width": range(MAX_GROUPS), "test_acc_mean": 0.5, "test_acc_std": 0.01})
    kept = captured_figure(monkeypatch)
    figures.plot_bars(table, ["model.width"], tmp_path / "b.png", metrics=("test_acc",))
    bars = kept["fig"].axes[0].patches
    assert len({mcolors.to_hex(b.get_facecolor()) for b in bars}) == MAX_GROUPS


def _history_two_runs(stop_b: int = 3) -> pd.DataFrame:
    """Group w=1: run a trains 5 epochs, run b stops after ``stop_b`` with a far higher loss; group w=2: two runs of
    5 epochs each."""
    rows = []
    for w, run, last, loss in ((1, "a", 5, 0.01), (1, "b", stop_b, 1.0), (2, "c", 5, 0.5), (2, "d", 5, 0.5)):
        rows += [{"epoch": e, "w": w, "run_dir": f"{run}", "test_error": loss / 2, "test_loss": loss,
                  "train_error": loss / 4, "train_loss": loss / 2} for e in range(1, last + 1)]
    return pd.DataFrame(rows)


def test_history_mean_is_solid_only_while_every_run_of_the_group_trains(tmp_path, monkeypatch):
    """A mean over the runs still training "falls" as the worse runs stop (CIFAR-10 main, width 12: 8 runs -> 1 by
    epoch 175): drawn solid, it read as the seeds' mean getting better. Solid only over the epochs every run of the
    group reached; beyond, faded, and the figure says what the faded part is."""
    kept = captured_figure(monkeypatch)
    figures.plot_history(_history_two_runs(), ["w"], tmp_path / "h.png")
    for ax in kept["fig"].axes:
        named = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
        for split in ("test", "train"):
            line = named[f"w=1 ({split})"]
            x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
            assert list(x[np.isfinite(y)]) == [1, 2, 3], "solid only where both runs have a reading"
            faded = [ln for ln in ax.get_lines() if ln.get_label().startswith("_") and ln.get_color() ==
                     line.get_color() and ln.get_linestyle() == line.get_linestyle()]
            assert len(faded) == 1 and faded[0].get_alpha() < 1
            assert list(faded[0].get_xdata()) == [3, 4, 5]  # joined to the solid part, then the runs still training
            full = named[f"w=2 ({split})"]  # both runs to the end: solid throughout, nothing faded
            assert np.isfinite(np.asarray(full.get_ydata(), float)).all()
            assert not [ln for ln in ax.get_lines() if ln.get_label().startswith("_") and ln.get_color() ==
                        full.get_color()]
        assert "still training" in ax.get_title()


def test_history_without_early_stops_says_nothing_of_faded_means(tmp_path, monkeypatch):
    kept = captured_figure(monkeypatch)
    figures.plot_history(_history_two_runs(stop_b=5), ["w"], tmp_path / "h.png")
    for ax in kept["fig"].axes:
        assert "still training" not in ax.get_title()
        assert all(np.isfinite(np.asarray(ln.get_ydata(), float)).all() for ln in ax.get_lines())


def _spiked_runs() -> pd.DataFrame:
    """Widths 1, 2, 4 at noise 0.2, three seeds; seed 2 at width 2 ended inside a loss spike (read at its final
    errors, 0.30 train and 0.70 test, against 0.05 and 0.40 for the others)."""
    rows = []
    for w in (1, 2, 4):
        for s in range(3):
            spiked = w == 2 and s == 2
            rows.append({"model.width": w, "label_noise.p": 0.2, "seed": s, "status": "completed",
                         "train_error": 0.30 if spiked else 0.05, "test_error": 0.70 if spiked else 0.40,
                         "stalled": False, "ended_in_spike": spiked})
    return pd.DataFrame(rows)


def test_runs_ended_inside_a_spike_are_counted_per_point_and_kept_in_the_means():
    """They are results read at their final errors, in the means as declared; the tables count them as they count
    stalled runs (they were averaged in with no count)."""
    from analysis.double_descent import descent_curves
    from analysis.tables import format_table, summary_table

    runs = _spiked_runs()
    curves = descent_curves(runs).set_index("model.width")
    assert curves["n_ended_in_spike"].to_dict() == {1: 0, 2: 1, 4: 0}
    assert curves.loc[2, "test_mean"] == pytest.approx(0.5)  # (0.4 + 0.4 + 0.7) / 3: kept in the mean
    table = summary_table(runs, by=["model.width"])
    assert table.set_index("model.width")["n_ended_in_spike"].to_dict() == {1: 0, 2: 1, 4: 0}
    shown = format_table(table)
    assert shown["ended in a spike"].tolist() == [0, 1, 0]
    assert "n_ended_in_spike" not in shown  # the count shows under its header, not as a metric


def test_the_double_descent_figure_marks_points_with_seeds_ended_inside_a_spike(tmp_path, monkeypatch):
    from analysis.double_descent import descent_curves, descent_summary

    runs = _spiked_runs()
    curves = descent_curves(runs)
    kept = captured_figure(monkeypatch)
    figures.plot_double_descent(curves, descent_summary(curves), tmp_path / "dd.png", runs=runs)
    for ax, col in zip(kept["fig"].axes, ("train", "test"), strict=True):
        marks = [ln for ln in ax.get_lines() if "loss spike" in ln.get_label()]
        assert len(marks) == 1
        mark = marks[0]
        assert list(mark.get_xdata()) == [2]
        assert list(mark.get_ydata()) == pytest.approx([100 * curves.set_index("model.width").loc[2, f"{col}_mean"]])
        assert mark.get_marker() not in ("s", "o", ".") and mark.get_markerfacecolor() == "none"
    clean = descent_curves(runs.assign(ended_in_spike=False))
    kept = captured_figure(monkeypatch)
    figures.plot_double_descent(clean, descent_summary(clean), tmp_path / "dd2.png", runs=runs)
    assert not [ln for ax in kept["fig"].axes for ln in ax.get_lines() if "loss spike" in ln.get_label()]


def _two_recipes() -> pd.DataFrame:
    """Weight decay 0 on seeds 0-2 and 0.01 on seeds 3-5, at widths 1 and 2: no seed repeats, so
    ``one_run_per_seed`` saw nothing to compare."""
    rows = [{"model.width": w, "label_noise.p": 0.2, "seed": s, "optimizer.weight_decay": 0.0 if s < 3 else 0.01,
             "status": "completed", "train_error": 0.1, "test_error": 0.3 if s < 3 else 0.5}
            for w in (1, 2) for s in range(6)]
    df = pd.DataFrame(rows)
    df.attrs["config_columns"] = ["model.width", "label_noise.p", "seed", "optimizer.weight_decay"]
    return df


def test_descent_curves_refuse_two_recipes_on_seeds_that_do_not_overlap():
    """They pooled into test_mean over six "seeds" of one setting; the learning-curve fit already refused this."""
    from analysis.double_descent import descent_curves

    runs = _two_recipes()
    with pytest.raises(ValueError, match=r"optimizer\.weight_decay \(0\.0, 0\.01\).*two recipes.*"
                                         r"by=\['optimizer\.weight_decay'\]"):
        descent_curves(runs)
    apart = descent_curves(runs, by=["optimizer.weight_decay"])  # the fix the message names
    assert apart["n_seeds"].tolist() == [3, 3, 3, 3]
    assert apart.groupby("optimizer.weight_decay")["test_mean"].first().to_dict() == pytest.approx(
        {0.0: 0.3, 0.01: 0.5})
    one = runs[runs["optimizer.weight_decay"] == 0.0]
    one.attrs.update(runs.attrs)
    assert descent_curves(one)["n_seeds"].tolist() == [3, 3]  # one recipe: as before
    bare = runs.copy()
    bare.attrs = {}  # a frame that names no config columns is not checked (as one_run_per_seed)
    assert descent_curves(bare)["n_seeds"].tolist() == [6, 6]
