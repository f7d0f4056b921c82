"""Hydra sweep grammar -> Optuna distributions.

The meanings are hydra-optuna-sweeper's (HOS 1.2/1.3):
- `choice(a, b)`, `a,b` and `shuffle(choice(...))` -> categorical;
- `range(start, stop, step)` -> int (or stepped float) from start to stop *included* for the samplers that
  draw from a distribution (HOS builds `IntDistribution(start, stop, step)`); for the grid sampler the values
  Hydra's own range gives, stop *excluded* (HOS lists `(high - low) // step` values for a grid);
- `shuffle(range(...))` -> categorical over Hydra's range values (stop excluded), as HOS; a sampler has no
  order to shuffle, so the choices are kept in one sorted order (every worker and resume agrees on it);
- `interval(lo, hi)` -> float (Hydra casts both ends to float), `int(interval(lo, hi))` -> int; `tag(log, ...)`
  -> log scale.
Anything else is a fixed value passed to every trial.
"""

import math
from collections.abc import Mapping
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)


class SearchSpaceError(ValueError):
    pass


def _categorical(override: Override) -> CategoricalDistribution:
    choices = list(override.sweep_iterator(transformer=Transformer.encode))
    for c in choices:
        if not isinstance(c, (str, int, float, bool, type(None))):
            raise SearchSpaceError(f"a choice must be str, int, float, bool or null, got {c!r}")
    if override.value().shuffle:  # one order in every process: resumes and workers must agree on the distribution
        choices.sort(key=lambda c: (type(c).__name__, c))
    return CategoricalDistribution(choices)


def _range(override: Override, for_grid: bool) -> BaseDistribution:
    value = override.value()
    if value.shuffle or for_grid:  # Hydra's own values, stop excluded, as HOS
        return _categorical(override)
    start, stop, step = value.start, value.stop, value.step
    n = math.floor((stop - start) / step + 1e-9) + 1  # stop included when the step reaches it
    if n < 1:
        raise SearchSpaceError(f"range({start}, {stop}, {step}) is empty")
    last = start + (n - 1) * step
    if all(isinstance(v, int) for v in (start, stop, step)):
        lo, hi = min(start, last), max(start, last)
        return IntDistribution(lo, hi, step=abs(step))
    lo, hi = min(start, last), max(start, last)
    return FloatDistribution(float(lo), float(hi), step=abs(float(step)))


def _interval(override: Override) -> BaseDistribution:
    value = override.value()
    log = "log" in value.tags
    if isinstance(value.start, int) and isinstance(value.end, int):
        return IntDistribution(value.start, value.end, log=log)
    return FloatDistribution(float(value.start), float(value.end), log=log)


def to_distribution(override: Override, for_grid: bool = False) -> Any:
    """A distribution for a sweep override, or the plain string value for a fixed one. `for_grid`: the values of
    a grid sampler (a range excludes its stop)."""
    if not override.is_sweep_override():
        return override.get_value_element_as_str()
    if type(override.value()).__name__ == "Glob":  # hydra's Glob needs the ConfigLoader: refused in our words
        raise SearchSpaceError(f"{override.input_line!r}: glob is not supported: use choice, range or interval")
    if override.is_choice_sweep():
        return _categorical(override)
    if override.is_range_sweep():
        return _range(override, for_grid)
    if override.is_interval_sweep():
        return _interval(override)
    raise SearchSpaceError(f"{override.input_line!r} is not supported (use choice, range or interval)")


def parse(params: Mapping[str, Any], arguments: list[str],
          grid: bool = False) -> tuple[dict[str, BaseDistribution], dict[str, str | None]]:
    """Split `hydra.sweeper.params` plus command-line arguments into a search space and fixed values
    (`grid`: for the grid sampler, whose ranges exclude their stop).

    A later entry for the same key wins, whatever its prefix, so `x=3` or `++x=3` on the command line fixes a swept
    `x` (a fixed value keeps its prefix in the job's override: `+key=` adds a key the config lacks).
    """
    lines = [(f"hydra.sweeper.params.{k}", f"{k}={v}") for k, v in params.items()]
    lines += [("command line", a) for a in arguments]
    parser = OverridesParser.create()
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for where, line in lines:
        try:
            (override,) = parser.parse_overrides([line])
            value = None if override.is_delete() and override.value() is None else to_distribution(override, grid)
        except Exception as e:  # noqa: BLE001 - re-raised with the key that caused it
            raise SearchSpaceError(f"{where}: cannot use {line!r} as a search space: {e}") from e
        key = override.get_key_element()
        for earlier in [k for k in (*space, *fixed) if bare(k) == bare(key)]:  # `x`, `+x` and `++x`: one key
            space.pop(earlier, None)
            fixed.pop(earlier, None)
        if isinstance(value, BaseDistribution):
            space[key] = value
        else:
            fixed[key] = value  # None: a bare `~key` deletion, passed on as written (override_line)
    return space, fixed


def bare(key: str) -> str:
    """A key without its override prefix (``+``, ``++``, ``~``): the config key it sets."""
    return key.lstrip("+~")


def override_line(key: str, value: str | None) -> str:
    """The override a job gets for a fixed value (`~key` alone for a deletion without a value, as HOS)."""
    return key if value is None else f"{key}={value}"


def from_legacy(search_space: Mapping[str, Any]) -> dict[str, str]:
    """hydra-optuna-sweeper's deprecated `search_space` node -> sweep expressions for `params`."""
    params = {}
    for key, spec in search_space.items():
        kind = spec.get("type")
        if kind == "categorical":
            params[key] = "choice(" + ",".join(str(c) for c in spec["choices"]) + ")"
        elif kind in ("int", "float"):
            lo, hi = spec["low"], spec["high"]
            if kind == "int":
                lo, hi = int(lo), int(hi)
            else:
                lo, hi = float(lo), float(hi)
            # Hydra's `interval` casts its ends to float: an int parameter is `int(interval(...))` (review 2026-11-29:
            # `type: int` was sampled as floats, where hydra-optuna-sweeper drew ints)
            bounds = f"int(interval({lo},{hi}))" if kind == "int" else f"interval({lo},{hi})"
            if spec.get("step") is not None:
                params[key] = f"range({lo},{hi},{spec['step']})"
            elif spec.get("log"):
                params[key] = f"tag(log,{bounds})"
            else:
                params[key] = bounds
        else:
            raise SearchSpaceError(f"hydra.sweeper.search_space.{key}.type: unknown type {kind!r}")
    return params


def grid(space: Mapping[str, BaseDistribution]) -> dict[str, list[Any]]:
    """The value lists for optuna's GridSampler; only discrete distributions have one."""
    out: dict[str, list[Any]] = {}
    for key, dist in space.items():
        if isinstance(dist, CategoricalDistribution):
            out[key] = list(dist.choices)
        elif isinstance(dist, (IntDistribution, FloatDistribution)) and dist.step is not None and not dist.log:
            n = int(round((dist.high - dist.low) / dist.step)) + 1
            out[key] = [dist.low + i * dist.step for i in range(n)]
        else:
            raise SearchSpaceError(
                f"hydra.sweeper.params.{key}: the grid sampler needs a choice or range, not a continuous interval"
            )
    return out
