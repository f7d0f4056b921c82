"""Evaluation: loss and error over a split, plus the binary-task metrics radiology uses."""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F


def binary_metrics(prob_pos: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """ROC AUC, probabilistic F1 (the RSNA competition's pF1), sensitivity/specificity at 0.5 and
    balanced accuracy."""
    from sklearn.metrics import roc_auc_score

    labels = labels.astype(bool)
    pred = prob_pos >= 0.5
    tp_soft = float(prob_pos[labels].sum())
    pprec = tp_soft / max(float(prob_pos.sum()), 1e-12)
    precall = tp_soft / max(int(labels.sum()), 1)
    pf1 = 2 * pprec * precall / (pprec + precall) if pprec + precall > 0 else 0.0
    sens = float((pred & labels).sum() / max(labels.sum(), 1))
    spec = float((~pred & ~labels).sum() / max((~labels).sum(), 1))
    auc = float(roc_auc_score(labels, prob_pos)) if 0 < labels.sum() < len(labels) else float("nan")
    return {"auc": auc, "pf1": pf1, "sensitivity": sens, "specificity": spec, "balanced_acc": (sens + spec) / 2}


def batchnorm_start_share(model: torch.nn.Module, steps: int) -> float:
    """The largest share of its start value (mean 0, variance 1) that a BatchNorm running statistic of ``model``
    still holds after ``steps`` training updates: ``(1 - momentum) ** steps`` (0 without BatchNorm, or with
    ``momentum=None``, PyTorch's cumulative average)."""
    shares = [(1.0 - m.momentum) ** steps for m in model.modules()
              if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
              and m.momentum is not None]
    return max(shares, default=0.0)


@torch.no_grad()
def recompute_batchnorm(model: torch.nn.Module, loader, autocast: contextlib.AbstractContextManager | None = None
                        ) -> None:
    """Replace the BatchNorm running statistics of ``model`` by their average over ``loader``'s images (one forward
    pass in train mode, as ``torch.optim.swa_utils.update_bn``, under the run's autocast). Each batch is weighted by
    its images (momentum n_i / images so far), not once per batch as update_bn's cumulative average does (a last
    partial batch of 413 of 1437 images carried half the weight): the running mean is the images' mean whatever
    ``trainer.eval_batch_size``; the running variance is the image-weighted mean of the batches' variances, so it
    leaves out the spread between batch means and still moves a little with the batch size (about 0.6% on
    shuffled images). The random numbers its dropout draws come from a forked generator, so training goes on exactly as
    if no evaluation had happened."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    was_training = model.training
    device = next(model.parameters()).device
    for m in norms:
        m.reset_running_stats()
    model.train()
    seen = 0
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type), \
                autocast or contextlib.nullcontext():
            for x, *_ in loader:
                x = x.to(device, non_blocking=True)
                seen += len(x)
                for m in norms:
                    m.momentum = len(x) / seen
                model(x)
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.train(was_training)


@torch.inference_mode()  # no autograd bookkeeping at all (cheaper than no_grad); only Python floats leave
def evaluate(model: torch.nn.Module, loader, autocast: contextlib.AbstractContextManager | None = None,
             num_classes: int | None = None, clean_labels: torch.Tensor | None = None,
             flipped: torch.Tensor | None = None) -> dict[str, float]:
    """Mean cross-entropy loss, error (1 - accuracy) and accuracy of ``model`` over ``loader``.

    One forward pass per batch in eval mode under the run's ``autocast``; the sums stay on the device and
    are read back once per split (no per-batch host sync). The clean-label metrics score the same logits.
    The loader's order is fixed (no shuffle, no augmentation), so no random number is drawn.

    With ``clean_labels`` and ``flipped`` (aligned with the loader's unshuffled order: the original labels
    of the same images and which of them label noise replaced) it adds ``loss_clean`` and ``error_clean``
    against the original labels and ``error_noisy_subset``: the error on the flipped images against the
    labels trained on (NaN when none is flipped).
    """
    was_training = model.training
    model.eval()
    dev = loader.device
    loss_sum = torch.zeros((), device=dev, dtype=torch.float64)
    wrong = torch.zeros((), device=dev, dtype=torch.int64)
    clean = torch.zeros(3, device=dev, dtype=torch.float64)  # clean loss sum, clean wrong, wrong on flipped
    probs, labels, start = [], [], 0
    for xb, yb in loader:
        with autocast or contextlib.nullcontext():
            logits = model(xb)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        pred = logits.argmax(1)
        miss = pred != yb
        wrong += miss.sum()
        if clean_labels is not None:
            yc = clean_labels[start:start + len(yb)].to(dev)
            clean += torch.stack([F.cross_entropy(logits, yc, reduction="sum").double(),
                                  (pred != yc).sum().double(),
                                  (miss & flipped[start:start + len(yb)].to(dev)).sum().double()])
        start += len(yb)
        if num_classes == 2:
            probs.append(logits.softmax(1)[:, 1])
            labels.append(yb)
    model.train(was_training)
    n = max(loader.n, 1)
    out = {"loss": loss_sum.item() / n, "error": wrong.item() / n}  # one sync per split
    out["acc"] = 1.0 - out["error"]
    if clean_labels is not None:
        c, n_flipped = clean.tolist(), int(flipped.sum())
        out.update(loss_clean=c[0] / n, error_clean=c[1] / n,
                   error_noisy_subset=c[2] / n_flipped if n_flipped else float("nan"))
    if num_classes == 2 and probs:
        out.update(binary_metrics(torch.cat(probs).cpu().numpy(), torch.cat(labels).cpu().numpy()))
    return out
