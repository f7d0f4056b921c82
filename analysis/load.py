"""Run directories and Optuna storages into pandas.

A run directory is any folder holding ``.hydra/config.yaml`` (see the run-directory contract in
the README): ``metrics.jsonl`` (one JSON object per evaluation) and ``summary.json`` sit next to it.
"""
from __future__ import annotations

import difflib
import json
import statistics
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from hydra_plugins.vitsweep_sweeper.protocol import flatten_config
from src import run_contract as contract  # the run directory's flag rules, shared with the trainer

PathLike = str | Path
_EXPECTED = (
    "expected a Hydra output folder holding run directories, i.e. folders with "
    "'.hydra/config.yaml' next to 'summary.json'/'metrics.jsonl' "
    "(e.g. outputs/multirun/<date_time> or one of its numbered job folders)"
)


class MissingColumnError(KeyError):
    """A requested column is not in the frame; the message lists the close names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def require_columns(df: pd.DataFrame, *columns: str | None) -> None:
    """Raise MissingColumnError naming each missing column and the closest existing ones."""
    existing = [str(c) for c in df.columns]
    for col in columns:
        if col is None or col in df.columns:
            continue
        close = difflib.get_close_matches(col, existing, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise MissingColumnError(f"column '{col}' not found{hint} ({len(existing)} columns in all)")


def completed_only(df: pd.DataFrame, who: str, status: str | None = "completed") -> pd.DataFrame:
    """Keep rows whose status equals ``status`` (None keeps all); print how many were excluded."""
    if status is None or "status" not in df.columns:
        return df
    keep = df["status"] == status
    if (~keep).any():
        counts = df.loc[~keep, "status"].fillna("unknown").value_counts().to_dict()
        detail = ", ".join(f"{n} {s}" for s, n in counts.items())
        print(f"{who}: excluded {int((~keep).sum())} runs with status != {status} ({detail})")
    return df[keep]


def one_run_per_seed(df: pd.DataFrame, keys: list[str], metrics: list[str], who: str,
                     seed_col: str = "seed") -> pd.DataFrame:
    """``df`` with runs that repeat a (``keys``, seed) averaged into one row, so a repeat (the same grid read from
    two folders, a rerun beside the first run) never counts as an extra seed; warns when it averages.

    Runs that differ in a recipe key (a config key not in ``keys``, runtime keys aside: another dropout, weight
    decay, data file or stop limit) are not repeats of one seed but two settings: raises, naming the key, since
    averaged they would read as one seed of a smaller spread (``analysis.design.spread``'s power with it)."""
    if seed_col not in df.columns or df[seed_col].isna().all():
        return df
    cols = [*keys, seed_col]
    dup = df.duplicated(cols, keep=False) & df[seed_col].notna()  # runs without a seed are never repeats
    if not dup.any():
        return df
    differ = _recipe_differences(df[dup], cols)
    if differ:
        named = "; ".join(f"{k} ({', '.join(v)})" for k, v in differ.items())
        raise ValueError(f"{who}: runs of one ({', '.join(cols)}) differ in {named}: two recipes, not one seed run "
                         f"twice; keep them apart (by={[*differ]!r}, or a groupby on them) or read one study's folders")
    warnings.warn(f"{who}: {int(dup.sum())} runs repeat a seed of the same setting ({', '.join(cols)}); each "
                  "seed's runs are averaged and counted once", stacklevel=3)
    merged = df[dup].groupby(cols, dropna=False, sort=False, as_index=False)[metrics].mean()
    return pd.concat([df.loc[~dup, [*cols, *metrics]], merged], ignore_index=True)


# where the run read its data and which device trained it are not the recipe: the same grid read from a committed
# copy and a live one differs in dataset.root (as design.compare exempts them)
NOT_RECIPE = (*contract.STUDY_RUNTIME_KEYS, "hydra", "logger", "trial", "dataset.root", "trainer.device",
              "trainer.compile")


def recipe_columns(df: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The config columns of ``df`` (``df.attrs['config_columns']``, as :func:`load_runs` sets them; none for a frame
    without) that define what a run computed: not a key of ``NOT_RECIPE`` (or under one), not in ``exclude``."""
    exclude = set(exclude)
    return [k for k in df.attrs.get("config_columns", []) if k in df and k not in exclude
            and not any(k == r or k.startswith(r + ".") for r in NOT_RECIPE)]


def _recipe_differences(df: pd.DataFrame, cols: list[str]) -> dict[str, list[str]]:
    """Config keys (runtime keys aside) whose value differs within a group of ``cols`` -> the values seen."""
    keys = recipe_columns(df, cols)
    out = {}
    for k in keys:
        v = df[k].map(_norm)
        if (v.groupby([df[c] for c in cols], dropna=False).nunique(dropna=False) > 1).any():
            out[k] = sorted({str(x) for x in v})
    return out


def _norm(v):
    """One spelling of a config value: 8, 8.0 and "8" alike; NaN and None alike."""
    if v is None or (isinstance(v, float) and v != v):
        return "nan"
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def find_run_dirs(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Every folder under ``paths`` (recursively, the paths themselves included) holding .hydra/config.yaml."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    if not paths:
        raise FileNotFoundError(f"no folders given; {_EXPECTED}")
    found: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"'{p}' does not exist; {_EXPECTED}")
        if not p.is_dir():
            raise NotADirectoryError(f"'{p}' is a file; {_EXPECTED}")
        found.update(cfg.parent.parent.resolve() for cfg in p.rglob(".hydra/config.yaml"))
    if not found:
        raise FileNotFoundError(f"no run directories under {', '.join(map(str, paths))}; {_EXPECTED}")
    return sorted(found, key=_natural_key)


def _natural_key(p: Path) -> list:
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in p.as_posix().split("/")]


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts to dotted keys (the sweeper's and the trainer's flattener); an empty dict below the top becomes
    None and lists become tuples, so that columns stay hashable for groupby."""
    if not d:
        return {}
    return {k: _column_value(v) for k, v in flatten_config(d, prefix).items()}


def _column_value(v):
    if isinstance(v, dict):  # an empty one: flatten_config keeps it as a leaf
        return None
    if isinstance(v, list):
        return tuple(tuple(x) if isinstance(x, list) else x for x in v)
    return v


def read_config(run_dir: Path, ended: bool = False) -> dict:
    """The run's composed config as a flat dict; interpolations resolved where they can be. ``ended``: the run has
    a summary, so the config it ended under (``config.json``, the trainer's) is read where there is one: Hydra
    rewrites ``.hydra/config.yaml`` before the trainer's checks, so a start refused in a finished run's dir (another
    config, bad input) left the finished results there under the refused command's config."""
    path = run_dir / "config.json"
    if ended and path.is_file():
        try:
            return flatten(json.loads(path.read_text()))
        except (OSError, ValueError):
            warnings.warn(f"{path}: unreadable; reading .hydra/config.yaml", stacklevel=3)
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    try:
        return flatten(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # e.g. ${hydra:...} resolvers that only exist inside a running job
        flat = flatten(OmegaConf.to_container(cfg, resolve=False))
        for key in list(flat):
            try:
                flat[key] = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
            except Exception:
                pass
        return flat


def read_summary(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        warnings.warn(f"{path}: unreadable summary ({e}); run kept with status 'unknown'", stacklevel=3)
        return {"status": "unknown"}


def _trial_of_run_dir(run_dir: Path):
    from hydra_plugins.vitsweep_sweeper.protocol import trial_of_run_dir

    try:
        return trial_of_run_dir(run_dir)
    except Exception:  # an unreadable Hydra record names no trial
        return None


def _run_record(run_dir: Path) -> tuple[dict, list[str]]:
    summary = read_summary(run_dir)
    row = read_config(run_dir, ended=summary is not None)
    config_cols = list(row)
    if summary is None:  # training, killed, or (no metrics.jsonl: the trainer's set-up never ran) a start that
        # its checks refused, which Hydra's record of the job outlives
        row["status"] = "running" if (run_dir / "metrics.jsonl").exists() else "not started"
        trial = _trial_of_run_dir(run_dir)  # a job killed before its summary: its trial is in its Hydra record
        if trial is not None:
            row.setdefault("study_name", trial.study_name)
            row.setdefault("trial_number", trial.number)
            row.setdefault("study_storage", trial.storage)
    else:
        for k, v in summary.items():
            v = tuple(v) if isinstance(v, list) else v
            if isinstance(v, dict):
                row.update(flatten(v, f"{k}."))
            elif k in row and row[k] != v:
                row[f"summary.{k}"] = v  # the trainer recorded something other than the config
            else:
                row[k] = v
    if summary is not None:  # from its metrics: the lowest train error the run reached (the trainer's record where
        # it kept one) and its recent one, the median of its last readings (a final reading inside a spike stands out)
        path = run_dir / "metrics.jsonl"
        readings = [m["train_error"] for m in (read_metrics(path) if path.is_file() else [])
                    if isinstance(m.get("train_error"), int | float)]
        lowest = row.get("best_train_error")
        if not isinstance(lowest, int | float):
            lowest = min(readings, default=None)
        if lowest is not None:
            row["min_train_error"] = lowest
        if readings:
            row["recent_train_error"] = float(statistics.median(readings[-contract.SPIKE_WINDOW:]))
    if "study_name" not in row and row.get("trial.study_name") is not None:
        row["study_name"] = row["trial.study_name"]
    if "trial_number" not in row and row.get("trial.number") is not None:
        row["trial_number"] = row["trial.number"]
    if "study_storage" not in row and row.get("trial.storage") is not None:  # runs written before the protocol
        row["study_storage"] = row["trial.storage"]
    row["run_dir"] = str(run_dir)
    return row, config_cols


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


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl rows; an unreadable line (e.g. truncated by a kill) is skipped with a warning."""
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                warnings.warn(f"{path}:{lineno}: skipped unreadable line ({e.msg})", stacklevel=2)
                continue
            if not isinstance(obj, dict):
                warnings.warn(f"{path}:{lineno}: skipped line that is not a JSON object", stacklevel=2)
                continue
            rows.append(obj)
    return rows


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
    frames = [hist.assign(**{k: [v] * len(hist) for k, v in run.items() if k not in hist.columns})  # lists whole
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
