"""Run directories and Optuna storages into pandas.

A run directory is any folder holding ``.hydra/config.yaml`` (see the run-directory contract in
the README): ``metrics.jsonl`` (one JSON object per evaluation) and ``summary.json`` sit next to it.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis.run_dir import _EXPECTED, PathLike, _run_record, find_run_dirs, read_metrics
from analysis.studies import _optuna_states, open_study_storage
from src import run_contract as contract  # the run directory's flag rules, shared with the trainer


def load_runs(paths: PathLike | Iterable[PathLike], optuna_state: bool = True) -> pd.DataFrame:
    """One row per run dir under ``paths``: dotted config columns, summary.json fields, run_dir.

    Runs without summary.json get status 'running', or 'not started' without metrics.jsonl either (a start its
    checks refused); 'failed' when their trial, named by the run's Hydra record, was told FAIL. Every row gets the
    flags ``stalled`` and ``low_lr_stop``
    (see :func:`result_flags`); a stalled run is a completed result, also when it was written before that contract.
    When a run is an Optuna trial whose storage
    (summary key ``study_storage``; config key ``trial.storage`` in runs written before it) can be opened,
    ``optuna_state`` holds the trial's state name.
    ``df.attrs['config_columns']`` lists the columns that came from the config.
    """
    rows, config_cols = [], {}
    for run_dir in find_run_dirs(paths):
        row, cols = _run_record(run_dir)
        rows.append(row)
        config_cols.update(dict.fromkeys(cols))
    df = result_flags(pd.DataFrame(rows))
    if optuna_state and "study_storage" in df.columns and "study_name" in df.columns:
        df["optuna_state"] = _optuna_states(df)
        dead = df["status"].isin(["running", "not started"]) & (df["optuna_state"] == "FAIL")
        df.loc[dead, "status"] = "failed"  # no summary, and its trial was told FAIL: not running any more
    df.attrs["config_columns"] = list(config_cols)
    return df


def result_flags(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the run-result flags of the summary.json contract, filled in for runs written before it.

    ``stalled``: the train error stayed at chance (``stop_reason == 'stalled'``), or a completed run ended with it
    within the trainer's ``stalled_margin`` (0.01) of chance (``chance_train_error``) for another reason, e.g. a
    model that learned, collapsed to one class and, its train error flickering, ran to the epoch cap (the trainer
    records this in `stalled`; summaries written before it did say false), or it ``collapsed``: its train error ended
    ``COLLAPSE_RISE`` (0.5) or more above the lowest it reached (``min_train_error``: the summary's
    ``best_train_error``, or metrics.jsonl for older runs), e.g. a model that nearly fit its labels and then lost
    them to a loss spike, ending a few points below chance. Either way it did not end as a learned model.
    ``ended_in_spike``: a finished run, not collapsed, whose final train error lies ``SPIKE_RISE`` (0.05) or more above
    ``recent_train_error``, the median of its last ``SPIKE_WINDOW`` (20) readings in metrics.jsonl: a learned model
    read inside a transient loss spike (its final errors are the spike's; the analysis says so). Neither
    chance rule applies where one class is a majority (``chance_train_error`` below ``MIN_CHANCE_ERROR``, 0.5), as
    in the trainer. Such a run is a result (its test and train errors are real) and gets ``status`` 'completed';
    runs written before the contract recorded it as 'failed' with a NaN objective, which is then taken from the
    metric ``objective_name`` names. ``low_lr_stop``: the trainer's flag (it stopped as converged or stalled with
    the lr below a tenth of its base; the flag came with ``lr_at_stop`` and ``base_lr``, so a run without it
    predates all three: False). ``capped``, only where some run has a convergence rule (``trainer.converge_epochs``):
    a completed run with that rule that ended at its epoch or step cap, so it did not converge. Runs that diverged
    (``nonfinite_loss``) stay failed."""
    if df.empty:
        return df
    df = df.copy()
    reason = df["stop_reason"] if "stop_reason" in df else pd.Series(None, index=df.index, dtype=object)
    recorded = df["stalled"] if "stalled" in df else pd.Series(None, index=df.index, dtype=object)
    stalled = recorded.where(recorded.notna(), reason == "stalled").astype(bool)
    collapsed = pd.Series(False, index=df.index)
    if "chance_train_error" in df and "train_error" in df:  # the run directory's contract (src.run_contract, the
        # trainer's own rules); they hold for finished runs only
        chance = pd.to_numeric(df["chance_train_error"], errors="coerce")
        final = pd.to_numeric(df["train_error"], errors="coerce")
        finished = df["status"] == "completed"
        # a null trainer.stalled_margin (the stop rule off) reads as NaN here, so it gets the default too: this
        # column says the run ended at chance, which holds whatever the stop rule was told
        raw = df["trainer.stalled_margin"] if "trainer.stalled_margin" in df else pd.Series(None, index=df.index)
        margin = pd.to_numeric(raw, errors="coerce").fillna(contract.STALLED_MARGIN)
        stalled |= (finished & contract.at_chance(final, chance, margin)).fillna(False).astype(bool)
        if "min_train_error" in df:
            lowest = pd.to_numeric(df["min_train_error"], errors="coerce")
            collapsed = (finished & contract.collapsed(final, lowest, chance)).fillna(False).astype(bool)
    df["collapsed"] = collapsed
    spiked = pd.Series(False, index=df.index)
    if "recent_train_error" in df and "train_error" in df:  # a finished run not collapsed whose final train error
        # reads a transient spike above its recent readings
        recent = pd.to_numeric(df["recent_train_error"], errors="coerce")
        final = pd.to_numeric(df["train_error"], errors="coerce")
        spiked = ((df["status"] == "completed") & ~collapsed & contract.ended_in_spike(final, recent)).fillna(False)
    df["ended_in_spike"] = spiked.astype(bool)
    stalled |= collapsed
    df["stalled"] = stalled
    df.loc[stalled, "status"] = "completed"
    if "objective" in df and "objective_name" in df:
        for i in df.index[stalled & df["objective"].isna()]:
            name = df.at[i, "objective_name"]
            if isinstance(name, str) and name in df and pd.notna(df.at[i, name]):
                df.at[i, "objective"] = df.at[i, name]
    df["low_lr_stop"] = df["low_lr_stop"].fillna(False).astype(bool) if "low_lr_stop" in df else False
    rule = "trainer.converge_epochs"
    on = pd.to_numeric(df[rule], errors="coerce").fillna(0) > 0 if rule in df else None  # 0 and null: the rule off
    if on is not None and on.any():  # a study stopped by convergence: a run at its cap did not converge
        ended = df["stop_reason"] if "stop_reason" in df else pd.Series(None, index=df.index, dtype=object)
        df["capped"] = (df["status"] == "completed") & on & ended.isin(["max_epochs", "max_steps"])
    return df


def load_history(paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """One row per evaluation (metrics.jsonl line) of every run, plus its config columns and the run's status and flags
    (:func:`result_flags`, from the run's final numbers)."""
    records, hists = [], []
    for run_dir in find_run_dirs(paths):
        path = run_dir / "metrics.jsonl"
        metrics = read_metrics(path) if path.exists() else []
        if metrics:
            records.append(_run_record(run_dir)[0])
            hists.append(pd.DataFrame(metrics))
    if not hists:
        raise FileNotFoundError(f"no metrics.jsonl with readable lines under {paths}; {_EXPECTED}")
    # each run's flags and status from its own final numbers (a stalled run is a result), not from each epoch's: an
    # epoch at chance early in a run that learned is no stalled run
    runs = result_flags(pd.DataFrame(records))
    # a run's columns join its history as one frame (lists whole), not one insert per column: 4 s on heads_depth
    frames = [pd.concat([hist, pd.DataFrame({k: [v] * len(hist) for k, v in run.items() if k not in hist.columns},
                                            index=hist.index)], axis=1)
              for hist, (_, run) in zip(hists, runs.iterrows(), strict=True)]
    return pd.concat(frames, ignore_index=True)


def load_study(storage: str, study_name: str, paths: PathLike | Iterable[PathLike] | None = None) -> pd.DataFrame:
    """Optuna's trials table joined to the runs (``runs_*`` columns are from load_runs).

    Runs are matched by the trial's user attribute ``run_dir`` when it names a run read, else by the summary's
    ``study_name``/``trial_number`` among the runs that record this storage. A run retried in its run dir belongs to
    the last attempt (the trial that reported it), not to the failed trials before it. Runs are read from ``paths``,
    or else from the run_dir attributes.
    """
    import optuna

    opened = open_study_storage(storage)
    try:
        study = optuna.load_study(study_name=study_name, storage=opened)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(opened)]
        raise ValueError(f"no study '{study_name}' in {storage}; studies there: {names}") from None
    trials = study.trials_dataframe()
    if trials.empty:
        return trials
    if paths is None:
        if "user_attrs_run_dir" not in trials.columns:
            raise ValueError(f"study '{study_name}' has no user attr run_dir; pass paths= (the sweep folder)")
        paths = [p for p in trials["user_attrs_run_dir"].dropna().unique() if Path(p).is_dir()]
    runs = load_runs(paths, optuna_state=False)
    by_number = _runs_by_number(runs, storage, study_name)
    attr = trials.get("user_attrs_run_dir", pd.Series(None, index=trials.index, dtype=object))
    present = set(runs["run_dir"])
    key = []
    for a, n in zip(attr, trials["number"], strict=True):
        k = str(Path(a).resolve()) if isinstance(a, str) else None
        key.append(k if k in present else by_number.get(int(n)))  # a stale attribute (a moved folder): the number
    # a retry runs in its failed trial's run dir: the run is the last attempt's, the one that reported it
    owner: dict[str, int] = {}
    for i, k in enumerate(key):
        if k is not None:
            owner[k] = i
    key = [k if k is not None and owner[k] == i else None for i, k in enumerate(key)]
    joined = trials.assign(_key=key).merge(runs.add_prefix("runs_"), how="left", left_on="_key",
                                           right_on="runs_run_dir")
    return joined.drop(columns="_key")


def _same_storage(a: object, b: str) -> bool:
    """Whether a run's recorded storage URL names the storage ``b`` (SQLite and journal files compared as paths)."""
    from hydra_plugins.vitsweep_sweeper.protocol import storage_file

    fa, fb = storage_file(a), storage_file(b)
    if fa is not None and fb is not None:
        return fa.resolve() == fb.resolve()
    return a == b


def _runs_by_number(runs: pd.DataFrame, storage: str, study_name: str) -> dict[int, str]:
    """Trial number -> run dir, for the runs of ``study_name`` in ``storage``: the runs recording that storage; when
    none does (the storage was moved or copied), every run of the study's name, a number two runs claim left unjoined
    with a warning."""
    if "trial_number" not in runs.columns:
        return {}
    mine = runs[runs["study_name"] == study_name] if "study_name" in runs.columns else runs
    mine = mine[mine["trial_number"].notna()]
    if "study_storage" in mine.columns:
        here = mine["study_storage"].map(lambda a: _same_storage(a, storage))
        if here.any():
            mine = mine[here]
    claimed = mine.groupby("trial_number")["run_dir"].agg(list)
    twice = {int(n): d for n, d in claimed.items() if len(d) > 1}
    if twice:
        warnings.warn(f"load_study: trial numbers {sorted(twice)} of '{study_name}' are claimed by more than one run "
                      "(two sweeps of one study name under paths?); those trials are left unjoined", stacklevel=3)
    return {int(n): d[0] for n, d in claimed.items() if len(d) == 1}
