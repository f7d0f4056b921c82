"""What a named study was started with (its recipe and its grid), and the checks that refuse to resume it with
another: a changed key, or another grid, fails before any trial."""

import logging
from typing import Any

import optuna
from omegaconf import OmegaConf

from . import _protocol as protocol
from . import _search_space as search_spaces
from . import _storage as storages
from . import _study as studies

log = logging.getLogger(__name__)
# trials that ran, or run, under a study's recipe: while one exists, a changed recipe would mix two experiments
KEEPS_RECIPE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)


class RecipeChecks:
    """The recipe and grid checks of `SweeperImpl` (a mixin: it reads the sweeper's settings from `self`)."""

    def _recipe(self, trials: list | None = None, version: int = studies.RECIPE_VERSION) -> dict[str, Any]:
        """What a study's trials compute, flattened, without the keys a trial samples (its params, and those of the
        study's trials so far, custom_search_space's included). Version 2: one flattened job config per preset
        choice, composed as its trials are (the config, the choice's overrides, the fixed ones), so a key that only
        some choices set, the contents of a config group a choice selects, and a fixed override of a key the
        presets set are all in it; without presets one config, named "". Version 1 (the storages in
        docs/studies/heads_depth/records/main and docs/studies/double_descent_cnn_cifar10/records/earlier_cpu hold
        it): the shared config without every key any preset sets, so a change to such a key (e.g. heads_depth's
        optimizer.lr, which only the CNN preset sets) went unnoticed; such a study keeps that check."""
        sampled = set(self.space) | _trial_keys(trials or [])
        fixed = {search_spaces.bare(k) for k in self.fixed}
        presets = {key: table for key, table in (self.presets or {}).items() if key not in fixed}
        if version == 1:
            for table in presets.values():
                sampled |= {o.split("=", 1)[0] for overrides in table.values() for o in overrides}
            return _without(protocol.flatten_config(OmegaConf.to_container(self.job_config, resolve=False)), sampled)
        configs = {f"{key}={choice}": self._job_config([str(o) for o in overrides])
                   for key, table in presets.items() for choice, overrides in table.items()} or {"": self.job_config}
        return {studies.RECIPE_VERSION_KEY: version,
                "configs": {name: _without(protocol.flatten_config(OmegaConf.to_container(cfg, resolve=False)), sampled)
                            for name, cfg in configs.items()}}

    def _check_recipe(self, study_id: int) -> None:
        """A named study resumes only with the recipe it was started with: a changed key fails before any trial."""
        saved = self.storage.get_study_system_attrs(study_id).get(studies.RECIPE_ATTR)
        if saved is None:  # a study started before the recipe was recorded
            return
        version = int(saved.get(studies.RECIPE_VERSION_KEY, 1))
        if version > studies.RECIPE_VERSION:
            raise ValueError(f"hydra.sweeper.study_name={self.name!r}: this study in {storages.safe(self.url)} "
                             f"recorded its recipe in version {version}, newer than this vitsweep's "
                             f"{studies.RECIPE_VERSION}: upgrade vitsweep to resume it")
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        keys = _trial_keys(trials)
        current = self._recipe(trials, version)
        if version == 1:
            diff = protocol.config_differences(_without(saved, keys), current)
        else:  # a change in every preset choice is named once; one in some choices, with those choices
            where: dict[str, list[str]] = {}
            common = sorted(saved["configs"].keys() & current["configs"].keys())
            for name in common:
                before, now = _without(saved["configs"][name], keys), current["configs"][name]
                for line in protocol.config_differences(before, now):
                    where.setdefault(line, []).append(name)
            diff = [line if len(names) == len(common) else f"{line} (in {', '.join(names)})"
                    for line, names in where.items()]
        if not diff:
            return
        where = f"hydra.sweeper.study_name={self.name!r}: this study in {storages.safe(self.url)}"
        new_folder = "give the new values a folder of their own (another hydra.sweep.dir and hydra.sweeper.study_name)"
        if any(t.state in KEEPS_RECIPE for t in trials):
            why = "was started with another recipe, so resuming it would mix two experiments"
            fix = f"restore those values to finish the study, or {new_folder}"
        else:  # e.g. every trial failed for a wrong dataset.root: "restore those values" would train nothing
            why = (f"has no trial that ran to a result ({len(trials)} failed or waiting), and it was started with "
                   "other values")
            fix = ("its failed trials count as done, so rerunning it would train nothing: start it afresh (move its "
                   f"sweep dir aside) or {new_folder}")
        raise ValueError(f"{where} {why}:\n  " + "\n  ".join(diff) + f"\nfix: {fix}")

    def _check_grid(self, study_id: int) -> None:
        """A grid study resumes only with its own grid: its points so far were claimed from that grid, so another
        would run some points twice or never, and Optuna cannot place its earlier trials in it (found resuming a
        pilot with one of its two sizes). Refused before the study is touched."""
        saved = self.storage.get_study_system_attrs(study_id).get(studies.GRID_ATTR)
        if saved is None or not self.is_grid:  # a study started before the grid was recorded, or another sampler
            return

        def show(values):
            return "(not swept)" if values is None else "[" + ", ".join(map(str, values)) + "]"
        def typed(values):  # 0 and 0.0 are equal, but other points to the claim loop (point_key compares reprs)
            return None if values is None else [repr(v) for v in values]
        changed = [k for k in sorted(saved.keys() | self.grid.keys()) if typed(saved.get(k)) != typed(self.grid.get(k))]
        diff = [f"{k}: {show(saved.get(k))} -> {show(self.grid.get(k))}" for k in changed]
        if diff:
            raise ValueError(
                f"hydra.sweeper.params: grid study {self.name!r} in {storages.safe(self.url)} was started with another "
                "grid, so resuming it would run some points twice or never:\n  " + "\n  ".join(diff)
                + "\nfix: restore the grid to finish the study, or start a new one in its own folder (another "
                "hydra.sweep.dir and hydra.sweeper.study_name)")

    def _space(self) -> dict[str, str]:
        """The search space as the study records it: each sampled key's distribution, spelt as a sweep expression."""
        return {k: describe(d) for k, d in sorted(self.space.items())}

    def _check_space(self, study_id: int) -> None:
        """A named study resumes only with the search space it was started with (a grid: ``_check_grid``): a key
        fixed or dropped trains the rest at one value while ``best_params`` names none for it, and a changed range
        mixes two spaces in one study (each went on without a word; a changed choice list crashed after its trial was
        created). Refused before the study is touched. Studies started before the space was recorded are not checked.
        """
        saved = self.storage.get_study_system_attrs(study_id).get(studies.SPACE_ATTR)
        if saved is None or self.is_grid:
            return
        now = self._space()
        fixed = {search_spaces.bare(k): v for k, v in self.fixed.items()}

        def show(key, spaces):
            if key in spaces:
                return spaces[key]
            return f"fixed ({fixed[key]})" if key in fixed else "not swept"
        diff = [f"{k}: {show(k, saved)} -> {show(k, now)}" for k in sorted(saved.keys() | now.keys())
                if saved.get(k) != now.get(k)]
        if diff:
            raise ValueError(
                f"hydra.sweeper.params: study {self.name!r} in {storages.safe(self.url)} was started with another "
                "search space, so its best params would mix two studies:\n  " + "\n  ".join(diff)
                + "\nfix: restore the search space to finish the study, or start a new one in its own folder (another "
                "hydra.sweep.dir and hydra.sweeper.study_name)")

    def _grid_order(self, study: optuna.Study, seed: int | None) -> None:
        """The study's grid order comes from the seed it was started with: every later process keeps it."""
        attrs = self.storage.get_study_system_attrs(studies.study_id(study))
        if studies.GRID_SEED_ATTR not in attrs:
            self.storage.set_study_system_attr(studies.study_id(study), studies.GRID_SEED_ATTR, seed)
        elif attrs[studies.GRID_SEED_ATTR] != seed:
            log.warning(f"hydra.sweeper.sampler.seed={seed} is ignored: study {self.name!r} keeps the grid order of "
                        f"seed {attrs[studies.GRID_SEED_ATTR]}, so every point still runs once")
        self.points = studies.grid_points(self.grid, attrs.get(studies.GRID_SEED_ATTR, seed))


def describe(dist) -> str:
    """A distribution as the sweep expression that makes it: ``choice(2, 4)``, ``interval(0.0, 0.3)``, with
    ``tag(log, ...)`` and ``step`` where set."""
    from optuna.distributions import CategoricalDistribution

    if isinstance(dist, CategoricalDistribution):
        return "choice(" + ", ".join(map(str, dist.choices)) + ")"
    step = getattr(dist, "step", None)
    text = f"interval({dist.low}, {dist.high})" + (f" step {step}" if step not in (None, 1) else "")
    return f"tag(log, {text})" if getattr(dist, "log", False) else text


def _trial_keys(trials: list) -> set[str]:
    return {k for t in trials for k in studies.params_of(t)}


def _without(flat: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """`flat` without `keys` (override keys: a leading +, ++ or ~ is dropped) and anything under them."""
    keys = {k.lstrip("+~") for k in keys}
    return {k: v for k, v in flat.items() if not any(k == s or k.startswith(s + ".") for s in keys)}
