"""analysis.design on hand-written pilots whose threshold, collapses, spread and peak are known."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import design, load_runs
from tests.helpers import write_run

WIDTHS = [1, 2, 3, 4, 6, 8, 12, 16, 32]
BUMP = 0.12


def cnn_config(seed, width, lr, n_train, noise=0.2):
    return {"seed": seed, "dataset": {"name": "cifar10", "n_train": n_train},
            "model": {"_target_": "src.models.cnn.WidthCNN", "width": width},
            "optimizer": {"lr": lr}, "label_noise": {"p": noise}, "trainer": {"max_epochs": 300}}


def curve(width, t):
    """Train error falls to 0 at the threshold ``t``; test error falls 0.05 a doubling, with a bump of 0.12 at the
    critical width (the grid width just below ``t``)."""
    train = 0.0 if width >= t else 0.3 * (1 - width / t) + 0.02
    crit = max(w for w in WIDTHS if w < t)
    test = 0.7 - 0.05 * np.log2(width) + (BUMP if width == crit else 0.0)
    return train, test


def write_pilot(root, collapse_at=None, sizes=(2048, 8192), lrs=(0.05, 0.02, 0.01), seeds=(0, 1), noise_sd=0.01):
    """A pilot grid; threshold 3 at n 2048 and 8 at n 8192. ``collapse_at``: {(lr, width)} whose runs collapse."""
    rng = np.random.default_rng(0)
    num = 0
    for n in sizes:
        t = 3 if n == 2048 else 8
        for lr in lrs:
            for w in WIDTHS:
                for s in seeds:
                    train, test = curve(w, t)
                    extra = {"chance_train_error": 0.9, "best_train_error": train}
                    if collapse_at and (lr, w) in collapse_at:
                        train, test = 0.9, 0.9
                    write_run(root, num, cnn_config(s, w, lr, n),
                              {"status": "completed", "stop_reason": "converged", "train_error": train,
                               "test_error": test + rng.normal(0, noise_sd), **extra})
                    num += 1
    return root


def test_thresholds_per_size_and_lr_count_the_underfitting_widths_below(tmp_path):
    df = load_runs(write_pilot(tmp_path))
    th = design.thresholds(df)
    assert set(th["threshold"]) == {3.0, 8.0}
    row = th[(th["dataset.n_train"] == 8192) & (th["optimizer.lr"] == 0.02)].iloc[0]
    assert row["underfit_below"] == 5  # 1, 2, 3, 4, 6
    assert design.thresholds(df[df["dataset.n_train"] == 2048])["underfit_below"].eq(2).all()


def test_the_lr_rule_takes_the_largest_lr_with_no_collapse_at_its_threshold_widths(tmp_path):
    # lr 0.05 collapses at C1 = 6 (next to the n-8192 threshold 8); 0.02 collapses at C1 = 32 only, far from it
    df = load_runs(write_pilot(tmp_path, collapse_at={(0.05, 6), (0.02, 32)}))
    lr, table = design.choose_lr(df)
    assert lr == 0.02
    assert table.set_index("optimizer.lr").loc[0.05, "flagged"] == 4  # 2 seeds x 2 sizes at C1 = 6
    assert not table.set_index("optimizer.lr").loc[0.05, "stable"]


def test_no_lr_is_chosen_when_every_rung_collapses(tmp_path):
    df = load_runs(write_pilot(tmp_path, collapse_at={(lr, 4) for lr in (0.05, 0.02, 0.01)}))
    assert design.choose_lr(df)[0] is None


def test_the_contrast_sd_and_the_smallest_detectable_peak(tmp_path):
    df = load_runs(write_pilot(tmp_path, seeds=tuple(range(6)), noise_sd=0.02, lrs=(0.02,)))
    sp = design.spread(df)
    # each contrast is x_t - x_side of independent draws with sd 0.02: sd 0.02 * sqrt(2)
    assert sp.contrast_sd == pytest.approx(0.02 * np.sqrt(2), rel=0.35)
    assert sp.dof == 2 * 2 * 5  # 2 curves x 2 contrasts x (6 seeds - 1)
    lo, hi = sp.sd_interval()  # the power figure takes the sd as known: the output gives its interval
    assert sp.power_sd == max(sp.left_sd, sp.right_sd)  # the noisier side's, on its own 10 dof
    assert lo < sp.power_sd < hi and hi / lo == pytest.approx(2.51, abs=0.01)  # chi-square, 10 dof
    assert design.mde(0.02, 4) > design.mde(0.02, 8)
    assert design.mde(0.02, 1) != design.mde(0.02, 1)  # NaN: one seed has no spread
    # both contrasts must be significant: each side gets power sqrt(0.8), so 4 seeds at sd 0.0294 detect 0.058
    # (0.049 for a single one-sided test at power 0.8, the figure first used for the MNIST main run)
    assert design.mde(0.0294, 4) == pytest.approx(0.0580, abs=5e-4)


def test_a_pilot_with_no_two_sided_contrast_takes_its_power_from_one_width_sd(tmp_path):
    # the CIFAR-10 main run was declared from such a pilot (widths 3-8 only: no contrast had both neighbours), with
    # the contrast sd taken as sqrt(2) x one width's sd; the test must use that figure, not give NaN power
    # (it did: every verdict then read "inconclusive (the design detects nan and up ...)")
    df = load_runs(write_pilot(tmp_path, seeds=tuple(range(4)), noise_sd=0.02, lrs=(0.02,), sizes=(8192,)))
    narrow = df[df["model.width"].isin([4, 6, 8])]
    sp = design.spread(narrow)
    assert sp.dof == 0 and np.isnan(sp.contrast_sd) and sp.width_sd > 0
    assert sp.power_sd == pytest.approx(np.sqrt(2) * sp.width_sd) and "sqrt(2)" in sp.power_source
    full = design.spread(df)
    assert full.power_sd == max(full.left_sd, full.right_sd) and "contrast" in full.power_source
    assert design.mde(0.027 * np.sqrt(2), 8) == pytest.approx(0.044, abs=5e-4)  # the declared CIFAR-10 figure
    (test,) = design.peak_tests(df.assign(test_error=df["test_error"] - 0.05 * (df["model.width"] == 6)),
                                pilot_sd=sp.power_sd, effect=0.05)
    assert np.isfinite(test.mde) and "nan" not in test.verdict


def test_the_main_run_is_chosen_by_the_declared_rules(tmp_path):
    p = design.plan([str(write_pilot(tmp_path))], tol=0.01, seeds=[3, 4], effect=0.05)
    m = design.choose_main(p, target=6)
    assert m["n_train"] == 8192  # threshold 8 is closer to 6 (log scale) than 3, and leaves 5 underfit widths
    assert m["grid"][:2] == [3, 4] and 8 in m["grid"] and 5 in m["grid"] and 6 in m["grid"] and m["grid"][-1] == 64
    assert m["seeds"] == 3  # spread 0.01: three seeds already detect 0.05
    over = design.main_overrides(m, p["lr"])
    assert over[0] == "optimizer.lr=0.05" and "dataset.n_train=8192" in over and over[-1] == "seed=choice(0,1,2)"


def test_the_plans_pilot_curves_count_a_rerun_seed_once(tmp_path):
    """Review 2026-11-30 (design): the plan's pilot-curves table took its mean and sd over runs, so a (curve, width,
    seed) run twice counted as two seeds; each seed's runs are averaged first, as in ``spread``."""
    root = write_pilot(tmp_path, lrs=(0.02,), sizes=(8192,), seeds=(0, 1))
    write_run(root, 1000, cnn_config(0, 6, 0.02, 8192), {"status": "completed", "stop_reason": "converged",
                                                          "train_error": 0.05, "test_error": 0.9})
    df = load_runs(root)
    at6 = df[df["model.width"] == 6].sort_values("seed")
    seed_means = at6.groupby("seed")["test_error"].mean()
    row = design.plan([str(root)], tol=0.01, seeds=[3], effect=0.05)["curves"].set_index("model.width").loc[6]
    assert (row["seeds"], row["runs"]) == (2, 3)
    assert row["test_mean"] == pytest.approx(seed_means.mean()) and row["test_sd"] == pytest.approx(seed_means.std())


def test_a_real_peak_at_the_threshold_is_reproduced_and_a_flat_curve_with_power_is_not(tmp_path):
    df = load_runs(write_pilot(tmp_path / "a", seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,)))
    (test,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05)
    assert (test.center, test.left, test.right) == (6.0, 3.0, 12.0)  # threshold 8: the critical width is 6
    assert test.vs_left == pytest.approx(BUMP - 0.05, abs=0.02)
    assert test.vs_right == pytest.approx(BUMP + 0.05, abs=0.02)
    assert test.height == test.vs_left and test.verdict == "reproduced"
    assert test.contrast_sd == pytest.approx(0.01 * np.sqrt(2), rel=0.6)  # the run's own spread (noise sd 0.01)
    # the same curve without the bump falls monotonically: above its right neighbour, below its left: no peak
    flat = df.assign(test_error=np.where(df["model.width"] == 6, df["test_error"] - BUMP, df["test_error"]))
    (test,) = design.peak_tests(flat, pilot_sd=0.015, effect=0.05)
    assert test.p_value > 0.05 and test.mde < 0.05 and test.verdict == "not reproduced"
    (test,) = design.peak_tests(flat, pilot_sd=0.2, effect=0.05)
    assert test.verdict.startswith("inconclusive") and "more seeds" in test.verdict


def test_the_threshold_centred_test_is_a_separate_sensitivity_check(tmp_path):
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,)))
    (test,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05, rule="threshold")
    assert (test.center, test.left, test.right) == (8.0, 4.0, 16.0) and test.verdict != "reproduced"
    with pytest.raises(ValueError, match="center='middle'"):
        design.peak_tests(df, pilot_sd=0.015, effect=0.05, rule="middle")


def test_a_collapse_at_a_tested_width_makes_the_verdict_inconclusive(tmp_path):
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2), lrs=(0.05,), sizes=(8192,), collapse_at={(0.05, 12)}))
    (test,) = design.peak_tests(df, pilot_sd=0.01, effect=0.05)
    assert test.flagged_runs == 3 and test.verdict.startswith("inconclusive (3 collapsed")


def test_an_unfinished_grid_gives_no_verdict_but_inconclusive_naming_what_is_missing(tmp_path):
    """The declared test reads the whole grid: the critical width comes from every seed's train error and the power
    from the declared seeds. On a sweep still running (or stopped half way) the same contrast on the seeds that
    happened to finish first must not read as the study's verdict."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,))
    df = load_runs(root)
    (whole,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05)
    assert whole.verdict == "reproduced"
    # seed 3 has not reached width 12 yet (no run dir); seed 2's run at width 6 was stopped half way
    gone = df[(df["seed"] == 3) & (df["model.width"] == 12)].index
    part = df.drop(gone)
    part.loc[(part["seed"] == 2) & (part["model.width"] == 6), "status"] = "stopped"
    (test,) = design.peak_tests(part, pilot_sd=0.015, effect=0.05)
    assert test.verdict == "inconclusive (grid unfinished: 34 of 36 runs finished, 1 stopped, 1 not started)"
    # a run that diverged is no test-error value either
    failed = df.copy()
    failed.loc[(failed["seed"] == 1) & (failed["model.width"] == 32), "status"] = "failed"
    (test,) = design.peak_tests(failed, pilot_sd=0.015, effect=0.05)
    assert test.verdict == "inconclusive (grid unfinished: 35 of 36 runs finished, 1 failed)"


def test_a_finished_run_without_a_score_makes_the_verdict_inconclusive_instead_of_losing_its_seed(tmp_path):
    """Review finding: the contrast table skipped a finished run with no test error, so its seed left the pairing
    unnoticed (a 4-seed grid read "reproduced" on 3); with no test error at the whole critical width the test raised
    KeyError. A finished run the test cannot read is named, and the verdict waits for it."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,)))
    one = df.copy()
    one.loc[(one["model.width"] == 6) & (one["seed"] == 3), "test_error"] = np.nan
    (test,) = design.peak_tests(one, pilot_sd=0.015, effect=0.05)
    assert test.verdict == ("inconclusive (1 finished run has no test or train error (model.width 6 seed 3): "
                            "score it again or rerun it)")
    whole = df.copy()
    whole.loc[whole["model.width"] == 6, "test_error"] = np.nan
    (test,) = design.peak_tests(whole, pilot_sd=0.015, effect=0.05)
    assert test.verdict.startswith("inconclusive (4 finished runs have no test or train error (model.width 6 seed 0")
    train = df.copy()  # a train error decides the threshold, at any width
    train.loc[(train["model.width"] == 32) & (train["seed"] == 0), "train_error"] = np.nan
    (test,) = design.peak_tests(train, pilot_sd=0.015, effect=0.05)
    assert test.verdict.startswith("inconclusive (1 finished run has no test or train error (model.width 32 seed 0")


def test_an_inconclusive_verdict_without_a_p_value_says_why(tmp_path):
    """Review finding: with one seed, or a contrast equal in every seed, the t-test has no p value, and the verdict
    said "no threshold with a neighbour on each side in the grid" though the grid had both."""
    one = load_runs(write_pilot(tmp_path / "one", seeds=(0,), lrs=(0.02,), sizes=(8192,)))
    (test,) = design.peak_tests(one, pilot_sd=0.015, effect=0.05)
    assert (test.left, test.right) == (3.0, 12.0)
    assert test.verdict == "inconclusive (1 seed has the three tested widths: the paired t-test needs 2 or more)"
    same = load_runs(write_pilot(tmp_path / "same", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.0))
    (test,) = design.peak_tests(same, pilot_sd=0.015, effect=0.05)
    assert test.verdict == ("inconclusive (a contrast is the same in every seed: the paired t-test needs a spread; "
                            "check that the seeds differ)")
    edge = one[one["model.width"] >= 4]  # threshold 8, critical 6: no left neighbour at most 3
    (test,) = design.peak_tests(edge, pilot_sd=0.015, effect=0.05)
    assert test.verdict == "inconclusive (no threshold with a neighbour on each side in the grid)"


def test_the_test_names_a_curve_whose_runs_trained_on_more_than_one_machine(tmp_path):
    """Review finding: the device check tells CPU from GPU only. The MNIST CNN's fixed-budget arm pairs C1 1-6 trained
    on one CPU model with C1 8-16 on another, and the ViT CPU grid mixes two CPU models in every width; neither was
    said. Runs of one recipe on two machines are still samples of it (not refused), but the output names the mix
    and the widths it falls on, where a machine effect would be confounded with width."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1), lrs=(0.02,), sizes=(8192,)), optuna_state=False)
    assert design.machine_note(df.assign(machines=[("cpu A",)] * len(df))) == ""
    mixed = df.assign(machines=[("cpu B",) if w >= 8 else None for w in df["model.width"]])
    mixed.loc[(mixed["model.width"] == 32) & (mixed["seed"] == 1), "machines"] = pd.Series(
        [("cpu B", "cpu A")], index=mixed.index[(mixed["model.width"] == 32) & (mixed["seed"] == 1)])
    note = design.machine_note(mixed)
    assert note == ("\nFinished runs of one curve on more than one machine (noted, not refused: each is a run of the "
                    "recipe, but a machine effect would be confounded with the widths named; \"not recorded\": the "
                    "run, or its part before a resume, trained before summaries named their machine): "
                    "label_noise.p=0.2: 10 not recorded, "
                    "7 cpu B, 1 cpu B then cpu A (the fewer at 8, 12, 16, 32).\n")


def test_the_grid_a_sweep_declared_counts_seeds_and_widths_that_never_started(tmp_path):
    """A seed (or width) no run dir holds yet is missing too: the sweeper's study records its grid."""
    import optuna

    from hydra_plugins.vitsweep_sweeper.protocol import declared_grid

    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,))
    storage = f"sqlite:///{root / 'optuna.db'}"
    study = optuna.create_study(study_name="dd", storage=storage)
    study._storage.set_study_system_attr(study._study_id, "vitsweep:grid",
                                         {"model.width": WIDTHS, "seed": [0, 1, 2, 3]})
    for summary in root.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        summary.write_text(json.dumps({**s, "study_name": "dd", "study_storage": storage}))
    assert declared_grid(storage, "dd") == {"model.width": WIDTHS, "seed": [0, 1, 2, 3]}
    (test,) = design.peak_tests(load_runs(root, optuna_state=False), pilot_sd=0.015, effect=0.05)
    assert test.verdict == "inconclusive (grid unfinished: 27 of 36 runs finished, 9 not started)"
    out = tmp_path / "test.md"
    assert design.main(["test", str(root), "--pilot", str(root), "--out", str(out)]) == 0
    assert "27 of 36 runs finished" in out.read_text()


def with_summary(root: Path, **extra) -> Path:
    for summary in root.glob("*/summary.json"):
        summary.write_text(json.dumps({**json.loads(summary.read_text()), **extra}))
    return root


def test_the_test_refuses_runs_of_two_devices_or_recipes_in_one_curve(tmp_path):
    """Review finding: the CPU and the lent GPUs' records of one study, each grid unfinished, were one curve to the
    test once passed together; their union reached a full grid and printed "reproduced", though the report declares
    the test on one device's full grid, never on a mix. A mixed curve is refused, naming what differs."""
    cpu = with_summary(write_pilot(tmp_path / "cpu", seeds=(0, 1), lrs=(0.02,), sizes=(8192,)), device="cpu")
    gpu = with_summary(write_pilot(tmp_path / "gpu", seeds=(2, 3), lrs=(0.02,), sizes=(8192,)), device="cuda")
    with pytest.raises(ValueError, match=r"device.*'cpu'.*'cuda'.*one device"):
        design.peak_tests(load_runs([cpu, gpu]), pilot_sd=0.015, effect=0.05)
    (alone,) = design.peak_tests(load_runs(cpu), pilot_sd=0.015, effect=0.05)  # each device alone is a curve
    assert alone.seeds == 2
    other = write_pilot(tmp_path / "other", seeds=(2, 3), lrs=(0.02,), sizes=(8192,))
    for config in other.glob("*/.hydra/config.yaml"):  # another data file: another recipe
        config.write_text(config.read_text().replace("name: cifar10", "name: cifar10\n  root: elsewhere.npz"))
    with pytest.raises(ValueError, match=r"dataset\.root"):
        design.peak_tests(load_runs([tmp_path / "cpu", other]), pilot_sd=0.015, effect=0.05)


def test_the_test_refuses_a_curve_whose_widths_trained_under_different_recipes(tmp_path):
    """Review finding: the recipe check compared runs within one width only, so a curve stitched from two studies
    (momentum 0.9 at the narrow widths, 0 at the wide ones) read "reproduced". A key must hold one value along the
    whole curve, unless it is a model key with a different value at each width (a ViT's MLP size follows its dim)."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,))
    for config in root.glob("*/.hydra/config.yaml"):
        text = config.read_text()
        wide = any(f"width: {w}\n" in text for w in (8, 12, 16, 32))
        config.write_text(text.replace("optimizer:\n", f"optimizer:\n  momentum: {0.0 if wide else 0.9}\n"))
    df = load_runs(root)
    assert set(df["optimizer.momentum"]) == {0.0, 0.9}
    with pytest.raises(ValueError, match=r"widths differ in optimizer\.momentum"):
        design.peak_tests(df, pilot_sd=0.015, effect=0.05)
    mlp = load_runs(write_pilot(tmp_path / "b", seeds=(0, 1), lrs=(0.02,), sizes=(8192,)))
    mlp["model.mlp_dim"] = 2 * mlp["model.width"]  # a model key that follows the width is the grid's own
    mlp.attrs["config_columns"] = [*mlp.attrs["config_columns"], "model.mlp_dim"]
    design.peak_tests(mlp, pilot_sd=0.015, effect=0.05)
    mlp["model.dropout"] = np.where(mlp["model.width"] >= 8, 0.0, 0.1)  # but two models' values split by width: no
    mlp.attrs["config_columns"] = [*mlp.attrs["config_columns"], "model.dropout"]
    with pytest.raises(ValueError, match=r"widths differ in model\.dropout"):
        design.peak_tests(mlp, pilot_sd=0.015, effect=0.05)


def test_the_test_refuses_a_run_given_twice_and_runs_outside_the_declared_grid(tmp_path):
    """Review finding: two finished runs of one (curve, width, seed) were averaged into one seed's value, and seeds
    outside the grid the study declared joined the test (and its power) unnoticed."""
    import optuna

    a = write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,))
    b = write_pilot(tmp_path / "b", seeds=(2,), lrs=(0.02,), sizes=(8192,))
    with pytest.raises(ValueError, match=r"9 finished runs repeat a \(curve, width, seed\)"):
        design.peak_tests(load_runs([a, b]), pilot_sd=0.015, effect=0.05)
    storage = f"sqlite:///{a / 'optuna.db'}"
    study = optuna.create_study(study_name="dd", storage=storage)
    study._storage.set_study_system_attr(study._study_id, "vitsweep:grid", {"model.width": WIDTHS, "seed": [0, 1]})
    with_summary(a, study_name="dd", study_storage=storage)
    with pytest.raises(ValueError, match=r"9 finished runs lie outside the grid their study declared.*seed 2"):
        design.peak_tests(load_runs(a, optuna_state=False), pilot_sd=0.015, effect=0.05)


def test_a_fixed_budget_arm_takes_a_convergence_arm_run_that_converged_at_the_budget_epoch(tmp_path):
    """Review 2026-11-30 (stop rules): a run whose convergence rule fired at the evaluation of its capped epoch
    records ``converged`` (tests/test_stop_rules.py); it trained the whole budget, so it is the fixed arm's run of
    its (width, seed) like one that recorded ``max_epochs`` there. One that converged before the cap is not."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    for s in range(2):
        for w in WIDTHS:
            train, test = curve(w, 8)
            cfg = cnn_config(s, w, 0.05, 8192)
            reason, epochs = ("converged", 300) if (w, s) == (4, 1) else ("converged", 120) if w >= 8 else \
                ("max_epochs", 300)
            summary = {"status": "completed", "stop_reason": reason, "epochs": epochs, "train_error": train,
                       "test_error": test}
            write_run(conv, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
            if w >= 8:
                write_run(fixed, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": None}},
                          {**summary, "stop_reason": "max_epochs", "epochs": 300})
    both = design.with_capped(load_runs(fixed, optuna_state=False), load_runs(conv, optuna_state=False))
    taken = both[both["run_dir"].str.contains("conv")]
    at_budget = taken[(taken["model.width"] == 4) & (taken["seed"] == 1)]
    assert (at_budget["status"] == "completed").all() and at_budget["test_error"].notna().all()
    assert (taken["status"] == "completed").all() and set(taken["model.width"]) == {1, 2, 3, 4, 6}


def test_a_fixed_budget_arm_takes_the_convergence_arms_capped_runs_for_the_pairs_it_did_not_train(tmp_path):
    """double_descent_cnn's fixed-budget arm trains only what the convergence rule ended early: a run that reached
    the same cap under that rule is the fixed arm's run of its (width, seed) (tests/test_stop_rules.py)."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    rng = np.random.default_rng(0)
    for s in range(4):
        for w in WIDTHS:
            train, test = curve(w, 8)
            cfg = cnn_config(s, w, 0.05, 8192)
            early = w >= 8 and not (w == 8 and s == 0)  # the rule ended these; C1 8 seed 0 ran to the cap
            summary = {"status": "completed", "stop_reason": "converged" if early else "max_epochs",
                       "epochs": 120 if early else 300, "train_error": train,
                       "test_error": test + 0.03 * early + rng.normal(0, 0.01)}
            write_run(conv, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
            if w >= 8:  # the fixed arm's own sweep: widths 8-32, every seed, the whole budget
                write_run(fixed, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": None}},
                          {**summary, "stop_reason": "max_epochs", "epochs": 300, "test_error": test})
    main = load_runs(fixed, optuna_state=False)
    both = design.with_capped(main, load_runs(conv, optuna_state=False))
    assert len(both) == 4 * len(WIDTHS)  # C1 8 seed 0 from the fixed arm, not twice
    taken = both[both["run_dir"].str.contains("conv")]
    assert set(taken["model.width"]) == {1, 2, 3, 4, 6} and (taken["stop_reason"] == "max_epochs").all()
    assert taken["trainer.converge_epochs"].isna().all()  # one curve with the fixed arm's runs
    (test,) = design.peak_tests(both, pilot_sd=0.015, effect=0.05)
    assert (test.center, test.left, test.right, test.seeds) == (6.0, 3.0, 12.0, 4) and test.verdict == "reproduced"
    # alone, the fixed arm's sweep is not the arm's grid: no threshold below its narrowest width
    (alone,) = design.peak_tests(main, pilot_sd=0.015, effect=0.05)
    assert alone.verdict.startswith("inconclusive")
    # a capped run under another cap is no run of this budget: none is taken, and an arm that holds none of the
    # fixed arm's curves is refused (review 2026-11-28: it added nothing, silently, and the narrow widths were
    # never read)
    other = load_runs(conv, optuna_state=False).assign(**{"trainer.max_epochs": 200})
    with pytest.raises(ValueError, match=r"holds no run of the fixed-budget arm's curves.*trainer.max_epochs = "
                                         r"\['300.0'\] here, \['200.0'\] there"):
        design.with_capped(main, other)
    # review findings (2026-11-27): the convergence arm's runs the rule ended early at pairs the fixed arm's sweep
    # lacks are missing runs of this arm, not absent from its grid
    narrow = main[main["model.width"] > 8]
    (short8,) = design.peak_tests(design.with_capped(narrow, load_runs(conv, optuna_state=False)), 0.015, 0.05)
    assert short8.verdict == "inconclusive (grid unfinished: 33 of 36 runs finished, 3 ended early)"
    # another recipe is refused, naming the key
    mnist = load_runs(conv, optuna_state=False).assign(**{"dataset.name": "mnist"})
    with pytest.raises(ValueError, match=r"dataset.name = \['mnist'\] there, 'cifar10' here"):
        design.with_capped(main, mnist)
    # widths and seeds stored as floats on one side still name the same pairs (no pair twice)
    floats = load_runs(conv, optuna_state=False).astype({"model.width": float, "seed": float})
    assert len(design.with_capped(main, floats)) == 4 * len(WIDTHS)
    # both arms in one call: a curve keyed by a null (converge_epochs) is still checked for missing runs
    fixed_part = main.drop(main[(main["seed"] == 3) & (main["model.width"] >= 12)].index)
    two = pd.concat([load_runs(conv, optuna_state=False), fixed_part], ignore_index=True)
    verdicts = [t.verdict for t in design.peak_tests(two, pilot_sd=0.015, effect=0.05)]
    assert any(v.startswith("inconclusive (grid unfinished: 13 of 16 runs") for v in verdicts), verdicts
    out = tmp_path / "test.md"
    assert design.main(["test", str(fixed), "--capped-from", str(conv), "--pilot", str(conv), "--curves",
                        "--out", str(out)]) == 0
    text = out.read_text()
    assert "| reproduced |" in text
    rows = [r for r in text.split("## The curves it read")[1].splitlines() if r.startswith("| 0.2 |")]
    assert len(rows) == len(WIDTHS) and all(r.split("|")[3].strip() == "4" for r in rows)  # 4 seeds a width


def test_a_fixed_budget_arm_whose_runs_so_far_share_one_width_reads_its_widths_from_both_arms(tmp_path):
    """Found starting the ViT's fixed-budget arm: with its first runs all at one dim, ``with_capped`` looked for the
    width column in that arm alone and raised "column 'model.width' not found" instead of "grid unfinished"; then it
    took a key its width's preset sets (the ViT's mlp_dim = 2 x dim) for a recipe the other arm does not share. An arm
    whose rule ended early at one width only would never have been tested."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    for s in range(2):
        for w in WIDTHS:
            train, test = curve(w, 8)
            cfg = cnn_config(s, w, 0.05, 8192)
            cfg["model"]["fc"] = 2 * w  # set by each width's preset
            early = w == 12  # the rule ended only these early
            summary = {"status": "completed", "stop_reason": "converged" if early else "max_epochs",
                       "epochs": 120 if early else 300, "train_error": train, "test_error": test}
            write_run(conv, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
            if early:  # the fixed arm's sweep, in its first sitting: width 12, one run done and one running
                write_run(fixed, s, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": None}},
                          {**summary, "stop_reason": "max_epochs", "epochs": 300} if s == 0 else None)
    main = load_runs(fixed, optuna_state=False)
    both = design.with_capped(main, load_runs(conv, optuna_state=False))
    assert len(both) == 2 * len(WIDTHS)
    (test,) = design.peak_tests(both, pilot_sd=0.015, effect=0.05)
    assert test.verdict == "inconclusive (grid unfinished: 17 of 18 runs finished, 1 running)"
    # a key the preset ties to the width is still checked at the widths both arms hold
    other = load_runs(conv, optuna_state=False)
    other.loc[other["model.width"] == 12, "model.fc"] = 25
    with pytest.raises(ValueError, match=r"model.fc = \['25.0'\] there, 24.0 here"):
        design.with_capped(main, other)


def two_arms(tmp_path, fixed_wds=(0.0, 0.01), fixed_rule=None, fixed_reason="max_epochs", fixed_epochs=300,
             fixed_grid_wds=(0.0, 0.01), conv_grid=None, conv_seeds=3, fixed_seeds=3, fixed_rules=None):
    """A convergence arm (every width, ``conv_seeds`` seeds, weight decays 0 and 0.01; widths >= 8 converged early)
    and a fixed arm's sweep that trained widths >= 8 of ``fixed_wds`` for ``fixed_seeds`` seeds, its study declaring
    the weight decays ``fixed_grid_wds`` and those seeds (the convergence arm's study declares ``conv_grid``, or
    nothing). ``fixed_rules``: the fixed runs' converge_epochs by seed (else ``fixed_rule`` for all)."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    rng = np.random.default_rng(0)
    n = 0
    for wd in (0.0, 0.01):
        for s in range(max(conv_seeds, fixed_seeds)):
            for w in WIDTHS:
                n += 1
                train, test = curve(w, 8)
                cfg = {**cnn_config(s, w, 0.05, 8192), "optimizer": {"lr": 0.05, "weight_decay": wd}}
                early = w >= 8
                summary = {"status": "completed", "stop_reason": "converged" if early else "max_epochs",
                           "epochs": 120 if early else 300, "train_error": train,
                           "test_error": test + rng.normal(0, 0.01)}
                if s < conv_seeds:
                    write_run(conv, n, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
                if early and wd in fixed_wds and s < fixed_seeds:
                    rule = fixed_rules[s] if fixed_rules else fixed_rule
                    write_run(fixed, n, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": rule}},
                              {**summary, "stop_reason": fixed_reason, "epochs": fixed_epochs})
    declare(fixed, "dd_fixed", {"model.width": [8, 12, 16, 32], "optimizer.weight_decay": list(fixed_grid_wds),
                                "seed": list(range(fixed_seeds))})
    if conv_grid:
        declare(conv, "dd", conv_grid)
    return load_runs(fixed, optuna_state=False), load_runs(conv, optuna_state=False)


def test_a_fixed_arm_counts_only_runs_that_trained_the_whole_budget(tmp_path):
    """Review findings (2026-11-28): the fixed arm's own runs were never checked for reaching the cap, so its sweep
    launched with the convergence rule still on, or cut by max_steps, printed the convergence arm's verdict under
    the fixed arm's name."""
    main, conv = two_arms(tmp_path / "a")
    assert [t.verdict for t in design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)] == ["reproduced"] * 2
    main, conv = two_arms(tmp_path / "b", fixed_rule=20, fixed_reason="converged", fixed_epochs=120)
    with pytest.raises(ValueError, match=r"stop by convergence \(trainer.converge_epochs = 20\).*"
                                         r"trainer.converge_epochs=null"):
        design.with_capped(main, conv)
    main, conv = two_arms(tmp_path / "c", fixed_reason="max_steps", fixed_epochs=150)
    verdicts = [t.verdict for t in design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)]
    assert verdicts == ["inconclusive (grid unfinished: 15 of 27 runs finished, 12 ended early)"] * 2


def test_a_declared_curve_with_no_run_yet_is_a_row_of_the_test_not_left_out(tmp_path):
    """Review finding (2026-11-28): the ViT's fixed arm, its first runs all at weight decay 0.01, printed one curve
    named "label_noise.p=0.2" and took no capped run of the weight-decay-0 arm its study declared; a main run whose
    second weight decay had not begun read as a test of one curve."""
    main, conv = two_arms(tmp_path / "a", fixed_wds=(0.01,))
    tests = {t.curve: t.verdict for t in design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)}
    assert tests == {"optimizer.weight_decay=0.0, label_noise.p=0.2":
                     "inconclusive (grid unfinished: 15 of 27 runs finished, 12 not started)",
                     "optimizer.weight_decay=0.01, label_noise.p=0.2": "reproduced"}
    # a pair the fixed arm's study declared but has not trained stays missing, though the other arm's run there
    # reached the cap (review 2026-11-28: the sweep declared it, so its own run is the one the test waits for)
    pair = lambda df: (df["model.width"] == 8) & (df["seed"] == 0) & (df["optimizer.weight_decay"] == 0.01)  # noqa: E731
    capped = conv.copy()
    capped.loc[pair(capped), ["stop_reason", "epochs"]] = ["max_epochs", 300]
    tests = {t.curve: t.verdict for t in design.peak_tests(design.with_capped(main[~pair(main)], capped), 0.015, 0.05)}
    assert tests["optimizer.weight_decay=0.01, label_noise.p=0.2"] == (
        "inconclusive (grid unfinished: 26 of 27 runs finished, 1 not started)")
    alone = {t.curve: t.verdict for t in design.peak_tests(main, 0.015, 0.05)}
    assert alone["optimizer.weight_decay=0.0, label_noise.p=0.2"] == (
        "inconclusive (grid unfinished: 0 of 12 runs finished, 12 not started)")
    assert len(alone) == 2


def declare(root, name, grid):
    """Runs of ``root`` in an Optuna study that declared ``grid`` (as the sweeper records it)."""
    import optuna

    storage = f"sqlite:///{root / 'optuna.db'}"
    study = optuna.create_study(study_name=name, storage=storage)
    study._storage.set_study_system_attr(study._study_id, "vitsweep:grid", grid)
    with_summary(root, study_name=name, study_storage=storage)


def test_a_declared_noise_level_with_no_run_yet_is_a_row_of_the_test(tmp_path):
    """Review finding (2026-11-28): the sweeper declares noise as the group name (CIFAR-10: label_noise ['none',
    'p20']); with only the p20 runs begun, the test prints one curve and its verdict, and the declared noise-free curve
    has no row (a weight decay not begun gets one)."""
    rng = np.random.default_rng(0)
    for s in range(3):
        for w in WIDTHS:
            train, test = curve(w, 8)
            write_run(tmp_path, s * 100 + w, cnn_config(s, w, 0.05, 8192, noise=0.2),
                      {"status": "completed", "stop_reason": "max_epochs", "epochs": 300, "train_error": train,
                       "test_error": test + rng.normal(0, 0.01)})
    declare(tmp_path, "dd", {"model.width": WIDTHS, "label_noise": ["none", "p20"], "seed": [0, 1, 2]})
    tests = design.peak_tests(load_runs(tmp_path, optuna_state=False), 0.015, 0.05)
    assert len(tests) == 2, [(t.curve, t.verdict) for t in tests]


def test_the_convergence_studys_grid_adds_no_curve_to_the_fixed_arm(tmp_path):
    """Review finding (2026-11-28): the fixed arm declared weight decay 0.01 only; the convergence arm's study declared
    0 and 0.01. Its capped runs carry its study, so peak_tests' _declared_curves reads its grid and adds a row for
    weight decay 0, a curve the fixed arm never declared and with_capped took no run of: 'grid unfinished' for ever."""
    main, conv = two_arms(tmp_path, fixed_wds=(0.01,), fixed_grid_wds=(0.01,),
                          conv_grid={"model.width": WIDTHS, "optimizer.weight_decay": [0.0, 0.01], "seed": [0, 1, 2]})
    both = design.with_capped(main, conv)
    tests = {t.curve: t.verdict for t in design.peak_tests(both, 0.015, 0.05)}
    assert list(tests.values()) == ["reproduced"], tests


def test_a_pair_the_fixed_arm_declared_stays_missing_when_a_curve_key_is_null(tmp_path):
    """Review finding (2026-11-28): dataset.n_train: null (the whole training set, the config's default) makes
    _declared_ids empty (its product takes a key the grid does not declare at runs[k].dropna() values: none), so the
    convergence arm's capped run fills a pair the fixed arm declared and has not trained, and the test prints
    'reproduced'."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    rng = np.random.default_rng(0)
    n = 0
    for s in range(3):
        for w in WIDTHS:
            n += 1
            train, test = curve(w, 8)
            cfg = cnn_config(s, w, 0.05, None)
            early = w >= 8 and not (w == 8 and s == 0)  # (8, 0) ran to the cap in the convergence arm too
            summary = {"status": "completed", "stop_reason": "converged" if early else "max_epochs",
                       "epochs": 120 if early else 300, "train_error": train,
                       "test_error": test + rng.normal(0, 0.01)}
            write_run(conv, n, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
            if w >= 8 and (w, s) != (8, 0):  # the fixed arm's sweep has not trained (8, 0) yet
                write_run(fixed, n, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": None}},
                          {**summary, "stop_reason": "max_epochs", "epochs": 300})
    declare(fixed, "dd_fixed", {"model.width": [8, 12, 16, 32], "seed": [0, 1, 2]})
    both = design.with_capped(load_runs(fixed, optuna_state=False), load_runs(conv, optuna_state=False))
    (t,) = design.peak_tests(both, 0.015, 0.05)
    assert t.verdict == "inconclusive (grid unfinished: 26 of 27 runs finished, 1 not started)"


def test_the_test_names_a_curve_whose_runs_trained_at_mixed_precisions(tmp_path):
    """precision=auto times its candidates at each start, so one grid can mix fp32 and bf16 runs (the MNIST CNN's
    main run: 7 of 40 fp32); the test's output says so instead of treating the grid as one recipe silently."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1), lrs=(0.02,), sizes=(8192,)), optuna_state=False)
    assert design.precision_note(df.assign(precision="bf16")) == ""
    mixed = df.assign(precision=np.where((df["model.width"] <= 2) & (df["seed"] == 1), "fp32", "bf16"))
    assert design.precision_note(mixed) == ("\nMixed precisions among the finished runs (the test treats them alike): "
                                            "label_noise.p=0.2: 16 bf16, 2 fp32 (the fewer at 1, 2).\n")

def test_the_plan_command_prints_the_rule_and_the_power_table(tmp_path, capsys):
    write_pilot(tmp_path, collapse_at={(0.05, 8)})
    assert design.main(["plan", str(tmp_path), "--seeds", "3,6"]) == 0
    out = capsys.readouterr().out
    assert "Chosen lr: **0.02**" in out and "| 6 |" in out
    assert design.main(["plan", str(tmp_path), "--target", "6"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["optimizer.lr=0.02", "dataset.n_train=8192"]


def test_compact_records_keep_what_the_analysis_reads_with_paths_made_relative(tmp_path):
    from analysis.records import copy_records

    src = tmp_path / "sweep"
    run = write_run(src, 0, {**cnn_config(0, 4, 0.05, 2048), "dataset": {"root": "/machine/data/x.npz"}},
                    {"status": "completed", "train_error": 0.0, "test_error": 0.5,
                     "study_storage": "sqlite:////machine/sweep/optuna.db"}, metrics=[{"epoch": 1}])
    (run / "checkpoint.pt").write_bytes(b"weights")
    (run / "train.log").write_text("log")
    aside = run / "previous-20261126-130056"  # an interrupted attempt's records, moved aside by the restart
    aside.mkdir()
    (aside / "summary.json").write_text('{"status": "interrupted"}')
    (aside / "metrics.jsonl").write_text('{"epoch": 1}\n')
    written = copy_records(src, tmp_path / "records", {"/machine/data/": "../shared/data/", "/machine/": ""})
    names = sorted(p.relative_to(tmp_path / "records").as_posix() for p in written)
    assert names == ["0/.hydra/config.yaml", "0/.hydra/overrides.yaml", "0/metrics.jsonl", "0/summary.json"]
    df = load_runs(tmp_path / "records")
    assert df.loc[0, "dataset.root"] == "../shared/data/x.npz" and df.loc[0, "test_error"] == 0.5
    with pytest.raises(SystemExit, match="never overwritten"):
        copy_records(src, tmp_path / "records")


def test_the_declared_fit_range_keeps_only_sizes_where_every_seed_interpolated():

    from analysis.fits import overfitting_regime

    rows = []
    for n, trains in [(128, [0.0, 0.89]), (256, [0.0, 0.0]), (512, [0.02, 0.0]), (1024, [0.0, 0.0]),
                      (2048, [0.0, 0.005])]:
        for seed, tr in enumerate(trains):
            rows.append({"arch": "a", "dataset.n_train": n, "seed": seed, "train_error": tr, "test_error": 0.1,
                         "stalled": tr > 0.5})
    kept, table = overfitting_regime(pd.DataFrame(rows), by="arch")
    assert sorted(kept["dataset.n_train"].unique()) == [1024, 2048]  # 512 fails (2%), so 256 below it is cut too
    assert table.set_index("dataset.n_train").loc[128, "flagged"] == 1


def test_a_size_with_a_run_that_has_no_final_train_error_or_did_not_complete_is_outside_the_fit_range():
    """A run with no train error (diverged, or still running) or one that did not complete (stopped, failed) cannot
    show that its seed interpolated: its size fails the rule. Before, ``max`` skipped the NaN, the size passed with a
    seed fewer, and a stopped run was judged on a partial train error."""
    from analysis.fits import overfitting_regime

    def rows(bad: dict) -> pd.DataFrame:
        return pd.DataFrame([{"arch": "a", "dataset.n_train": n, "seed": s, "train_error": 0.0, "test_error": 0.1,
                              "status": "completed", **(bad if (n, s) == (512, 1) else {})}
                             for n in (256, 512, 1024, 2048) for s in range(4)])

    for bad in ({"train_error": float("nan")}, {"status": "interrupted"}, {"status": "failed"}):
        kept, table = overfitting_regime(rows(bad), by="arch")
        assert sorted(kept["dataset.n_train"].unique()) == [1024, 2048], bad
        assert not table.set_index("dataset.n_train").loc[512, "in_range"], bad


def test_a_size_where_a_seed_has_no_run_at_all_is_outside_the_fit_range():
    """Review finding: "every seed there interpolated" counted the runs a size had, never the seeds it should
    have: a size holding seed 0 alone passed. The group's seeds are those it has at any size."""
    from analysis.fits import overfitting_regime

    rows = pd.DataFrame([{"arch": "a", "dataset.n_train": n, "seed": s, "train_error": 0.0, "test_error": 0.1,
                          "status": "completed"} for n in (128, 256, 512, 1024) for s in range(4)
                         if n != 128 or s == 0])
    kept, table = overfitting_regime(rows, by="arch")
    assert sorted(kept["dataset.n_train"].unique()) == [256, 512, 1024]
    row = table.set_index("dataset.n_train").loc[128]
    assert not row["in_range"] and row["missing_seeds"] == 3


def test_a_size_where_a_group_has_no_run_at_all_is_outside_the_fit_range():
    """Review finding (2026-11-30): a size where one seed has no run failed the rule, but a size where every seed of
    the group has none was absent from the table and so never failed: the range ran from the largest size down across
    the gap (arch a lacked 512, which arch b ran, and its fit took 128-256 below it). A size another group of the
    frame has, inside the group's own span, is a size the group lacks: it fails, with runs 0 and every seed
    missing."""
    from analysis.fits import overfitting_regime

    rows = pd.DataFrame([{"arch": arch, "dataset.n_train": n, "seed": s, "train_error": 0.0, "test_error": 0.1,
                          "status": "completed"} for arch in ("a", "b") for n in (128, 256, 512, 1024, 2048)
                         for s in range(4) if arch == "b" or n != 512])
    kept, table = overfitting_regime(rows, by="arch")
    assert sorted(kept.loc[kept.arch == "a", "dataset.n_train"].unique()) == [1024, 2048]
    assert sorted(kept.loc[kept.arch == "b", "dataset.n_train"].unique()) == [128, 256, 512, 1024, 2048]
    row = table.set_index(["arch", "dataset.n_train"]).loc[("a", 512)]
    assert not row["in_range"] and row["runs"] == 0 and row["missing_seeds"] == 4
    # a size beyond the group's own span is another grid, not a gap: b alone at 4096 leaves a's range as it was
    more = pd.concat([rows, rows[(rows.arch == "b") & (rows["dataset.n_train"] == 2048)].assign(
        **{"dataset.n_train": 4096})], ignore_index=True)
    kept, table = overfitting_regime(more, by="arch")
    assert sorted(kept.loc[kept.arch == "a", "dataset.n_train"].unique()) == [1024, 2048]
    assert ("a", 4096) not in set(zip(table["arch"], table["dataset.n_train"], strict=True))


ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "docs" / "studies"


@pytest.mark.parametrize("study, dirs, main_scale", [
    ("double_descent_cnn", ["pilot_gpu"], "cpu"), ("double_descent_vit", ["pilot_gpu"], "cpu"),
    ("double_descent_cnn_cifar10", ["pilot_gpu", "pilot_gpu_threshold"], "main")])
def test_each_pilot_table_regenerates_from_its_committed_records_at_the_declared_effect(study, dirs, main_scale,
                                                                                       tmp_path):
    """The pilot plan is computed at the effect its main run's header declares (its `--effect`, else the tool's
    0.05): the ViT plan had said 0.05 where the header declared 0.03, and a regeneration with the same default
    passed."""
    header = (ROOT / "sweeps" / "scales" / study / f"{main_scale}.yaml").read_text()
    declared = re.search(r"--effect (\d*\.\d+)", header)
    effect = declared.group(1) if declared else "0.05"
    records = STUDIES / study / "records"
    out = tmp_path / "plan.md"
    design.main(["plan", *[str(records / d) for d in dirs], "--effect", effect, "--out", str(out)])
    committed = (STUDIES / study / "analysis" / "pilot_plan.md").read_text()
    assert f"Published effect taken as {float(effect):.3f}." in committed
    assert out.read_text() == committed
    # and `make reports`, which writes the committed plan, passes the same effect (its line had no --effect)
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [x for x in make.splitlines() if f"design plan $(S)/{study}/records/{dirs[0]} " in x]
    given = re.search(r"--effect (\d*\.\d+)", line)
    assert float(given.group(1) if given else "0.05") == float(effect), line


def test_the_heads_depth_declared_analysis_regenerates_from_its_committed_records():
    import importlib.util

    spec = importlib.util.spec_from_file_location("orderings", STUDIES / "heads_depth" / "scripts" / "orderings.py")
    orderings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(orderings)
    text = orderings.declared(str(STUDIES / "heads_depth" / "records" / "main"))
    assert text == (STUDIES / "heads_depth" / "analysis" / "declared.md").read_text()


def test_committed_records_hold_no_absolute_machine_paths():
    """Records read the same on any clone: no path of the machine that ran them, in the text records or in the
    attributes of an Optuna storage (its recipe's dataset.root, each trial's run dir)."""
    import re
    import sqlite3

    from analysis.records import ATTR_TABLES

    bad = re.compile(r"(/work/|/tmp/|/root/|/home/)")
    records = [p for p in STUDIES.glob("*/records/**/*") if p.is_file()]
    offenders = [p for p in records if p.suffix in (".yaml", ".json", ".jsonl") and bad.search(p.read_text())]
    for db in (p for p in records if p.suffix == ".db"):
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            values = [v for t in ATTR_TABLES if t in tables for (v,) in con.execute(f"SELECT value_json FROM {t}")]
        offenders += [db] if any(bad.search(v) for v in values) else []
    assert offenders == [], f"rewrite with python -m analysis.records DIR --in-place --replace: {offenders[:5]}"


def test_every_study_folder_has_the_one_shape():
    """docs/studies/README.md: a study folder holds its report.md, records/, analysis/ and scripts/, nothing else."""
    allowed = {"report.md", "records", "analysis", "scripts"}
    extra = {study.name: sorted({p.name for p in study.iterdir()} - allowed)
             for study in STUDIES.iterdir() if study.is_dir()}
    assert {k: v for k, v in extra.items() if v} == {}
    assert all((study / "report.md").is_file() for study in STUDIES.iterdir() if study.is_dir())


@pytest.mark.parametrize("study, dirs, out", [
    ("heads_depth", ["records/main"], ""),
    ("double_descent_cnn_cifar10", ["records/earlier_cpu", "records/earlier_cpu_threshold"], "earlier_cpu"),
    ("double_descent_cnn_cifar10", ["records/main"], "main"),
    ("double_descent_cnn_cifar10", ["records/main_fixed"], "main_fixed"),
    ("double_descent_cnn", ["records/main", "records/main_seed6", "records/main_seeds789"], ""),
    ("double_descent_vit", ["records/main_gpu"], "main_gpu"),
    ("double_descent_vit", ["records/main_bf16"], "main_bf16"),
    *[(study, [f"records/{run}"], run) for study, run in (("patch_size", "rerun"), ("vit_vs_cnn", "rerun"),
                                                          ("tune_vit", "rerun_median"), ("tune_vit", "rerun_none"))]])
def test_each_committed_analysis_regenerates_from_its_records(study, dirs, out, tmp_path, monkeypatch):
    """The report's tables (Markdown and CSV; figures aside) come back the same from the committed records."""
    from analysis.report import make_report

    monkeypatch.chdir(ROOT)  # the records name their storage relative to the repository
    committed = STUDIES / study / "analysis" / out
    make_report([f"docs/studies/{study}/{d}" for d in dirs], tmp_path)
    for table in sorted((committed / "tables").glob("*")):
        assert (tmp_path / "tables" / table.name).read_text() == table.read_text(), table.name
    assert (tmp_path / "report.md").read_text() == (committed / "report.md").read_text()


CENTRES = (("critical", "declared_test.md"), ("threshold", "sensitivity_threshold.md"))  # the declared test and
# the post hoc reading centred on the interpolation threshold (the Makefile's CENTRES)
DECLARED_TESTS = [  # (study, main-run records, pilot records, centre, committed file under analysis/, capped-from,
    # the effect a design must see: the tool's default 0.05 unless the sweep declared another)
    *[("double_descent_cnn_cifar10", [f"records/{arm}"], ["records/pilot_gpu", "records/pilot_gpu_threshold"], c,
       f"{arm}/{name}", [], None) for arm in ("main", "main_fixed")
      for c, name in CENTRES],
    ("double_descent_cnn", ["records/main", "records/main_seed6", "records/main_seeds789"], ["records/pilot_gpu"],
     "critical", "main_test.md",
     [], None),
    ("double_descent_cnn", ["records/main_fixed", "records/main_fixed_seeds789"], ["records/pilot_gpu"], "critical",
     "main_fixed_test.md", ["records/main", "records/main_seed6", "records/main_seeds789"], None),
    *[("double_descent_vit", [f"records/{grid}"], ["records/pilot_gpu"], c, f"{grid}/{name}", [], 0.03)
      for grid in ("main_gpu", "main_bf16")
      for c, name in CENTRES],
    *[("double_descent_vit", ["records/fixed_bf16"], ["records/pilot_gpu"], c, f"fixed_bf16/{name}",
       ["records/main_bf16"], 0.03)
      for c, name in CENTRES]]


@pytest.mark.parametrize("study, main, pilot, center, name, capped, effect", DECLARED_TESTS)
def test_each_declared_test_regenerates_from_its_committed_records(study, main, pilot, center, name, capped, effect,
                                                                  tmp_path):
    """The verdict a report states, from the main run's records and the pilot's spread (the declared power); a
    fixed-budget arm that trained only what the convergence rule ended early names that arm (``--capped-from``)."""
    root = STUDIES / study
    out = tmp_path / "test.md"
    extra = ["--capped-from", *[str(root / d) for d in capped], "--curves"] if capped else []
    extra += ["--effect", str(effect)] if effect is not None else []
    design.main(["test", *[str(root / d) for d in main], "--pilot", *[str(root / d) for d in pilot],
                 "--center", center, *extra, "--out", str(out)])
    assert out.read_text() == (root / "analysis" / name).read_text()


def test_every_file_under_committed_records_is_tracked_by_git():
    """A record the regeneration tests read but .gitignore hides (an optuna.db) passes here and fails on a clean
    clone; `git add -f` it. Skips outside a git checkout."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "docs/studies"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hidden = [p for p in out if "__pycache__" not in p]
    assert hidden == [], f"ignored by .gitignore, so absent from a clean clone (git add -f them): {hidden[:5]}"


VERDICTS = ("reproduced", "partly reproduced", "not reproduced", "inconclusive", "not run")
POWER = ("with power", "with the power", "smallest detectable", "interval excludes")


def verdict_cells(text: str, source: str) -> list[tuple[str, str, str, bool]]:
    """(source, verdict cell, its row and table header, whether the cell must open with a verdict word) for each
    "| **Verdict" row (not a superseded "(then)" one) and each row of a table with a verdict or comparison column."""
    out, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if cells[0].startswith("**Verdict") and "(then)" not in cells[0]:
            out.append((source, cells[1], line, True))
        elif header is None:
            header = line
            names = [c.lower() for c in cells]
            column = next((names.index(n) for n in ("verdict", "comparison") if n in names), None)
        elif column is not None and not set(line) <= set("|-: ") and len(cells) == len(names):
            out.append((f"{source}: {cells[0][:40]}", cells[column], header + line, names[column] == "verdict"
                        and source == "README.md"))
    return out


def test_every_verdict_is_one_of_the_declared_words_and_not_reproduced_states_its_power():
    """The rule every report and the README state (issue 26): a verdict is reproduced, not reproduced or inconclusive
    (partly reproduced for a finding of parts, not run without data); "not reproduced" only where the design's
    smallest detectable effect is below the published one, so its row says so. Found in the README's table:
    patch_size (one seed, 28 steps) and tune_vit (no published figure) read "not reproduced" with no power behind
    them, and the attention report called a post-hoc, powerless layer-1 difference "not reproduced"."""
    import re

    root = STUDIES.parents[1]
    cells = verdict_cells((root / "README.md").read_text(), "README.md")
    assert len([c for c in cells if c[3]]) >= 10, "the README's reproductions table was not found"
    for study in sorted(p for p in STUDIES.iterdir() if p.is_dir()):
        found = verdict_cells((study / "report.md").read_text(), study.name)
        assert found, f"{study.name}/report.md has no Verdict row and no table with a verdict column"
        cells += found
    for source, cell, row, opens in cells:
        words = re.sub(r'"[^"]*"', "", cell.replace("*", "")).strip().lower()  # quoted: an earlier verdict, cited
        if opens:
            assert any(words.startswith(v) for v in VERDICTS), f"{source}: {words[:80]!r} opens with none of {VERDICTS}"
        if "not reproduced" in words:
            assert any(k in row.lower() for k in POWER), f"{source}: 'not reproduced' without power: {words[:160]!r}"


def test_compare_pairs_two_grids_of_one_recipe_point_by_point_and_refuses_two_recipes(tmp_path):
    """The ViT double descent's CPU and GPU grids (one sweep, trained apart) are set side by side by this, not by
    hand: per (curve, width, seed) both finished, the second's test error minus the first's."""
    a = load_runs(write_pilot(tmp_path / "a", sizes=(8192,), lrs=(0.02,)), optuna_state=False)
    b = load_runs(write_pilot(tmp_path / "b", sizes=(8192,), lrs=(0.02,), noise_sd=0.03), optuna_state=False)
    b = b[~((b["model.width"] == 8) & (b["seed"] == 1))]  # one point the second grid lacks
    pairs = design.compare(a, b)
    assert len(pairs) == len(a) - 1
    one = pairs[(pairs["model.width"] == 4) & (pairs["seed"] == 0)].iloc[0]
    ta = a[(a["model.width"] == 4) & (a["seed"] == 0)]["test_error"].iloc[0]
    tb = b[(b["model.width"] == 4) & (b["seed"] == 0)]["test_error"].iloc[0]
    assert one["diff"] == pytest.approx(tb - ta) and one["diff"] != 0
    text = design.compare_markdown(pairs, "model.width")
    assert f"{len(a) - 1} points both finished: mean {pairs['diff'].mean():+.4f}" in text
    other = b.assign(**{"dataset.name": "mnist"})
    other.attrs = b.attrs
    with pytest.raises(ValueError, match="dataset.name"):
        design.compare(a, other)
    extra = b.assign(**{"model.extra": 1})
    extra.attrs = {**b.attrs, "config_columns": [*b.attrs["config_columns"], "model.extra"]}
    with pytest.raises(ValueError, match="model.extra"):  # a recipe key one grid has and the other lacks
        design.compare(a, extra)
    twice = pd.concat([b, b.iloc[:1]], ignore_index=True)
    twice.attrs = b.attrs
    with pytest.raises(ValueError, match="repeat a \\(curve, width, seed\\)"):  # review: a repeat joined twice
        design.compare(a, twice)
    with pytest.raises(ValueError, match="no point"):  # another n_train is another curve: nothing to pair
        design.compare(a, load_runs(write_pilot(tmp_path / "c", sizes=(2048,), lrs=(0.02,)), optuna_state=False))


def test_the_vit_device_check_regenerates_from_its_committed_records(tmp_path):
    """The report's device check (the ViT's CPU grid against its GPU grid, point by point) is `compare`'s output on
    the committed records."""
    root = STUDIES / "double_descent_vit"
    out = tmp_path / "devices.md"
    design.main(["compare", str(root / "records" / "main_bf16"), "--against", str(root / "records" / "main_gpu"),
                 "--out", str(out)])
    assert out.read_text() == (root / "analysis" / "devices.md").read_text()


def test_the_pilots_spread_counts_a_run_read_twice_once(tmp_path):
    """The same pilot read from two folders doubled each width's runs: the one-width sd shrank with the inflated dof
    and with it the smallest detectable peak, making "not reproduced" easier to reach (review 2026-11-29, F4). The
    CIFAR-10 pilot held such repeats: its threshold sweep reran C1 = 8 beside the first sweep's runs."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02))
    once = design.spread(df)
    twice = pd.concat([df, df.assign(run_dir=df["run_dir"] + "-copy")], ignore_index=True)
    with pytest.warns(UserWarning, match="repeat a seed"):
        again = design.spread(twice)
    assert (again.width_sd, again.contrast_sd, again.dof) == pytest.approx((once.width_sd, once.contrast_sd, once.dof))


def test_the_smallest_detectable_peak_has_its_stated_joint_power_at_every_seed_count():
    """Each one-sided paired t-test needs power sqrt(0.8) at the mde: by the noncentral t, not the central-t sum,
    which gave 0.851 at 2 seeds (joint about 0.72: review 2026-11-29, F5)."""
    from scipy import stats

    for k in range(2, 11):
        d = design.mde(1.0, k)
        crit = stats.t.ppf(1 - design.ALPHA, k - 1)
        power = 1 - stats.nct.cdf(crit, k - 1, d * np.sqrt(k))
        assert power >= np.sqrt(design.POWER) - 1e-6, (k, power)
    assert design.mde(1.0, 2) == pytest.approx(7.3155, abs=1e-3)


def test_the_pilot_sd_interval_covers_though_the_two_contrasts_share_their_centre():
    """The left and right contrasts of a seed share the centre width's error (correlation 0.5 when the widths'
    errors are independent), so they are not 2 (k - 1) independent degrees of freedom: counted so, the "95%"
    interval covered 92-93% (review 2026-11-29, F6). Pilots simulated as spread() pools them: 2 curves x 3 seeds."""
    rng = np.random.default_rng(0)
    trials, curves, k = 4000, 2, 3
    x = rng.normal(0, 0.02, (trials, curves, k, 3))  # each seed's errors at the left, centre and right widths
    left, right = x[..., 1] - x[..., 0], x[..., 1] - x[..., 2]
    ss = ((left.var(-1, ddof=1) + right.var(-1, ddof=1)) * (k - 1)).sum(-1)
    dof = 2 * curves * (k - 1)
    hits = 0
    for s in ss:
        lo, hi = design.Spread(float(np.sqrt(s / dof)), dof, np.nan, curves).sd_interval()
        hits += lo <= 0.02 * np.sqrt(2) <= hi
    assert 0.94 <= hits / trials <= 0.97


def test_a_seed_the_fixed_arm_declared_is_missing_where_the_other_arm_has_no_run_of_it(tmp_path):
    """The fixed arm declared seeds 0-3 and the convergence arm holds 0-2: seed 3 has no run at the borrowed widths,
    yet the curves read whole and the verdict paired seeds 0-2 without a word (review 2026-11-29, F1; on the real
    MNIST arm, leaving main_seed6 out of --capped-from turned 'not reproduced' on 5 seeds into a 4-seed test)."""
    main, conv = two_arms(tmp_path, conv_seeds=3, fixed_seeds=4)
    verdicts = [t.verdict for t in design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)]
    assert verdicts == ["inconclusive (grid unfinished: 31 of 36 runs finished, 5 not started)"] * 2


def test_seeds_only_the_convergence_arm_declared_neither_join_the_fixed_arm_nor_hold_it_unfinished(tmp_path):
    """The convergence study declared seeds 0-2 and the fixed study 0-1: its seed 2 was expected at every width (the
    fixed sweep never trains it: 'ended early' for ever), and its capped runs joined the pairing (review 2026-11-29,
    F2)."""
    grid = {"model.width": WIDTHS, "optimizer.weight_decay": [0.0, 0.01], "seed": [0, 1, 2]}
    main, conv = two_arms(tmp_path, conv_seeds=3, fixed_seeds=2, conv_grid=grid)
    tests = design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)
    assert [t.verdict for t in tests] == ["reproduced"] * 2 and [t.seeds for t in tests] == [2, 2]


def test_a_fixed_arm_with_the_rule_off_as_0_and_as_null_is_one_curve(tmp_path):
    """converge_epochs 0 and null both leave the rule off; runs holding each split every curve in two that never
    finished (review 2026-11-29, F4)."""
    main, conv = two_arms(tmp_path, fixed_rules=[0, None, 0])
    tests = design.peak_tests(design.with_capped(main, conv), 0.015, 0.05)
    assert [t.verdict for t in tests] == ["reproduced"] * 2


def test_the_main_runs_overrides_use_the_pilots_width_key_head_multiples_and_fresh_seeds(capsys):
    """`plan --target` printed `model.width=...` and seeds from 0 for the ViT pilot, whose width is `model.dim`
    (so the printed grid set nothing), with dim 10 (not divisible by its 4 heads) and the pilot's own seeds 0-1."""
    pilot = ROOT / "docs" / "studies" / "double_descent_vit" / "records" / "pilot_gpu"
    assert design.main(["plan", str(pilot), "--target", "30", "--effect", "0.03"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    dims = re.search(r"model\.dim=choice\(([\d,]+)\)", line)
    assert dims and "model.width" not in line, line
    assert all(int(d) % 4 == 0 for d in dims.group(1).split(",")), line
    # fresh seeds after the pilot's: the declared main run's 2-7, and since the power figure takes each contrast's
    # own sd (0.0247 and 0.0170, not the pooled 0.0212), the rule now asks 7 seeds to detect 0.03 (6 detect 0.0301)
    assert "seed=choice(2,3,4,5,6,7,8)" in line, line


def test_a_curve_whose_widths_ran_under_different_step_or_wall_limits_is_refused(tmp_path):
    """Review 2026-11-29 (stats, 1): the recipe check skipped every runtime key, the stop limits among them, so a
    curve whose narrow widths stopped at 100 steps and wide ones at 100,000 ("completed" both) read "not
    reproduced", the tested width compared against a neighbour cut short. A study's limits are its recipe."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,))
    for config in root.glob("*/.hydra/config.yaml"):
        text = config.read_text()
        narrow = any(f"width: {w}\n" in text for w in (1, 2, 3, 4))
        config.write_text(text.replace("trainer:\n", f"trainer:\n  max_steps: {100 if narrow else 100000}\n"))
    with pytest.raises(ValueError, match=r"widths differ in trainer\.max_steps"):
        design.peak_tests(load_runs(root), pilot_sd=0.015, effect=0.05)


def test_the_pilots_spread_refuses_two_recipes_read_as_repeats_of_one_seed(tmp_path):
    """Review 2026-11-29 (stats, 2 and 8): two pilot folders of different recipes (here dropout 0 and 0.3) were
    averaged per (width, seed) as if one seed had run twice: the averaged seed spread shrank (a ratio of 0.70 in
    simulation) and the smallest detectable peak with it. Runs that differ in a recipe key are never one seed's."""
    a = write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    b = write_pilot(tmp_path / "b", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    for config in b.glob("*/.hydra/config.yaml"):
        config.write_text(config.read_text().replace("model:\n", "model:\n  dropout: 0.3\n"))
    for config in a.glob("*/.hydra/config.yaml"):
        config.write_text(config.read_text().replace("model:\n", "model:\n  dropout: 0.0\n"))
    with pytest.raises(ValueError, match=r"differ in model\.dropout \(0\.0, 0\.3\)"):
        design.spread(load_runs([a, b]))
    from analysis import descent_curves
    with pytest.raises(ValueError, match=r"model\.dropout.*by="):
        descent_curves(load_runs([a, b]))
    assert len(descent_curves(load_runs([a, b]), by=["model.dropout"]))  # the fix the message names
    for config in b.glob("*/.hydra/config.yaml"):  # the same recipe read from a copy elsewhere: a repeat, averaged
        config.write_text(config.read_text().replace("dropout: 0.3", "dropout: 0.0").replace(
            "name: cifar10", "name: cifar10\n  root: /elsewhere/copy.npz"))
    with pytest.warns(UserWarning, match="repeat a seed"):
        design.spread(load_runs([a, b]))


def test_a_collapse_that_decides_the_threshold_makes_the_verdict_inconclusive(tmp_path):
    """Review 2026-11-29 (stats, 4): flagged runs were counted only at the three tested widths (6 against 3 and 12),
    and left out of the threshold's mean: with 3 of 4 seeds collapsed at C1 = 8 the surviving seed alone made 8
    the threshold, and the verdict read "not reproduced"."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,))
    df = load_runs(root)
    flat = df.assign(test_error=np.where(df["model.width"] == 6, df["test_error"] - BUMP, df["test_error"]))
    at8 = (flat["model.width"] == 8) & (flat["seed"] < 3)
    flat.loc[at8, ["train_error", "collapsed"]] = [0.9, True]
    (test,) = design.peak_tests(flat, pilot_sd=0.015, effect=0.05)
    assert (test.center, test.left, test.right) == (6.0, 3.0, 12.0)
    assert test.verdict.startswith("inconclusive (3 collapsed or stalled runs decide the threshold")
    # a collapse far from the threshold (C1 = 32, well past it) decides nothing and tests nothing
    far = flat.copy()
    far.loc[at8, ["train_error", "collapsed"]] = [0.0, False]
    far.loc[(far["model.width"] == 32) & (far["seed"] == 0), ["train_error", "collapsed"]] = [0.9, True]
    (test,) = design.peak_tests(far, pilot_sd=0.015, effect=0.05)
    assert test.verdict == "not reproduced"


def test_a_pilot_without_spread_gives_no_power_and_no_verdict_of_absence():
    """Review 2026-11-29 (stats, 6): a pilot sd of 0 gave a smallest detectable peak of 0, and "not reproduced"."""
    assert np.isnan(design.mde(0.0, 4)) and np.isnan(design.mde(-0.1, 4))
    assert design.verdict(0.5, -0.01, design.mde(0.0, 4), 0.05, 0).startswith("inconclusive (no power figure")


def test_the_effect_must_be_an_error_fraction(tmp_path, capsys):
    """Review 2026-11-29 (stats, B): --effect 5 (percent by mistake) made every design powerful enough."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1), lrs=(0.02,), sizes=(8192,))
    for bad in ("5", "0", "-0.05"):
        with pytest.raises(SystemExit):
            design.main(["test", str(root), "--pilot", str(root), "--effect", bad])
        assert "a test-error fraction in (0, 1)" in capsys.readouterr().err


def test_the_sd_interval_counts_each_seed_once_where_the_pilots_curves_share_seeds(tmp_path):
    """Review 2026-11-29 (study statistics, 1): the ViT pilot's two contrast curves (weight decay 0 and 0.01) ran on
    the same seeds 0-1, which share their data, label noise and init, and their seed differences had the same sign:
    the sd's dof added 1 per curve and side (2), and its interval read 0.0128-0.1551 where, each seed counted once
    (1 dof), it is 0.011-0.79. Both are printed; the power figure itself is unchanged."""
    from scipy import stats
    df = load_runs(write_pilot(tmp_path / "shared", seeds=(0, 1, 2), lrs=(0.02,)))  # n 2048 and 8192, seeds 0-2
    sp = design.spread(df)
    assert sp.curves == 2 and sp.dof == 2 * 2 * 2 and sp.contrast_seeds == 3
    lo, hi = sp.sd_interval()
    once_lo, once_hi = sp.sd_interval(seeds_once=True)
    assert hi / lo == pytest.approx(np.sqrt(stats.chi2.ppf(0.975, 4) / stats.chi2.ppf(0.025, 4)), rel=1e-6)
    assert once_hi / once_lo == pytest.approx(np.sqrt(stats.chi2.ppf(0.975, 2) / stats.chi2.ppf(0.025, 2)), rel=1e-6)
    main = load_runs(write_pilot(tmp_path / "main", seeds=(3, 4, 5), lrs=(0.02,), sizes=(8192,)))
    text = design.tests_markdown(design.peak_tests(main, sp, effect=0.05), sp)
    assert f"counting each seed once (2 dof): {once_lo:.4f}-{once_hi:.4f}" in text, text
    # curves on other seeds each: nothing shared, one interval
    a = load_runs(write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(2048,)))
    b = load_runs(write_pilot(tmp_path / "b", seeds=(3, 4, 5), lrs=(0.02,), sizes=(8192,)))
    apart = design.spread(pd.concat([a, b], ignore_index=True))
    assert apart.contrast_seeds == 6 and apart.sd_interval(seeds_once=True) == apart.sd_interval()
    assert "counting each seed once" not in design.tests_markdown(design.peak_tests(main, apart, effect=0.05), apart)


def test_the_power_figure_takes_the_noisier_contrast_since_a_peak_needs_both(tmp_path):
    """Review 2026-11-29 (stats, 3): the power figure pooled the left and right contrasts' sds, but the declared
    test needs both one-sided tests to reject, so its power is set by the noisier side. Simulated with sides of sd
    0.039 and 0.007 (pooled as one), the joint power at the printed mde was 0.68-0.70, not 0.8. The MNIST CNN pilot's
    sides were 0.041 and 0.0045 (pooled 0.029)."""
    df = load_runs(write_pilot(tmp_path, seeds=tuple(range(6)), noise_sd=0.001, lrs=(0.02,), sizes=(8192,)))
    rng = np.random.default_rng(1)
    left = df["model.width"] == 3  # the critical width 6's left neighbour: only the left contrast is noisy
    df.loc[left, "test_error"] += rng.normal(0, 0.04, int(left.sum()))
    sp = design.spread(df)
    assert sp.left_sd > 10 * sp.right_sd and sp.contrast_sd < sp.left_sd
    assert sp.power_sd == sp.left_sd and "left" in sp.power_source
    lo, hi = sp.sd_interval()  # the interval of the sd the power uses, on that side's own dof
    assert lo < sp.power_sd < hi and sp.dof == 2 * 5
    from scipy import stats
    assert hi / lo == pytest.approx(np.sqrt(stats.chi2.ppf(0.975, 5) / stats.chi2.ppf(0.025, 5)), rel=1e-6)
    # simulated joint power of the declared test at the mde for 4 seeds, with these two sides: 0.8, not more (the
    # larger sd for both sides, the first fix, gave about 0.9 and asked more seeds than the rule needs)
    k, d = 4, sp.mde(4)
    assert d < design.mde(sp.power_sd, 4)
    crit = stats.t.ppf(1 - design.ALPHA, k - 1)
    centre = min(sp.left_sd, sp.right_sd) / np.sqrt(2)  # shared by both contrasts, whose sds are the pilot's
    x = rng.normal(0, 1, (20000, k, 3)) * [np.sqrt(sp.left_sd**2 - centre**2), centre,
                                           np.sqrt(sp.right_sd**2 - centre**2)]
    x[..., 1] += d  # the centre stands d above both neighbours
    both = np.ones(len(x), bool)
    for side in (0, 2):
        c = x[..., 1] - x[..., side]
        both &= c.mean(1) / (c.std(1, ddof=1) / np.sqrt(k)) > crit
    assert 0.77 <= both.mean() <= 0.85, both.mean()


def test_a_test_on_runs_that_declare_no_grid_says_it_cannot_see_what_never_started(tmp_path, capsys):
    """Review 2026-11-29 (stats, 5): runs naming no study (a plain Hydra multirun) have no declared grid, so the grid
    is what they hold: a width that never started moved the right neighbour (12 -> 16) and the verdict came out
    with no warning. The test still runs, and says so in its output."""
    root = write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,))
    with pytest.warns(UserWarning, match=r"no declared grid.*never started"):
        design.peak_tests(load_runs(root), pilot_sd=0.015, effect=0.05)
    out = tmp_path / "test.md"
    with pytest.warns(UserWarning, match="no declared grid"):
        design.main(["test", str(root), "--pilot", str(root), "--out", str(out)])
    assert "No declared grid" in out.read_text()


def test_the_power_comes_from_the_pilot_at_the_main_runs_lr(tmp_path):
    """Review 2026-11-29 (stats, B): where the lr rule chose no lr (every rung collapsed) the pilot was not filtered,
    and its spread pooled every lr; nothing checked that the main run trained at the lr the pilot's spread came
    from. The pilot is read at the main run's lr; one the pilot lacks is refused, naming both."""
    pilot = write_pilot(tmp_path / "pilot", collapse_at={(lr, 4) for lr in (0.05, 0.02, 0.01)}, sizes=(8192,),
                        seeds=(0, 1, 2))
    main = write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3, 4, 5))
    out = tmp_path / "t.md"
    assert design.main(["test", str(main), "--pilot", str(pilot), "--out", str(out)]) == 0
    at = load_runs(pilot)
    expected = design.spread(at[at["optimizer.lr"] == 0.02])
    assert f"Pilot contrast sd {expected.contrast_sd:.4f}" in out.read_text()
    other = write_pilot(tmp_path / "other", lrs=(0.03,), sizes=(8192,), seeds=(3, 4, 5))
    with pytest.raises(SystemExit, match=r"optimizer\.lr 0\.03.*pilot.*0\.01, 0\.02, 0\.05"):
        design.main(["test", str(other), "--pilot", str(pilot)])


def test_a_curve_that_never_interpolates_says_so(tmp_path):
    """Review 2026-11-29 (stats, B): "no threshold with a neighbour on each side" was printed for a curve whose
    every width stayed above the train-error tolerance, where the fix is wider models, not another grid step."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1), lrs=(0.02,), sizes=(8192,)))
    (test,) = design.peak_tests(df.assign(train_error=0.3), pilot_sd=0.015, effect=0.05)
    assert "no width interpolates" in test.verdict


def test_a_run_whose_last_reading_is_a_loss_spike_is_flagged_with_its_recent_train_error(tmp_path):
    """Review 2026-11-29 (records audit): ViT fixed-arm run 13 had 0% train error from epoch 155 to 498, read 52% at
    499 and 37.9% at 500, and its summary said completed, not collapsed (a rise under 0.5): its final errors read a
    transient AdamW loss spike, not the model, and nothing said so."""
    config = cnn_config(0, 8, 0.02, 4096)
    flat = [{"epoch": e, "train_error": 0.0} for e in range(1, 41)]
    spike = [*flat[:-1], {"epoch": 40, "train_error": 0.379}]
    falling = [{"epoch": e, "train_error": 0.4 - 0.01 * e} for e in range(1, 41)]
    end = {"status": "completed", "stop_reason": "max_epochs", "chance_train_error": 0.9, "test_error": 0.25}
    write_run(tmp_path, 0, config, {**end, "train_error": 0.379, "best_train_error": 0.0}, spike)
    write_run(tmp_path, 1, config, {**end, "train_error": 0.0, "best_train_error": 0.0}, flat)
    write_run(tmp_path, 2, config, {**end, "train_error": 0.0, "best_train_error": 0.0}, falling)
    write_run(tmp_path, 3, config, {**end, "train_error": 0.1, "best_train_error": 0.0})  # no metrics.jsonl
    df = load_runs(tmp_path).sort_values("run_dir", key=lambda s: s.str.len() * 100 + s.str[-1].map(ord))
    assert df["ended_in_spike"].tolist() == [True, False, False, False]
    assert df["recent_train_error"].iloc[0] == 0.0  # the median of its last 20 readings
    assert df["recent_train_error"].iloc[2] == pytest.approx(np.median([0.4 - 0.01 * e for e in range(21, 41)]))
    assert np.isnan(df["recent_train_error"].iloc[3])
    assert not df["collapsed"].any()


def test_a_tested_width_chosen_by_end_of_run_spikes_makes_the_verdict_say_so(tmp_path):
    """Review 2026-11-29 (records audit): the ViT study's critical dim 16 was "the widest dim above 1% train error"
    only because its runs' final epochs fell inside loss spikes (GPU grid, no weight decay: mean final 1.09%, mean of
    each run's median over its last 20 epochs 0.18%); the verdict read "reproduced" with no word of it."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,)))
    df["recent_train_error"] = df["train_error"]
    (plain,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05)
    assert plain.center == 6.0 and plain.verdict == "reproduced" and plain.spiked_runs == 0
    # 3 of 4 seeds at the threshold width C1 = 8 end inside a spike: the final reading moves the threshold to 12
    at8 = (df["model.width"] == 8) & (df["seed"] < 3)
    spiked = df.copy()
    spiked.loc[at8, ["train_error", "ended_in_spike"]] = [0.08, True]
    (test,) = design.peak_tests(spiked, pilot_sd=0.015, effect=0.05)
    assert test.center == 8.0  # the declared reading (final train errors) is kept ...
    assert test.spiked_runs == 3  # ... and the runs at the tested widths that ended inside a spike are counted
    assert test.verdict.startswith("inconclusive") or "fragile" in test.verdict
    assert "3 runs" in test.verdict and "last 20" in test.verdict and "6" in test.verdict, test.verdict
    # the same spikes far from the threshold (C1 = 32) move nothing: only counted where they are tested
    far = df.copy()
    far.loc[(far["model.width"] == 32) & (far["seed"] < 3), ["train_error", "ended_in_spike"]] = [0.08, True]
    (test,) = design.peak_tests(far, pilot_sd=0.015, effect=0.05)
    assert test.center == 6.0 and test.verdict == "reproduced" and test.spiked_runs == 0
    text = design.spike_note(spiked)
    assert "model.width 8 seed 0" in text and "0.080" in text


def test_a_tested_width_chosen_by_runs_that_lost_their_fit_makes_the_verdict_say_so(tmp_path):
    """Review 2026-11-29 (design, r_design_9): in the CIFAR-10 study 7-10 of the 24 runs at each curve's tested
    widths ended 5-24 points of train error above their own best (constant lr 0.05), unflagged by the collapse and
    spike rules; read from each run's best train error the critical width moved (6 -> 4 at 0% noise), and the
    verdict said nothing of it (the report said it by hand). Where reading each run's best train error
    (``min_train_error``) moves the tested width, the verdict says fragile, naming the runs and the other width."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2, 3), lrs=(0.02,), sizes=(8192,)))
    df["min_train_error"] = df["train_error"]
    (plain,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05)
    assert plain.center == 6.0 and plain.verdict == "reproduced"
    # every seed's run at the critical width C1 = 6 had fit its labels, then drifted 5+ points off
    lost = df.copy()
    assert (lost.loc[lost["model.width"] == 6, "train_error"] >= 0.052).all()
    lost.loc[lost["model.width"] == 6, "min_train_error"] = 0.002
    (test,) = design.peak_tests(lost, pilot_sd=0.015, effect=0.05)
    assert test.center == 6.0  # the declared reading (final train errors) is kept
    assert test.verdict.startswith("reproduced (fragile: 4 runs lost their fit (0.05 or more above their best train"
                                   " error) and decide the tested width: read at their best it is 4"), test.verdict
    # a drift under 5 points (noise about the 1% fit tolerance: a run's lowest reading is biased low) is no lost fit
    small = lost.assign(min_train_error=np.where(lost["model.width"] == 6, lost["train_error"] - 0.04,
                                                 lost["min_train_error"]))
    small.loc[small["model.width"] == 6, "train_error"] = 0.045
    (test,) = design.peak_tests(small.assign(min_train_error=small["min_train_error"].clip(lower=0.005)),
                                pilot_sd=0.015, effect=0.05)
    assert test.verdict == "reproduced", test.verdict
    # drift that moves nothing (far above the threshold) leaves the verdict alone
    far = df.copy()
    far.loc[far["model.width"] == 32, "min_train_error"] = 0.0
    (test,) = design.peak_tests(far.assign(train_error=np.where(far["model.width"] == 32, 0.009, far["train_error"])),
                                pilot_sd=0.015, effect=0.05)
    assert test.verdict == "reproduced"
    (test,) = design.peak_tests(df.drop(columns="min_train_error"), pilot_sd=0.015, effect=0.05)
    assert test.verdict == "reproduced"  # older records without the column read as before


def test_runs_ending_inside_a_spike_at_a_tested_width_make_the_verdict_fragile_where_they_decide_it(tmp_path):
    """A spike read at the tested width inflates its test error: a curve with no peak, whose runs at the critical
    width ended inside spikes in 4 of 6 seeds, read "reproduced"; without those seeds it reads otherwise, and the
    verdict says so. Spiked runs that change nothing are counted (`spiked_runs`) but leave the verdict alone, also
    where leaving their seeds out would only cost power."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2, 3, 4, 5), lrs=(0.02,), sizes=(8192,)))
    flat = df.assign(test_error=np.where(df["model.width"] == 6, df["test_error"] - BUMP, df["test_error"]))
    at6 = (flat["model.width"] == 6) & (flat["seed"] < 5)
    flat.loc[at6, "test_error"] += 0.15
    flat.loc[at6, "ended_in_spike"] = True
    (test,) = design.peak_tests(flat, pilot_sd=0.015, effect=0.05)
    assert test.spiked_runs == 5 and test.verdict.startswith("reproduced (fragile: ")
    assert "without their 5 seeds the test reads inconclusive" in test.verdict, test.verdict
    calm = flat.copy()
    calm.loc[at6, "test_error"] -= 0.15
    (test,) = design.peak_tests(calm, pilot_sd=0.015, effect=0.05)
    assert test.spiked_runs == 5 and test.verdict == "not reproduced"  # one seed left: no power, nothing fragile


def noisy_centre_frame(seeds=8, extra=0.135, sd=0.15, seed=1):
    """Threshold 8 (critical width 6, neighbours 3 and 12); the test error at width 6 stands ``extra`` above the
    falling curve, with a per-seed spread ``sd`` there (an unstable recipe at the tested width)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(seeds):
        noise6 = rng.normal(0, sd)
        for w in [2, 3, 4, 6, 8, 12, 16, 32]:
            train = 0.0 if w >= 8 else 0.3 * (1 - w / 8) + 0.02
            test = 0.7 - 0.05 * np.log2(w) + rng.normal(0, 0.005) + (extra + noise6 if w == 6 else 0)
            rows.append({"status": "completed", "model.width": w, "label_noise.p": 0.2, "seed": s,
                         "train_error": train, "test_error": test})
    return pd.DataFrame(rows)


def test_not_reproduced_needs_the_observed_peaks_upper_bound_below_the_effect():
    """Review 2026-11-29 (design, D1): "not reproduced" was returned whenever p >= 0.05 and the pilot's mde was at most
    the effect, never looking at the observed height: a noisy main run whose peak stood 0.062 above both neighbours
    (p 0.057, effect 0.05) read "not reproduced". The one-sided 95% upper bound of the height must lie below the
    effect too; and the mde must be below the effect (issue 26), not equal."""
    df = noisy_centre_frame()
    (t,) = design.peak_tests(df, pilot_sd=0.015, effect=0.05, grids={})
    assert t.p_value >= 0.05 and t.mde < 0.05 and t.height > 0.05
    from scipy import stats
    x = df.pivot(index="seed", columns="model.width", values="test_error")
    side = x[6] - (x[3] if t.vs_left <= t.vs_right else x[12])  # the side whose mean is the height
    assert side.mean() == pytest.approx(t.height)
    assert t.verdict.startswith("inconclusive (observed height 0.062, upper bound "), t.verdict
    assert "above the published effect 0.050" in t.verdict
    # the bound is at least the height's side's mean + t(0.95, k - 1) sd / sqrt(k) (Bonferroni: the smaller side's
    # bound at t(0.975); see the coverage test below)
    assert t.height_upper >= side.mean() + stats.t.ppf(0.95, 7) * side.std() / np.sqrt(8)
    # a flat curve with the same pilot power: the bound lies below the effect, "not reproduced" stands
    (flat,) = design.peak_tests(noisy_centre_frame(extra=-0.1, sd=0.005), pilot_sd=0.015, effect=0.05, grids={})
    assert flat.height_upper < 0.05 and flat.verdict == "not reproduced"
    # the bound alone: a height whose bound reaches the effect is inconclusive, and so is an mde equal to it
    assert design.verdict(0.9, -0.03, 0.04, 0.05, 0, upper=0.01) == "not reproduced"
    assert design.verdict(0.9, -0.03, 0.04, 0.05, 0, upper=0.05).startswith("inconclusive (observed height -0.030")
    assert design.verdict(0.9, -0.03, 0.05, 0.05, 0, upper=0.01).startswith("inconclusive (the design detects 0.050")
    assert design.verdict(0.9, -0.03, 0.04, 0.05, 0).startswith("inconclusive")  # no bound given: no absence


def test_the_heights_upper_bound_covers_the_true_height_at_95_percent_where_the_two_sides_tie():
    """The height is the smaller of two side means, and its bound was the one-sided 95% bound of whichever side's
    observed mean was smaller: a side chosen by the data. Where the two true contrasts tie (the boundary of "not
    reproduced") and the sides vary independently, that bound fell below the true height in about 1 - 0.95^2 of
    runs, so "not reproduced" could be said 10% of the time of a peak exactly as high as the effect. The bound is
    now the smaller of the two sides' one-sided (1 - alpha/2) bounds (Bonferroni): it covers min(mu_left, mu_right)
    whenever both sides' bounds cover their own means, at least 95% of the time whatever the sides' correlation."""
    from scipy import stats
    rng = np.random.default_rng(7)
    k, sims, true = 8, 3000, 0.05
    draws = rng.normal(true, 0.02, size=(sims, k, 2))  # two independent contrasts with the same true mean
    covered = np.mean([design.height_upper(pd.DataFrame(x, columns=["left", "right"])) >= true for x in draws])
    assert covered >= 0.94, covered  # the side-picked 95% bound covers about 0.90 here
    # the bound on one draw, written out: each side's mean + t(0.975, k - 1) sd / sqrt(k), the smaller of the two
    d = pd.DataFrame(draws[0], columns=["left", "right"])
    each = d.mean() + stats.t.ppf(0.975, k - 1) * d.std() / np.sqrt(k)
    assert design.height_upper(d) == pytest.approx(each.min(), rel=1e-12)


def test_the_pilots_spread_estimates_one_runs_variance_where_a_seed_was_rerun_with_different_results():
    """Review 2026-11-29 (design, D2): the CIFAR-10 pilot reran C1 = 8 at seeds 0 and 1 with different results, and
    spread() averaged each seed's reruns into one value: the sd of a mean of reruns, biased low against the single
    run per seed the main test faces. Simulated pilots (numpy): 9 widths x 4 seeds, each (width, seed) run 1-3
    times, a seed's draw (sd 0.01) shared by its reruns, each run its own (sd 0.02, a nondeterministic GPU run).
    Averaged, E[sd^2] was 0.69 of one run's variance; the variance of the per-seed means plus the pooled rerun
    variance times mean(1 - 1/r) (``one_run_variance``, as ``spread`` computes it) is unbiased, for one width and
    for a contrast of two."""
    rng = np.random.default_rng(0)
    draws, widths, seeds, seed_sd, rerun_sd = 20000, 9, 4, 0.01, 0.02
    one = seed_sd**2 + rerun_sd**2
    r = rng.integers(1, 4, (draws, widths, seeds))  # runs per (width, seed)
    runs = rng.normal(0, rerun_sd, (draws, widths, seeds, 3))
    kept = np.arange(3) < r[..., None]
    means = rng.normal(0, seed_sd, (draws, widths, seeds)) + (runs * kept).sum(-1) / r
    cell_mean = (runs * kept).sum(-1) / r
    within = (((runs - cell_mean[..., None]) ** 2) * kept).sum((1, 2, 3))
    e2 = within / (r - 1).sum((1, 2))  # the pooled rerun variance of each pilot
    naive = means.var(-1, ddof=1).mean(-1)
    fixed = np.array([np.mean([design.power.one_run_variance(means[i, w].var(ddof=1), 1 - 1 / r[i, w], e2[i])
                               for w in range(widths)]) for i in range(2000)])
    assert naive.mean() == pytest.approx(one * 0.69, rel=0.03)  # the bias the review found
    assert fixed.mean() == pytest.approx(one, rel=0.03)
    contrast = means[:, 1] - means[:, 0]  # a contrast of two widths
    lost = (1 - 1 / r[:, 1]) + (1 - 1 / r[:, 0])
    fixed = [design.power.one_run_variance(contrast[i].var(ddof=1), lost[i], e2[i]) for i in range(draws)]
    assert np.mean(fixed) == pytest.approx(2 * one, rel=0.03)


def test_the_pilots_spread_counts_reruns_by_the_rule_and_says_so(tmp_path):
    """spread() applies ``one_run_variance`` and the declared-test output says how many reruns it found and how it
    counted them: a pilot whose width 12 ran twice at every seed with different results."""
    df = load_runs(write_pilot(tmp_path, seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02))
    again = df[df["model.width"] == 12].assign(run_dir=lambda d: d["run_dir"] + "-rerun",
                                               test_error=lambda d: d["test_error"] + [0.03, -0.01, 0.02])
    with pytest.warns(UserWarning, match="rerun with different results"):
        sp = design.spread(pd.concat([df, again], ignore_index=True))
    assert (sp.reruns, sp.rerun_cells, sp.duplicates) == (3, 3, 0)
    both = pd.concat([df, again]).query("`model.width` == 12")
    e2 = both.groupby("seed")["test_error"].var().mean()
    assert sp.rerun_sd == pytest.approx(np.sqrt(e2))
    x = df.pivot(index="seed", columns="model.width", values="test_error")
    x[12] = both.groupby("seed")["test_error"].mean()
    expect = np.mean([x[w].var() for w in WIDTHS]) + e2 * 0.5 / len(WIDTHS)  # width 12: 1 - 1/2 at every seed
    assert sp.width_sd**2 == pytest.approx(expect)
    assert sp.right_sd**2 == pytest.approx((x[6] - x[12]).var() + e2 * 0.5)  # the right neighbour of 6 is 12
    assert sp.left_sd**2 == pytest.approx((x[6] - x[3]).var())
    assert "reran 3 (curve, width, seed) cells" in sp.rerun_note and "1 - 1/r" in sp.rerun_note
    with pytest.warns(UserWarning, match="no declared grid"):
        tests = design.peak_tests(df, sp, 0.05)
    assert sp.rerun_note in design.tests_markdown(tests, sp)
    assert design.spread(df).rerun_note.startswith("Reruns: none")


def test_a_test_pooling_several_studies_names_each_with_its_seeds_and_the_reading_before_each_was_added(tmp_path):
    """Review 2026-11-29 (design, D4): the MNIST convergence arm pools three studies (seeds 2-5, 6, 7-9; the last
    run two days after the first two had been read: inconclusive on seeds 2-6, not reproduced on 2-9), and the
    declared test's output named neither the studies nor their seeds. It lists them in the order given, with their
    seeds and when they ran, says which started after the ones before had finished, and gives the reading on the
    studies up to each (interim, post hoc beside the declared test)."""
    root = STUDIES / "double_descent_cnn"
    out = tmp_path / "t.md"
    design.main(["test", *[str(root / "records" / d) for d in ("main", "main_seed6", "main_seeds789")],
                 "--pilot", str(root / "records" / "pilot_gpu"), "--out", str(out)])
    text = out.read_text()
    listed = re.search(r"Studies read, in the order given: (.*)", text).group(1)
    assert listed.index("double_descent_cnn (seeds 2-5") < listed.index("double_descent_cnn_seed6 (seed 6") \
        < listed.index("double_descent_cnn_seeds789 (seeds 7-9")
    assert "2026-11-29 06:50-08:03 UTC" in listed
    assert "started after the last run of the studies before it had finished" in text
    interim = text[text.index("Interim readings"):]
    assert "seeds 2-6 (5 seeds): inconclusive (the design detects 0.056" in interim
    assert "seeds 2-9 (8 seeds): not reproduced" in interim
    assert "post hoc" in interim


def test_the_fallback_power_figure_prints_the_interval_of_the_one_width_sd_it_rests_on(tmp_path):
    """Review 2026-11-29 (design, D3): with no two-sided pilot contrast the power used sqrt(2) x one width's sd, but
    its interval was NaN and the output printed none, though that sd had 4 dof (CIFAR-10: 0.0187-0.0896 around
    0.0312, the mde at 8 seeds 0.022-0.104). The fallback has the chi-square interval of the one-width sd's dof."""
    from scipy import stats

    df = load_runs(write_pilot(tmp_path, seeds=tuple(range(4)), noise_sd=0.02, lrs=(0.02,), sizes=(8192,)))
    sp = design.spread(df[df["model.width"].isin([4, 6, 8])])
    assert sp.dof == 0 and sp.width_dof == 3 * 3  # 3 widths x (4 seeds - 1)
    lo, hi = sp.sd_interval()
    dof = sp.width_dof
    assert lo == pytest.approx(sp.power_sd * np.sqrt(dof / stats.chi2.ppf(0.975, dof)))
    assert hi == pytest.approx(sp.power_sd * np.sqrt(dof / stats.chi2.ppf(0.025, dof)))
    (t,) = design.peak_tests(df, sp, 0.05, grids={})
    text = design.tests_markdown([t], sp)
    assert f"(95% interval {lo:.4f}-{hi:.4f}, from the one-width sd's {dof} dof" in text


def test_the_declared_test_states_which_pilot_sizes_its_spread_pools_and_each_sizes_figure_post_hoc(tmp_path):
    """Review 2026-11-29 (design, D5): the pilot is restricted to the main run's lr only (``pilot_at_main_lr``), so
    its spread pools every pilot n_train though the main run trains at one (MNIST: 1024 and 4096 pooled, mde(8)
    0.041; 4096 alone 0.0045, 1024 alone 0.057). The rule was in force before the main runs and stays; the output
    states it, the sizes pooled, and each size's figure, labelled post hoc (sensitivity)."""
    pilot = write_pilot(tmp_path / "pilot", lrs=(0.02,), sizes=(2048, 8192), seeds=(0, 1, 2), noise_sd=0.02)
    main = write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3, 4, 5))
    out = tmp_path / "t.md"
    with pytest.warns(UserWarning, match="no declared grid"):
        design.main(["test", str(main), "--pilot", str(pilot), "--out", str(out)])
    text = out.read_text()
    assert "Pilot pooling (the rule in force before the main runs" in text
    assert "dataset.n_train 2048, 8192 pooled; the main run trains at 8192" in text
    df = load_runs(pilot)
    for n in (2048, 8192):
        alone = design.spread(df[df["dataset.n_train"] == n])
        assert f"dataset.n_train {n} alone: mde at 3 seeds {alone.mde(3):.4f}" in text
    assert "Post hoc (sensitivity)" in text


def test_the_studies_are_read_in_the_order_given_not_in_the_folders_alphabetical_order(tmp_path):
    """Review 2026-11-29 (analysis): ``find_run_dirs`` sorted every run dir found, so ``load_runs([later, earlier])``
    read ``earlier``'s folder first whatever the order given, and the declared test's "Studies read, in the order
    given" listed them alphabetically: a study given second that started after the first had finished was then
    listed first, and the output said "The studies' runs overlap in time" of two studies that did not overlap."""
    from analysis.design.sources import sources_markdown, study_order

    first, second = tmp_path / "z_first", tmp_path / "a_second"
    for root, name, seeds in ((first, "dd_first", (0, 1)), (second, "dd_second", (2,))):
        for i, s in enumerate(seeds):
            write_run(root, i, cnn_config(s, 4, 0.02, 2048),
                      {"status": "completed", "stop_reason": "converged", "train_error": 0.0, "test_error": 0.2,
                       "study_name": name, "study_storage": f"sqlite:///{root}/optuna.db", "trial_number": i})
    df = load_runs([first, second], optuna_state=False)
    assert [s[1] for s in study_order(df)] == ["dd_first", "dd_second"]
    times = {s: (pd.Timestamp(f"2026-11-29 0{h}:00"), pd.Timestamp(f"2026-11-29 0{h}:30"))
             for s, h in zip(study_order(df), (1, 3), strict=True)}
    text = sources_markdown(df, times=times)
    assert re.search(r"in the order given: dd_first \(seeds 0-1; .*\), dd_second \(seed 2", text)
    assert "dd_second started after the last run of the studies before it had finished" in text


def test_a_pilot_threshold_is_a_mean_over_seeds_not_over_runs(tmp_path):
    """Review 2026-11-29 (analysis): ``threshold`` averaged the train errors of a width's runs, so a seed rerun at a
    width counted once per run. Here seed 0 ran twice at C1 = 8 (train error 0 both times) and seed 1 once (2.5%):
    the runs' mean 0.83% put the pilot's threshold (and the main grid ``choose_main`` builds round it) at 8, where
    the seeds' mean is 1.25%, and ``spread``, which averages each seed's reruns first, centred its contrasts at 12."""
    num = 0
    for w in WIDTHS:
        for s in (0, 1):
            train, test = curve(w, 8)
            train = 0.025 if (w, s) == (8, 1) else train
            for _ in range(2 if (w, s) == (8, 0) else 1):  # a genuine rerun: another test error
                write_run(tmp_path, num, cnn_config(s, w, 0.02, 8192),
                          {"status": "completed", "stop_reason": "converged", "train_error": train,
                           "test_error": test + 0.001 * num, "chance_train_error": 0.9, "best_train_error": train})
                num += 1
    df = load_runs(tmp_path)
    (t,) = design.thresholds(df)["threshold"]
    assert t == 12
    assert design.choose_lr(df)[1]["runs_at_threshold_widths"].iloc[0] == 9  # C1 6-24: 6, 8 (3 runs), 12, 16


def test_the_plan_chooses_no_main_run_when_the_lr_rule_chose_no_lr(tmp_path, capsys):
    """Review 2026-11-29 (analysis): with every lr collapsed at its threshold widths the lr rule chooses none, and
    ``plan --target`` still printed a main run: its n_train and grid from a threshold read at whichever lr's curve lay
    nearest the target, and no ``optimizer.lr``, so the main run would train at the config's lr, which the pilot
    may never have tried, looking like the rules' choice. It refuses instead."""
    write_pilot(tmp_path, collapse_at={(lr, 4) for lr in (0.05, 0.02, 0.01)})
    assert design.main(["plan", str(tmp_path), "--target", "6"]) == 1
    captured = capsys.readouterr()
    assert "dataset.n_train=" not in captured.out and "seed=choice" not in captured.out
    assert "the lr rule chose no lr" in captured.err


def test_a_fixed_arm_refuses_capped_runs_that_set_a_recipe_key_its_own_runs_lack(tmp_path):
    """Review 2026-11-29 (analysis): ``with_capped`` compared the recipe keys of the fixed arm's config only, so a key
    the other arm's runs set and the fixed arm's configs do not hold at all (momentum 0.9 there, no such key here:
    runs of another code version, or another optimizer group) let its runs join the fixed arm's curves unnoticed,
    and the test, whose config columns are the fixed arm's, never compared it either."""
    conv, fixed = tmp_path / "conv", tmp_path / "fixed"
    for s in range(2):
        for w in WIDTHS:
            train, test = curve(w, 8)
            cfg = cnn_config(s, w, 0.05, 8192)
            summary = {"status": "completed", "stop_reason": "max_epochs", "epochs": 300, "train_error": train,
                       "test_error": test}
            write_run(conv, s * 100 + w, {**cfg, "optimizer": {"lr": 0.05, "momentum": 0.9},
                                          "trainer": {"max_epochs": 300, "converge_epochs": 20}}, summary)
            if w >= 8:
                write_run(fixed, s * 100 + w, {**cfg, "trainer": {"max_epochs": 300, "converge_epochs": None}}, summary)
    main = load_runs(fixed, optuna_state=False)
    with pytest.raises(ValueError, match=r"optimizer\.momentum = \['0\.9'\] there, '\(not set\)' here"):
        design.with_capped(main, load_runs(conv, optuna_state=False))
    with pytest.raises(ValueError, match=r"optimizer\.momentum = \['\(not set\)'\] there, 0\.9 here"):  # and back
        design.with_capped(main.assign(**{"optimizer.momentum": 0.9}).pipe(_with_config_column, "optimizer.momentum"),
                           load_runs(conv, optuna_state=False).drop(columns="optimizer.momentum"))


def _with_config_column(df: pd.DataFrame, key: str) -> pd.DataFrame:
    df.attrs["config_columns"] = [*df.attrs["config_columns"], key]
    return df


def test_the_pilot_pooling_note_prints_no_mde_while_the_tests_hold_one_seed(tmp_path):
    """2026-11-30 (ViT fixed-budget arm, grid unfinished): with the tests holding at most 1 seed the note printed
    "mde at 1 seeds nan" beside each size; it gives each size's power sd and says why there is no mde."""
    from analysis.design.plan import pooling_note

    pilot = write_pilot(tmp_path / "pilot", lrs=(0.02,), sizes=(2048, 8192), seeds=(0, 1, 2), noise_sd=0.02)
    main = write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3,))
    text = pooling_note(load_runs(pilot), load_runs(main), 1)
    assert "nan" not in text and "mde at 1 seeds" not in text
    assert "no mde: the tests hold 1 seed, and a seed spread needs 2" in text


def test_the_pilot_pooling_note_names_each_recipe_key_the_pilot_trained_otherwise(tmp_path):
    """Review 2026-11-30 (design): the ViT's pilot trained 300 epochs under precision auto and the main run 500 under
    bf16; the declared test gave the pilot's spread as the power figure's without a word of it. The note names every
    recipe key whose values differ between the two (the seeds, the lr, the sizes and noise levels it reports
    already, and a size that follows the width, aside) and a key only one of them records."""
    from analysis.design.plan import pooling_note

    pilot = load_runs(write_pilot(tmp_path / "pilot", lrs=(0.02,), sizes=(8192,), seeds=(0, 1, 2)))
    main = load_runs(write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3, 4, 5)))
    assert "trained otherwise" not in pooling_note(pilot, main, 3)
    main["trainer.max_epochs"] = 500
    main = _with_config_column(main.assign(**{"model.attention": "sdpa"}), "model.attention")
    text = pooling_note(pilot, main, 3)
    assert "The pilot trained otherwise than the main run in trainer.max_epochs (300 -> 500)" in text
    assert "model.attention (not recorded -> sdpa)" in text and "seed" not in text.split("trained otherwise")[1]


def test_the_pilot_pooling_note_counts_the_runs_the_spread_leaves_out(tmp_path):
    """Review 2026-11-30 (design): 16 of the ViT pilot's 48 runs were stopped before they finished, and the spread
    reads finished runs only; which runs a stop catches (the slow ones) need not be random, so the note counts them."""
    from analysis.design.plan import pooling_note

    pilot = load_runs(write_pilot(tmp_path / "pilot", lrs=(0.02,), sizes=(8192,), seeds=(0, 1, 2)))
    main = load_runs(write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3, 4, 5)))
    pilot.loc[pilot.index[:3], "status"] = ["stopped", "stopped", "failed"]
    text = pooling_note(pilot, main, 3)
    n = len(pilot)
    assert f"The spread reads {n - 3} of the pilot's {n} runs at that lr (3 left out: 2 stopped, 1 failed)" in text


def test_a_single_lr_pilot_at_another_lr_than_the_main_runs_is_refused(tmp_path):
    """A pilot that tried one lr, not the main run's, gave the power figure another recipe's spread, and the pooling
    note said it was "at the main run's lr": the refusal that a several-lr pilot gets (``pilot_at_main_lr``) was
    skipped where lr was not a curve key of the pilot."""
    pilot = write_pilot(tmp_path / "pilot", lrs=(0.05,), sizes=(8192,), seeds=(0, 1, 2))
    main = write_pilot(tmp_path / "main", lrs=(0.02,), sizes=(8192,), seeds=(3, 4, 5))
    with pytest.raises(SystemExit, match=r"optimizer\.lr 0\.02.*pilot never tried.*0\.05"):
        design.main(["test", str(main), "--pilot", str(pilot)])
    same = write_pilot(tmp_path / "same", lrs=(0.05,), sizes=(8192,), seeds=(3, 4, 5))
    assert design.main(["test", str(same), "--pilot", str(pilot)]) == 0


def test_the_pilots_spread_refuses_a_curve_pooling_two_recipes_on_other_seeds_or_other_widths(tmp_path):
    """The pilot's spread refused two recipes only where they shared a (curve, width, seed): two recipes on seeds
    0-2 and 3-5 of one width, or one recipe at the narrow widths and another at the wide ones (two pilot sweeps
    stitched), were pooled silently into the seed spread and the contrast the power figure rests on, which the
    main test refuses (``one_recipe``) and the curves refuse (``require_one_recipe``)."""
    def set_dropout(root, pick):
        for config in root.glob("*/.hydra/config.yaml"):
            text = config.read_text()
            width = float(re.search(r"width: (\S+)", text).group(1))
            seed = float(re.search(r"seed: (\S+)", text).group(1))
            config.write_text(text.replace("model:\n", f"model:\n  dropout: {pick(width, seed)}\n"))

    a = write_pilot(tmp_path / "a", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    b = write_pilot(tmp_path / "b", seeds=(3, 4, 5), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    set_dropout(a, lambda w, s: 0.0)
    set_dropout(b, lambda w, s: 0.3)
    with pytest.raises(ValueError, match=r"model\.dropout \(0\.0, 0\.3\)"):
        design.spread(load_runs([a, b]))
    c = write_pilot(tmp_path / "c", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    set_dropout(c, lambda w, s: 0.3 if w >= 6 else 0.0)
    with pytest.raises(ValueError, match=r"model\.dropout \(0\.0, 0\.3\)"):
        design.spread(load_runs([c]))
    d = write_pilot(tmp_path / "d", seeds=(0, 1, 2), lrs=(0.02,), sizes=(8192,), noise_sd=0.02)
    set_dropout(d, lambda w, s: 0.1)
    assert design.spread(load_runs([d])).dof  # one recipe: read as before


def test_the_lr_rule_counts_a_run_that_diverged_at_a_threshold_width(tmp_path):
    """A run whose loss went non-finite (status failed, ``nonfinite_loss``) at a threshold width is the lr's
    instability too; the rule read finished runs only, so an lr whose runs diverged next to the threshold was
    "stable" and chosen."""
    root = write_pilot(tmp_path, sizes=(8192,))
    for summary in root.glob("*/summary.json"):
        config = (summary.parent / ".hydra" / "config.yaml").read_text()
        if re.search(r"lr: 0\.05\b", config) and re.search(r"width: 6\b", config):
            s = json.loads(summary.read_text())
            s.update(status="failed", stop_reason="nonfinite_loss", train_error=None, test_error=None)
            summary.write_text(json.dumps(s))
    lr, table = design.choose_lr(load_runs(root))
    assert lr == 0.02
    assert table.set_index("optimizer.lr").loc[0.05, "flagged"] == 2  # 2 seeds at C1 = 6, next to the threshold 8
