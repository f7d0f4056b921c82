"""The trial/storage protocol's implementation; import it as ``hydra_plugins.vitsweep_sweeper.protocol``."""


import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV", "Reporter", "TrialIdentity", "current_trial", "env_overrides", "make_reporter",
           "open_existing_storage", "open_storage", "trial_of_env", "trial_of_hydra", "trial_of_run_dir"]

ENV = {"study_name": "VITSWEEP_TRIAL_STUDY", "number": "VITSWEEP_TRIAL_NUMBER", "storage": "VITSWEEP_TRIAL_STORAGE"}
Reporter = Callable[[float, int], bool]  # (objective, epoch) -> prune?


@dataclass(frozen=True)
class TrialIdentity:
    """Which trial of which study a job runs, and where the study is stored (an Optuna storage URL)."""
    study_name: str
    number: int
    storage: str


def env_overrides(trial: TrialIdentity) -> list[str]:
    """The Hydra overrides that hand ``trial`` to its job (``hydra.job.env_set``, quoted for the override parser)."""
    values = {"study_name": trial.study_name, "number": str(trial.number), "storage": trial.storage}
    return [f"++hydra.job.env_set.{ENV[k]}={quote(v)}" for k, v in values.items()]


def quote(text: str) -> str:
    """``text`` as a single-quoted value of Hydra's override grammar (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _from(values: Mapping[str, Any]) -> TrialIdentity | None:
    got = {k: values.get(var) for k, var in ENV.items()}
    if any(v is None or str(v) == "" for v in got.values()):
        return None
    return TrialIdentity(str(got["study_name"]), int(got["number"]), str(got["storage"]))


def trial_of_env(env: Mapping[str, str] | None = None) -> TrialIdentity | None:
    """The trial this process runs (Hydra exports ``hydra.job.env_set`` while a task runs), or None."""
    return _from(os.environ if env is None else env)


def trial_of_hydra(hydra_cfg: Any) -> TrialIdentity | None:
    """The trial of a job's Hydra config (the ``hydra`` node, or ``HydraConfig.get()``), or None."""
    job = hydra_cfg.get("job") if hasattr(hydra_cfg, "get") else None
    env_set = job.get("env_set") if job is not None else None
    return _from(env_set or {})


def trial_of_run_dir(run_dir: str | Path) -> TrialIdentity | None:
    """The trial recorded in a run dir's ``.hydra/hydra.yaml`` (Hydra's default ``hydra.output_subdir``), or None."""
    path = Path(run_dir) / ".hydra" / "hydra.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    return trial_of_hydra(OmegaConf.load(path).get("hydra") or {})


def current_trial(run_dir: str | Path | None = None) -> TrialIdentity | None:
    """The trial a job runs: from the environment, else from ``run_dir``'s Hydra record; None outside a sweep."""
    return trial_of_env() or (trial_of_run_dir(run_dir) if run_dir is not None else None)


def open_storage(url: str, existing: bool = False):
    """Open an Optuna storage by URL (``sqlite:///``, ``journal://``, PostgreSQL, MySQL); errors name
    ``hydra.sweeper.storage``. ``existing=True`` skips creating tables (a job or a reader of a sweep's storage)."""
    from . import _storage as storage  # optuna loads only when a storage is opened

    return storage.open_storage(url, existing=existing)


def open_existing_storage(url: str):
    """Open a storage for reading only: a local file (SQLite, journal) must exist, since opening a missing
    one would create it."""
    from ._storage import journal_path, normalize, sqlite_path

    url = normalize(url)
    local = sqlite_path(url) or journal_path(url)
    if local is not None and not Path(local.split("?", 1)[0]).is_file():
        raise FileNotFoundError(f"no such file {local} (relative paths are from {Path.cwd()})")
    return open_storage(url, existing=True)


def make_reporter(trial: TrialIdentity | None) -> Reporter | None:
    """None outside a sweep (or in a multi-objective study); else ``report(value, epoch) -> prune?``, which records
    the objective as the trial's intermediate value at ``epoch`` and asks the study's pruner."""
    if trial is None:
        return None
    import optuna

    from ._study import pruner_from_study

    storage = open_storage(trial.storage, existing=True)
    study_id = storage.get_study_id_from_name(trial.study_name)
    study = optuna.load_study(study_name=trial.study_name, storage=storage,
                              pruner=pruner_from_study(storage, study_id))
    if len(study.directions) > 1:
        return None  # Optuna prunes single-objective studies only
    handle = optuna.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, trial.number))

    def report(value: float, epoch: int) -> bool:
        if not math.isfinite(value):
            return False  # the trainer stops on a non-finite loss by itself
        handle.report(float(value), int(epoch))
        return handle.should_prune()

    return report
