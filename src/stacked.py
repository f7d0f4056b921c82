"""Stacked members: several runs that differ only in member keys train as one model with ``torch.func``.

This module is the app's stacker (``src/train.py`` declares it to the vectorized launcher): ``plan_groups`` says
which of a batch's runs train together, and ``train_stacked`` (``train_members``) starts each member as a single
run and trains them, part after part. The stacked step and the members' loop are ``src.stacked_loop``; how a group
is cut into parts (by what the step shares, by the device's memory) is ``src.stacked_parts``.

Each member is a real run: the single run's start (``src.resume.resume``: a fresh set-up, continued from its
checkpoint if any) builds its ``RunState`` exactly as a single run's, so initial weights, data subset, label noise,
batch order and augmentation draws are the single run's by construction. Its parameters then become views into
stacked tensors (one leading member dimension, ``torch.func.stack_module_state``); one ``vmap`` of
``functional_call`` over the one model definition computes every member's loss on its own batch, one backward gives
each member the gradients of its own loss, and each member's own optimizer (own state, learning rate, weight decay,
gradient clipping) steps its parameters in place. Stop rules, evaluation, pruning, checkpoints and summaries are
the single run's, per member; a member that stops (converged, stalled, pruned, non-finite loss) is finalised and
leaves the stack while the others go on. Losses and gradients of different members never mix, so a NaN
in one member never touches another.

Dropout under ``vmap`` draws a different mask per member (``randomness="different"``) from the global
generator, so with dropout a member's masks differ from its single run's: same distribution, other draws.
Models with BatchNorm (running statistics updated in place) and fp16 runs (one GradScaler per run) run alone.

On CUDA a group is cut, before its first step, to the members that fit in the device's free memory
(``src.stacked_parts``, shared between the launcher's processes on one GPU); the parts train one after another.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from src.loop import replay_final_report
from src.records import hold_run_dir, writable_run_dir
from src.resume import already_stopped, prepare_resume, resume
from src.run_setup import plain_config
from src.run_state import RunState
from src.run_summary import finish, summarise
from src.stacked_loop import _report, run_members
from src.stacked_parts import stack_parts
from src.stop_signal import (
    StopSignal,
    stop_in_flight,
)
from src.trainer import start_tracking
from src.trial import Reporter
from src.validate import check_config

MEMBER_KEYS = ("seed", "label_noise", "optimizer.lr", "optimizer.weight_decay")
STACKABLE_MODELS = ("src.models.cnn.WidthCNN", "src.models.vit.ViT")


def _without(cfg: Mapping[str, Any], keys: Sequence[str]) -> dict:
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}
    for key in keys:
        head, _, leaf = key.partition(".")
        if leaf and isinstance(out.get(head), dict):
            out[head].pop(leaf, None)
        elif not leaf:
            out.pop(head, None)
    return out


def why_not_stackable(cfg: Mapping[str, Any]) -> str | None:
    """None when a run of ``cfg`` can train stacked; else the reason, naming the key."""
    target = cfg["model"]["_target_"]
    if target not in STACKABLE_MODELS:
        return f"model._target_={target} cannot stack (BatchNorm or not a study model): stacked are {STACKABLE_MODELS}"
    if cfg["trainer"].get("precision") == "fp16":
        return "trainer.precision=fp16 cannot stack (one GradScaler per run): use bf16 or fp32"
    if cfg["trainer"].get("compile"):
        return "trainer.compile=true cannot stack: the stacked step is eager"
    nested = [k for k in _targets(cfg["model"], "model") if k != "model._target_"]
    if nested:  # e.g. a conv stem with BatchNorm, whose running statistics cannot stack
        return (f"{nested[0]} builds a sub-module whose layers are not checked for stacking: "
                "use hydra.launcher.stack=never")
    return None


def _targets(node: Any, path: str) -> Iterable[str]:
    """The paths of every ``_target_`` key under ``node`` (dicts and lists, any depth)."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from [f"{path}.{k}"] if k == "_target_" else _targets(v, f"{path}.{k}")
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _targets(v, f"{path}[{i}]")


def plan_groups(cfgs: Sequence[Mapping[str, Any]], max_members: int, strict: bool) -> list[list[int]]:
    """Positions of the jobs to train together (one list per unit, singles included, in job order of
    their first member): jobs whose configs agree on every key but ``MEMBER_KEYS``, cut to ``max_members``.
    ``strict`` (``stack=always``) raises for a config that cannot stack instead of running it alone."""
    groups: dict[str, list[int]] = {}
    units: list[list[int]] = []
    for i, cfg in enumerate(cfgs):
        reason = why_not_stackable(cfg)
        if reason:
            if strict:
                raise ValueError(f"hydra.launcher.stack=always: {reason}; use stack=auto or never")
            units.append([i])
            continue
        key = repr(sorted(_without(cfg, MEMBER_KEYS).items()))
        if key not in groups or len(groups[key]) == max_members:
            groups[key] = []
            units.append(groups[key])
        groups[key].append(i)
    return units


def train_stacked(cfgs: Sequence[Mapping[str, Any]], run_dirs: Sequence[str | Path],
                  reporters: Sequence[Reporter | None], sweep_dir: str | Path | None = None,
                  on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """The vectorized launcher's entry (declared by ``src/train.py``): ``train_members``, then per run what a
    single run's task returns (``src.train.objective_of``: its objective, or ``optuna.TrialPruned`` for a pruned
    trial) or the exception that ended it. ``on_done(k, that)`` as each member ends for good, before the group does
    (the launcher tells its sweeper then, so a stop of the group hands back only the members still training)."""
    def result_of(k: int, result: dict | BaseException) -> Any:
        if isinstance(result, BaseException):
            return result
        try:
            return objective_of(result, in_trial=reporters[k] is not None)
        except Exception as e:  # noqa: BLE001 - optuna.TrialPruned: the member's JobReturn carries it
            return e

    from src.train import objective_of

    done = None if on_done is None else (lambda k, result: on_done(k, result_of(k, result)))
    return [result_of(k, r) for k, r in enumerate(train_members(cfgs, run_dirs, reporters, sweep_dir, done))]


def train_members(cfgs: Sequence[Mapping[str, Any]], run_dirs: Sequence[str | Path],
                  reporters: Sequence[Reporter | None] | None = None, sweep_dir: str | Path | None = None,
                  on_done: Callable[[int, dict], None] | None = None) -> list[dict | BaseException]:
    """Train runs that ``plan_groups`` put together as one stacked model, each into its own run dir (and its own
    tracker run, ``logger=``; ``sweep_dir`` as in ``src.trainer.train``). Returns per run its summary dict (as
    ``src.trainer.train``) or the exception that ended it; ``on_done(k, summary)`` as each run ends for good (at once
    for a run that had finished before)."""
    reporters = reporters or [None] * len(cfgs)
    results: list[dict | BaseException | None] = [None] * len(cfgs)
    states: dict[int, RunState] = {}
    held = contextlib.ExitStack()  # each member's run dir, as src.trainer.train holds a single run's
    # SIGTERM/SIGINT handlers from before the first member's trackers start, as a single run's (src.trainer): a stop
    # during the members' start stops the group after its first step, every member's tracker run KILLED (it ended
    # the process at once, their tracker runs left RUNNING: second review 2026-11-30). Installed once every run dir
    # is held, as a single run's: a stop while a run dir is awaited (its first process still alive) ends the process
    stop = StopSignal()

    def ended(k: int, summary: dict) -> None:  # a member that ends before its part does: its result stands
        results[k] = summary
        _report(on_done, k, summary)

    try:
        ready = []
        for k, (cfg, run_dir) in enumerate(zip(cfgs, run_dirs, strict=True)):
            try:  # the single run's checks, and its run dir held
                cfg = plain_config(cfg)
                check_config(cfg)
                run_dir = writable_run_dir(run_dir)
                held.enter_context(hold_run_dir(run_dir))
            except Exception as e:  # this member fails alone
                results[k] = e
                continue
            ready.append((k, cfg, run_dir))
        with stop.installed():  # a normal end hands on a signal no member stopped for (StopSignal)
            _start_members(ready, reporters, sweep_dir, results, states, on_done)
            for part in stack_parts(states):
                members = {k: states[k] for k in part}
                for s in members.values():  # what the member's summary records of how it trained
                    s.info["stacked_members"] = len(members)
                    if s.info.get("attention"):  # under vmap a ViT trains with the explicit ops, whatever it evaluates
                        s.info["attention_trained"] = "explicit"
                try:
                    results_by_member = run_members(members, {k: reporters[k] for k in part}, ended, stop)
                except Exception as e:  # the stacked step itself failed: every member still training records it
                    for k, s in members.items():
                        if results[k] is not None:  # it ended before the failure
                            continue
                        if s.recorder is not None and not (s.recorder.dir / "summary.json").is_file():
                            s.recorder.summary(summarise(s, "error", f"{type(e).__name__}: {e}"), s.cfg)
                        results[k] = e
                else:
                    for k, summary in results_by_member.items():
                        results[k] = summary
                finally:  # their summaries closed them; this closes them after an exception that came before one
                    _close_trackers(members.values())
    finally:  # a stop in a member's set-up or in one part leaves the other members' tracker runs open
        _close_trackers(states.values())
        held.close()
    return results


def _start_members(ready: Sequence[tuple[int, dict, Path]], reporters: Sequence[Reporter | None],
                   sweep_dir: str | Path | None, results: list, states: dict[int, RunState],
                   on_done: Callable[[int, dict], None] | None) -> None:
    """Each held member's start, as a single run's: resume or a fresh set-up (its RNG order included), its trackers
    started; a member to train goes into ``states``, one that ended already (or fails) into ``results``."""
    for k, cfg, run_dir in ready:
        state = None
        try:
            found, done = prepare_resume(cfg, run_dir)
            if done is None:
                state = resume(cfg, run_dir, found)
                start_tracking(state, None if sweep_dir is None else Path(sweep_dir))
                if already_stopped(state):
                    done = finish(state, state.stop_reason, checkpoint=False)  # killed after its final checkpoint
                elif pruned := replay_final_report(state, reporters[k]):  # extended past a cap it is pruned at
                    done = finish(state, pruned)
                else:
                    states[k] = state
                    continue
            results[k] = done
            _report(on_done, k, done)
        except Exception as e:  # this member fails alone
            results[k] = e
            if state is not None:  # its tracker runs started, and no summary or later close reaches them
                _close_trackers([state])


def _close_trackers(states: Iterable[RunState]) -> None:
    """End the members' tracker runs (a no-op for those a summary ended): KILLED while a stop is in flight (the
    members are handed back and resume), else FAILED. Called from ``finally`` clauses, where ``sys.exc_info``
    holds the exception on its way out."""
    stop = stop_in_flight()
    for s in states:
        s.recorder.trackers.close("KILLED" if stop else "FAILED")
