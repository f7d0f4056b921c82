"""Stacked members: several runs that differ only in member keys train as one model with ``torch.func``.

Each member is a real run: ``src.trainer``'s set-up (or resume) builds its ``RunState`` exactly as a
single run's, so initial weights, data subset, label noise, batch order and augmentation draws are the
single run's by construction. Its parameters then become views into stacked tensors (one leading member
dimension, ``torch.func.stack_module_state``); one ``vmap`` of ``functional_call`` over the one model
definition computes every member's loss on its own batch, one backward gives each member the gradients
of its own loss, and each member's own optimizer (own state, learning rate, weight decay, gradient
clipping) steps its parameters in place. Stop rules, evaluation, pruning, checkpoints and summaries are
the single run's, per member; a member that stops (converged, stalled, pruned, non-finite loss) is finalised and
leaves the stack while the others go on. Losses and gradients of different members never mix, so a NaN
in one member never touches another.

Dropout under ``vmap`` draws a different mask per member (``randomness="different"``) from the global
generator, so with dropout a member's masks differ from its single run's: same distribution, other draws.
Models with BatchNorm (running statistics updated in place) and fp16 runs (one GradScaler per run) run alone.

On CUDA a group is cut, before its first step, to the members that fit in the device's free memory
(``member_bytes``, shared between the launcher's processes on one GPU); the parts train one after another.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from hydra_plugins.vitsweep_sweeper.protocol import TrialTakenOver
from src.loop import begin_epoch, checkpoint_due, close_epoch, until_stopped
from src.records import hold_run_dir, writable_run_dir
from src.resume import already_stopped, prepare_resume, resume
from src.run_setup import plain_config
from src.run_state import RunState
from src.run_summary import finish, summarise
from src.stop_signal import RunInterrupted, StopSignal
from src.trainer import start_tracking
from src.trial import Reporter
from src.validate import check_config

log = logging.getLogger(__name__)
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


class MemberStack:
    """The members' parameters stacked along a leading member dimension; each member's parameters are
    views into it, so its own optimizer updates the stack in place."""

    def __init__(self, states: Sequence[RunState]):
        self.states = list(states)
        models = [s.model for s in self.states]
        self.params, self.buffers = stack_module_state(models)
        for k, model in enumerate(models):
            for name, p in model.named_parameters():
                p.data = self.params[name][k]
        self.base = models[0]  # the one model definition: functional_call swaps the stacked tensors in

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        smoothing = self.states[0].cfg["trainer"].get("label_smoothing", 0.0)
        logits = functional_call(self.base, (params, self.buffers), (x,))
        return F.cross_entropy(logits, y, weight=weight, label_smoothing=smoothing)

    def step(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step of every member on its own batch; returns the members' losses (detached)."""
        params = {n: p.detach().requires_grad_() for n, p in self.params.items()}
        x = torch.stack([b[0] for b in batches])
        y = torch.stack([b[1] for b in batches])
        weights = None  # each member's own class weights (from its own training subset), when the data has them
        if self.states[0].class_weights is not None:
            weights = torch.stack([s.class_weights for s in self.states])
        self.base.train()
        with self.states[0].autocast:
            losses = vmap(self._loss, in_dims=(0, 0, 0, None if weights is None else 0), randomness="different")(
                params, x, y, weights)
        losses.sum().backward()  # members share no parameter: each gets the gradient of its own loss
        for k, s in enumerate(self.states):
            for name, p in s.model.named_parameters():
                p.grad = params[name].grad[k]
            for group in s.optimizer.param_groups:
                group["lr"] = s.schedule(s.step)
            clip = s.cfg["trainer"].get("grad_clip")
            if clip:
                torch.nn.utils.clip_grad_norm_(s.model.parameters(), clip)
            s.optimizer.step()
            s.optimizer.zero_grad(set_to_none=True)
            s.step += 1
        return losses.detach()

    def release(self) -> None:
        """Give every member its own parameter storage again (before it is saved or leaves the stack)."""
        for s in self.states:
            for p in s.model.parameters():
                p.data = p.data.clone()


class _Member:
    """One stacked run's progress through its current epoch."""

    def __init__(self, state: RunState, reporter: Reporter | None):
        self.state, self.reporter = state, reporter
        self.batches = None  # iterator over the current epoch's batches
        self.pending = None  # a batch drawn for a step that did not happen (another member stopped first)

    def next_batch(self):
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        s = self.state
        if self.batches is None:
            begin_epoch(s)
            self.batches, self.images, self.epoch_start = iter(s.train_loader), 0, s.wall_s()
            self.loss_sum = torch.zeros((), device=s.device)
        return next(self.batches, None)

    def end_epoch(self, reason: str | None, pbar) -> str | None:
        """The single run's end of epoch (``src.loop.run_loop``): time, NaN check, stop rules, evaluation."""
        s = self.state
        s.epoch_done = reason is None
        self.batches = None
        if reason is None and not math.isfinite(self.loss_sum.item()):
            reason = "nonfinite_loss"
        try:
            return close_epoch(s, reason, self.images, self.epoch_start, self.reporter, pbar)
        except TrialTakenOver as e:  # this member's trial was retried elsewhere: it stops alone, as after SIGTERM
            log.warning("%s: %s", s.recorder.dir, e)
            return "interrupted"


def _save(s: RunState) -> None:
    """The single run's end-of-epoch checkpoint; the model's tensors are copied out of the stack (a view
    would save every member's storage)."""
    if checkpoint_due(s):
        state = s.state_dict()
        state["model"] = {k: v.clone() for k, v in state["model"].items()}
        s.recorder.checkpoint(state)


def _tick(members: dict[int, _Member], stack: MemberStack, pbar) -> dict[int, str]:
    """One step of every member (ending and starting epochs as they come); returns members that stopped."""
    stopped, batches = {}, {}
    for k, m in members.items():
        batch = m.next_batch()
        if batch is None:  # the epoch is over: evaluate, maybe stop, else save and start the next one
            reason = m.end_epoch(None, pbar)
            if reason:
                stopped[k] = reason
                continue
            _save(m.state)
            batch = m.next_batch()
        batches[k] = batch
    if stopped:  # no step this tick: the others keep the batches they drew for it
        for k, batch in batches.items():
            members[k].pending = batch
        return stopped
    losses = stack.step([batches[k] for k in members])
    pbar.update()
    for (k, m), loss in zip(members.items(), losses, strict=True):
        s = m.state
        m.loss_sum += loss
        m.images += len(batches[k][1])
        log_every = int(s.cfg["trainer"].get("log_every", 50))
        finite = s.step % log_every or math.isfinite(m.loss_sum.item())  # sync point, as in a single run
        reason = s.rules.after_step(s.step, s.wall_s()) if finite else "nonfinite_loss"
        if reason:
            stopped[k] = reason if reason == "nonfinite_loss" else m.end_epoch(reason, pbar)
    return stopped


def run_members(states: dict[int, RunState], reporters: dict[int, Reporter | None],
                on_done: Callable[[int, dict], None] | None = None) -> dict[int, dict]:
    """Train the set-up members together until each stops; returns each member's summary. ``on_done(k, summary)``
    as each member stops for good (not when a stop signal interrupts them all)."""
    stop = StopSignal()  # SIGTERM/SIGINT: every member saves and ends `interrupted`, as a single run would
    members = {k: _Member(s, until_stopped(reporters.get(k), stop)) for k, s in states.items()}
    summaries: dict[int, dict] = {}
    for s in states.values():
        s.started = time.perf_counter()
    first = next(iter(states.values()))
    with stop.installed(), tqdm(desc=f"stack of {len(states)} {first.info['model']}", unit="step",
                                disable=not first.cfg["trainer"].get("progress", True), leave=False,
                                mininterval=30.0) as pbar:
        stack = MemberStack([m.state for m in members.values()])
        while members:
            stopped = _tick(members, stack, pbar)
            interrupted = stop.signum is not None and not stopped  # every member just stepped: none pending
            if interrupted:
                stopped = {k: m.end_epoch("interrupted", pbar) for k, m in members.items()}
            if stopped:  # finalise them and go on with the others
                stack.release()
                for k, reason in stopped.items():
                    summaries[k] = finish(members.pop(k).state, reason)
                    if not interrupted:
                        _report(on_done, k, summaries[k])
                if interrupted:
                    raise RunInterrupted(stop.signum, summaries)
                if members:
                    stack = MemberStack([m.state for m in members.values()])
    return summaries


def _report(on_done: Callable[[int, dict], None] | None, k: int, summary: dict) -> None:
    """``on_done(k, summary)``, whose failure is logged and never fails the member or the group."""
    if on_done is None:
        return
    try:
        on_done(k, summary)
    except Exception as e:  # noqa: BLE001 - the group's result still carries this member's
        log.warning(f"reporting member {k}'s end failed ({type(e).__name__}: {e})")


def member_bytes(state: RunState) -> int:
    """Device bytes one more stacked member of ``state``'s kind is estimated to need, before any step: its
    parameters four times (weights, gradients, two optimizer moments) plus every tensor autograd saves for
    one training batch, counted by a forward pass on the meta device (no memory, no compute; in fp32, so
    an overestimate under bf16), all times 1.5 for allocator slack and kernel workspaces. The member's data
    is already on the device when this is asked, so the free memory counts it."""
    model = copy.deepcopy(state.model).to("meta").train()
    loader = state.train_loader
    x = torch.empty((loader.batch_size, *loader.x.shape[1:]), device="meta")
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    params = sum(p.numel() * p.element_size() for p in state.model.parameters())
    return int(1.5 * (4 * params + saved))


def device_budget(device: torch.device) -> int | None:
    """Bytes a stacked group may take on ``device`` (None: no limit, on CPU): 90% of the free memory,
    shared equally by the launcher's processes on that GPU (``VITSWEEP_GPU_SHARE``)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(0.9 * free / max(1, int(os.environ.get("VITSWEEP_GPU_SHARE", "1"))))


def fitting_parts(states: dict[int, RunState]) -> list[list[int]]:
    """The members cut into parts that each fit the device's budget (one part where all fit)."""
    keys = list(states)
    first = states[keys[0]]
    budget = device_budget(first.device)
    if budget is None or len(keys) < 2:
        return [keys]
    need = member_bytes(first)
    size = max(1, budget // need)
    if size >= len(keys):
        return [keys]
    parts = [keys[i:i + size] for i in range(0, len(keys), size)]
    log.warning(f"{len(keys)} stacked members need about {len(keys) * need / 2**30:.2f} GiB, {budget / 2**30:.2f} "
                f"GiB fit on {first.device}: training them as {len(parts)} stacks of at most {size}, one after "
                "another (hydra.launcher.max_members sets the largest stack)")
    return parts


def stack_parts(states: dict[int, RunState]) -> list[list[int]]:
    """The members cut into the parts that train as one stack: by resolved precision first (the stacked step runs
    under its first member's autocast, and ``precision=auto`` may resolve differently for a member resumed from a
    checkpoint of another machine), then by the device's memory (``fitting_parts``)."""
    by_precision: dict[Any, dict[int, RunState]] = {}
    for k, s in states.items():
        by_precision.setdefault(s.info.get("precision"), {})[k] = s
    return [part for group in by_precision.values() for part in fitting_parts(group)]


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
    try:
        for k, (cfg, run_dir) in enumerate(zip(cfgs, run_dirs, strict=True)):
            try:  # the single run's start: checks, resume or a fresh set-up (its RNG order included)
                cfg = plain_config(cfg)
                check_config(cfg)
                run_dir = writable_run_dir(run_dir)
                held.enter_context(hold_run_dir(run_dir))
                found, done = prepare_resume(cfg, run_dir)
                if done is None:
                    state = resume(cfg, run_dir, found)
                    start_tracking(state, None if sweep_dir is None else Path(sweep_dir))
                    if not already_stopped(state):
                        states[k] = state
                        continue
                    done = finish(state, state.stop_reason, checkpoint=False)  # killed after its final checkpoint
                results[k] = done
                _report(on_done, k, done)
            except Exception as e:  # this member fails alone
                results[k] = e
        for part in stack_parts(states):
            members = {k: states[k] for k in part}
            for s in members.values():  # what the member's summary records of how it trained
                s.info["stacked_members"] = len(members)
                if s.info.get("attention"):  # under vmap a ViT trains with the explicit ops, whatever it evaluates with
                    s.info["attention_trained"] = "explicit"
            try:
                results_by_member = run_members(members, {k: reporters[k] for k in part}, on_done)
            except Exception as e:  # the stacked step itself failed: every member still training records it
                for k, s in members.items():
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


def _close_trackers(states: Iterable[RunState]) -> None:
    """End the members' tracker runs (a no-op for those a summary ended): KILLED while a stop is in flight (the
    members are handed back and resume), else FAILED. Called from ``finally`` clauses, where ``sys.exc_info``
    holds the exception on its way out."""
    stop = isinstance(sys.exc_info()[1], (RunInterrupted, KeyboardInterrupt))
    for s in states:
        s.recorder.trackers.close("KILLED" if stop else "FAILED")
