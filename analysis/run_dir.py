"""One run directory read into one row: its config, summary and metrics (the contract in docs/run_dir.md)."""
from __future__ import annotations

import functools
import json
import statistics
import warnings
from collections.abc import Iterable
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from hydra_plugins.vitsweep_sweeper.protocol import flatten_config
from src import run_contract as contract  # the run directory's contract (SPIKE_WINDOW), shared with the trainer

PathLike = str | Path
_EXPECTED = (
    "expected a Hydra output folder holding run directories, i.e. folders with "
    "'.hydra/config.yaml' next to 'summary.json'/'metrics.jsonl' "
    "(e.g. outputs/multirun/<date_time> or one of its numbered job folders)"
)


def find_run_dirs(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """Every folder under ``paths`` (recursively, the paths themselves included) holding .hydra/config.yaml, in the
    order the paths are given (each path's in natural order; one found under two paths comes with the first).

    The order given is kept: a declared test lists the studies it pools in that order, and reads which started
    after the ones before had finished from it (``analysis.design.sources``); sorted all together, the run dirs of
    ``[later, earlier]`` came back ``earlier``'s first (review 2026-11-29, analysis)."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    if not paths:
        raise FileNotFoundError(f"no folders given; {_EXPECTED}")
    found: dict[Path, None] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"'{p}' does not exist; {_EXPECTED}")
        if not p.is_dir():
            raise NotADirectoryError(f"'{p}' is a file; {_EXPECTED}")
        here = {cfg.parent.parent.resolve() for cfg in p.rglob(".hydra/config.yaml")}
        found.update(dict.fromkeys(sorted(here, key=_natural_key)))
    if not found:
        raise FileNotFoundError(f"no run directories under {', '.join(map(str, paths))}; {_EXPECTED}")
    return list(found)


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
    text = (run_dir / ".hydra" / "config.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_yaml_loader())
    if isinstance(data, dict) and "${" not in text:  # nothing to resolve: OmegaConf would hand the same dict back
        return flatten(data)
    cfg = OmegaConf.create(data)
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


@functools.cache
def _yaml_loader() -> type:
    """OmegaConf's YAML loader (its float forms, no timestamps, duplicate keys refused) on libyaml's parser where
    PyYAML has it: ``OmegaConf.load`` parses in pure Python, 10 ms a run's config, the largest part of reading a
    study's records (``make reports``; tests/test_analysis.py checks both loaders agree)."""
    from omegaconf._utils import get_yaml_loader

    base = get_yaml_loader()
    if not getattr(yaml, "__with_libyaml__", False):
        return base

    class Loader(yaml.cyaml.CParser, base):  # as yaml.CSafeLoader: the C parser, the Python constructor and resolver
        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

    return Loader


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
