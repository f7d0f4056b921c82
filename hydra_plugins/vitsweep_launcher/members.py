"""Jobs of one stacked group as Hydra jobs: each member gets its run dir, `.hydra/` files and job logging
from Hydra's own ``run_job`` (with a task that only records its config and run dir), then all train at
once in the app's stacker (``protocol.declare_app(stacker=...)``; vitsweep's: ``src.stacked.train_stacked``) and
each ``JobReturn`` gets what its member returns, or its exception (``optuna.TrialPruned`` for a pruned trial).
Hydra's job callbacks see ``on_job_end`` before the training, not after. A member that ends before its group is
reported at once (``on_member_done``), where the stacker takes an ``on_done`` callback."""

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, run_job
from omegaconf import DictConfig


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

    rets = [run_job(hydra_context=hydra_context, task_function=record, config=cfg, job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir") for cfg in configs]
    # each member's trial comes from its own Hydra config (the environment holds none once run_job returns)
    reporters = [make_reporter(trial_of_hydra(cfg.hydra)) for cfg in configs]
    train_stacked = importlib.import_module(stacker).train_stacked
    extra = {}
    if on_member_done is not None and "on_done" in inspect.signature(train_stacked).parameters:
        extra["on_done"] = lambda k, result: on_member_done(int(configs[k].hydra.job.num), result, captured[k][1])
    results = train_stacked([c for c, _ in captured], [d for _, d in captured], reporters, sweep_dir=sweep_dir,
                            **extra)
    for ret, result in zip(rets, results, strict=True):
        if isinstance(result, BaseException):
            ret.return_value, ret.status = result, JobStatus.FAILED
        else:
            ret.return_value, ret.status = result, JobStatus.COMPLETED
    return rets
