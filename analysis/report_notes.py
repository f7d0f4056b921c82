"""The report's notes on how its runs are grouped and how they went: keys that vary with a compared one,
stalled and low-lr stops, the precision and device they trained at, and the runs that failed."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.report_page import Report
from analysis.varied import _determined_by, key_roles
from src import run_contract as contract  # the run directory's contract: what a spike is


def _grouping_notes(runs: pd.DataFrame, varied: list[str], dependents: dict[str, list[str]],
                    by: list[str] | None) -> list[str]:
    """Lines naming the stop rules that vary only with a compared key, and (with ``--by``) every varied key that the
    chosen groups average over."""
    lines = [f"- `{k}` varies with {', '.join(f'`{j}`' for j in on)} (one value per value of "
             f"{'it' if len(on) == 1 else 'them'}): not a separate axis." for k, on in dependents.items()
             if not by or set(on) <= set(varied)]
    if by:
        mixed = [k for k in [*key_roles(runs)[0], *dependents]
                 if k not in varied and not _determined_by(runs, k, varied)]
        lines += [f"- note: the rows average runs that differ in `{k}` (not in --by)." for k in mixed]
    return [*lines, ""] if lines else []


def _run_names(run_dirs: pd.Series, paths: list[str]) -> list[str]:
    """Each run dir relative to the sweep folder holding it (the folder's own name when it is one)."""
    roots = [Path(p).resolve() for p in paths]
    names = []
    for d in map(Path, run_dirs):
        root = next((r for r in roots if d == r or r in d.parents), None)
        names.append(d.relative_to(root).as_posix() if root is not None and d != root else d.name)
    return names


EXECUTION = ("precision", "device")  # what each run's summary.json records of how it trained; no config column says


def _counts(values: pd.Series) -> str:
    """``"fp32 2, bf16 1"``: each value with its count, the commonest first (ties by name)."""
    counts = values.value_counts()
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{v} {n}" for v, n in order)


def _execution(rep: Report, runs: pd.DataFrame, varied: list[str]) -> None:
    """The precision and device the completed runs trained at, from their summaries: `trainer.precision=auto` times
    fp32 and bf16 for each model on the machine, so two compared settings can train at two precisions while both
    configs say `auto`, and a grid resumed elsewhere can mix devices. One line when every run shares them; otherwise
    a count per compared setting, and a warning when the settings differ in them (a difference between settings may
    then be precision's or the device's as well)."""
    done = runs[runs["status"] == "completed"]
    cols = [c for c in EXECUTION if c in done and done[c].notna().any() and c not in varied]  # --by precision: a key
    if done.empty or not cols:
        return
    shown = done.assign(**{c: done[c].fillna("unknown").astype(str) for c in cols})
    if "device" in cols:
        shown["device"] = shown["device"].str.split(":").str[0]  # cuda:0 and cuda:1 are one kind of device
    if all(shown[c].nunique() == 1 for c in cols):
        where = " on ".join(shown[c].iloc[0] for c in cols)
        rep.add(f"- Every completed run trained at {where} (the {' and '.join(cols)} its summary.json records).", "")
        return
    groups = shown.groupby(varied, dropna=False, sort=True) if varied else shown.assign(_all="all").groupby("_all")
    table = groups[cols].agg(_counts).reset_index()

    def confounded(c: str) -> bool:  # the settings differ in it, and not because it is one of them (a pinned value)
        if f"trainer.{c}" in varied:
            return bool((groups[c].nunique() > 1).any())
        return groups[c].apply(lambda v: tuple(sorted(v.value_counts(normalize=True).round(6).items()))).nunique() > 1

    differ = bool(varied) and any(confounded(c) for c in cols)
    rep.add("## Precision and device", "",
            "The completed runs trained at more than one " + " or ".join(cols) + " (from their summary.json; "
            "`trainer.precision=auto` chooses per model and machine, so configs that all say `auto` can differ)"
            + (". **Warning: the compared settings differ in the precision or device they trained at**, so a "
               "difference between them may be precision's or the device's as well as the settings'; pin "
               "`trainer.precision` (and `trainer.device`) to compare them." if differ else "."), "")
    rep.table(table, "execution")


def _flag_notes(runs: pd.DataFrame, paths: list[str]) -> list[str]:
    """Lines counting stalled runs and naming the runs that stopped moving while their lr had annealed."""
    lines = []
    stalled = runs["stalled"].fillna(False).astype(bool) if "stalled" in runs else pd.Series(False, runs.index)
    if stalled.any():
        collapsed = int(runs["collapsed"].fillna(False).astype(bool).sum()) if "collapsed" in runs else 0
        # the margin each was flagged under (analysis.load.result_flags: a null or missing key is the default)
        raw = runs["trainer.stalled_margin"] if "trainer.stalled_margin" in runs else pd.Series(None, runs.index)
        margins = sorted(set(pd.to_numeric(raw[stalled], errors="coerce").fillna(contract.STALLED_MARGIN)))
        lines.append(f"- {int(stalled.sum())} stalled runs (train error at the end within "
                     f"{' / '.join(f'{m:g}' for m in margins)} of chance, the error of always predicting the "
                     "commonest training label"
                     + (f"; or collapsed, {collapsed} of them: ended {contract.COLLAPSE_RISE} or more above the "
                        "lowest train error they had reached" if collapsed else "")
                     + "): results, kept in every table and curve and counted in their `stalled` column.")
    spiked = runs["ended_in_spike"].fillna(False).astype(bool) if "ended_in_spike" in runs else None
    if spiked is not None and spiked.any():
        n = int(spiked.sum())
        lines.append(f"- {n} run{'s' if n > 1 else ''} ended inside a loss spike (final train error "
                     f"{contract.SPIKE_RISE} or more above the median of {'their' if n > 1 else 'its'} last "
                     f"{contract.SPIKE_WINDOW} readings; `analysis.load.result_flags`): results read at their final "
                     "errors, kept in every table and curve, counted in the tables' `ended in a spike` column.")
    low = runs["low_lr_stop"].fillna(False).astype(bool) if "low_lr_stop" in runs else pd.Series(False, runs.index)
    if low.any():
        n = int(low.sum())
        named = ", ".join(f"`{d}`" for d in runs.loc[low, "run_dir"])
        its = "their" if n > 1 else "its"
        lines.append(f"- {n} run{'s' if n > 1 else ''} stopped (converged or stalled) with {its} lr below "
                     f"10% of {its} base (the trainer's `low_lr_stop`): the train error may have "
                     f"stopped moving because the lr had annealed, not because the model had fitted ({named}). "
                     "Counted in the tables' `low-lr stops` column.")
    return [*lines, ""] if lines else []


def _failed(rep: Report, runs: pd.DataFrame, varied: list[str], paths: list[str]) -> None:
    """Failed runs (diverged to NaN, crashed, unreadable), counted per configuration and stop reason."""
    bad = runs[runs["status"].isin(["failed", "unknown"])]
    if bad.empty:
        return
    bad = bad.assign(stop_reason=bad["stop_reason"].fillna("-") if "stop_reason" in bad else "-",
                     _name=_run_names(bad["run_dir"], paths),
                     _error=bad["error"].fillna("").astype(str).str.slice(0, 120) if "error" in bad else "")
    seeds = bad["seed"] if "seed" in bad else pd.Series(None, bad.index)
    rows = []
    for key, g in bad.assign(_seed=seeds).groupby([*varied, "stop_reason"], dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip([*varied, "stop_reason"], key, strict=True)), "runs": len(g),
                     "seeds": ", ".join(str(v) for v in sorted(g["_seed"].dropna().unique())),
                     "run dirs": ", ".join(g["_name"]), "error": g["_error"].iloc[0]})
    rep.add("## Failed runs", "", f"{len(bad)} run{'s' if len(bad) > 1 else ''} failed (a loss that diverged to NaN, "
            "a crash, an unreadable summary); they are in no table or curve above. Per configuration:", "")
    rep.table(pd.DataFrame(rows), "failed_runs")
