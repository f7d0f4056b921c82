"""Entry point: ``python -m src.train [overrides]`` (``-m`` for a multirun sweep).

Composes the config with Hydra, hands it to the trainer, and returns the sweep objective.
"""
from __future__ import annotations

if __name__ == "__main__":  # before torch loads: glibc reads its malloc settings only at start-up
    from src.malloc import restart_with_lean_malloc

    restart_with_lean_malloc()

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from hydra_plugins.vitsweep_sweeper.protocol import declare_app  # noqa: E402
from src.run_contract import STUDY_RUNTIME_KEYS, objective_direction  # noqa: E402

# what the vitsweep sweeper and launcher need to know of this task, in every process that runs this module (a
# sweep's main process and its workers): the direction of trainer.objective, the keys a resumed study may change,
# and where stacked members train (src.stacked.plan_groups and train_stacked)
declare_app(objective="trainer.objective", direction=objective_direction, runtime_keys=STUDY_RUNTIME_KEYS,
            stacker="src.stacked")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    # imported here, not at the top: a multirun's launching process composes and hands out jobs and never
    # trains, so it does not load torch (1.7 s on a 2-core CPU, before the first job could start)
    from src.trackers import sweep_dir_of
    from src.trainer import train
    from src.trial import current_trial, make_reporter

    hydra_cfg = HydraConfig.get()
    run_dir = hydra_cfg.runtime.output_dir
    trial = current_trial(run_dir)  # an Optuna trial started by the vitsweep sweeper: report for pruning
    reporter = make_reporter(trial) if trial is not None else None
    # SIGTERM/SIGINT: raises RunInterrupted, a non-zero exit
    summary = train(cfg, run_dir, reporter, sweep_dir=sweep_dir_of(hydra_cfg))
    return objective_of(summary, in_trial=reporter is not None)


def objective_of(summary: dict, in_trial: bool) -> float:
    """The sweep objective of a returned summary; an Optuna trial the pruner stopped raises TrialPruned."""
    if in_trial and summary["stop_reason"] == "pruned":
        import optuna

        raise optuna.TrialPruned(f"pruned at epoch {summary['epochs']} with {summary['objective_name']} "
                                 f"{summary['objective']}")
    return summary["objective"]


if __name__ == "__main__":
    main()
