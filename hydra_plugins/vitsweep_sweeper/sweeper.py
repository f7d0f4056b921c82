"""`hydra/sweeper=vitsweep`: Optuna studies with pruning, streaming workers, budgets and resume.

This module is what Hydra's plugin scan imports; Optuna and the implementation load only when a
sweep actually uses this sweeper.
"""

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class VitsweepSweeper(Sweeper):
    def __init__(self, **kwargs: Any) -> None:
        from ._impl import SweeperImpl

        self.impl = SweeperImpl(**kwargs)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        return self.impl.sweep(arguments)
