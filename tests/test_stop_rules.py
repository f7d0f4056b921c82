"""Stop rules, objectives and the clean-label metrics, end to end through the trainer."""
from __future__ import annotations

import json
import math

import pytest

from hydra_plugins.vitsweep_sweeper.protocol import ENV
from src.run_contract import objective_direction
from src.stop_rules import StopRules
from src.trainer import train

# (eval_every, converge_epochs) -> the epoch a run with a constant train error stops at:
# the first evaluation with one at or before converge_epochs epochs earlier.
CONVERGENCE = {(1, 2): 3, (2, 3): 6, (2, 4): 6, (5, 12): 20}


def rows_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("eval_every, window", list(CONVERGENCE))
def test_convergence_fires_for_any_eval_every(tiny_cfg, tmp_path, eval_every, window):
    # A zero learning rate freezes the model, so the train error is constant from the first epoch.
    summary = train(tiny_cfg("trainer.max_epochs=60", f"trainer.converge_epochs={window}", "optimizer.lr=0",
                             "trainer.stalled_margin=null",
                             f"trainer.eval_every={eval_every}", "dataset.n_train=100"), tmp_path)
    assert summary["stop_reason"] == "converged" and summary["status"] == "completed"
    assert summary["epochs"] == CONVERGENCE[(eval_every, window)]
    evaluated = [r["epoch"] for r in rows_of(tmp_path)]
    assert evaluated == list(range(eval_every, summary["epochs"] + 1, eval_every))
    assert len(evaluated) == math.ceil(window / eval_every) + 1  # the documented minimum


def test_convergence_needs_the_whole_window_within_tol():
    rules = StopRules(converge_epochs=4, converge_tol=0.01, eval_every=2)
    assert [rules.after_eval(e, err) for e, err in [(2, 0.5), (4, 0.3), (6, 0.3), (8, 0.3)]] == \
        [None, None, None, "converged"]  # at 6 the window opens at epoch 2, whose 0.5 is outside tol


def test_a_run_that_converges_at_its_epoch_cap_records_the_convergence(tiny_cfg, tmp_path):
    """Review 2026-11-30 (stop rules): the evaluation of the capped epoch met the convergence rule, yet the run
    recorded ``max_epochs``, which the analysis reads as "reached the cap before converging" (``capped``), while the
    same run under a higher cap, or stopped by a step limit on that epoch's last batch, records ``converged`` at the
    same epoch with the same errors. Converging and being capped at one evaluation is converging."""
    import pandas as pd

    from analysis.load import result_flags

    over = ("trainer.converge_epochs=2", "optimizer.lr=0", "trainer.stalled_margin=null", "dataset.n_train=100")
    free = train(tiny_cfg("trainer.max_epochs=60", *over), tmp_path / "free")
    at_cap = train(tiny_cfg("trainer.max_epochs=3", *over), tmp_path / "at_cap")
    assert (free["stop_reason"], free["epochs"]) == ("converged", CONVERGENCE[(1, 2)])
    assert (at_cap["stop_reason"], at_cap["status"], at_cap["epochs"]) == ("converged", "completed", 3)
    assert at_cap["train_error"] == free["train_error"] and at_cap["test_error"] == free["test_error"]
    assert not result_flags(pd.DataFrame([{**at_cap, "trainer.converge_epochs": 2}]))["capped"].any()


@pytest.mark.parametrize("limit, reason", [("trainer.max_epochs=5", "max_epochs"),
                                           ("trainer.max_steps=10", "max_steps")])  # 2 steps an epoch
def test_a_stops_off_grid_evaluation_does_not_make_the_run_converge(tiny_cfg, tmp_path, limit, reason):
    """Review 2026-11-30 (stop rules): a stop at epoch 5 under eval_every=2 makes an evaluation there that an
    uninterrupted run never makes; with the one at epoch 2 it spans converge_epochs (3), so the rule fired on it and
    the run recorded ``converged`` at 5 (final: never extended), where the uninterrupted run converges at 6."""
    over = ["trainer.converge_epochs=3", "trainer.eval_every=2", "optimizer.lr=0", "trainer.stalled_margin=null",
            "dataset.n_train=100", "scheduler=constant"]
    free = train(tiny_cfg(*over, "trainer.max_epochs=60"), tmp_path / "free")
    assert (free["stop_reason"], free["epochs"]) == ("converged", CONVERGENCE[(2, 3)])
    cut = train(tiny_cfg(*over, limit if reason == "max_epochs" else "trainer.max_epochs=60",
                         *([limit] if reason == "max_steps" else [])), tmp_path / "cut")
    assert (cut["stop_reason"], cut["epochs"]) == (reason, 5)


def test_max_wall_alone_is_a_stop_rule(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("trainer.max_epochs=null", "trainer.max_wall_s=1", "scheduler=constant"), tmp_path)
    assert summary["stop_reason"] == "max_wall" and summary["status"] == "stopped" and summary["wall_s"] >= 1


def test_max_wall_alone_with_a_cosine_schedule_says_how(tiny_cfg, tmp_path):
    with pytest.raises(ValueError, match="scheduler=cosine needs a run length.*scheduler=constant"):
        train(tiny_cfg("trainer.max_epochs=null", "trainer.max_wall_s=1"), tmp_path)


@pytest.mark.parametrize("override, message", [
    ("trainer.objective=test_eror", r"trainer.objective='test_eror' is not a metric this run records: did you mean "
                                    r"test_error"),
    ("trainer.objective=val_acc", "trainer.objective=val_acc needs a validation split: set dataset.val_size"),
    ("trainer.objective=test_auc", "'test_auc' is not a metric this run records"),  # digits has 10 classes
    ("trainer.log_every=0", r"trainer.log_every=0 must be an integer >= 1"),
    ("trainer.checkpoint_every=-1", r"trainer.checkpoint_every=-1 must be an integer >= 0"),
    ("trainer.resume=sometimes", r"trainer.resume='sometimes' is unknown: choose one of \['auto', 'never'\]"),
    ("trainer.max_epochs=null", "set trainer.max_epochs, trainer.max_steps or trainer.max_wall_s"),
    # a fraction scored no image (train_error 0.0, as if interpolated); a negative size all but that many
    ("trainer.train_eval_size=0.5", r"trainer.train_eval_size=0.5 must be null .* or an integer >= 1"),
    ("trainer.train_eval_size=-50", r"trainer.train_eval_size=-50 must be null .* or an integer >= 1"),
])
def test_bad_trainer_input_fails_before_any_record(tiny_cfg, tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        train(tiny_cfg(override), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_accuracy_objectives_are_reported_for_pruning_and_maximised(tiny_cfg, tmp_path):
    seen = []
    summary = train(tiny_cfg("trainer.max_epochs=4", "dataset.val_size=100", "trainer.objective=val_acc"), tmp_path,
                    reporter=lambda v, e: seen.append((v, e)) or e >= 2)
    rows = rows_of(tmp_path)
    assert summary["stop_reason"] == "pruned" and [e for _, e in seen] == [1, 2]
    assert [v for v, _ in seen] == [r["val_acc"] for r in rows] == [1 - r["val_error"] for r in rows]
    assert summary["objective"] == summary["val_acc"] and summary["objective_direction"] == "maximize"
    assert objective_direction("val_auc") == "maximize" and objective_direction("test_error") == "minimize"


def test_clean_label_error_equals_the_noisy_one_without_noise(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("trainer.max_epochs=2", "trainer.train_eval_size=120"), tmp_path)
    for r in [*rows_of(tmp_path), summary]:
        assert r["train_error_clean"] == r["train_error"] and r["train_loss_clean"] == r["train_loss"]
        noisy = r["train_error_noisy_subset"]
        assert noisy is None or math.isnan(noisy)  # no flipped image scored: NaN, null in the files


def test_clean_label_error_differs_with_label_noise(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("trainer.max_epochs=3", "label_noise=p20", "dataset.n_train=600",
                             "trainer.train_eval_size=300", "optimizer.lr=3e-3"), tmp_path)
    rows = rows_of(tmp_path)
    for r in rows:  # the clean metrics score the same predictions against other labels
        assert r["train_loss_clean"] != r["train_loss"]
        assert 0.0 <= r["train_error_noisy_subset"] <= 1.0
    # errors count wrong predictions only: a model that still predicts one class everywhere (this tiny ViT after its
    # first epoch, on some dropout draws) can be wrong as often against both label sets
    assert any(r["train_error_clean"] != r["train_error"] for r in rows)
    # A model that has not memorised the noise mostly predicts the true class of a flipped image, so it is
    # wrong against the noisy label there more often than on the clean images.
    assert summary["train_error_noisy_subset"] > summary["train_error_clean"]


def test_a_trial_tuned_on_the_test_split_says_so_once(tiny_cfg, tmp_path, caplog, monkeypatch):
    # the vitsweep sweeper hands a job its trial through the environment (hydra.job.env_set)
    import optuna

    url = f"sqlite:///{tmp_path}/optuna.db"  # a trial's job records its objective in its study
    optuna.create_study(study_name="s", storage=url).ask()
    for var, value in zip(ENV.values(), ("s", "0", url), strict=True):
        monkeypatch.setenv(var, value)
    train(tiny_cfg("trainer.max_epochs=2"), tmp_path)
    assert caplog.text.count("tuned on the TEST split") == 1


def test_a_run_stuck_at_chance_is_a_stalled_result_not_a_failure(tiny_cfg, tmp_path):
    """Defect: a stalled run failed with a NaN objective, so it dropped out of every curve (biasing the
    under-parametrised end of a double-descent curve downwards) and counted against max_failure_rate. It is a
    result: completed, flagged ``stalled``, with its real objective."""
    # A frozen random model (lr 0) predicts near chance: its unchanging train error is no convergence.
    summary = train(tiny_cfg("trainer.max_epochs=30", "trainer.converge_epochs=2", "optimizer.lr=0",
                             "dataset.n_train=100"), tmp_path)
    assert summary["stop_reason"] == "stalled" and summary["status"] == "completed" and summary["stalled"] is True
    assert math.isfinite(summary["objective"]) and summary["objective"] == summary["test_error"]
    assert summary["train_error"] >= summary["chance_train_error"] - 0.01
    assert "error" not in summary
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["stalled"] is True


def test_a_run_that_reached_its_epoch_cap_at_chance_is_recorded_stalled(tiny_cfg, tmp_path):
    """Seen in the CIFAR-10 double-descent study: a C1 = 4 CNN collapsed to chance and ran to its 1000-epoch cap
    (its error moved by a few images, so the stall rule never fired); its summary said ``stalled: false`` and
    the result read as a learned model at 89.9% test error. The summary's flag now means "ended at chance",
    whatever stopped the run (the analysis applies the same test to older summaries)."""
    summary = train(tiny_cfg("trainer.max_epochs=3", "trainer.converge_epochs=null", "optimizer.lr=0",
                             "dataset.n_train=100"), tmp_path)
    assert summary["stop_reason"] == "max_epochs" and summary["status"] == "completed"
    assert summary["train_error"] >= summary["chance_train_error"] - 0.01
    assert summary["stalled"] is True
    assert json.loads((tmp_path / "summary.json").read_text())["stalled"] is True


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """The summary of a 20-epoch run at lr 3e-3, which learns; the tests only read it (trained once for them)."""
    from tests.conftest import TINY, compose_cfg

    return train(compose_cfg([*TINY, "trainer.max_epochs=20", "optimizer.lr=3e-3"]), tmp_path_factory.mktemp("learned"))


def test_a_run_that_learned_is_not_stalled(learned):
    summary = learned
    assert summary["train_error"] < summary["chance_train_error"] - 0.1, summary  # it learned
    assert summary["stalled"] is False


def test_stalled_needs_the_error_at_chance():
    rules = StopRules(converge_epochs=2, chance_error=0.887)
    assert [rules.after_eval(e, 0.893) for e in (1, 2, 3)] == [None, None, "stalled"]
    rules = StopRules(converge_epochs=2, chance_error=0.887)
    assert [rules.after_eval(e, 0.0) for e in (1, 2, 3)] == [None, None, "converged"]  # interpolated
    rules = StopRules(converge_epochs=2, chance_error=0.887, stalled_margin=None)
    assert [rules.after_eval(e, 0.893) for e in (1, 2, 3)] == [None, None, "converged"]  # check turned off


def test_a_run_whose_train_error_collapsed_from_far_lower_is_recorded_collapsed_and_stalled(tiny_cfg, tmp_path,
                                                                                         monkeypatch, learned):
    """Seen on CIFAR-10 near the interpolation threshold: runs reached 3-6% train error, a loss spike killed their
    ReLUs and they ended at 87% (chance 90%: outside the stall margin), recorded as plain results. The train errors
    are scripted here (the model trains for real); the summary records the lowest and flags the collapse."""
    import itertools

    import src.loop as loop

    scripted = itertools.chain([0.8, 0.05], itertools.repeat(0.87))
    original = loop.evaluation_row

    def row_with_scripted_train_error(*args, **kwargs):
        row = original(*args, **kwargs)
        row["train_error"] = next(scripted)
        return row

    monkeypatch.setattr(loop, "evaluation_row", row_with_scripted_train_error)
    summary = train(tiny_cfg("trainer.max_epochs=3", "trainer.converge_epochs=null"), tmp_path)
    assert summary["best_train_error"] == 0.05 and summary["train_error"] == 0.87
    assert summary["collapsed"] is True and summary["stalled"] is True and summary["status"] == "completed"
    # a run whose (scripted) train error never fell below where it ended: 3 epochs, as above (this run trained 20
    # epochs at lr 3e-3 while the script still replaced its train errors: the rule reads only those)
    steady = train(tiny_cfg("trainer.max_epochs=3", "trainer.converge_epochs=null"), tmp_path / "steady")
    assert steady["best_train_error"] == steady["train_error"] == 0.87 and steady["collapsed"] is False
    assert learned["collapsed"] is False  # and a real run that learned (unscripted) is not collapsed either


def test_the_chance_rules_hold_off_where_the_commonest_label_is_a_majority():
    """Review finding: on a 2%-positive binary set (RSNA, balance: pos_weight) chance is 0.02, so "within 0.01 of
    chance" took any train error >= 0.011 (even one far worse than predicting all negatives) for a model that did
    not learn. Being at chance, or collapsing to it, means something only where always predicting the commonest
    label is wrong at least half the time."""
    rules = StopRules(converge_epochs=2, chance_error=0.02)
    assert not rules.at_chance(0.015) and not rules.at_chance(0.3)
    assert [rules.after_eval(e, 0.3) for e in (1, 2, 3)] == [None, None, "converged"]
    assert StopRules(chance_error=0.5).at_chance(0.495) and StopRules(chance_error=0.9).at_chance(0.895)
    assert StopRules(chance_error=0.9).chance_rules_apply() is True
    assert StopRules(chance_error=0.02).chance_rules_apply() is False


def test_a_stopped_run_s_exception_survives_pickling_so_a_pool_worker_can_send_it_back():
    """Review finding: RunInterrupted pickled but did not unpickle (its __init__ takes two arguments), so a pool
    worker's stopped job broke the launcher's pool instead of returning its result."""
    import pickle

    from src.stop_signal import RunInterrupted

    back = pickle.loads(pickle.dumps(RunInterrupted(15, {"stop_reason": "interrupted"})))
    assert isinstance(back, SystemExit) and back.code == 143 and back.signum == 15
    assert back.summary == {"stop_reason": "interrupted"}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model", [("model=cnn", "model.width=2"), ()])
def test_a_stop_rule_that_never_fires_leaves_the_training_bitwise_the_same(tiny_cfg, tmp_path, model, precision):
    """A run that reached its epoch cap under the convergence rule is, on the same machine and at the same
    precision, the fixed-budget run of the same cap: the rule only reads the train error, so the double-descent
    studies' fixed-budget arms take those runs as they are and train only the runs the rule ended early
    (docs/studies/double_descent_cnn/report.md). The rule's window (2 epochs) is checked at every epoch from the
    third on, and never fires, since the train error keeps moving."""
    runs = {}
    for rule in ("trainer.converge_epochs=null", "trainer.converge_epochs=2"):
        run_dir = tmp_path / rule.rsplit("=", 1)[1]
        summary = train(tiny_cfg(*model, "trainer.max_epochs=8", rule, "trainer.converge_tol=0.0",
                                 f"trainer.precision={precision}", "trainer.stalled_margin=null",
                                 "scheduler=constant", "optimizer.lr=1e-2", "dataset.n_train=200"), run_dir)
        assert summary["stop_reason"] == "max_epochs" and summary["precision"] == precision
        timing = ("wall_s", "images_per_s", "train_images_per_s")
        runs[rule] = ([{k: v for k, v in r.items() if k not in timing} for r in rows_of(run_dir)],
                      {k: summary[k] for k in ("train_error", "train_loss", "test_error", "test_loss", "epochs")})
    (free, free_end), (ruled, ruled_end) = runs.values()
    assert len(free) == 8 and free == ruled and free_end == ruled_end
