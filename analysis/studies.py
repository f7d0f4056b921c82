"""The Optuna studies runs name: opening their storages (a moved SQLite file too) and reading trial states."""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd


def studies_of(df: pd.DataFrame) -> Iterator[tuple[str, str, pd.Series, str]]:
    """(storage as recorded, study name, the rows of its runs, the storage to open) for every Optuna study the runs
    name (``study_storage``, ``study_name``); a moved SQLite file is found beside its runs (``_moved_sqlite``)."""
    if not {"study_storage", "study_name"} <= set(df.columns):
        return
    for storage, study_name in df[["study_storage", "study_name"]].dropna().drop_duplicates().itertuples(index=False):
        sel = (df["study_storage"] == storage) & (df["study_name"] == study_name)
        yield storage, study_name, sel, _moved_sqlite(storage, df.loc[sel, "run_dir"]) or storage


def _optuna_states(df: pd.DataFrame) -> pd.Series:
    states = pd.Series(None, index=df.index, dtype=object)
    for storage, study_name, sel, found in studies_of(df):
        try:
            trials = _study_trials(found, study_name)
        except Exception as e:  # storage moved, or a relative sqlite path from another cwd
            warnings.warn(f"cannot open Optuna study '{study_name}' at {storage}: {e}", stacklevel=3)
            continue
        states[sel] = df.loc[sel, "trial_number"].map(
            lambda n, trials=trials: trials.get(int(n)) if pd.notna(n) else None
        )
    return states


def _moved_sqlite(storage: str, run_dirs: Iterable[str]) -> str | None:
    """The SQLite storage of a sweep folder that was moved or copied (a study's committed state/, another machine):
    when the recorded file is gone, the file of the same name in the folder holding the runs, if there is one."""
    if not storage.startswith("sqlite:///"):
        return None
    recorded = Path(storage.removeprefix("sqlite:///").split("?", 1)[0])
    if recorded.is_file():
        return None
    for folder in sorted({Path(d).parent for d in run_dirs}):
        if (folder / recorded.name).is_file():
            return f"sqlite:///{(folder / recorded.name).resolve()}"
    return None


def open_study_storage(storage: str):
    """The Optuna storage at ``storage``, any URL the sweeper records as a run's ``study_storage`` (SQLite, a journal
    file, PostgreSQL, MySQL), opened through the sweeper's public protocol. A local file must exist: opening a
    missing one would create it, and reading must never write."""
    from hydra_plugins.vitsweep_sweeper.protocol import open_existing_storage

    return open_existing_storage(storage)


def _study_trials(storage: str, study_name: str) -> dict[int, str]:
    """Trial number -> state name. A trial failed as interrupted whose retries carried on in its run dir (the
    sweeper's `retry_of` chain) gets the state of the last retry, named: a run that finished while its trial was not
    told (a killed sweep) keeps that trial's number in its summary, and its result was reported by the retry."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=open_study_storage(storage))
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    retry = {t.user_attrs["retry_of"]: t.number for t in trials.values() if "retry_of" in t.user_attrs}
    states = {}
    for number, t in trials.items():
        last = t
        while last.number in retry and last.state == optuna.trial.TrialState.FAIL:
            last = trials[retry[last.number]]
        states[number] = t.state.name if last is t else f"{last.state.name} (as retry {last.number})"
    return states
