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


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, autocast: contextlib.AbstractContextManager | None = None,
             num_classes: int | None = None) -> dict[str, float]:
    """Mean cross-entropy loss and error (1 - accuracy) of ``model`` over ``loader``."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=loader.device, dtype=torch.float64)
    wrong = torch.zeros((), device=loader.device, dtype=torch.int64)
    probs, labels = [], []
    for xb, yb in loader:
        with autocast or contextlib.nullcontext():
            logits = model(xb)
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, yb, reduction="sum").double()
        wrong += (logits.argmax(1) != yb).sum()
        if num_classes == 2:
            probs.append(logits.softmax(1)[:, 1])
            labels.append(yb)
    model.train(was_training)
    n = max(loader.n, 1)
    out = {"loss": loss_sum.item() / n, "error": wrong.item() / n}  # one sync per split
    if num_classes == 2 and probs:
        out.update(binary_metrics(torch.cat(probs).cpu().numpy(), torch.cat(labels).cpu().numpy()))
    return out
