"""Which of a batch's jobs run together (``hydra.launcher.stack``, ``max_members``): each job a unit of its own, or
groups that the app's stacker (``protocol.declare_app(stacker=...)``, its ``plan_groups``) trains as one stacked model.
"""

import importlib
import logging

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def stacks(stack: str, max_members: int, device: str, n_jobs: int) -> bool:
    """Whether a batch may train jobs as stacked groups (``hydra.launcher.stack``)."""
    return not (stack == "never" or max_members == 1 or (stack == "auto" and device != "cuda") or n_jobs < 2)


def plan_units(configs: list[DictConfig], stack: str, max_members: int, device: str,
               stacker: str | None) -> list[list[int]]:
    """Positions of the jobs to run together: one list per unit, in job order of their first member. ``stacker``:
    the app's stacked training (``protocol.stacker()``); without one every job is a unit of its own."""
    if stacker is None and stack == "always" and max_members > 1 and len(configs) > 1:
        raise ValueError("hydra.launcher.stack=always: this app declares no stacked training "
                         "(hydra_plugins.vitsweep_sweeper.protocol.declare_app(stacker=...)); use stack=auto or never")
    if stacker is None or not stacks(stack, max_members, device, len(configs)):
        return [[i] for i in range(len(configs))]
    if any(OmegaConf.select(c, "hydra.job.chdir", default=False) for c in configs):
        # a group trains in its worker's cwd, a single job in its run dir: relative paths would name other files
        if stack == "always":
            log.warning("hydra.launcher.stack=always: these jobs set hydra.job.chdir=true, and a stacked group trains "
                        "in its worker's cwd, not in each job's run dir, so they run one by one; set "
                        "hydra.job.chdir=false (the project's default) to stack them")
        return [[i] for i in range(len(configs))]
    plan_groups = importlib.import_module(stacker).plan_groups
    groups = plan_groups([_task_cfg(c) for c in configs], max_members, strict=stack == "always")
    return _apart_by_env(groups, configs)


def _apart_by_env(groups: list[list[int]], configs: list[DictConfig]) -> list[list[int]]:
    """Each group cut into jobs whose ``hydra.job.env_set`` agree (the trial identity aside): a group trains under one
    environment (``members.group_env``), and a single job under its own env_set."""
    from .members import group_env

    out: list[list[int]] = []
    for group in groups:
        parts: dict[str, list[int]] = {}
        for i in group:
            parts.setdefault(repr(sorted(group_env([configs[i]]).items())), []).append(i)
        out += parts.values()
    return sorted(out, key=lambda unit: unit[0])


def _task_cfg(cfg: DictConfig) -> dict:
    """The job's config without the hydra node, unresolved (grouping compares the keys as written)."""
    out = OmegaConf.to_container(cfg, resolve=False)
    out.pop("hydra", None)
    return out
