"""The set-up that builds a run's state from a composed config: ``setup(cfg, run_dir)`` -> ``RunState``.

``setup`` checks the config, then builds the data (label noise applied), the model, the precision (``auto``: timed
by ``measure_precision``) and attention path, the optimizer, the loaders, the learning-rate schedule, the stop rules,
the recorder and the summary's facts, in the order a run consumes its random streams (``src.run_state.RunState``).
The trainer calls it at every start of a run; the throughput benchmark and launchers that build runs themselves use
the same set-up.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import hydra.utils
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from src import probe_cache
from src.data import DataSplits, build_data
from src.data.loader import Loader, fits_on_device
from src.device_setup import autocast_for, compile_model, numerics, resolve_attention, setup_device, use_channels_last
from src.label_noise import apply_label_noise
from src.optim import build_optimizer
from src.records import RunRecorder
from src.run_contract import objective_direction
from src.run_state import RunState, Schedule
from src.stop_rules import StopRules, steps_in_run
from src.trial import current_trial, study_constant
from src.validate import check_config, check_warmup_steps, resolve_objective, resolve_precision

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


def check_study_objective(t: Mapping[str, Any], objective: str, run_dir: str | Path | None) -> None:
    """In an Optuna trial: refuse an objective other than the one its study's first trial optimised (``auto`` is
    val_error with a validation split, test_error without, so a study sweeping ``dataset.val_size`` through 0 would
    rank, and prune, test errors against validation errors)."""
    trial = current_trial(run_dir)
    if trial is None:
        return
    study_objective = study_constant(trial, "objective_name", objective)
    if study_objective != objective:
        raise ValueError(f"trainer.objective={t.get('objective', 'auto')} is {objective} in this trial, but study "
                         f"{trial.study_name!r} ranks its trials by {study_objective}: one study compares one metric "
                         "(auto is val_error with dataset.val_size > 0, test_error without). Set trainer.objective="
                         f"{study_objective} and give every trial a dataset.val_size that has that split")


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
    batch = min(int(t["batch_size"]), len(data.y_train))
    per_epoch = len(data.y_train) // batch  # the training loader's steps (drop_last), known before the model is built
    check_warmup_steps(cfg["scheduler"], t, per_epoch, steps_in_run(t.get("max_epochs"), t.get("max_steps"), per_epoch))
    model, model_cfg = build_model(cfg["model"], data)
    channels_last = use_channels_last(model, device, t.get("channels_last", "auto"))
    model = model.to(device, memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    probe, attention, probe_from = None, None, None
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
    check_study_objective(t, objective, run_dir)
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
