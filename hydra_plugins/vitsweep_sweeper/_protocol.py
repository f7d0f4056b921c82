"""The trial/storage protocol's implementation; import it as ``hydra_plugins.vitsweep_sweeper.protocol``."""


import contextlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ENV", "Reporter", "TrialIdentity", "TrialTakenOver", "config_differences", "current_trial", "declare_app",
           "declared_grid",
           "env_overrides", "file_lock", "flatten_config", "implied_direction", "job_exception", "make_reporter",
           "open_existing_storage", "open_storage", "runtime_keys", "stacker", "storage_file", "study_constant",
           "trial_of_env",
           "trial_of_hydra", "trial_of_run_dir"]

ENV = {"study_name": "VITSWEEP_TRIAL_STUDY", "number": "VITSWEEP_TRIAL_NUMBER", "storage": "VITSWEEP_TRIAL_STORAGE"}
Reporter = Callable[[float, int], bool]  # (objective, epoch) -> prune?


class TrialTakenOver(RuntimeError):
    """Raised by a reporter whose trial another worker has finished: it failed this worker as not answering (a
    suspended process, a frozen host) and retried the trial, so the retry now stands for this point. The job
    should stop as after SIGTERM (keep its last checkpoint, which the retry resumes) and report nothing more."""


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
    """The trial a job runs: from the environment, else from ``run_dir``'s Hydra record; None outside a sweep.
    Inside the Hydra job whose output dir is ``run_dir``, the record is the running job's Hydra config, read from
    memory: parsing ``hydra.yaml`` took 40 ms, twice for every job of a grid (docs/benchmarks/README.md)."""
    found = trial_of_env()
    if found is not None or run_dir is None:
        return found
    running = _running_hydra(run_dir)
    return trial_of_hydra(running) if running is not None else trial_of_run_dir(run_dir)


def _running_hydra(run_dir: str | Path) -> Any:
    """The running Hydra job's config (what it writes to ``.hydra/hydra.yaml``) when ``run_dir`` is its output
    dir; else None (no job runs, or another job's run dir, as for stacked members)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    cfg = HydraConfig.get()
    output_dir = cfg.runtime.get("output_dir") if cfg.get("runtime") is not None else None
    if not output_dir or Path(output_dir).resolve() != Path(run_dir).resolve():
        return None
    return cfg


def open_storage(url: str, existing: bool = False):
    """Open an Optuna storage by URL (``sqlite:///``, ``journal://``, PostgreSQL, MySQL); errors name
    ``hydra.sweeper.storage``. ``existing=True`` skips creating tables (a job or a reader of a sweep's storage)."""
    from . import _storage as storage  # optuna loads only when a storage is opened

    return storage.open_storage(url, existing=existing)


def storage_file(url: object) -> Path | None:
    """The local file of a storage URL (SQLite, journal file) as written, query dropped; None for a server."""
    from ._storage import journal_path, sqlite_path

    if not isinstance(url, str):
        return None
    local = sqlite_path(url) or journal_path(url)
    return Path(local.split("?", 1)[0]) if local is not None else None


def open_existing_storage(url: str):
    """Open a storage for reading only: a local file (SQLite, journal) must exist, since opening a missing
    one would create it."""
    from ._storage import normalize

    url = normalize(url)
    local = storage_file(url)
    if local is not None and not local.is_file():
        raise FileNotFoundError(f"no such file {local} (relative paths are from {Path.cwd()})")
    return open_storage(url, existing=True)


def declared_grid(url: str, study_name: str) -> dict[str, list] | None:
    """The grid a grid study declared when it started, ``{param: [values]}`` as the sweeper stored it for resumes,
    or None (not a grid study, or written before the sweeper kept it). Reads only; a local file must exist."""
    from ._study import GRID_ATTR, study_id

    storage = open_existing_storage(url)
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    return storage.get_study_system_attrs(study_id(study)).get(GRID_ATTR)


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
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    handle = optuna.Trial(study, trial_id)
    # a retry carries the epochs its original reported (the sweeper copies them): its run, resumed from a checkpoint,
    # may report some of them again; they stay as recorded, and the pruner already let the point go on past them
    recorded = set(storage.get_trial(trial_id).intermediate_values)

    def report(value: float, epoch: int) -> bool:
        if int(epoch) in recorded:
            return False
        if not math.isfinite(value):
            return False  # the trainer stops on a non-finite loss by itself
        from optuna.exceptions import UpdateFinishedTrialError

        try:
            handle.report(float(value), int(epoch))
        except UpdateFinishedTrialError:
            raise TrialTakenOver(f"trial {trial.number} of study {trial.study_name!r} was finished by another "
                                 "worker (failed as not answering, then retried): its retry stands for this "
                                 "point, so this run stops and leaves its last checkpoint to it") from None
        return handle.should_prune()

    return report


def study_constant(trial: TrialIdentity, key: str, value: Any) -> Any:
    """The value of ``key`` that every job of ``trial``'s study must share, such as the metric its task returns: the
    first job to ask records its ``value`` (a study system attr ``vitsweep:<key>``) and gets it back; every later job
    gets that recorded value, to refuse itself when its own differs. Under the sweeper's claim lock, so two first jobs
    cannot both record theirs."""
    from . import _storage as storage

    opened = open_storage(trial.storage, existing=True)
    study_id = opened.get_study_id_from_name(trial.study_name)
    attr = f"vitsweep:{key}"
    with storage.claim_lock(trial.storage, opened, study_id):
        recorded = opened.get_study_system_attrs(study_id)
        if attr in recorded:
            return recorded[attr]
        opened.set_study_system_attr(study_id, attr, value)
    return value


# ------------------------------------------------------------------------------------ what the app declares
# What an app tells the sweeper about its task (declare_app); empty in an app that declares nothing
_APP: dict[str, Any] = {"objective": None, "direction": None, "runtime_keys": ("hydra",), "stacker": None}


def declare_app(objective: str | None = None, direction: Callable[[str], str] | None = None,
                runtime_keys: Iterable[str] = (), stacker: str | None = None) -> None:
    """Tell the sweeper how to read this app's task; call it when the module that holds ``@hydra.main`` is imported,
    so the sweep's main process and its worker processes (which rerun the same command) all have it.

    ``objective`` is the config key that names what the task returns, and ``direction(value)`` the
    ``minimize``/``maximize`` that its value implies: ``hydra.sweeper.direction`` defaults to it, and a direction that
    contradicts it is refused before any trial (an accuracy minimised would look like a finished study).
    ``runtime_keys`` are config keys (each with everything under it) that a rerun may change without changing what a
    trial computes, such as threads and progress bars: the recipe check that guards a resumed study ignores them.
    Not a trial's length: finished trials keep theirs, so a study resumed under another would mix two budgets. An
    app that declares nothing gets ``minimize`` (hydra-optuna-sweeper's default) and a recipe check
    over every key but ``hydra``.

    ``stacker`` is the module path of the app's stacked training, for the vectorized launcher
    (``hydra.launcher.stack``): its ``plan_groups(task_configs, max_members, strict)`` gives the positions of the
    jobs to train together (one list per unit), and ``train_stacked(task_configs, run_dirs, reporters, sweep_dir)``
    trains one group and returns, per job, what the task returns or the exception that ended it; where it also takes
    ``on_done``, it calls ``on_done(position, that)`` for each job that ends for good while the group runs (stopped by
    its own rules, or found finished at its start; not one interrupted by a stop signal, nor one whose set-up failed),
    and the launcher tells the sweeper at once: a stop then hands back only the jobs still training. Without one,
    every job runs alone."""
    _APP.update(objective=objective, direction=direction, runtime_keys=("hydra", *runtime_keys), stacker=stacker)


def objective_key() -> str | None:
    """The config key that names what the task returns, as the app declared it (None: not declared)."""
    return _APP["objective"]


def implied_direction(job_config: Any) -> tuple[str, str, str] | None:
    """``(objective key, its value, direction)`` as the app declared them for this job config, or None (no
    declaration, or the key is not in the config)."""
    key, rule = _APP["objective"], _APP["direction"]
    if key is None or rule is None:
        return None
    from omegaconf import OmegaConf

    value = OmegaConf.select(job_config, key, default=None)
    return None if value is None else (key, str(value), rule(str(value)))


def stacker() -> str | None:
    """The module path of the app's stacked training, or None."""
    return _APP["stacker"]


def runtime_keys() -> tuple[str, ...]:
    """The keys a rerun may change (``hydra`` and what the app declared)."""
    return _APP["runtime_keys"]


def job_exception(ret: Any) -> BaseException:
    """The exception a failed Hydra job raised. ``JobReturn.return_value``, Hydra's public way, re-raises it and
    writes "Error executing job" to stderr, so this is the one place that reads the private ``_return_value``."""
    return ret._return_value


def flatten_config(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config (plain mappings) as ``{"dotted.key": leaf}``; an empty mapping stays a leaf ``{}`` and a list
    is a leaf. The one flattener of the sweeper's recipes, the trainer's checkpoints and the analysis tables."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten_config(v, f"{prefix}{k}."))
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                       ignore: Iterable[str] | None = None, strict: bool = False) -> list[str]:
    """``key: saved -> current`` for every key that differs between two configs (nested or flattened), except the
    ``ignore`` keys and everything under them (default: ``runtime_keys()``). A key absent from one side equals a null
    on the other, unless ``strict``."""
    skip = tuple(runtime_keys() if ignore is None else ignore)
    a, b = flatten_config(saved), flatten_config(current)
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in sorted(a.keys() | b.keys())
            if not any(k == r or k.startswith(r + ".") for r in skip)
            and (a.get(k) != b.get(k) or (strict and (k in a) != (k in b)))]


@contextlib.contextmanager
def file_lock(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive POSIX lock on ``path`` (created if absent) for the block: processes on one machine take turns
    (the sweeper's storage creation and claims, the trainer's start-up probe cache, a run's dir). ``on_wait()`` is
    called once when another process holds it, before waiting. Without ``fcntl`` (Windows) the block runs
    unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
