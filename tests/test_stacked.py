"""Stacked members (src/stacked.py): the same runs as alone, trained as one model with torch.func."""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from omegaconf import OmegaConf

from src.run_state import setup
from src.stacked import MemberStack, plan_groups, train_members
from src.trainer import train, train_step
from tests.conftest import TINY, compose_cfg

CNN = ["model=cnn", "model.width=2", *[o for o in TINY if not o.startswith("model.")]]
VIT = [*TINY, "model.dropout=0.0"]
MEMBERS = [["seed=0"], ["seed=1", "label_noise=p20"], ["seed=2", "optimizer.lr=3e-3", "optimizer.weight_decay=0.1"],
           ["seed=0", "label_noise=p10", "optimizer.lr=5e-4"]]


def plain(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_cfg(list(overrides)), resolve=True)


def batches(state):
    """The run's batches epoch after epoch, as its loader draws them."""
    while True:
        yield from state.train_loader


def single_losses(cfg: dict, steps: int) -> list[float]:
    s = setup(cfg, None)
    out = []
    for xb, yb in itertools.islice(batches(s), steps):
        for group in s.optimizer.param_groups:
            group["lr"] = s.schedule(len(out))
        out.append(train_step(s.model, s.optimizer, s.scaler, s.autocast, xb, yb,
                              grad_clip=cfg["trainer"].get("grad_clip")).item())
    return out


def stacked_losses(cfgs: list[dict], steps: int) -> list[list[float]]:
    states = [setup(cfg, None) for cfg in cfgs]
    stack = MemberStack(states)
    streams = [batches(s) for s in states]
    return torch.stack([stack.step([next(b) for b in streams]) for _ in range(steps)]).T.tolist()


@pytest.mark.parametrize("base", [CNN, VIT, [*CNN, "trainer.grad_clip=0.05"]], ids=["cnn", "vit", "cnn-clip"])
def test_members_match_their_single_runs_for_50_steps(base):
    """Own seed, label noise, lr and weight decay per member: every member's loss at each of the first
    50 steps equals its single run's within 1e-4 relative."""
    cfgs = [plain(*base, *m, "dataset.n_train=300") for m in MEMBERS]
    stacked = stacked_losses(cfgs, 50)
    for k, cfg in enumerate(cfgs):
        alone = torch.tensor(single_losses(cfg, 50))
        rel = ((torch.tensor(stacked[k]) - alone).abs() / alone.abs()).max().item()
        print(f"{base[0]} member {k} ({' '.join(MEMBERS[k])}): max relative loss difference {rel:.2e}")
        assert rel < 1e-4, (k, rel)
