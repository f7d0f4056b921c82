"""Where a start in a run dir begins: a finished run's summary (with or without its checkpoints), the
checkpoints to continue from after the checks that refuse a different config or a shorter limit, and the
resumed ``RunState``."""
from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra_plugins.vitsweep_sweeper.protocol import config_differences
from src.checkpoint import check_extension, check_resumable, move_aside, read_checkpoints
from src.run_contract import RUNTIME_KEYS
from src.run_setup import setup
from src.run_state import RunState
from src.stop_rules import StopRules

log = logging.getLogger(__name__)


def finished_summary(run_dir: Path, rules: StopRules) -> dict[str, Any] | None:
    """The summary of a run in ``run_dir`` that has ended and would not continue under ``rules``."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    s = json.loads(path.read_text())
    done = rules.still_stops(s.get("stop_reason"), s.get("epochs") or 0, s.get("steps") or 0, s.get("wall_s") or 0)
    return s if done else None


# runtime keys a finished run may differ in and still be this config's result: not its length (under a cosine
# schedule another length is another run from step 0; under any, a cap below where the run went is another run)
SAME_RUN_RUNTIME_KEYS = tuple(k for k in RUNTIME_KEYS if k not in ("trainer.max_epochs", "trainer.max_steps"))


def finished_without_checkpoint(cfg: dict[str, Any], run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run whose checkpoints are gone (records copied without them, space freed), where
    the config it ended under (``config.json``) is this one but for runtime keys and its stop still holds: done, as
    with its final checkpoint (found on a lent H100: 11 converged runs came back from checkpoint-free records and
    trained again). Only under ``trainer.checkpoint=true``: a run without checkpoints trains again on a rerun."""
    path = run_dir / "config.json"
    if not cfg["trainer"].get("checkpoint", True) or not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    # stricter than a checkpoint's check: every key present in both, and the run length unchanged
    diff = config_differences(saved, cfg, ignore=SAME_RUN_RUNTIME_KEYS, strict=True)
    if diff:
        log.warning("%s holds a finished run under another config, and no checkpoint: its files are moved aside and "
                    "the run trains again (%s)", run_dir, "; ".join(diff[:5]))
        return None
    return finished_summary(run_dir, StopRules.from_config(cfg["trainer"]))


def prepare_resume(cfg: dict[str, Any], run_dir: Path) -> tuple[Iterator[tuple[Path, dict]], dict | None]:
    """(checkpoints to try, newest first; the summary of a finished run or None). Fails before any work
    when the newest readable checkpoint comes from a different config, or when changed limits would continue it
    under another lr-schedule horizon (``check_extension``); moves unusable files aside."""
    if cfg["trainer"].get("resume", "auto") == "never":
        move_aside(run_dir)
        return iter(()), None
    found = read_checkpoints(run_dir)
    newest = next(found, None)
    if newest is None:
        done = finished_without_checkpoint(cfg, run_dir)
        if done is None:
            move_aside(run_dir)  # records of a run that cannot be continued (none, or no readable checkpoint)
        return iter(()), done
    check_resumable(newest[0], newest[1]["config"], cfg)
    check_not_past(newest[0], newest[1], cfg)
    # finished or not, only under the lr schedule it ran with: a finished cosine run under another horizon is another
    # run from step 0, and its summary is not this config's result
    check_extension(newest[0], newest[1], cfg)
    done = finished_summary(run_dir, StopRules.from_config(cfg["trainer"]))
    return itertools.chain([newest], found), done


def check_not_past(path: Path, ckpt: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    """Refuse a start whose epoch or step limit lies below where the run in ``path`` already went: a lower limit
    cannot shorten a run, and its records (a finished run's summary included) would not be this config's."""
    t = cfg["trainer"]
    epoch, step = int(ckpt.get("epoch") or 0), int(ckpt.get("step") or 0)
    past = [f"trainer.{k}={t[k]}" for k, ran in (("max_epochs", epoch), ("max_steps", step)) if t.get(k) and ran > t[k]]
    if past:
        raise ValueError(f"{path} holds a run that trained {epoch} epochs ({step} steps), past {' and '.join(past)}: a "
                         "lower limit cannot shorten it. Fix: a new run dir (hydra.run.dir=...) or "
                         "trainer.resume=never (moves this run's files aside and trains the shorter run)")


def resume(cfg: dict[str, Any], run_dir: Path, found: Iterable[tuple[Path, dict]]) -> RunState:
    """A fresh ``setup`` continued from the first checkpoint that loads (or a fresh start, with a warning).
    Each try gets its own ``setup``: a checkpoint that fails half-way leaves the state it touched unusable."""
    tried = False
    for path, ckpt in found:
        tried, state = True, setup(cfg, run_dir)
        try:
            state.load_state_dict(ckpt)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            log.warning("checkpoint %s does not fit this run (%s: %s): trying the previous one", path,
                        type(e).__name__, str(e).splitlines()[0])
            continue
        stale = run_dir / "summary.json"  # the previous start's (interrupted) summary, superseded by this run
        if stale.exists():
            stale.replace(run_dir / "summary.previous.json")
        log.info("resuming %s from %s (epoch %d, step %d)", run_dir, path.name, state.epoch, state.step)
        return state
    if tried:
        log.warning("no checkpoint in %s fits this run: starting afresh", run_dir)
        move_aside(run_dir)
    return setup(cfg, run_dir)


def already_stopped(state: RunState) -> bool:
    """True when ``state`` resumed from a run's final checkpoint and no stop limit was raised since, or when one was
    but that checkpoint's final evaluation, one an uninterrupted run makes too, converged or stalled: a run with a
    higher cap stops there, so its ``stop_reason`` becomes that one (the run trained on an epoch past it: found
    2026-11-29). Since 2026-11-30 such a run records the convergence itself (``src.loop.close_epoch``); checkpoints
    written before then kept the cap's reason (``max_epochs``) and are relabelled here."""
    if state.rules.still_stops(state.stop_reason, state.epoch, state.step, state.wall_before):
        return True
    final = state.before_final
    if state.stop_reason is not None and final and final["due"] and final["ends"]:
        state.stop_reason = final["ends"]
        return True
    return False
