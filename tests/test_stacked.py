"""Stacked members (src/stacked.py): the same runs as alone, trained as one model with torch.func."""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from omegaconf import OmegaConf

from src import stacked
from src.loop import train_step
from src.run_setup import setup
from src.stacked import plan_groups, train_members, why_not_stackable
from src.stacked_loop import MemberStack
from src.trainer import train
from tests.conftest import TINY, compose_cfg
from tests.helpers import run_cli

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


def test_groups_by_member_keys_cut_to_max_members_and_unstackable_models_alone():
    cfgs = [plain(*CNN, f"seed={s}", f"label_noise={n}") for n in ("none", "p10") for s in (0, 1, 2)]
    cfgs += [plain(*CNN, "model.width=4", "seed=0"), plain("model=cnn_vgg", *CNN[2:])]
    assert plan_groups(cfgs, 16, strict=False) == [[0, 1, 2, 3, 4, 5], [6], [7]]
    assert plan_groups(cfgs, 4, strict=False) == [[0, 1, 2, 3], [4, 5], [6], [7]]
    with pytest.raises(ValueError, match=r"stack=always: model._target_=src.models.cnn.VGGCNN cannot stack"):
        plan_groups(cfgs, 16, strict=True)


def test_a_diverging_member_stops_alone_and_the_others_finish_as_single_runs(tmp_path):
    """lr=1e30 makes one member's loss non-finite: it ends `nonfinite_loss`, the others' summaries
    and metrics rows equal those of their single runs."""
    extra = ["trainer.max_epochs=3", "trainer.log_every=1", "trainer.checkpoint=true"]
    members = (["seed=0"], ["seed=1", "optimizer.lr=1e30"], ["seed=2", "label_noise=p20"])
    cfgs = [plain(*CNN, *extra, *m) for m in members]
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(3)])
    assert results[1]["stop_reason"] == "nonfinite_loss" and results[1]["status"] == "failed"
    for k in (0, 2):
        alone = train(cfgs[k], tmp_path / f"alone{k}")
        assert results[k]["stop_reason"] == alone["stop_reason"] == "max_epochs"
        assert results[k]["test_error"] == pytest.approx(alone["test_error"], abs=0.02)
        assert results[k]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)
        assert results[k].keys() - {"stacked_members"} == alone.keys() and results[k]["stacked_members"] == 3
        rows = [(tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in (f"m{k}", f"alone{k}")]
        assert len(rows[0]) == len(rows[1]) == 3
        ckpt = torch.load(tmp_path / f"m{k}" / "checkpoint.pt", weights_only=True)
        assert ckpt["epoch"] == 3 and ckpt["model"].keys() == torch.load(
            tmp_path / f"alone{k}" / "checkpoint.pt", weights_only=True)["model"].keys()
        assert sum(v.numel() for v in ckpt["model"].values()) == results[k]["params"]  # no other member's weights


def test_a_model_with_a_configured_sub_module_is_not_stacked():
    """A ViT given a conv stem (BatchNorm inside) passed the check on model._target_ alone and failed at its first
    stacked step (`running_mean should contain 4 elements not 8`), taking its whole group with it."""
    cfg = plain(*VIT)
    cfg["model"]["stem"] = {"_target_": "src.models.vit.conv_stem", "in_channels": 1, "channels": 8, "stride": 1}
    assert "model.stem._target_ builds a sub-module" in why_not_stackable(cfg)
    cfg = plain(*VIT)
    cfg["model"]["blocks"] = [{"norm": {"_target_": "torch.nn.BatchNorm1d"}}]  # any depth, in lists too
    assert "model.blocks[0].norm._target_ builds a sub-module" in why_not_stackable(cfg)
    assert why_not_stackable(plain(*VIT)) is None


def test_members_of_other_resolved_precisions_train_apart_and_record_how_they_trained(tmp_path, monkeypatch):
    """The stacked step runs under its first member's autocast: members whose precision resolved differently (a run
    resumed from another machine's checkpoint keeps the precision it chose there) train in separate stacks, else one
    of them trains at the other's precision while its summary names its own. A member's summary says it trained
    stacked and, for a ViT, with the explicit attention ops."""
    stacks = []
    build = MemberStack.__init__

    def spy(self, states):
        stacks.append(sorted(s.info["precision"] for s in states))
        build(self, states)

    monkeypatch.setattr(MemberStack, "__init__", spy)
    cfgs = [plain(*VIT, "trainer.max_epochs=1", f"trainer.precision={p}", "seed=1") for p in ("bf16", "fp32")]
    results = train_members(cfgs, [tmp_path / p for p in ("bf16", "fp32")])
    assert stacks == [["bf16"], ["fp32"]]
    for k, p in enumerate(("bf16", "fp32")):
        alone = train(cfgs[k], tmp_path / f"alone_{p}")
        assert results[k]["precision"] == alone["precision"] == p
        assert results[k]["stacked_members"] == 1 and results[k]["attention_trained"] == "explicit"
        assert "stacked_members" not in alone and "attention_trained" not in alone


@pytest.mark.slow  # the suite's time: test_launcher.py::test_stacked_trials_each_know_their_own_trial trains a stacked
# group through the launcher, and the refusal is checked in process above
def test_stack_always_multirun_writes_every_member_run_dir(tmp_path):
    """Through the launcher: one stacked group of four jobs, each a complete run dir under the contract."""
    done = run_cli("-m", *CNN, "seed=0,1", "label_noise=none,p10", "hydra/launcher=vectorized",
                   "hydra.launcher.stack=always", "hydra.launcher.n_procs=1", f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 of them stacked in 1 group(s)" in done.stdout
    for k in range(4):
        run = tmp_path / str(k)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and (run / ".hydra" / "config.yaml").is_file()
        assert summary["seed"] == k // 2 and len((run / "metrics.jsonl").read_text().splitlines()) == 1
        assert summary["stacked_members"] == 4
    bad = run_cli("-m", "model=cnn_vgg", *CNN[2:], "seed=0,1", "hydra/launcher=vectorized",
                  "hydra.launcher.stack=always", f"hydra.sweep.dir={tmp_path / 'bad'}")
    assert bad.returncode != 0 and "model._target_=src.models.cnn.VGGCNN cannot stack" in bad.stderr


def test_members_resume_per_run_dir(tmp_path):
    """A finished member is not retrained; raising max_epochs continues each member from its checkpoint (under a
    constant lr: a cosine run's extension is refused, tests/test_resume.py)."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    cfgs = [plain(*CNN, "trainer.checkpoint=true", "trainer.max_epochs=2", "scheduler=constant", f"seed={s}")
            for s in (0, 1)]
    first = train_members(cfgs, dirs)
    keys = ("epochs", "steps", "wall_s", "test_error", "train_loss")
    again = train_members(cfgs, dirs)  # both finished: their summaries come back, nothing is retrained
    assert [[r[k] for k in keys] for r in again] == [[r[k] for k in keys] for r in first]
    longer = [plain(*CNN, "trainer.checkpoint=true", "trainer.max_epochs=3", "scheduler=constant", f"seed={s}")
              for s in (0, 1)]
    again = train_members(longer, dirs)
    for d, summary in zip(dirs, again, strict=True):
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == [1, 2, 3] and summary["epochs"] == 3 and summary["steps"] == 12


def test_a_member_stopping_at_its_epoch_end_costs_the_others_no_batch(tmp_path):
    """A frozen member (lr 0) stops on the convergence rule at the end of epoch 3 while the other
    member has already drawn its next epoch's first batch: that batch must still be trained on, so
    the other member's rows equal its single run's to the end."""
    extra = ["trainer.max_epochs=6", "trainer.converge_epochs=2", "dataset.n_train=300"]
    cfgs = [plain(*CNN, *extra, *m) for m in (["seed=0", "optimizer.lr=1e-2"], ["seed=1", "optimizer.lr=0"])]
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)])
    assert results[1]["epochs"] == 3 and results[0]["epochs"] == 6
    train(cfgs[0], tmp_path / "alone")
    volatile = ("wall_s", "images_per_s")
    rows = [[{k: v for k, v in json.loads(line).items() if k not in volatile}
             for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("m0", "alone")]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
    for got, want in zip(*rows, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4), got["epoch"]


def test_a_group_larger_than_the_device_budget_trains_in_parts_with_the_same_results(tmp_path, monkeypatch, caplog):
    """Members that do not all fit the device's free memory (a budget of 2.5 members here) train as
    stacks of 2 then 1, one after the other, each member still equal to its single run."""
    import src.stacked_parts as stacked_parts

    cfgs = [plain(*CNN, "trainer.max_epochs=2", f"seed={s}") for s in (0, 1, 2)]
    need = stacked_parts.member_bytes(setup(cfgs[0], None))
    monkeypatch.setattr(stacked_parts, "device_budget", lambda device: int(2.5 * need))
    with caplog.at_level("WARNING", logger="src.stacked_parts"):
        results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(3)])
    assert "training them as 2 stacks of at most 2" in caplog.text
    for k, cfg in enumerate(cfgs):
        alone = train(cfg, tmp_path / f"alone{k}")
        assert results[k]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)
        assert results[k]["epochs"] == alone["epochs"] == 2


def test_member_bytes_counts_parameters_and_the_batch_activations():
    """The up-front estimate grows with the batch (saved activations) and covers weights, gradients and
    two optimizer moments; a wider model needs more."""
    from src.stacked_parts import member_bytes

    small = setup(plain(*CNN, "trainer.batch_size=50"), None)
    params = sum(p.numel() * 4 for p in small.model.parameters())
    assert member_bytes(small) > 1.5 * 4 * params
    double = setup(plain(*CNN, "trainer.batch_size=100"), None)
    wide = setup(plain(*CNN, "model.width=8", "trainer.batch_size=50"), None)
    activations = member_bytes(small) - 1.5 * 4 * params
    assert member_bytes(double) - 1.5 * 4 * params == pytest.approx(2 * activations, rel=0.05)
    assert member_bytes(wide) > member_bytes(small)


def test_dropout_members_draw_their_own_masks_and_agree_with_single_runs_in_distribution():
    """With dropout, a member's masks come from vmap's own draws (randomness="different"), not its single
    run's: its losses are not the single run's, but across 8 seeds the per-seed differences after 40 steps
    centre on zero (paired t-test), and the members' masks differ from each other."""
    from scipy import stats

    cfgs = [plain(*VIT, "model.dropout=0.3", f"seed={s}", "dataset.n_train=300") for s in range(8)]
    stacked = torch.tensor(stacked_losses(cfgs, 40))
    alone = torch.tensor([single_losses(cfg, 40) for cfg in cfgs])
    assert not torch.allclose(stacked[:, 5:], alone[:, 5:], rtol=1e-4)  # other draws
    last = slice(30, 40)  # mean loss over the last 10 steps, per seed
    diff = (stacked[:, last].mean(1) - alone[:, last].mean(1)).numpy()
    p = stats.ttest_1samp(diff, 0.0).pvalue
    print(f"stacked minus single, mean loss of steps 31-40 over 8 seeds: {diff.mean():+.4f} "
          f"(sd {diff.std(ddof=1):.4f}), paired t-test p = {p:.3f}")
    assert p > 0.01
    # the same seed twice in one stack: equal weights and batches, so only the masks can tell them apart
    twins = torch.tensor(stacked_losses([cfgs[0], cfgs[0]], 3))
    assert twins[0, 0] != twins[1, 0]


def test_a_stacked_group_shows_one_progress_bar(tmp_path, capsys):
    cfgs = [plain(*CNN, "trainer.progress=true", f"seed={s}") for s in (0, 1)]
    train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)])
    assert capsys.readouterr().err.count("stack of 2 WidthCNN") >= 1


def test_members_report_their_end_as_it_comes_and_a_failing_report_fails_no_member(tmp_path):
    """``train_members(on_done=...)`` (what the launcher tells the sweeper through): each member as it stops, the
    frozen one (lr 0, converged at epoch 3) before the other; a callback that raises is logged, and both members
    still end with their summaries."""
    extra = ["trainer.max_epochs=6", "trainer.converge_epochs=2", "dataset.n_train=300"]
    cfgs = [plain(*CNN, *extra, *m) for m in (["seed=0", "optimizer.lr=1e-2"], ["seed=1", "optimizer.lr=0"])]
    told = []
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)], on_done=lambda k, s: told.append((k, s)))
    assert [k for k, _ in told] == [1, 0] and [s["epochs"] for _, s in told] == [3, 6]

    def broken(k, summary):
        raise RuntimeError("the launching process is gone")

    again = train_members(cfgs, [tmp_path / f"n{k}" for k in range(2)], on_done=broken)
    assert [r["epochs"] for r in again] == [r["epochs"] for r in results] == [6, 3]


def test_a_stop_in_one_stack_ends_the_tracker_runs_of_members_of_later_stacks(tmp_path, monkeypatch):
    """Every member's trackers start before the first stack trains; a stop (RunInterrupted) in the first stack
    closed only that stack's members, so the later stacks' MLflow runs showed RUNNING for ever. They end KILLED,
    as an interrupted single run's does."""
    pytest.importorskip("mlflow", reason="pip install 'vitsweep[mlflow]'")
    import signal

    from mlflow.tracking import MlflowClient

    from src.stop_signal import RunInterrupted

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfgs = [plain(*VIT, "logger=mlflow", f"logger.mlflow.tracking_uri={uri}", "trainer.max_epochs=1",
                  f"trainer.precision={p}") for p in ("bf16", "fp32")]  # two precisions: two stacks

    def stopped(members, *args):
        raise RunInterrupted(signal.SIGTERM, {})

    monkeypatch.setattr(stacked, "run_members", stopped)
    dirs = [tmp_path / "bf16", tmp_path / "fp32"]
    with pytest.raises(RunInterrupted):
        train_members(cfgs, dirs)
    client = MlflowClient(tracking_uri=uri)
    ids = [json.loads((d / "tracker.json").read_text())["mlflow"]["run_id"] for d in dirs]
    assert [client.get_run(i).info.status for i in ids] == ["KILLED", "KILLED"]  # handed back, to resume


def _first_member_raises_at_epoch_2(tmp_path, error: Exception):
    """Two 3-epoch CNN members trained stacked, the first's reporter raising ``error`` from epoch 2: (cfgs, results)."""
    def reporter(value, epoch):
        if epoch >= 2:
            raise error
        return False

    extra = ["trainer.max_epochs=3", "trainer.checkpoint=true"]
    cfgs = [plain(*CNN, *extra, f"seed={k}") for k in range(2)]
    return cfgs, train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)], reporters=[reporter, None])


def test_a_member_whose_trial_was_taken_over_stops_alone(tmp_path):
    """A member's reporter raising TrialTakenOver (its trial failed as not answering and retried elsewhere) went
    through the group's error handler: every member of the stack ended `error` with that member's exception."""
    from hydra_plugins.vitsweep_sweeper.protocol import TrialTakenOver

    _, results = _first_member_raises_at_epoch_2(tmp_path, TrialTakenOver("trial 7 taken over"))
    assert results[0]["status"] == "stopped" and results[0]["stop_reason"] == "interrupted", results[0]
    assert results[1]["status"] == "completed" and results[1]["epochs"] == 3, results[1]


def test_two_members_given_one_run_dir_fail_instead_of_waiting_on_themselves(tmp_path):
    """flock is per open file: the second member's hold of a dir its own process held waited for ever."""
    cfgs = [plain(*CNN, "trainer.max_epochs=1", f"seed={k}") for k in range(2)]
    results = train_members(cfgs, [tmp_path / "same", tmp_path / "same"])
    assert isinstance(results[1], RuntimeError) and "already being trained by this process" in str(results[1])
    assert results[0]["status"] == "completed"


def test_a_stacked_member_extended_past_a_stop_mid_epoch_drops_that_evaluation(tmp_path):
    """Review 2026-11-29 (diff, 1): only the single-run path dropped the half-trained epoch's evaluation of a run
    extended past a step limit; a stacked member kept the extra row (two rows for epoch 2) and its best_*."""
    def rows(d):
        return [(r["epoch"], r["step"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    over = [*CNN, "trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=3"]
    dirs = [tmp_path / "a", tmp_path / "b"]
    train_members([plain(*over, "trainer.max_steps=5", f"seed={s}") for s in (0, 1)], dirs)
    train_members([plain(*over, f"seed={s}") for s in (0, 1)], dirs)
    assert rows(dirs[0]) == rows(dirs[1]) == [(1, 4), (2, 8), (3, 12)]


def test_a_stacked_member_extended_past_its_epoch_cap_records_what_an_uninterrupted_member_does(tmp_path):
    """Review 2026-11-29 (trainer): the final evaluation at a member's epoch cap (test split scored, made though
    eval_every=2 said none was due) stayed in the records of a member extended past it."""
    def rows(d):
        return [{k: v for k, v in r.items() if k not in ("wall_s", "images_per_s")}
                for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    over = [*VIT, "trainer.checkpoint=true", "scheduler=constant", "trainer.eval_every=2", "trainer.test_every=4",
            "trainer.max_epochs=6"]
    whole, cut = [tmp_path / "whole_a", tmp_path / "whole_b"], [tmp_path / "cut_a", tmp_path / "cut_b"]
    ref = train_members([plain(*over, f"seed={s}") for s in (0, 1)], whole)
    train_members([plain(*over, "trainer.max_epochs=3", f"seed={s}") for s in (0, 1)], cut)
    extended = train_members([plain(*over, f"seed={s}") for s in (0, 1)], cut)
    for w, c, r, e in zip(whole, cut, ref, extended, strict=True):
        assert [(row["epoch"], "test_error" in row) for row in rows(c)] == [(2, False), (4, True), (6, True)]
        assert rows(c) == rows(w) and e["best_test_error"] == r["best_test_error"]


def test_a_stacked_member_extended_past_its_epoch_cap_is_pruned_where_an_uninterrupted_member_is(tmp_path):
    """Review 2026-11-29 (trainer leftover): a member's final evaluation at its cap reports to no pruner; extended,
    the member never reported that epoch and trained on where the uninterrupted member was pruned. Member 0's
    reporter prunes at epoch 2; member 1 has none and trains to its cap."""
    over = [*CNN, "trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=4"]
    whole, cut = [tmp_path / "whole_a", tmp_path / "whole_b"], [tmp_path / "cut_a", tmp_path / "cut_b"]
    calls = {"whole": [], "cut": []}

    def prunes_at_2(name):
        return lambda value, epoch: calls[name].append((value, epoch)) or epoch == 2

    ref = train_members([plain(*over, f"seed={s}") for s in (0, 1)], whole, reporters=[prunes_at_2("whole"), None])
    assert [r["stop_reason"] for r in ref] == ["pruned", "max_epochs"] and ref[0]["epochs"] == 2
    train_members([plain(*over, "trainer.max_epochs=2", f"seed={s}") for s in (0, 1)], cut,
                  reporters=[prunes_at_2("cut"), None])
    extended = train_members([plain(*over, f"seed={s}") for s in (0, 1)], cut, reporters=[prunes_at_2("cut"), None])
    assert [(r["stop_reason"], r["epochs"]) for r in extended] == [("pruned", 2), ("max_epochs", 4)]
    assert calls["cut"] == calls["whole"]
    for w, c in zip(whole, cut, strict=True):
        assert (c / "metrics.jsonl").read_text().count("\n") == (w / "metrics.jsonl").read_text().count("\n")


def test_a_member_diverging_in_its_first_epoch_counts_that_epoch_s_training_time(tmp_path):
    """Review 2026-11-30 (stacked): a member whose loss went non-finite at a step left the stack without closing its
    epoch, so that epoch's time never reached its train_time: diverging in epoch 1, its summary's train_images_per_s
    was steps * batch / 1e-9 (1e11), where its single run records its real throughput."""
    cfgs = [plain(*CNN, "trainer.max_epochs=2", "trainer.log_every=1", m) for m in ("seed=0", "optimizer.lr=1e30")]
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)])
    alone = train(cfgs[1], tmp_path / "alone")
    assert results[1]["stop_reason"] == alone["stop_reason"] == "nonfinite_loss"
    assert results[1]["steps"] == alone["steps"] and results[1]["epochs"] == alone["epochs"] == 1
    assert results[1]["train_images_per_s"] < 100 * alone["train_images_per_s"], results[1]["train_images_per_s"]


def test_members_that_differ_in_what_the_stacked_step_shares_train_apart(tmp_path, monkeypatch):
    """Review 2026-11-30 (stacked): the stacked step takes the loss's label smoothing and the model definition (its
    dropout rate, say) from its first member; ``train_members`` stacked whatever it was given, so a member with
    another trainer.label_smoothing trained with member 0's and recorded its own. Members that differ there train in
    separate stacks, each equal to its single run."""
    stacks = []
    build = MemberStack.__init__

    def spy(self, states):
        stacks.append(sorted(int(s.cfg["seed"]) for s in states))
        build(self, states)

    monkeypatch.setattr(MemberStack, "__init__", spy)
    extra = ["trainer.max_epochs=2", "dataset.n_train=300", "optimizer.lr=1e-2"]
    cfgs = [plain(*CNN, *extra, *m) for m in (["seed=0"], ["seed=1", "trainer.label_smoothing=0.5"], ["seed=2"])]
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(3)])
    assert sorted(stacks) == [[0, 2], [1]]
    for k, cfg in enumerate(cfgs):
        alone = train(cfg, tmp_path / f"alone{k}")
        assert results[k]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4), k
    stacks.clear()
    cfgs = [plain(*VIT, "trainer.max_epochs=1", f"seed={k}", f"model.dropout={p}") for k, p in enumerate((0.0, 0.3))]
    train_members(cfgs, [tmp_path / f"v{k}" for k in range(2)])
    assert sorted(stacks) == [[0], [1]]


def test_a_member_that_ended_before_its_stack_failed_keeps_its_result(tmp_path, monkeypatch):
    """Review 2026-11-30 (stacked): a failure of the stacked step became the result of every member of the part,
    those that had already ended included: the frozen member (lr 0) converged at epoch 3 and wrote its completed
    summary, yet ``train_members`` returned the other member's later exception for it."""
    extra = ["trainer.max_epochs=6", "trainer.converge_epochs=2", "dataset.n_train=300"]
    cfgs = [plain(*CNN, *extra, *m) for m in (["seed=0", "optimizer.lr=1e-2"], ["seed=1", "optimizer.lr=0"])]
    step = MemberStack.step

    def fails_alone(self, batches):
        if len(self.states) == 1:
            raise RuntimeError("the stacked step failed")
        return step(self, batches)

    monkeypatch.setattr(MemberStack, "step", fails_alone)
    results = train_members(cfgs, [tmp_path / f"m{k}" for k in range(2)])
    assert isinstance(results[0], RuntimeError)
    assert isinstance(results[1], dict) and results[1]["status"] == "completed" and results[1]["epochs"] == 3
    assert json.loads((tmp_path / "m1" / "summary.json").read_text())["status"] == "completed"
    assert json.loads((tmp_path / "m0" / "summary.json").read_text())["status"] == "failed"


def test_a_member_whose_evaluation_or_report_fails_fails_alone(tmp_path):
    """Review 2026-11-30 (stacked): an exception in one member's end of epoch (its pruner report: the study's
    storage gone, say) went through the group's error handler, so every member of the stack ended `error` with that
    member's exception in its summary. It fails that member alone, as its single run; the others train on and
    equal their single runs."""
    cfgs, results = _first_member_raises_at_epoch_2(tmp_path, RuntimeError("the study's storage is gone"))
    assert isinstance(results[0], RuntimeError), results[0]
    failed = json.loads((tmp_path / "m0" / "summary.json").read_text())
    assert failed["status"] == "failed" and "storage is gone" in failed["error"] and failed["epochs"] == 2
    alone = train(cfgs[1], tmp_path / "alone")
    assert results[1]["status"] == "completed" and results[1]["epochs"] == 3 and "error" not in results[1]
    assert results[1]["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-4)


def test_sigterm_while_a_stacked_members_trackers_start_stops_the_group_cleanly(tmp_path):
    """Second review 2026-11-30: the single run's SIGTERM handler is in place before its trackers start, but a stacked
    group's (``run_members``) came only after every member's set-up: a SIGTERM while the second member's MLflow run
    started (the vectorized launcher's worker keeps the default handler) ended the process at once (rc -15), the
    first member's MLflow run and its own left RUNNING. Found by sending SIGTERM from the second member's tracker
    start. The group now stops as a single run does: after its first step, each member's checkpoint and
    ``interrupted`` summary written (exit 143), every member's MLflow run KILLED."""
    pytest.importorskip("mlflow", reason="pip install 'vitsweep[mlflow]'")
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from tests.conftest import ROOT

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    dirs = [str(tmp_path / f"m{k}") for k in range(2)]
    code = ("import os, signal; from omegaconf import OmegaConf; from tests.conftest import compose_cfg, TINY; "
            "from src.stacked import train_members; from src.trackers_mlflow import MLflowTracker; calls = []; "
            "MLflowTracker._supersede = lambda self, run_dir: calls.append(run_dir) or (len(calls) == 2 and "
            "os.kill(os.getpid(), signal.SIGTERM)); "
            f"cfgs = [OmegaConf.to_container(compose_cfg([*TINY, 'model.dropout=0.0', 'logger=mlflow', "
            f"'logger.mlflow.tracking_uri={uri}', 'trainer.checkpoint=true', f'seed={{k}}']), resolve=True) "
            "for k in range(2)]; "
            f"train_members(cfgs, {dirs!r})")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, (done.returncode, done.stderr[-3000:])
    client = MlflowClient(tracking_uri=uri)
    for d in dirs:
        assert json.loads((tmp_path / d / "summary.json").read_text())["stop_reason"] == "interrupted", d
        run_id = json.loads((tmp_path / d / "tracker.json").read_text())["mlflow"]["run_id"]
        assert client.get_run(run_id).info.status == "KILLED", d
