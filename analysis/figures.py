"""Figures as PNG files (matplotlib, Agg backend): every axis labelled, every curve in a legend."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.fits import curve_points  # noqa: E402
from analysis.frames import require_columns  # noqa: E402
from analysis.tables import METRICS, format_value  # noqa: E402


def group_label(by: list[str], key) -> str:
    """"patch=4, p=0.1"; a ``_target_`` shows as its group and class ("model=ViT"); floats as in the tables."""
    key = key if isinstance(key, tuple) else (key,)
    parts = []
    for k, v in zip(by, key, strict=True):
        if k.endswith("._target_"):
            parts.append(f"{k.split('.')[-2]}={str(v).rsplit('.', 1)[-1]}")
        else:
            parts.append(f"{k.split('.')[-1]}={format_value(v) if isinstance(v, float) else v}")
    return ", ".join(parts) or "all runs"


# one colour per group: tab10's ten, then tab20's ten lighter ones; from the 11th group on a marker as well (a light
# colour beside its dark one is told apart by it), and past 20 groups the colours come round with another marker
_TAB20 = [mcolors.to_hex(c) for c in plt.get_cmap("tab20").colors]
PALETTE = (*_TAB20[0::2], *_TAB20[1::2])
GROUP_MARKERS = (None, "^", "s", "D", "v", "P", "X", "*")


def group_style(i: int) -> tuple[str, str | None]:
    """(colour, marker or None) of the ``i``-th group of a figure: no two groups up to 20 share a colour, and none
    up to 80 share both (``analysis.report.MAX_GROUPS`` is 12)."""
    return PALETTE[i % len(PALETTE)], GROUP_MARKERS[(i // 10) % len(GROUP_MARKERS)]


def _groups(df: pd.DataFrame, by: list[str]):
    if not by:
        return [("all runs", df)]
    return [(group_label(by, k), g) for k, g in df.groupby(by, dropna=False, sort=True)]


def save_figure(fig, out: str | Path) -> Path:
    """tight_layout, write PNG (parents created), close the figure."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


LEGEND_COLUMNS = 2  # history legends sit below their panel, this many entries a row
LEGEND_ROW_IN = 0.16  # inches of figure height a legend row takes (fontsize 7)
FADED = 0.35  # alpha of a history mean over fewer runs than its group has
STILL_TRAINING = "faded: mean over the runs still training (some of the group had stopped)"


def _readings(g: pd.DataFrame, x: str, col: str) -> tuple[pd.Series, pd.Series]:
    """Per ``x`` with a reading of ``col`` in group ``g``: the mean over the runs read there, and whether every run of
    the group was (runs told apart by ``run_dir``; without it the most readings at any ``x`` is the group's count)."""
    held = g[g[col].notna()]
    mean = held.groupby(x)[col].mean()
    if "run_dir" in g:
        count, runs = held.groupby(x)["run_dir"].nunique(), g["run_dir"].nunique()
    else:
        count = held.groupby(x)[col].size()
        runs = count.max() if len(count) else 0
    return mean, count.reindex(mean.index).fillna(0) >= runs


def _plot_mean(ax, mean: pd.Series, complete: pd.Series, style: str, label: str, **kw) -> bool:
    """The mean solid (or ``style``) where every run has a reading, faded where some had stopped, the two joined;
    returns whether a faded part was drawn."""
    ax.plot(mean.index, mean.where(complete), style, label=label, **kw)
    partial = ~complete.to_numpy()
    if not partial.any():
        return False
    near = partial | np.r_[partial[1:], False] | np.r_[False, partial[:-1]]  # joined to the solid part beside it
    ax.plot(mean.index[near], mean[near], style, alpha=FADED, label=f"_{label} (runs still training)", **kw)
    return True


def plot_history(hist: pd.DataFrame, by: list[str], out: str | Path, x: str = "epoch") -> Path:
    """Accuracy and loss per epoch, mean over seeds per group; solid = test, dashed = train. The mean is drawn so only
    over the epochs every run of its group reached: past the end of a group's first run to stop it is the mean over
    the runs still training (it "improves" as the worse runs stop), drawn faded, and the titles say so."""
    require_columns(hist, x, "test_error", "test_loss", *by)
    groups = list(_groups(hist, by))
    rows = math.ceil(2 * len(groups) / LEGEND_COLUMNS)  # a test and a train entry a group
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2 + LEGEND_ROW_IN * rows))
    faded = False
    for i, (label, g) in enumerate(groups):
        color, own = group_style(i)
        epochs = g[x].nunique()
        marker = own or ("o" if epochs < 2 else None)  # a run evaluated once is a point, not an invisible line
        kw = dict(color=color, marker=marker, markevery=max(1, epochs // 8) if own else None)
        for split, style in (("test", "-"), ("train", "--")):
            # epochs where a split was not scored (trainer.test_every) are dropped, so the scored ones join up
            if f"{split}_error" in g:
                err, complete = _readings(g, x, f"{split}_error")
                faded |= _plot_mean(ax_acc, 100 * (1 - err), complete, style, f"{label} ({split})", **kw)
            if f"{split}_loss" in g:
                loss, complete = _readings(g, x, f"{split}_loss")
                faded |= _plot_mean(ax_loss, loss, complete, style, f"{label} ({split})", **kw)
    note = f"\n{STILL_TRAINING}" if faded else ""
    ax_acc.set(xlabel=x, ylabel="accuracy (%)")
    ax_loss.set(xlabel=x, ylabel="cross-entropy loss", yscale="log")
    ax_acc.set_title(f"accuracy per epoch (mean over seeds){note}", fontsize=9 if faded else None)
    ax_loss.set_title(f"loss per epoch (mean over seeds){note}", fontsize=9 if faded else None)
    for ax in (ax_acc, ax_loss):  # below the axes, the figure taller by its rows: inside, it hid the curves
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=LEGEND_COLUMNS)
    return save_figure(fig, out)


def plot_learning_curves(df: pd.DataFrame, fits: pd.DataFrame, out: str | Path) -> Path:
    """Log-log points and fitted lines; alpha with its CI in the legend. A point is the geometric mean over seeds
    (the quantity the fit uses), its bar one standard deviation of the log error (``gmean * exp(+-log_std)``); the
    small dots are the seeds' own runs. A power law that misses its points (``curved``, :mod:`analysis.fit_shape`) is
    drawn dashed and labelled with how far off the line its means sit. An offset model whose floor misses its points
    (``offset_ok`` false: a floor above a measured mean, or at zero) is drawn grey and labelled rejected."""
    x, y, by = fits.attrs["x"], fits.attrs["y"], fits.attrs["by"]
    points = curve_points(df[df["status"] == "completed"] if "status" in df else df, x, y, by)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    for i, fit in enumerate(fits.to_dict("records")):
        key = tuple(fit[k] for k in by) if by else ()
        sel = np.ones(len(points), bool)
        for k, v in zip(by, key, strict=True):
            sel &= (points[k] == v).to_numpy() | (pd.isna(points[k]).to_numpy() & pd.isna(v))
        p = points[sel]
        color, own = group_style(i)
        # a size with one seed has no log std: no bar (a zero-length one, caps at the point, read as no spread)
        g, spread = p["gmean"].to_numpy(float), np.exp(p["log_std"].to_numpy(float))
        ax.errorbar(p[x].to_numpy(float), g, yerr=[g - g / spread, g * spread - g], fmt=own or "o", color=color,
                    capsize=3)
        seeds = _seed_points(df, by, key) if by else df[df["status"] == "completed"] if "status" in df else df
        if seeds is not None and len(seeds):
            ax.plot(seeds[x], seeds[y], ".", color=color, alpha=0.4, ms=4, label=f"_seeds {i}")
        n = np.geomspace(fit["x_min"], fit["x_max"], 50)
        ci = f" [{fit['alpha_lo']:.3f}, {fit['alpha_hi']:.3f}]" if np.isfinite(fit["alpha_lo"]) else ""
        name = group_label(by, key) if by else "fit"
        curved = str(fit.get("curved")) == "True"  # a bool, or read back from a csv: a string
        bend = f" (curved: means up to {fit['max_miss']:.0%} off the line, α depends on the range)" if curved else ""
        ax.plot(n, fit["prefactor"] * n ** fit["alpha"], "--" if curved else "-", color=color,
                label=f"{name}: α={fit['alpha']:.3f}{ci}{bend}")
        if np.isfinite(fit.get("offset", np.nan)):
            curve = fit["offset_prefactor"] * n ** fit["offset_alpha"] + fit["offset"]
            if fit.get("offset_ok", True):
                ax.plot(n, curve, ":", color=color,
                        label=f"{name}: offset model α={fit['offset_alpha']:.3f}, c={fit['offset']:.3g}")
            else:  # a fit that misses its own points is shown as such, not as a result
                why = "floor above its points" if "above" in str(fit.get("offset_note", "")) else "floor at 0"
                ax.plot(n, curve, ":", color="0.6", lw=0.8, label=f"{name}: offset model rejected ({why})")
    ax.set(xscale="log", yscale="log", xlabel=f"{x} (log)", ylabel=f"{y} (log)",
           title="learning curves: geometric mean over seeds, ×/÷ log-space std, dots: seeds;\npower-law fits")
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())  # minor labels on a log axis overlap
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12))  # below the axes: it hides no point
    return save_figure(fig, out)


TRAIN_LINES = (("train", "-", "labels trained on"), ("train_clean", "--", "clean labels"),
               ("train_noisy_subset", ":", "flipped images, noisy labels"))


def _seed_points(runs: pd.DataFrame | None, keys: list[str], key) -> pd.DataFrame | None:
    """The completed runs of one curve (its group ``key`` over ``keys``), for drawing each seed's point."""
    if runs is None:
        return None
    key = key if isinstance(key, tuple) else (key,)
    sel = runs["status"] == "completed" if "status" in runs else pd.Series(True, index=runs.index)
    for k, v in zip(keys, key, strict=True):
        sel &= (runs[k] == v) | (runs[k].isna() & pd.isna(v))
    return runs[sel]


def plot_double_descent(curves: pd.DataFrame, summary: pd.DataFrame | None, out: str | Path,
                        runs: pd.DataFrame | None = None) -> Path:
    """Train and test error against width, one colour per noise level: the mean over seeds, a band of one std
    clipped to [0, 100]% (an error rate cannot leave it), and, given the ``runs``, every seed's own point.

    The train panel draws the error against the labels trained on (solid) and, when the runs recorded
    them, against the clean labels (dashed) and on the flipped images against their noisy labels (dotted).
    Peaks that stand above the seed spread get a black cross, bumps within noise (or made of stalled runs) a grey
    circle; points that average in stalled seeds (train error at chance) a hollow square on both panels, and points
    that average in seeds that ended inside a loss spike (``n_ended_in_spike``: read at their final errors) a hollow
    diamond."""
    width, noise, by = curves.attrs["width"], curves.attrs["noise"], curves.attrs["by"]
    keys = [*by, noise]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    groups = [(group_label(keys, k), k, g) for k, g in curves.groupby(keys, dropna=False, sort=True)]
    for i, (label, key, c) in enumerate(groups):
        color, own = group_style(i)
        c = c.sort_values(width)
        seeds = _seed_points(runs, keys, key)
        if seeds is not None and len(seeds):
            for ax, col in ((axes[0], "train_error"), (axes[1], "test_error")):
                ax.plot(seeds[width], 100 * seeds[col], ".", color=color, alpha=0.45, ms=4, label=f"_seeds {label}")
        lines = [(axes[0], *t) for t in TRAIN_LINES if f"{t[0]}_mean" in c and c[f"{t[0]}_mean"].notna().any()]
        for ax, col, style, what in [*lines, (axes[1], "test", "-", "")]:
            m, s = c[f"{col}_mean"].to_numpy(float), c[f"{col}_std"].fillna(0).to_numpy(float)
            name = f"{label} ({what})" if what and len(lines) > 1 else label
            ax.plot(c[width], 100 * m, style, marker=own or "o", color=color, label=name, ms=4 if own else 3)
            if style == "-":
                ax.fill_between(c[width], 100 * np.clip(m - s, 0, 1), 100 * np.clip(m + s, 0, 1), color=color,
                                alpha=0.15)
        if "n_stalled" in c and (c["n_stalled"] > 0).any():  # points that average in runs stuck at chance
            st = c[c["n_stalled"] > 0]
            for ax, col in ((axes[0], "train"), (axes[1], "test")):
                ax.plot(st[width], 100 * st[f"{col}_mean"], "s", ms=8, mfc="none", color=color,
                        label=f"{label}: with stalled or collapsed seeds")
        if "n_ended_in_spike" in c and (c["n_ended_in_spike"] > 0).any():  # means with a seed read inside a spike
            sp = c[c["n_ended_in_spike"] > 0]
            for ax, col in ((axes[0], "train"), (axes[1], "test")):
                ax.plot(sp[width], 100 * sp[f"{col}_mean"], "D", ms=9, mfc="none", color=color,
                        label=f"{label}: with seeds ended inside a loss spike")
    if summary is not None:
        peaks = summary.dropna(subset=["peak_width"])
        sig = peaks["peak_significant"].astype(bool) if "peak_significant" in peaks else pd.Series(True, peaks.index)
        if sig.any():
            axes[1].plot(peaks.loc[sig, "peak_width"], 100 * peaks.loc[sig, "peak_test_error"], "kx", ms=9,
                         label="test-error peak (post hoc)")
        untested = peaks["peak_z"].isna() if "peak_z" in peaks else pd.Series(False, peaks.index)
        stuck = (peaks["peak_stalled_seeds"].fillna(0) > 0 if "peak_stalled_seeds" in peaks
                 else pd.Series(False, peaks.index))
        for sel, label in ((~sig & ~untested & ~stuck, "bump within seed noise"),
                           (~sig & untested & ~stuck, "bump, untested (one seed: no spread)"),
                           (stuck, "bump of stalled runs: no peak")):
            if sel.any():
                axes[1].plot(peaks.loc[sel, "peak_width"], 100 * peaks.loc[sel, "peak_test_error"], "o", ms=9,
                             mfc="none", color="0.5", label=label)
    spread = "mean, ± std clipped to [0, 100]%" + (", dots: seeds" if runs is not None else "")
    titles = {"train": f"train error vs width\n({spread})", "test": f"test error vs width\n({spread})"}
    widths = sorted(curves[width].dropna().unique())
    widths = widths[:: -(-len(widths) // 12)]  # at most about 12 labelled ticks
    for ax, split in zip(axes, ("train", "test"), strict=True):
        ax.set(xscale="log", xlabel=f"{width} (log)", ylabel=f"{split} error (%)")
        ax.set_title(titles[split], fontsize=9)
        ax.set_xticks(widths, [f"{w:g}" for w in widths], fontsize=7)
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        ax.legend(fontsize=7, handlelength=3.5)
    return save_figure(fig, out)


def plot_bars(table: pd.DataFrame, by: list[str], out: str | Path,
              metrics: tuple[str, ...] = ("test_acc", "wall_s")) -> Path:
    """Side-by-side bars (mean, error bar = std over seeds) per group for each metric in the table."""
    metrics = [m for m in metrics if f"{m}_mean" in table.columns]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2), squeeze=False)
    labels = [group_label(by, tuple(r)) for r in table[by].itertuples(index=False)] if by else ["all runs"]
    hue = table[by[-1]].astype(str) if by else None  # colour = value of the last key, named in the legend
    levels = list(dict.fromkeys(hue)) if hue is not None else ["all runs"]
    colors = [group_style(levels.index(v))[0] for v in hue] if hue is not None else [group_style(0)[0]] * len(table)
    pos = np.arange(len(table))
    for ax, m in zip(axes[0], metrics, strict=True):
        header, kind = METRICS.get(m, (m, "num"))
        scale = 100.0 if kind == "pct" else 1.0
        unit_header = "wall time (s), training + evaluation" if kind == "time" else header
        # a group with one seed has no std: no error bar (a zero-length one, caps at the mean, read as no spread)
        std = table[f"{m}_std"]
        ax.bar(pos, scale * table[f"{m}_mean"], yerr=scale * std, capsize=4, color=colors)
        ax.set_xticks(pos, labels, rotation=30, ha="right", fontsize=8)
        lone = "\n(no bar: one seed)" if std.isna().any() else ""
        ax.set(ylabel=unit_header, xlabel=", ".join(by) or "runs", title=f"{unit_header}: mean ± std over seeds{lone}")
        if kind == "pct":
            lo = np.nanmin(scale * (table[f"{m}_mean"] - table[f"{m}_std"].fillna(0)))
            ax.set_ylim(max(0.0, lo - 0.1 * (100 - lo)), 100)
        handles = [plt.Rectangle((0, 0), 1, 1, color=group_style(i)[0]) for i in range(len(levels))]
        ax.legend(handles, levels, title=by[-1] if by else None, fontsize=7, title_fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save_figure(fig, out)
