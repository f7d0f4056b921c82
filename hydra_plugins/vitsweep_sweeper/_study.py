"""Study plumbing shared by the sweeper and the trial reporter: storage, budget, claims, progress."""

import contextlib
import fcntl
import math
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import optuna
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial, TrialState

from .config import PRUNERS, SAMPLERS

PRUNER_ATTR = "vitsweep:pruner"  # study system attr: the pruner config, read by every trial process
WORKER_ATTR = "vitsweep:worker"  # trial system attr: "host:pid" of the process running it
SQLITE_TIMEOUT_S = 120  # how long a worker waits for another one's SQLite write lock


def open_storage(url: str, existing: bool = False) -> optuna.storages.BaseStorage:
    """Open (and create the tables of) an RDB storage; errors name `hydra.sweeper.storage`.
    `existing=True` skips the table and version checks (a job opening its sweeper's storage)."""
    try:
        engine_kwargs: Dict[str, Any] = {}
        if url.startswith("sqlite"):
            engine_kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, skip_compatibility_check=existing, skip_table_creation=existing
        )
    except Exception as e:  # noqa: BLE001 - any driver error means the same thing to the user
        raise ValueError(f"hydra.sweeper.storage: cannot open {url!r}: {type(e).__name__}: {e}") from e


def _node(value: Any, table: Dict[str, Any], key: str) -> DictConfig:
    if value is None:
        value = "none" if key == "pruner" else "tpe"
    if isinstance(value, str):
        if value not in table:
            raise ValueError(f"hydra.sweeper.{key}: unknown {key} {value!r}; choose one of {sorted(table)}")
        return OmegaConf.structured(table[value])
    if not OmegaConf.is_config(value) or "_target_" not in value:
        raise ValueError(f"hydra.sweeper.{key}: expected a name from {sorted(table)} or a node with _target_")
    return value


def sampler_node(value: Any) -> DictConfig:
    return _node(value, SAMPLERS, "sampler")


def pruner_node(value: Any) -> DictConfig:
    return _node(value, PRUNERS, "pruner")


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    try:
        return instantiate(node, **kwargs)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"hydra.sweeper.{key}: cannot build {node.get('_target_')!r}: {e}") from e


def worker_seed(seed: Optional[int], n_existing: int, worker_id: int) -> Optional[int]:
    """A fresh single run keeps the user's seed; a resumed run or another worker gets a new one,
    so it does not replay the start-up points already in the study."""
    if seed is None or (n_existing == 0 and worker_id == 0):
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, n_existing, worker_id]).generate_state(1)[0])


def pruner_from_study(storage: optuna.storages.BaseStorage, study_id: int) -> optuna.pruners.BasePruner:
    cfg = storage.get_study_system_attrs(study_id).get(PRUNER_ATTR)
    return instantiate(OmegaConf.create(cfg)) if cfg else optuna.pruners.NopPruner()


def budget_trials(trials: Sequence[FrozenTrial]) -> List[FrozenTrial]:
    """Trials that use up the budget: all but those whose worker died mid-trial."""
    return [t for t in trials if not t.user_attrs.get("interrupted")]


def fail_orphans(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int:
    """Mark RUNNING trials whose worker process on this host is gone as FAIL (interrupted), so a
    resumed run re-spends their share of the budget. Trials of other hosts are left alone."""
    host = socket.gethostname()
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.system_attrs.get(WORKER_ATTR, "")
        h, _, pid = owner.rpartition(":")
        if h != host or not pid.isdigit() or _alive(int(pid)):
            continue
        storage.set_trial_user_attr(t._trial_id, "interrupted", True)
        storage.set_trial_user_attr(t._trial_id, "error", f"interrupted: worker {owner} exited")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        n += 1
    return n


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def claim_lock(url: str, storage: optuna.storages.BaseStorage, study_id: int) -> Iterator[None]:
    """Serialise "count the budget, then ask" across workers so a study never overshoots n_trials.

    SQLite: an flock next to the database file (workers on this machine). PostgreSQL and
    MySQL: a row lock on the study, held by a separate connection while the claim runs.
    """
    path = _local_path(url)
    if path is not None:
        with open(f"{path}.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    engine = getattr(storage, "engine", None)
    if engine is None:  # in-memory storage: one process only
        yield
        return
    import sqlalchemy

    with engine.connect() as conn, conn.begin():
        conn.execute(
            sqlalchemy.text("SELECT study_id FROM studies WHERE study_id = :i FOR UPDATE"), {"i": study_id}
        )
        yield


def _local_path(url: str) -> Optional[str]:
    if url.startswith("sqlite:///"):
        return url[len("sqlite:///") :]
    return None


def default_storage(sweep_dir: str) -> str:
    path = Path(sweep_dir).absolute() / "optuna.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def fmt(values: Optional[Sequence[float]]) -> str:
    if values is None:
        return "-"
    return ",".join(f"{v:.4g}" for v in values)


class Progress:
    """One line per finished trial: counter, number, state, value, best so far, elapsed."""

    def __init__(self, study: optuna.Study, n_trials: int, log: Any) -> None:
        self.study, self.n_trials, self.log = study, n_trials, log
        self.t0 = time.time()
        finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        self.seen = {t.number for t in finished}
        self.done = len(budget_trials(finished))

    def poll(self) -> None:
        for t in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            if t.number in self.seen or not t.state.is_finished():
                continue
            self.seen.add(t.number)
            self.done += not t.user_attrs.get("interrupted")
            err = f" error={t.user_attrs.get('error', '')[:120]!r}" if t.state == TrialState.FAIL else ""
            self.log.info(
                f"[{self.done:>3}/{self.n_trials}] trial {t.number} {t.state.name} value={fmt(t.values)} "
                f"best={self.best()} elapsed={time.time() - self.t0:.1f}s{err}"
            )

    def best(self) -> str:
        try:
            best = self.study.best_trials
        except ValueError:
            return "-"
        if not best:
            return "-"
        if len(self.study.directions) > 1:
            return f"{len(best)} Pareto trials"
        return f"{fmt(best[0].values)} (#{best[0].number})"


def state_counts(study: optuna.Study) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return counts


def write_results(study: optuna.Study, sweep_dir: str) -> Dict[str, Any]:
    """`optimization_results.yaml` in hydra-optuna-sweeper's format (best_params/best_value or solutions)."""
    out: Dict[str, Any] = {"name": "optuna", "study_name": study.study_name, "states": state_counts(study)}
    try:
        if len(study.directions) == 1:
            out["best_params"] = study.best_trial.params
            out["best_value"] = study.best_trial.value
        else:
            out["solutions"] = [{"params": t.params, "values": list(t.values)} for t in study.best_trials]
    except ValueError:
        pass  # no completed trial
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(out), Path(sweep_dir) / "optimization_results.yaml")
    return out


def is_finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)
