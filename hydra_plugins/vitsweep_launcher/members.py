"""Jobs of one stacked group as Hydra jobs: each member gets its run dir, `.hydra/` files and job logging
from Hydra's own ``run_job`` (with a task that only records its config and run dir), then all train at
once in the app's stacker (``protocol.declare_app(stacker=...)``; vitsweep's: ``src.stacked.train_stacked``) and
each ``JobReturn`` gets what its member returns, or its exception (``optuna.TrialPruned`` for a pruned trial).
Hydra's job callbacks see ``on_job_end`` before the training, not after. A member that ends before its group is
reported at once (``on_member_done``), where the stacker takes an ``on_done`` callback."""

import contextlib
import importlib
import inspect
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, env_override, run_job
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def run_member_jobs(configs: list[DictConfig], hydra_context: Any, stacker: str,
                    on_member_done: Callable[[int, Any, str], None] | None = None) -> list[JobReturn]:
    """The group's ``JobReturn``s, in ``configs`` order; ``on_member_done(job number, what the member returned or
    its exception, its run dir)`` as each member ends for good, while the others may still train."""
    from hydra_plugins.vitsweep_sweeper.protocol import make_reporter, trial_of_hydra

    captured: list[tuple[DictConfig, str]] = []
    sweep_dir: Path | None = None  # the members' shared sweep dir (e.g. where their trackers keep one store)

    def record(task_cfg: DictConfig) -> None:
        nonlocal sweep_dir
        captured.append((task_cfg, HydraConfig.get().runtime.output_dir))
        sweep_dir = Path(str(HydraConfig.get().sweep.dir)).absolute()

    rets, log_files = [], []
    for cfg in configs:
        rets.append(run_job(hydra_context=hydra_context, task_function=record, config=cfg,
                            job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
        log_files += [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]  # its job log
    # each member's trial comes from its own Hydra config (the environment holds none once run_job returns)
    reporters = [make_reporter(trial_of_hydra(cfg.hydra)) for cfg in configs]
    train_stacked = importlib.import_module(stacker).train_stacked
    extra = {}
    if on_member_done is not None and "on_done" in inspect.signature(train_stacked).parameters:
        extra["on_done"] = lambda k, result: on_member_done(int(configs[k].hydra.job.num), result, captured[k][1])
    jobs = [OmegaConf.select(c, "hydra.job.num") for c in configs]
    with env_override(group_env(configs)), _group_logs(log_files, jobs):
        results = train_stacked([c for c, _ in captured], [d for _, d in captured], reporters, sweep_dir=sweep_dir,
                                **extra)
    for ret, result in zip(rets, results, strict=True):
        if isinstance(result, BaseException):
            ret.return_value, ret.status = result, JobStatus.FAILED
        else:
            ret.return_value, ret.status = result, JobStatus.COMPLETED
    return rets


def group_env(configs: list[DictConfig]) -> dict[str, str]:
    """What run_job exports around a single job's task (``hydra.job.env_set``), for the group's training: the
    members' (``units.plan_units`` groups only jobs whose env_set agree) less the trial identity
    (``protocol.ENV``), which differs per member and which the stacker takes from each member's config."""
    from hydra_plugins.vitsweep_sweeper.protocol import ENV

    env = OmegaConf.select(configs[0], "hydra.job.env_set", default=None)
    env = {} if env is None else OmegaConf.to_container(env, resolve=True)
    return {str(k): str(v) for k, v in env.items() if k not in ENV.values()}


@contextlib.contextmanager
def _group_logs(handlers: list[logging.FileHandler], jobs: list[int]) -> Iterator[None]:
    """While the group trains, every member's job log (``hydra.job_logging``'s file, which run_job opened for it
    and the next member's run_job closed) takes the group's lines, under a line naming the group: its lines are
    not told apart by member, and before, they all went to the last member's log and none to the others'."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(h)
        h.close()
    opened = []
    for h in handlers:
        fresh = logging.FileHandler(h.baseFilename, mode="a", encoding=h.encoding)
        fresh.setFormatter(h.formatter)
        fresh.setLevel(h.level)
        root.addHandler(fresh)
        opened.append(fresh)
    log.info(f"stacked group of jobs {jobs}: the lines below are the whole group's, in each member's log")
    try:
        yield
    finally:
        for h in opened:
            root.removeHandler(h)
            h.close()
