"""Jobs of one stacked group as Hydra jobs: each member gets its run dir, `.hydra/` files and job logging
from Hydra's own ``run_job`` (with a task that only records its config and run dir), then all train at
once (``src.stacked.train_members``) and each ``JobReturn`` gets its member's objective, or its exception
(``optuna.TrialPruned`` for a pruned trial: ``src.train.objective_of``, the single run's rule). Hydra's job
callbacks see ``on_job_end`` before the training, not after."""

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, run_job
from omegaconf import DictConfig


def run_member_jobs(configs: list[DictConfig], hydra_context: Any) -> list[JobReturn]:
    from hydra_plugins.vitsweep_sweeper.protocol import make_reporter, trial_of_hydra
    from src.stacked import train_members
    from src.trackers import sweep_dir_of
    from src.train import objective_of

    captured: list[tuple[DictConfig, str]] = []
    sweep_dirs = []

    def record(task_cfg: DictConfig) -> None:
        captured.append((task_cfg, HydraConfig.get().runtime.output_dir))
        sweep_dirs.append(sweep_dir_of(HydraConfig.get()))  # the members' trackers share the sweep's store

    rets = [run_job(hydra_context=hydra_context, task_function=record, config=cfg, job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir") for cfg in configs]
    # each member's trial comes from its own Hydra config (the environment holds none once run_job returns)
    reporters = [make_reporter(trial_of_hydra(cfg.hydra)) for cfg in configs]
    results = train_members([c for c, _ in captured], [d for _, d in captured], reporters,
                            sweep_dir=sweep_dirs[0] if sweep_dirs else None)
    for ret, result, reporter in zip(rets, results, reporters, strict=True):
        if isinstance(result, BaseException):
            ret.return_value, ret.status = result, JobStatus.FAILED
            continue
        try:  # the single run's rule: a pruned trial's summary becomes optuna.TrialPruned
            value = objective_of(result, in_trial=reporter is not None)
        except Exception as e:
            ret.return_value, ret.status = e, JobStatus.FAILED
        else:
            ret.return_value, ret.status = value, JobStatus.COMPLETED
    return rets
