"""Checks that need no data: each names the config key and the fix, and runs before any work."""
from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from src.data import DATASETS, check_classes
from src.data.augment import AUGMENTS
from src.models.vit import check_vit_depth, check_vit_shape
from src.run_contract import BINARY_METRICS
from src.schedule import SCHEDULERS
from src.trackers import check_trackers

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
RESUME = ("auto", "never")
WHOLE_KEYS = {"max_epochs": "epochs", "max_steps": "optimizer steps", "converge_epochs": "epochs",
              "batch_size": "images per step", "eval_every": "epochs between evaluations",
              "eval_batch_size": "images per evaluation pass"}  # trainer keys that count whole things
SPLIT_METRICS = ("loss", "error", "acc")
CLEAN_METRICS = ("train_loss_clean", "train_error_clean", "train_error_noisy_subset")


def objective_metrics(splits: tuple[str, ...] = ("train", "val", "test"), binary: bool = True) -> list[str]:
    """Every metric a run with these evaluation splits records per evaluation and in its summary."""
    names = [f"{s}_{m}" for s in splits for m in (*SPLIT_METRICS, *(BINARY_METRICS if binary else ()))]
    return names + list(CLEAN_METRICS) + [f"best_{s}_error" for s in splits if s != "train"]


def resolve_objective(name: str, splits: tuple[str, ...], binary: bool) -> str:
    """``trainer.objective`` checked against the metrics this run will produce (``auto``: val_error with a
    validation split, else test_error)."""
    if name == "auto":
        return "val_error" if "val" in splits else "test_error"
    known = objective_metrics(splits, binary)
    if name in known:
        return name
    if name.startswith(("val_", "best_val_")) and name in objective_metrics((*splits, "val"), binary):
        raise ValueError(f"trainer.objective={name} needs a validation split: set dataset.val_size > 0")
    close = difflib.get_close_matches(name, objective_metrics(("train", "val", "test"), True), n=4, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"trainer.objective={name!r} is not a metric this run records: {hint}choose auto or one of "
                     f"{known}")


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.device={name} but no CUDA device is visible: use trainer.device=auto or cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"trainer.device={name!r} is unknown: choose auto, cpu, cuda or cuda:N")
    if name.startswith("cuda:"):
        return _cuda_n(name)
    return torch.device(name)


def _cuda_n(name: str) -> torch.device:
    """``cuda:N``: the N-th device this process sees, checked. In a vectorized-launcher worker pinned
    (``CUDA_VISIBLE_DEVICES``) to the one GPU that the launching process calls ``cuda:N``, that GPU, the worker's only
    device (``hydra_plugins/vitsweep_launcher/devices.py``, ``_worker_gpu_env``)."""
    from hydra_plugins.vitsweep_launcher.devices import LAUNCHER_DEVICE_ENV, cuda_index

    pinned, number = os.environ.get(LAUNCHER_DEVICE_ENV), name.split(":", 1)[1]
    if pinned and number.isdigit():
        if int(number) != int(pinned.split(":", 1)[1]):
            raise ValueError(f"trainer.device={name}: this launcher worker is pinned to the GPU of "
                             f"trainer.device={pinned}, its batch's first job's; the jobs of one multirun batch share "
                             "one trainer.device (sweep devices in separate multiruns, or use trainer.device=cuda)")
        return torch.device("cuda")
    return torch.device("cuda", cuda_index(name, torch.cuda.device_count(), "this process",
                                           "trainer.device=cuda for the first of them"))


def cpu_has_fast_bf16() -> bool:
    """bf16 matmuls are only fast on CPUs with AVX512-BF16 or AMX; elsewhere they are emulated
    (measured here on an AVX2-only EPYC: 0.3 GFLOP/s bf16 against 65 GFLOP/s fp32)."""
    cpu = getattr(torch, "cpu", None)
    return bool(cpu and (cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()))


def resolve_precision(name: str, device: torch.device) -> str:
    """``auto`` -> bf16 where the device runs it natively (CUDA with bf16, CPUs with AVX512-BF16/AMX), else fp32."""
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_has_fast_bf16() else "fp32"


def check_config(cfg: Mapping[str, Any]) -> torch.device:
    """Validate the composed config; returns the training device."""
    t, d = cfg["trainer"], cfg["dataset"]
    _check_study_found(cfg)
    _check_removed_keys(cfg)
    p = cfg["label_noise"]["p"]
    if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"label_noise.p={p} must be in [0, 1): it is the probability of replacing a training label")
    dropout = (cfg.get("model") or {}).get("dropout")
    if dropout is not None and (not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0):
        raise ValueError(f"model.dropout={dropout} must be in [0, 1): it is the probability of zeroing an activation")
    if d["name"] not in DATASETS:
        raise ValueError(f"dataset.name={d['name']!r} is unknown: choose one of {list(DATASETS)}")
    if d.get("augment", "none") not in AUGMENTS:
        raise ValueError(f"dataset.augment={d.get('augment')!r} is unknown: choose one of {list(AUGMENTS)}")
    check_classes(d.get("classes"), d["name"])  # the list's shape; membership is checked when the labels are loaded
    _check_dataset_sizes(d)
    _check_vit_shape(cfg.get("model") or {}, d)
    if cfg["scheduler"]["name"] not in SCHEDULERS:
        raise ValueError(f"scheduler.name={cfg['scheduler']['name']!r} is unknown: choose one of {list(SCHEDULERS)}")
    if t["precision"] not in PRECISIONS:
        raise ValueError(f"trainer.precision={t['precision']!r} is unknown: choose one of {list(PRECISIONS)}")
    _check_trainer_keys(t, cfg["scheduler"]["name"])
    check_trackers(cfg)  # a tracker's package is missing: say which extra to install, before any training
    for key in (*WHOLE_KEYS, "max_wall_s"):
        v = t.get(key)
        if v is None:
            continue
        if key in WHOLE_KEYS and not _whole(v, 1):
            # a fractional max_epochs set the cosine's horizon inside the last epoch and trained the rest at lr 0;
            # a fractional batch_size became int(0.5) = 0 images per step
            raise ValueError(f"trainer.{key}={v} must be a whole number >= 1 (or null where allowed): it counts "
                             f"{WHOLE_KEYS[key]}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"trainer.{key}={v} must be a positive number (or null where allowed)")
    _check_training_numbers(t)
    _check_optimizer_numbers(cfg.get("optimizer") or {})
    _check_schedule_keys(cfg["scheduler"], t)
    objective = str(t.get("objective", "auto"))
    if objective != "auto":
        resolve_objective(objective, ("train", "val", "test"), True)  # the name; the splits are checked in setup
    device = select_device(str(t["device"]))
    if t["precision"] == "fp16" and device.type != "cuda":
        raise ValueError("trainer.precision=fp16 needs CUDA (it uses a gradient scaler): "
                         "use trainer.precision=bf16 on CPU")
    return device


def _check_study_found(cfg: Mapping[str, Any]) -> None:
    """A study file Hydra found merges into the config and leaves no ``sweeps`` key; one it did not find (no
    ``--config-dir .``, or another working folder) stays a plain value and the run would train the defaults."""
    if "sweeps" in cfg:
        study = cfg["sweeps"]
        raise ValueError(
            f"sweeps={study} is a plain value in this config: Hydra found no study file sweeps/{study}.yaml, so "
            f"+sweeps={study} would train the defaults instead of the study's recipe. Fix: run from the "
            f"repository root with the study folder on Hydra's path (python -m src.train --config-dir . "
            f"+sweeps={study} ...), or python -m src.sweep {study} ...")


def _check_removed_keys(cfg: Mapping[str, Any]) -> None:
    if "scale_lr_by_width" in (cfg.get("optimizer") or {}):
        raise ValueError(
            "optimizer.scale_lr_by_width was removed: the lr is now the same constant at every model width "
            "(PyTorch's standard parametrisation, where one SGD step moves a cnn's logits within a factor of 2 from "
            "C1 = 1 to 32). "
            "The EPFL paper's eta_eff = eta / h belongs to its own parametrisation with 1/h gradients (sec. 3.2); "
            "dividing the lr by the width here shrank the step h-fold. Fix: drop the key and set optimizer.lr "
            "(e.g. 0.05 with optimizer=sgd)")


def _check_trainer_keys(t: Mapping[str, Any], scheduler: str) -> None:
    if not t.get("max_epochs") and not t.get("max_steps"):
        if not t.get("max_wall_s"):
            raise ValueError("set trainer.max_epochs, trainer.max_steps or trainer.max_wall_s: a run needs a stop rule")
        if scheduler != "constant":
            raise ValueError(f"scheduler={scheduler} needs a run length in epochs or steps: with trainer.max_wall_s "
                             "alone use scheduler=constant, or set trainer.max_epochs / trainer.max_steps")
    log_every = t.get("log_every", 50)
    if not _whole(log_every, 1):
        raise ValueError(f"trainer.log_every={log_every} must be an integer >= 1 (steps between loss checks)")
    every = t.get("checkpoint_every", 1)
    if not _whole(every, 0):
        raise ValueError(f"trainer.checkpoint_every={every} must be an integer >= 0 (epochs; 0 = only at the end)")
    test_every, eval_every = t.get("test_every", 1), t.get("eval_every", 1)
    if test_every is not None and (not _whole(test_every, 1)
                                   or (isinstance(eval_every, int) and eval_every > 0 and test_every % eval_every
                                       and eval_every % test_every)):  # a divisor (e.g. 1): every evaluation
        raise ValueError(f"trainer.test_every={test_every} must be null, a whole multiple of trainer.eval_every="
                         f"{eval_every} or a divisor of it such as 1 (every evaluation then scores the test split); it "
                         "counts epochs between scorings of the test split, and the final evaluation always scores it")
    size = t.get("train_eval_size")  # a fraction (0.5) scored no image: train_error 0.0, as if interpolated
    if size is not None and not _whole(size, 1):
        raise ValueError(f"trainer.train_eval_size={size} must be null (every train image) or an integer >= 1 (the "
                         "images of the train split scored at each evaluation)")
    if t.get("resume", "auto") not in RESUME:
        raise ValueError(f"trainer.resume={t.get('resume')!r} is unknown: choose one of {list(RESUME)}")
    threads = t.get("num_threads")
    if threads is not None and not _whole(threads, 1):
        raise ValueError(f"trainer.num_threads={threads} must be null (torch's default) or a whole number >= 1 (torch "
                         "intra-op threads on CPU)")
    layout = t.get("channels_last", "auto")
    if not (layout == "auto" or isinstance(layout, bool)):  # "off" was read as bool("off"): on
        raise ValueError(f"trainer.channels_last={layout!r} must be auto, true or false (auto: on for convolutional "
                         "models)")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_training_numbers(t: Mapping[str, Any]) -> None:
    """Trainer numbers torch takes without a word but that train something else than the run says."""
    clip = t.get("grad_clip")
    if clip is not None and (not _number(clip) or clip <= 0):  # a negative norm reverses every gradient; 0 was "off"
        raise ValueError(f"trainer.grad_clip={clip} must be null (no clipping) or a number > 0 (the largest global "
                         "gradient norm): a negative one multiplies every gradient by a negative factor (gradient "
                         "ascent), and 0 turned clipping off")
    smoothing = t.get("label_smoothing", 0.0)
    if not _number(smoothing) or not 0.0 <= smoothing < 1.0:  # torch takes < 0 silently, > 1 only at the first step
        raise ValueError(f"trainer.label_smoothing={smoothing} must lie in [0, 1): the share of each target spread "
                         "over all classes (0 = none; 1 leaves nothing to learn, below 0 is no smoothing at all)")
    tol = t.get("converge_tol")
    if tol is not None and (not _number(tol) or tol < 0):  # 1 or more converges at the first chance (tests use it)
        raise ValueError(f"trainer.converge_tol={tol} must be a number >= 0: the band of train errors that counts as "
                         "converged (0 = unchanged); below 0 convergence could never fire")
    margin = t.get("stalled_margin")
    if margin is not None and (not _number(margin) or not 0.0 <= margin < 1.0):
        raise ValueError(f"trainer.stalled_margin={margin} must be null (off) or lie in [0, 1): how far above the "
                         "error of always predicting the commonest label a motionless train error counts as stalled "
                         "(below 0 nothing ever is, 1 or more every converged run is)")
    window, cap, every = t.get("converge_epochs"), t.get("max_epochs"), t.get("eval_every") or 1
    if window and cap and cap < every + window:  # the first evaluation is at epoch eval_every: the window opens there
        warnings.warn(f"trainer.converge_epochs={window} can never fire under trainer.max_epochs={cap} with "
                      f"trainer.eval_every={every}: the earliest convergence stop is at epoch eval_every + "
                      f"converge_epochs = {every + window}, so the run stops at the cap (until a resume raises it). "
                      "Fix: raise trainer.max_epochs or lower trainer.converge_epochs (null = no convergence rule)",
                      UserWarning, stacklevel=2)  # one location: said once, though train and setup both check


def _as_float(v: Any) -> float | None:
    try:
        return None if isinstance(v, bool) else float(v)  # build_optimizer takes float(lr)
    except (TypeError, ValueError):
        return None


def _check_optimizer_numbers(o: Mapping[str, Any]) -> None:
    """What torch refuses only once the optimizer is built (after the data, the model and the start-up probes),
    without the key's name; and a momentum of 1 or more, which it takes (the velocity never decays)."""
    for key in ("lr", "weight_decay"):
        v = o.get(key, 0.0)
        number = _as_float(v)
        if number is None or not number >= 0:  # lr 0 is allowed: a frozen model (the tests' constant train error)
            raise ValueError(f"optimizer.{key}={v} must be a number >= 0")
    momentum = o.get("momentum")
    m = _as_float(momentum)
    if momentum is not None and (m is None or not 0.0 <= m < 1.0):
        raise ValueError(f"optimizer.momentum={momentum} must lie in [0, 1): the share of the velocity kept each step "
                         "(0.9 in conf/optimizer/sgd.yaml); at 1 or more it never decays")


def _check_schedule_keys(s: Mapping[str, Any], t: Mapping[str, Any]) -> None:
    """``scheduler.warmup_epochs`` and ``min_lr_ratio``, and a warm-up against ``trainer.max_epochs`` (against
    ``trainer.max_steps`` once the steps per epoch are known: ``check_warmup_steps``)."""
    warmup, ratio = s.get("warmup_epochs", 0), s.get("min_lr_ratio", 0.0)
    if not _number(warmup) or warmup < 0:  # a negative one started the cosine part-decayed, never reaching its floor
        raise ValueError(f"scheduler.warmup_epochs={warmup} must be a number >= 0 (epochs of linear warm-up from 0; "
                         "0 = none, fractions allowed)")
    if not _number(ratio) or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"scheduler.min_lr_ratio={ratio} must lie in [0, 1]: the cosine ends at min_lr_ratio * "
                         "optimizer.lr, so below 0 the lr turns negative (gradient ascent) and above 1 it rises past "
                         "the peak optimizer.lr that summary.json records as base_lr")
    max_epochs = t.get("max_epochs")
    if warmup > 0 and max_epochs and warmup >= max_epochs:
        raise ValueError(f"scheduler.warmup_epochs={warmup} is not shorter than the run (trainer.max_epochs="
                         f"{max_epochs}): the lr would still be rising at the last step and never train at "
                         f"optimizer.lr{' nor decay' if s.get('name') == 'cosine' else ''}. Fix: lower "
                         "scheduler.warmup_epochs well below trainer.max_epochs (0 = no warm-up), or raise "
                         "trainer.max_epochs")


def check_warmup_steps(s: Mapping[str, Any], t: Mapping[str, Any], steps_per_epoch: int, total_steps: float) -> None:
    """The warm-up in steps against the run's length in steps (``trainer.max_steps`` may cut it below
    ``max_epochs``): checked by the set-up once the training split is built, before the model."""
    warmup = int(s.get("warmup_epochs", 0) * steps_per_epoch)
    if warmup == 0 and s.get("warmup_epochs", 0) > 0:  # the schedule rounds the warm-up down to whole steps
        warnings.warn(f"scheduler.warmup_epochs={s.get('warmup_epochs')} is 0 steps ({steps_per_epoch} steps per "
                      "epoch): no warm-up. Fix: at least 1 / steps-per-epoch epochs, or 0", UserWarning, stacklevel=2)
    if warmup > 0 and warmup >= total_steps:
        raise ValueError(f"scheduler.warmup_epochs={s.get('warmup_epochs')} is {warmup} steps ({steps_per_epoch} "
                         f"steps per epoch), not shorter than the run's {int(total_steps)} steps (trainer.max_steps="
                         f"{t.get('max_steps')}, trainer.max_epochs={t.get('max_epochs')}): the lr would still be "
                         "rising at the last step and never train at optimizer.lr. Fix: lower scheduler.warmup_epochs "
                         "below the run's length in epochs, or raise trainer.max_steps")


def _whole(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _check_dataset_sizes(d: Mapping[str, Any]) -> None:
    """The dataset's counts, before the data is built: a fractional one failed in torch or scikit-learn after the
    data load, without the key's name (image_size=12.5, n_train=100.5), or was truncated (val_size=10.5 -> 10)."""
    for key, what in (("image_size", "null (the native size)"), ("n_train", "null (every training image)"),
                      ("test_size", "null (every test image)")):
        v = d.get(key)
        if v is not None and not _whole(v, 1):
            raise ValueError(f"dataset.{key}={v} must be {what} or a whole number >= 1")
    val = d.get("val_size") or 0
    if not _whole(val, 0):
        raise ValueError(f"dataset.val_size={val} must be a whole number >= 0 (images held out of the training split "
                         "for validation; 0 = none)")


def _check_vit_shape(m: Mapping[str, Any], d: Mapping[str, Any]) -> None:
    """A ViT's heads against its dim, and with a configured ``dataset.image_size`` its patch (a hybrid's stem stride)
    against the image: the model's constructor checks them too, but only once the data is built (every DICOM of
    rsna_mammo decoded, a download done). With ``image_size: null`` (the native size) the patch waits for the data."""
    target = str(m.get("_target_", ""))
    if target not in ("src.models.vit.ViT", "src.models.vit.HybridViT"):
        return
    check_vit_depth(m.get("depth", 6))
    hybrid, size = target.endswith("HybridViT"), d.get("image_size")
    stride = m.get("stem_stride", 4) if hybrid else m.get("stem_stride", 1)
    patch, dim, heads = 1 if hybrid else m.get("patch", 4), m.get("dim", 256), m.get("heads", 8)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (stride, patch, dim, heads)) or stride < 1:
        return  # the constructor names these
    if not _whole(size, 1):
        check_vit_shape(patch, patch, dim, heads)  # heads against dim only
        return
    if hybrid and size % stride:
        raise ValueError(f"model.stem_stride={stride} does not divide the image size {size}")
    check_vit_shape(size // stride, patch, dim, heads)
