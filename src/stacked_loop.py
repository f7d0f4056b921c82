"""The stacked members' training loop (``src.stacked.train_members`` hands it members already set up): one
``torch.func`` step trains them all, and each member's epochs, stop rules, evaluation and checkpoints are its single
run's (``src.loop``).

``MemberStack`` stacks the members' parameters along a leading member dimension (``stack_module_state``) and makes
each member's parameters views into them; its step is one ``vmap`` of ``functional_call`` over the one model
definition (every member's loss on its own batch; dropout draws a different mask per member), one backward, then
each member's own optimizer steps its parameters in place. ``run_members`` steps the members until each stops: a
member that stops (converged, stalled, pruned, non-finite loss, its trial taken over, its evaluation or pruner report
failed) is finalised and leaves the stack while the others go on; a SIGTERM/SIGINT ends every member ``interrupted``,
saved, as a single run.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from tqdm.auto import tqdm

from hydra_plugins.vitsweep_sweeper.protocol import TrialTakenOver
from src.loop import begin_epoch, checkpoint_due, close_epoch, until_stopped
from src.run_state import RunState
from src.run_summary import finish, summarise
from src.stop_signal import RunInterrupted, StopSignal
from src.trial import Reporter

log = logging.getLogger(__name__)


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
        self.error: Exception | None = None  # what failed this member's end of epoch (it then ends `error`)

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
        except Exception as e:  # its evaluation or its pruner report failed: it fails alone, as its single run
            log.error("%s: its end of epoch %d failed; the other members go on", s.recorder.dir, s.epoch, exc_info=e)
            self.error = e
            return "error"

    def fail(self) -> Exception:
        """End as a single run whose loop raised ``self.error``: its summary says so, its last checkpoint stays."""
        s, e = self.state, self.error
        s.recorder.summary(summarise(s, "error", f"{type(e).__name__}: {e}"), s.cfg)
        return e


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
        if reason:  # the single run's close of the epoch, a non-finite loss's included (its time is training time)
            stopped[k] = m.end_epoch(reason, pbar)
    return stopped


def run_members(states: dict[int, RunState], reporters: dict[int, Reporter | None],
                on_done: Callable[[int, dict | Exception], None] | None = None,
                stop: StopSignal | None = None) -> dict[int, dict | Exception]:
    """Train the set-up members together until each stops; returns each member's summary, or the exception that
    failed its end of epoch (evaluation, pruner report) alone. ``on_done(k, summary)`` as each member stops for good
    (not when a stop signal interrupts them all). ``stop``: the caller's handlers, installed by it since before the
    members' trackers started (``src.stacked.train_members``); a signal they noted stops the group after its first
    step. None: this call installs its own."""
    own = stop is None
    stop = stop or StopSignal()  # SIGTERM/SIGINT: every member saves and ends `interrupted`, as a single run would
    members = {k: _Member(s, until_stopped(reporters.get(k), stop)) for k, s in states.items()}
    summaries: dict[int, dict] = {}
    for s in states.values():
        s.started = time.perf_counter()
    first = next(iter(states.values()))
    handlers = stop.installed() if own else contextlib.nullcontext()
    with handlers, tqdm(desc=f"stack of {len(states)} {first.info['model']}", unit="step",
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
                    m = members.pop(k)
                    summaries[k] = m.fail() if m.error is not None else finish(m.state, reason)
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
