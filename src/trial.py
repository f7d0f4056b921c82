"""The running Optuna trial, as seen from a training job (for pruning).

The vitsweep sweeper passes each job `trial.study_name`, `trial.number` and `trial.storage`;
`make_reporter(cfg)` turns those into `report(value, epoch) -> prune?` for the trainer.
"""

import math
from collections.abc import Callable

from omegaconf import DictConfig

Reporter = Callable[[float, int], bool]  # (objective, epoch) -> prune?


def make_reporter(cfg: DictConfig) -> Reporter | None:
    """None outside a sweep (or in a multi-objective one); else a function that records the objective as the trial's
    intermediate value at `epoch` and returns whether the study's pruner stops the trial."""
    node = cfg.get("trial")
    if not node:
        return None
    import optuna

    from hydra_plugins.vitsweep_sweeper._storage import open_storage
    from hydra_plugins.vitsweep_sweeper._study import pruner_from_study

    storage = open_storage(str(node.storage), existing=True)
    study_id = storage.get_study_id_from_name(str(node.study_name))
    study = optuna.load_study(
        study_name=str(node.study_name), storage=storage, pruner=pruner_from_study(storage, study_id)
    )
    if len(study.directions) > 1:
        return None  # Optuna prunes single-objective studies only
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(node.number))
    trial = optuna.Trial(study, trial_id)

    def report(value: float, epoch: int) -> bool:
        if not math.isfinite(value):
            return False  # the trainer stops on a non-finite loss by itself
        trial.report(float(value), int(epoch))
        return trial.should_prune()

    return report
