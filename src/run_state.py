"""A run's whole state as one object, and the set-up that builds it from a composed config.

``setup(cfg, run_dir)`` turns a config into a ``RunState`` (data, model, optimizer, grad scaler, loaders,
learning-rate schedule, stop rules, recorder); ``state_dict()`` / ``load_state_dict()`` make
checkpointing and resuming it one call each. The trainer (``src.trainer``) runs the loop on it; the
throughput benchmark and launchers that build runs themselves use the same set-up.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import logging
import math
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra.utils
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from src import probe_cache
from src.data import DataSplits, build_data
from src.data.loader import Loader, fits_on_device
from src.label_noise import apply_label_noise
from src.optim import build_optimizer
from src.records import RunRecorder
from src.run_contract import objective_direction
from src.schedule import lr_at
from src.stop_rules import StopRules, steps_in_run
from src.trial import current_trial
from src.validate import check_config, resolve_objective, resolve_precision

log = logging.getLogger(__name__)


def build_model(model_cfg: Mapping[str, Any], data: DataSplits) -> tuple[torch.nn.Module, dict]:
    """Instantiate the ``model`` group for this data; returns the model and its full kwargs."""
    c, h, w = data.image_shape
    if h != w:
        raise ValueError(f"images are {h}x{w}: models expect square images, set dataset.image_size")
    full = {**dict(model_cfg), "image_size": h, "in_channels": c, "num_classes": data.num_classes}
    try:
        return hydra.utils.instantiate(full), full
    except InstantiationException as e:  # surface the constructor's own message (it names the key)
        raise (e.__cause__ if isinstance(e.__cause__, (ValueError, FileNotFoundError)) else e) from None


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


BF16_MARGIN = 1.1  # bf16 must beat fp32 by this factor: fp32 is the reference numerics, so near-ties keep it
PROBE_STEPS = 3  # timed forward + backward passes per precision, after one untimed warm-up


def step_seconds(model: torch.nn.Module, xb: torch.Tensor, yb: torch.Tensor,
                 autocast: contextlib.AbstractContextManager) -> float:
    """Median seconds of one forward + backward pass of ``model`` on (xb, yb) under ``autocast``."""
    times = []
    for i in range(PROBE_STEPS + 1):
        start = time.perf_counter()
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_precision(model: torch.nn.Module, image_shape: tuple[int, ...], num_classes: int,
                      batch_size: int, channels_last: bool = False,
                      prepare: Callable[[torch.nn.Module, str], Any] | None = None
                      ) -> tuple[str, dict[str, float]] | tuple[str, dict[str, float], dict[str, Any]]:
    """``auto`` on a CPU with native bf16: time a training step's forward + backward of this model at this
    batch size in fp32 and in bf16, and take bf16 only where it is at least ``BF16_MARGIN`` times faster (on
    one AVX512-BF16 CPU bf16 was 2.1x faster for the C1 = 32 CNN and slower at C1 <= 8; on another, 1.6x
    slower for the dim 64, depth 3 ViT). The probe trains a copy on a synthetic batch (in the memory format the
    run trains in) and restores the global random state, so the run it chooses for is the run it would be
    without it. Returns the choice and the median seconds per pass of each.

    ``prepare(copy, precision)``, where given, readies the probe's copy for that precision before it is timed and
    its return value is returned per precision as a third item: ``setup`` passes the attention probe, so that each
    precision is timed with the attention path ``model.attention=auto`` would pick under it (timed with the
    model's default path instead, bf16 lost by 2x where the CPU flash kernel is slow in bf16 and won by 1.7x with
    the explicit path: the double-descent ViT, docs/benchmarks/README.md)."""
    rng = torch.get_rng_state()
    try:
        probe = copy.deepcopy(model).train()
        g = torch.Generator().manual_seed(0)
        xb = torch.randn(batch_size, *image_shape, generator=g)
        xb = xb.contiguous(memory_format=torch.channels_last) if channels_last else xb
        yb = torch.randint(0, num_classes, (batch_size,), generator=g)
        cpu = torch.device("cpu")
        seconds, prepared = {}, {}
        for p in ("fp32", "bf16"):
            if prepare is not None:
                prepared[p] = prepare(probe, p)
            seconds[p] = step_seconds(probe, xb, yb, autocast_for(cpu, p))
    finally:
        torch.set_rng_state(rng)
    chosen = "bf16" if seconds["fp32"] >= BF16_MARGIN * seconds["bf16"] else "fp32"
    return (chosen, seconds, prepared) if prepare is not None else (chosen, seconds)


def resolve_attention(model: torch.nn.Module, batch_size: int, device: torch.device,
                      precision: str, context: str = "", shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``model.attention``: resolve ``auto`` by measurement (``src.models.attention_probe``) and log the choice.
    Returns the summary's facts: ``attention`` (the path) and, for ``auto``, the probe's seconds and reason.
    With ``shape`` (what the model is: its config and input), this machine's earlier measurement of that shape is
    reused (``src.probe_cache``; ``attention_probe_cached`` names its file)."""
    if not hasattr(model, "attention_path"):
        return {}
    if model.attention != "auto":
        return {"attention": model.attention_path()}
    from src.models.attention_probe import choose_attention

    def measure() -> dict[str, Any]:
        path, seconds, reason = choose_attention(model, batch_size, autocast_for(device, precision),
                                                 precision == "bf16")
        return {"attention": path, "attention_probe_s": seconds, "attention_reason": reason}

    key = {"shape": dict(shape), "batch": batch_size, "device": device.type, "precision": precision}
    facts, source = probe_cache.cached("attention", key, device, measure) if shape is not None else (measure(), None)
    model.set_attention_path(facts["attention"])
    kept = f"; kept from {source}" if source else ""
    log.info("attention auto%s: %s (%s%s)", context, facts["attention"], facts["attention_reason"], kept)
    return facts | ({"attention_probe_cached": str(source)} if source else {})


def setup_device(device: torch.device, t: Mapping[str, Any]) -> None:
    """Process-wide settings for training on ``device``: CPU threads, TF32 and cuDNN autotuning on CUDA."""
    if t.get("num_threads"):
        torch.set_num_threads(int(t["num_threads"]))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def numerics(device: torch.device) -> dict[str, Any]:
    """What ``precision`` leaves unsaid, for the summary: on CUDA whether fp32 matmuls and convolutions ran as TF32
    (``setup_device`` turns it on), so an "fp32" GPU run is not read as true fp32 beside a CPU one."""
    if device.type != "cuda":
        return {}
    return {"tf32": bool(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32)}


def use_channels_last(model: torch.nn.Module, device: torch.device, setting: bool | str = "auto") -> bool:
    """``trainer.channels_last``: ``auto`` turns it on for convolutional models (no transformer blocks).
    It pays on CPU too (oneDNN): measured 18-25% faster steps for cnn widths 4-8 and ~10% for resnet18."""
    if setting == "auto":
        return not hasattr(model, "blocks")
    return bool(setting)


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile`` for one run. Dynamo's in-memory caches are reset first: runs of a sweep in one
    process (Hydra's basic launcher) would otherwise hit its recompile limit after four runs and fall
    back to eager silently. Kernels still come from inductor's on-disk FX graph cache when shapes match."""
    torch._dynamo.reset()
    return torch.compile(model)


@dataclass
class Schedule:
    """The learning rate as a pure function of the step (``src.schedule.lr_at``) for one run."""

    base_lr: float
    total_steps: float  # inf with a wall-time limit alone (constant schedule only)
    warmup_steps: int
    name: str
    min_lr_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        total = int(self.total_steps) if math.isfinite(self.total_steps) else step + 1
        return lr_at(step, self.base_lr, total, self.warmup_steps, self.name, self.min_lr_ratio)


@dataclass
class RunState:
    """Everything one run is: what ``setup`` built plus its progress (the part ``state_dict`` saves).

    Reproducing one run's start outside ``setup`` (e.g. a launcher stacking several runs into one
    model) means consuming the random streams in this order: ``torch.manual_seed(seed)``;
    ``build_data(cfg.dataset, seed)``; label noise with ``apply_label_noise(y_train, p, num_classes,
    torch.Generator().manual_seed(seed + 1))``; ``build_model`` (initial weights from the global torch
    generator, right after the data); the training loader's own generator seeded with ``seed`` (batch
    order, then the augmentation draws of each batch, epoch after epoch); the scored train-eval subset
    from ``torch.Generator().manual_seed(seed + 2)``. Dropout draws from the global torch generator as
    training goes, continuing from its state right after ``build_model``. Neighbouring seeds share streams
    (seed s's label noise uses the integer seed that seed s + 1's initialisation uses): see docs/config.md.
    """

    cfg: dict
    device: torch.device
    data: DataSplits
    model: torch.nn.Module
    model_cfg: dict
    step_model: torch.nn.Module  # the model, or its torch.compile wrapper
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: contextlib.AbstractContextManager
    train_loader: Loader
    eval_loaders: dict[str, Loader]
    train_eval_clean: tuple[torch.Tensor, torch.Tensor]  # original labels and flipped mask of the scored train images
    schedule: Schedule
    rules: StopRules
    recorder: RunRecorder | None
    objective_name: str
    info: dict  # facts of the run that go into summary.json unchanged
    class_weights: torch.Tensor | None = None
    epoch: int = 0  # the epoch in progress, or the last one finished when ``epoch_done``
    epoch_done: bool = True
    step: int = 0
    train_time: float = 0.0  # seconds spent in training steps, over all starts of the run
    wall_before: float = 0.0  # wall seconds spent by earlier starts of the run
    last_row: dict = field(default_factory=dict)  # the latest evaluation
    best: dict = field(default_factory=dict)  # best_test_error, best_val_error so far
    stop_reason: str | None = None  # set by the final checkpoint of a run
    started: float = field(default_factory=time.perf_counter)
    machines_before: list | None = None  # the machines a resumed run's checkpoint names (None: not resumed)
    # rows seen, last row and best metrics before an evaluation of a half-trained epoch (a step rule stopped the run
    # mid-epoch): a run extended past that stop drops the evaluation, as an uninterrupted run never made it
    before_partial: dict | None = None

    def drop_partial_evaluation(self) -> None:
        """A run extended past a step rule that stopped it mid-epoch: its evaluation of the half-trained epoch leaves
        ``metrics.jsonl``, the last row and the best metrics (as it left the stop rules' history on load), so the
        extended run's records equal an uninterrupted run's: one row per epoch, and no best value of a model that run
        never evaluated (found 2026-11-29: best_val_error 0.045 against the uninterrupted 0.05). Checkpoints written
        before 2026-11-29 do not hold what to restore, and keep the row."""
        bp, self.before_partial = self.before_partial, None
        if bp is None:
            return
        self.last_row, self.best = dict(bp["last_row"]), dict(bp["best"])
        if self.recorder is not None:
            self.recorder.keep_rows(int(bp["rows"]))

    def wall_s(self) -> float:
        """Wall time of the run so far, counted across resumes."""
        return self.wall_before + time.perf_counter() - self.started

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, dicts, lists, numbers and strings only (``torch.load(weights_only=True)`` reads it)."""
        cuda = torch.cuda.get_rng_state_all() if self.device.type == "cuda" else []
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "model_cfg": self.model_cfg, "config": self.cfg,
            "data": dict(self.data_record),
            "epoch": self.epoch, "epoch_done": self.epoch_done, "step": self.step, "train_time": self.train_time,
            "wall_s": self.wall_s(), "rows": self.recorder.rows if self.recorder else 0,
            "last_row": dict(self.last_row), "best": dict(self.best), "rules": self.rules.state_dict(),
            "before_partial": self.before_partial,
            "stop_reason": self.stop_reason,
            "rng": {"torch": torch.get_rng_state(), "cuda": list(cuda)}, "loader": self.train_loader.state_dict(),
            "steps_per_epoch": len(self.train_loader),  # the schedule's horizon under other limits (check_extension)
            "precision": self.info["precision"],  # what `auto` chose: a resumed run keeps it
            "attention": self.info.get("attention"),  # likewise model.attention=auto's path
            "machines": self.info["machines"],  # every machine this run has trained on, in order
        }

    @functools.cached_property
    def data_record(self) -> dict[str, Any]:
        """What the checkpoint keeps of the data it trained on: the training images' statistics and shape, the class
        count and digests of the training labels as trained (label noise applied) and of the test labels. The data
        never changes within a run, so it is computed once, not at every checkpoint."""
        def digest(y: torch.Tensor) -> str:
            return hashlib.sha256(y.detach().cpu().contiguous().numpy().tobytes()).hexdigest()

        return {"mean": list(self.data.mean), "std": list(self.data.std), "image_shape": list(self.data.image_shape),
                "num_classes": self.data.num_classes, "labels_sha256": digest(self.data.y_train),
                "test_labels_sha256": digest(self.data.y_test)}

    def check_same_data(self, saved: Mapping[str, Any] | None) -> None:
        """Raise :class:`OtherDataError` when a checkpoint trained on other data than this run's: ``dataset.root``
        may move between starts (another machine's copy of a file), but continuing on other content (another file,
        other noisy labels, another test set) would finish one run on two datasets. It is an error, not a checkpoint
        to fall back from: starting afresh would throw the run's training away for what is likely a wrong path. The
        statistics are compared to a relative 1e-6 (their sums may round differently on another CPU); a checkpoint
        written before the label digests has none to compare."""
        if not saved:
            return
        now = self.data_record
        differ = [k for k in ("image_shape", "num_classes") if saved[k] != now[k]]
        differ += [k for k in ("mean", "std")
                   if not all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                              for a, b in zip(saved[k], now[k], strict=True))]
        for key, what in (("labels_sha256", "training labels"), ("test_labels_sha256", "test labels")):
            if saved.get(key) not in (None, now[key]):
                differ.append(what)
        if differ:
            raise OtherDataError(f"the checkpoint trained on other data ({', '.join(differ)} differ): the data behind "
                                 "dataset.root or the label noise changed since. Fix: point dataset.root back at the "
                                 "run's data, or trainer.resume=never to move this run's files aside and train it "
                                 "afresh on the new data")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; raises (RuntimeError, ValueError, KeyError) on one that does not fit."""
        self.check_same_data(state.get("data"))
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.rules.load_state_dict(state["rules"])
        self.train_loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"]["torch"])
        if self.device.type == "cuda" and state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.epoch, self.epoch_done, self.step = int(state["epoch"]), bool(state["epoch_done"]), int(state["step"])
        history = self.rules.history
        if not self.epoch_done and history and history[-1][0] == self.epoch:
            # a step rule stopped the run inside this epoch and evaluated the half-trained model: that value leaves
            # the convergence history (the epoch is evaluated when done, as in a run never stopped), else the
            # window would hold two values for one epoch and could converge later than the uninterrupted run
            history.pop()
            self.before_partial = state.get("before_partial")  # dropped from the records if the run goes on
        self.train_time, self.wall_before = float(state["train_time"]), float(state["wall_s"])
        self.last_row, self.best = dict(state["last_row"]), dict(state["best"])
        self.stop_reason = state.get("stop_reason")
        if state.get("precision", self.info["precision"]) != self.info["precision"]:  # auto chose otherwise now
            self.info["precision"] = state["precision"]
            self.autocast = autocast_for(self.device, state["precision"])
        if state.get("attention") and state["attention"] != self.info.get("attention"):  # auto chose otherwise now
            self.info["attention"] = state["attention"]
            self.model.set_attention_path(state["attention"])
        # a checkpoint written before machines were recorded (2026-11-27) trained on a machine nobody named
        before = list(state["machines"]) if "machines" in state else ["not recorded"]
        self.machines_before = before
        self.info["machines"] = before + [m for m in self.info["machines"] if m not in before]
        if self.recorder is not None:
            self.recorder.keep_rows(int(state["rows"]))


class OtherDataError(Exception):
    """A checkpoint of this run dir trained on other data than this start would: not resumed, and not replaced."""


def _place(data: DataSplits, device: torch.device) -> bool:
    """Move the splits to the device once (the train and train-eval loaders share one copy) when they fit."""
    splits = [x for x in (data.x_train, data.x_val, data.x_test) if x is not None]
    resident = fits_on_device(sum(x.numel() for x in splits), device)
    if resident:
        data.x_train, data.x_test = data.x_train.to(device), data.x_test.to(device)
        data.x_val = data.x_val.to(device) if data.x_val is not None else None
    return resident


def build_loaders(cfg: Mapping[str, Any], data: DataSplits, y_clean: torch.Tensor, flipped: torch.Tensor,
                  device: torch.device, channels_last: bool) -> tuple[Loader, dict[str, Loader], tuple]:
    """The training loader, the evaluation loaders (train subset, val, test) and the original labels
    and flipped mask of the scored train images."""
    t, seed, n_train = cfg["trainer"], int(cfg["seed"]), len(data.y_train)
    common = dict(device=device, mean=data.mean, std=data.std, channels_last=channels_last,
                  resident=_place(data, device))
    train_loader = Loader(data.x_train, data.y_train, min(int(t["batch_size"]), n_train),
                          augment=cfg["dataset"].get("augment", "none"), shuffle=True, drop_last=True, seed=seed,
                          sample_weights=data.sample_weights, **common)
    x, y, clean = data.x_train, data.y_train, (y_clean, flipped)  # no copy of the images when all are scored
    if t.get("train_eval_size") and t["train_eval_size"] < n_train:
        keep = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed + 2))[: int(t["train_eval_size"])]
        x, y, clean = x[keep.to(x.device)], y[keep], (y_clean[keep], flipped[keep])
    ebs = int(t["eval_batch_size"])
    eval_loaders = {"train": Loader(x, y, ebs, **common)}
    if data.x_val is not None:
        eval_loaders["val"] = Loader(data.x_val, data.y_val, ebs, **common)
    eval_loaders["test"] = Loader(data.x_test, data.y_test, ebs, **common)
    return train_loader, eval_loaders, clean


def machine_name(device: torch.device) -> str:
    """What trains on ``device``, as a summary names it: the GPU's name, or the CPU's model name with its family and
    model numbers (the CPU changes between sessions of one study; two CPUs of one name can be other cores)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    fields = probe_cache.cpu_fields()
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def _summary_info(cfg: Mapping[str, Any], data: DataSplits, flipped: torch.Tensor, params: int,
                  device: torch.device, precision: str, objective: str, chance: float,
                  run_dir: str | Path | None = None) -> dict[str, Any]:
    info = {"params": params, "device": str(device), "machines": [machine_name(device)], "precision": precision,
            "seed": int(cfg["seed"]),
            "model": cfg["model"]["_target_"].rsplit(".", 1)[-1], "dataset": cfg["dataset"]["name"],
            "n_train": len(data.y_train), "noisy_label_fraction": flipped.float().mean().item(),
            "objective_name": objective, "objective_direction": objective_direction(objective),
            "chance_train_error": chance, **numerics(device), **data.info}
    trial = current_trial(run_dir)  # set by the vitsweep sweeper through Hydra, never a config key
    if trial is not None:
        info.update(study_name=trial.study_name, trial_number=trial.number, study_storage=trial.storage)
        if objective.startswith("test_") and cfg["trainer"].get("objective", "auto") == "auto":
            log.warning("this Optuna trial is tuned on the TEST split (trainer.objective=auto and no "
                        "dataset.val_size): set dataset.val_size to tune on a validation split instead")
    return info


def plain_config(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A composed config as a resolved plain dict (what checkpoints store and compare)."""
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def chance_error(labels: torch.Tensor) -> float:
    """Error of always predicting the commonest of ``labels`` (the training labels, noisy ones included)."""
    return 1.0 - torch.bincount(labels).max().item() / max(len(labels), 1)


def setup(cfg: DictConfig | Mapping[str, Any], run_dir: str | Path | None) -> RunState:
    """Build a run from a composed config, checked first (``src.validate.check_config``). The run starts
    at epoch 0; ``load_state_dict`` continues it from a checkpoint. ``run_dir=None`` builds without a
    recorder (benchmarks); with a run dir, only ``metrics.jsonl`` is created (empty) if absent."""
    cfg = plain_config(cfg)
    device = check_config(cfg)
    t, seed = cfg["trainer"], int(cfg["seed"])
    precision = resolve_precision(t["precision"], device)
    setup_device(device, t)
    torch.manual_seed(seed)
    data = build_data(cfg["dataset"], seed)
    y_clean = data.y_train
    data.y_train, flipped = apply_label_noise(y_clean, float(cfg["label_noise"]["p"]), data.num_classes,
                                              torch.Generator().manual_seed(seed + 1))
    model, model_cfg = build_model(cfg["model"], data)
    channels_last = use_channels_last(model, device, t.get("channels_last", "auto"))
    model = model.to(device, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    batch, probe, attention, probe_from = min(int(t["batch_size"]), len(data.y_train)), None, None, None
    # what the start-up probes time, so this machine's earlier measurement of the same shape is reused
    shape = {"model": model_cfg, "image_shape": list(data.image_shape), "classes": data.num_classes,
             "channels_last": channels_last}
    if t["precision"] == "auto" and precision == "bf16" and device.type == "cpu":
        # with model.attention=auto the two are chosen together: each precision timed with its own best path
        pick = ((lambda m, p: resolve_attention(m, batch, device, p, f" under {p}", shape))
                if getattr(model, "attention", None) == "auto" else None)

        def measure() -> dict[str, Any]:
            chosen, seconds, *prepared = measure_precision(model, tuple(data.image_shape), data.num_classes, batch,
                                                           channels_last, pick)
            return {"precision": chosen, "seconds": seconds, "attention": prepared[0] if prepared else {}}

        found, source = probe_cache.cached("precision", shape | {"batch": batch}, device, measure)
        precision, probe, paths = found["precision"], found["seconds"], found["attention"]
        with_path = {p: f" with {f['attention']} attention" for p, f in paths.items()}
        log.info("precision auto: %s (forward + backward %.1f ms in fp32%s, %.1f ms in bf16%s%s)", precision,
                 1e3 * probe["fp32"], with_path.get("fp32", ""), 1e3 * probe["bf16"], with_path.get("bf16", ""),
                 f"; kept from {source}" if source else "")
        if source:
            probe_from = str(source)
        if paths:
            attention = paths[precision] | {"precision_probe_attention": {p: f["attention"] for p, f in paths.items()}}
            model.set_attention_path(attention["attention"])
            log.info("attention auto: %s (chosen with precision %s)", attention["attention"], precision)
    if attention is None:
        attention = resolve_attention(model, batch, device, precision, shape=shape)
    optimizer = build_optimizer(model, cfg["optimizer"], device)
    train_loader, eval_loaders, clean = build_loaders(cfg, data, y_clean, flipped, device, channels_last)
    objective = resolve_objective(str(t.get("objective", "auto")), tuple(eval_loaders), data.num_classes == 2)
    steps_per_epoch = len(train_loader)
    schedule = Schedule(optimizer.param_groups[0]["base_lr"],
                        steps_in_run(t.get("max_epochs"), t.get("max_steps"), steps_per_epoch),
                        int(cfg["scheduler"].get("warmup_epochs", 0) * steps_per_epoch), cfg["scheduler"]["name"],
                        cfg["scheduler"].get("min_lr_ratio", 0.0))
    params = sum(p.numel() for p in model.parameters())
    chance = chance_error(data.y_train)
    return RunState(
        cfg=cfg, device=device, data=data, model=model, model_cfg=model_cfg,
        step_model=compile_model(model) if t.get("compile") else model, optimizer=optimizer,
        scaler=torch.amp.GradScaler(device.type, enabled=precision == "fp16"),
        autocast=autocast_for(device, precision), train_loader=train_loader, eval_loaders=eval_loaders,
        train_eval_clean=clean, schedule=schedule, rules=StopRules.from_config(t, chance),
        recorder=RunRecorder(run_dir) if run_dir is not None else None, objective_name=objective,
        info=_summary_info(cfg, data, flipped, params, device, precision, objective, chance, run_dir)
        | ({"precision_probe_s": probe} if probe else {})
        | ({"precision_probe_cached": probe_from} if probe_from else {}) | attention,
        class_weights=data.class_weights.to(device) if data.class_weights is not None else None)
