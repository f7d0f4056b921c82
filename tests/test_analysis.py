"""analysis/ on synthetic run dirs written by hand in the run-directory contract's format."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from analysis import (
    MissingColumnError,
    descent_curves,
    descent_summary,
    fit_learning_curve,
    format_table,
    load_history,
    load_runs,
    load_study,
    slope_difference,
    summary_table,
)
from analysis.frames import one_run_per_seed
from analysis.report import make_report
from analysis.varied import varied_keys
from tests.helpers import captured_figure, write_run

SIZES = [128, 256, 512, 1024, 2048, 4096, 8192]


def config(seed: int, n_train: int = 1000, patch: int = 4, width: int = 64, noise: float = 0.0) -> dict:
    return {
        "seed": seed,
        "dataset": {"name": "mnist", "root": "data", "n_train": n_train, "image_size": None},
        "model": {"_target_": "src.models.vit.ViT", "patch": patch, "dim": width, "depth": 2, "heads": 2},
        "optimizer": {"lr": 0.001},
        "label_noise": {"p": noise},
        "trainer": {"max_epochs": 3},
    }


def summary(test_error: float, train_error: float = 0.0, status: str = "completed", **extra) -> dict:
    return {"status": status, "stop_reason": "max_epochs", "epochs": 3, "wall_s": 61.0, "test_error": test_error,
            "test_acc": 1 - test_error, "train_error": train_error, "train_loss": 0.1, "test_loss": 0.3,
            **extra}


def history(test_error: float, epochs: int = 3) -> list[dict]:
    return [{"epoch": e, "step": 10 * e, "wall_s": 20.0 * e, "lr": 1e-3, "train_loss": 1.0 / e,
             "train_error": 0.5 / e, "test_loss": 1.2 / e, "test_error": test_error * (1 + 1.0 / e),
             "images_per_s": 1000.0} for e in range(1, epochs + 1)]


def power_law_sweep(root: Path, alpha=-0.5, a=2.0, c=0.0, noise=0.05, seeds=4, sizes=SIZES, patch=4, rng=0):
    rng = np.random.default_rng(rng)
    num = 0
    for n in sizes:
        for s in range(seeds):
            err = (a * n**alpha + c) * np.exp(noise * rng.standard_normal())
            write_run(root, num, config(s, n_train=n, patch=patch), summary(err, n_train=n, seed=s), history(err))
            num += 1
    return root


def test_planted_power_law_recovered_with_ci(tmp_path):
    runs = load_runs(power_law_sweep(tmp_path))
    assert len(runs) == 28 and (runs["status"] == "completed").all()
    fit = fit_learning_curve(runs, x="dataset.n_train", y="test_error").iloc[0]
    assert abs(fit["alpha"] + 0.5) < 0.05
    assert fit["alpha_lo"] <= -0.5 <= fit["alpha_hi"]
    assert fit["alpha_hi"] - fit["alpha_lo"] < 0.1
    assert abs(fit["prefactor"] - 2.0) / 2.0 < 0.3
    assert fit["n_points"] == 7 and fit["r2"] > 0.95


def test_offset_model_recovers_planted_offset(tmp_path):
    runs = load_runs(power_law_sweep(tmp_path, a=3.0, c=0.05, noise=0.02, rng=1))
    fit = fit_learning_curve(runs, offset=True, n_boot=300).iloc[0]
    assert abs(fit["offset"] - 0.05) < 0.01
    assert fit["offset_lo"] <= 0.05 <= fit["offset_hi"]
    assert abs(fit["offset_alpha"] + 0.5) < 0.1
    # the plain power law, blind to the floor, reads a flatter exponent
    assert fit["alpha"] > -0.45


def test_offset_fit_reaches_the_least_squares_minimum_curve_fit_finds():
    """The offset model's fitter (every resample at once: exact in (a, c) for each alpha, a grid and golden section in
    alpha) lands where scipy's curve_fit does, floors above zero and at zero alike, and never leaves more residual."""
    from scipy.optimize import curve_fit

    from analysis.fit_offset import _fit_offsets

    rng = np.random.default_rng(11)
    n = 128.0 * 2.0 ** np.arange(6)
    floors = np.repeat([0.04, 0.0, 0.1], 20)
    rows = (6.0 * n**-0.55 + floors[:, None]) * np.exp(rng.normal(0, 0.05, (len(floors), 6)))
    fast = _fit_offsets(n, rows)
    ref = np.exp(np.log(n).mean())
    for row, (a, alpha, c) in zip(rows, fast, strict=True):
        (a0, alpha0, c0), _ = curve_fit(lambda x, a, al, c: a * x**al + c, n / ref, row, p0=(1.0, -0.5, 0.0),
                                        bounds=([0, -10, 0], [np.inf, 10, np.inf]), maxfev=5000)
        sse_scipy = ((a0 * (n / ref) ** alpha0 + c0 - row) ** 2).sum()
        sse = ((a * n**alpha + c - row) ** 2).sum()
        assert sse <= sse_scipy * (1 + 1e-6)
        assert alpha == pytest.approx(alpha0, abs=1e-4) and c == pytest.approx(c0, abs=1e-5)
        assert a * ref**alpha == pytest.approx(a0, rel=1e-4)


@pytest.mark.parametrize("missing", [False, True])
def test_offset_bootstrap_resamples_whole_seeds(monkeypatch, missing):
    """A seed's subsets are nested across sizes, so its errors move together: the offset model's bootstrap draws whole
    seeds (rows of the seed x size table), never seed 1 at one size beside seed 3 at the next (review 2026-12). Every
    resample, at every size, is the mean of one and the same multiset of seeds; a seed lacking a size leaves that
    size's mean to the drawn seeds that have it."""
    import itertools

    import analysis.fits as fits_module

    rng = np.random.default_rng(7)
    sizes = np.array([128, 256, 512, 1024, 2048])
    err = 2.0 * sizes**-0.5 * np.exp(rng.normal(0, 0.3, (4, 1)) + rng.normal(0, 0.05, (4, len(sizes))))
    runs = pd.DataFrame([{"dataset.n_train": n, "seed": s, "test_error": err[s, j], "status": "completed"}
                         for s in range(4) for j, n in enumerate(sizes)])
    if missing:  # seed 2 has no run at 512
        runs = runs[~((runs["seed"] == 2) & (runs["dataset.n_train"] == 512))]
        err[2, 2] = np.nan
    seen = []
    real = fits_module._offset_fit

    def capture(sizes, means, boot, label):  # keep the resamples, fit a few (the fits are not under test)
        seen.append(boot)
        return real(sizes, means, boot[:5], label)

    monkeypatch.setattr(fits_module, "_offset_fit", capture)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a seed lacking a size: the alpha interval's warning
        fit_learning_curve(runs, offset=True, n_boot=200)
    (boot,) = seen
    assert boot.shape == (200, len(sizes))
    multisets = itertools.combinations_with_replacement(range(4), 4)
    means = np.array([[np.mean(err[list(m), j][np.isfinite(err[list(m), j])]) if np.isfinite(err[list(m), j]).any()
                       else np.nan for j in range(len(sizes))] for m in multisets])
    means = means[np.isfinite(means).all(axis=1)]
    kept = boot[np.isfinite(boot).all(axis=1)]
    assert len(kept) >= 190
    for row in kept:  # the whole row is one multiset's means, to rounding
        assert np.isclose(means, row, rtol=1e-9, atol=0).all(axis=1).any(), row


def test_fit_groups_and_excludes_unfinished(tmp_path, capsys):
    power_law_sweep(tmp_path / "a", alpha=-0.5, patch=4, seeds=3)
    power_law_sweep(tmp_path / "b", alpha=-0.3, patch=2, seeds=3, rng=5)
    write_run(tmp_path / "c", 0, config(0, n_train=128, patch=2), None)  # still running
    write_run(tmp_path / "c", 1, config(1, n_train=128, patch=2), summary(0.9, status="failed"))
    runs = load_runs(tmp_path)
    assert set(runs["status"]) == {"completed", "running", "failed"}
    fits = fit_learning_curve(runs, by=["model.patch"], n_boot=200).set_index("model.patch")
    assert "excluded 2 runs" in capsys.readouterr().out
    assert abs(fits.loc[4, "alpha"] + 0.5) < 0.05 and abs(fits.loc[2, "alpha"] + 0.3) < 0.05


def test_fit_needs_three_sizes(tmp_path):
    power_law_sweep(tmp_path / "few", sizes=[100, 200], seeds=2, patch=2)
    runs = load_runs(tmp_path / "few")
    with pytest.raises(ValueError, match="needs >= 3 distinct values of dataset.n_train"):
        fit_learning_curve(runs)
    power_law_sweep(tmp_path / "many", sizes=SIZES[:4], seeds=2, patch=4)
    with pytest.warns(UserWarning, match="patch=2: a power-law fit needs >= 3.*skipped"):
        fits = fit_learning_curve(load_runs(tmp_path), by="model.patch", n_boot=50, errors="skip")
    assert list(fits["model.patch"]) == [4]


def test_missing_column_lists_close_names(tmp_path):
    runs = load_runs(power_law_sweep(tmp_path, sizes=SIZES[:3], seeds=1))
    with pytest.raises(MissingColumnError, match="dataset.ntrain.*close names: dataset.n_train"):
        fit_learning_curve(runs, x="dataset.ntrain")
    with pytest.raises(MissingColumnError, match="test_eror.*test_error"):
        summary_table(runs, by=["model.patch"], metrics=["test_eror"])


def test_empty_or_wrong_folder_says_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no run directories.*\.hydra/config\.yaml"):
        load_runs(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs(tmp_path / "nope")


def test_truncated_metrics_line_is_skipped_with_warning(tmp_path):
    run = write_run(tmp_path, 0, config(0), summary(0.1), history(0.1))
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 4, "step": 40, "test_err')  # the job was killed mid-write
    with pytest.warns(UserWarning, match=r"metrics\.jsonl:4: skipped unreadable line"):
        hist = load_history(tmp_path)
    assert list(hist["epoch"]) == [1, 2, 3]
    assert (hist["model.patch"] == 4).all() and (hist["status"] == "completed").all()


def test_config_flattened_and_summary_merged(tmp_path):
    write_run(tmp_path, 0, {**config(3), "trial": {"study_name": "s", "number": 7, "storage": None}},
              summary(0.2, seed=3, params=1234))
    row = load_runs(tmp_path).iloc[0]
    assert row["dataset.n_train"] == 1000 and row["model._target_"] == "src.models.vit.ViT"
    assert row["params"] == 1234 and row["seed"] == 3 and "summary.seed" not in row
    assert row["study_name"] == "s" and row["trial_number"] == 7
    assert Path(row["run_dir"]).name == "0"


CONFIG_YAML = """\
optimizer: {lr: 1e-3, weight_decay: 1.0e-05, momentum: .9, clip: .inf}
dataset: {root: null, date: 2001-12-14, quoted: '0.5', flag: yes, n_train: 1_024}
model:
  blocks: [[1, 2], [3]]
  extra: {}
  missing: ???
"""


@pytest.mark.parametrize("interpolated", [False, True])
def test_a_runs_config_reads_as_omegaconf_reads_it(tmp_path, interpolated):
    """read_config parses with libyaml under OmegaConf's rules (its float forms, no timestamps): the same values and
    types as OmegaConf.load, interpolations resolved; a duplicate key is refused as OmegaConf refuses it."""
    from omegaconf import OmegaConf

    from analysis.run_dir import flatten, read_config

    run = tmp_path / "0"
    (run / ".hydra").mkdir(parents=True)
    path = run / ".hydra" / "config.yaml"
    path.write_text(CONFIG_YAML + ("seed: ${dataset.n_train}\n" if interpolated else "seed: 3\n"))
    want = flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    got = read_config(run)
    assert got == want and [type(v) for v in got.values()] == [type(v) for v in want.values()]
    assert got["optimizer.lr"] == 0.001 and got["dataset.date"] == "2001-12-14" and got["seed"] in (3, 1024)
    path.write_text("seed: 1\nseed: 2\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key seed"):
        read_config(run)


def test_load_study_joins_trials_to_runs(tmp_path):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="lc", storage=storage)
    for i in range(3):
        trial = study.ask()
        cfg = {**config(i), "trial": {"study_name": "lc", "number": trial.number, "storage": storage}}
        run = write_run(tmp_path / "sweep", i, cfg, summary(0.1 * (i + 1), study_name="lc", trial_number=trial.number))
        if i == 0:
            trial.set_user_attr("run_dir", str(run))  # joined by path; the others by trial number
        if i < 2:
            study.tell(trial, 0.1 * (i + 1))
    trials = load_study(storage, "lc", paths=tmp_path / "sweep")
    assert list(trials["number"]) == [0, 1, 2]
    assert list(trials["runs_test_error"]) == pytest.approx([0.1, 0.2, 0.3])
    assert list(trials["state"]) == ["COMPLETE", "COMPLETE", "RUNNING"]
    runs = load_runs(tmp_path / "sweep")
    assert list(runs["optuna_state"]) == ["COMPLETE", "COMPLETE", "RUNNING"]
    with pytest.raises(ValueError, match="no study 'nope'.*lc"):
        load_study(storage, "nope")


def test_a_run_told_through_a_retry_shows_the_state_of_the_trial_that_reported_it(tmp_path):
    """Found in heads_depth's report: a run that finished while its trial was not told (a killed sweep)
    is reported by a retry in the same run dir, and its summary keeps the first trial's number; the trials table
    showed that run as 'completed' with Optuna state FAIL, as if a failed trial were in the results."""
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="r", storage=storage)
    first = study.ask()
    run = write_run(tmp_path / "sweep", 0, config(0),
                    summary(0.1, study_name="r", trial_number=first.number, study_storage=storage))
    first.set_user_attr("interrupted", True)
    study.tell(first, state=TrialState.FAIL)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.1,
                                 user_attrs={"retry_of": first.number, "run_dir": str(run)}))
    runs = load_runs(tmp_path / "sweep")
    assert list(runs["optuna_state"]) == ["COMPLETE (as retry 1)"]


def double_descent_sweep(root: Path, seeds: int = 3) -> Path:
    widths = [2, 4, 8, 16, 32, 64, 128, 256]
    # noisy labels: classical U, then a peak at the interpolation threshold (width 32), then descent
    planted = {0.0: ([0.3, 0.2, 0.08, 0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.35, 0.3, 0.28, 0.26, 0.25, 0.24, 0.23]),
               0.2: ([0.4, 0.3, 0.2, 0.05, 0.0, 0.0, 0.0, 0.0], [0.5, 0.35, 0.3, 0.33, 0.45, 0.35, 0.3, 0.28])}
    rng, num = np.random.default_rng(2), 0
    for p, (train, test) in planted.items():
        for w, tr, te in zip(widths, train, test, strict=True):
            for s in range(seeds):
                jitter = 0.004 * rng.standard_normal(2)
                write_run(root, num, config(s, width=w, noise=p),
                          summary(te + jitter[0], max(0.0, tr + abs(jitter[1]) * (tr > 0))), history(te))
                num += 1
    return root


def test_double_descent_peak_at_planted_width(tmp_path):
    runs = load_runs(double_descent_sweep(tmp_path))
    curves = descent_curves(runs)  # width column found automatically: model.dim
    assert curves.attrs["width"] == "model.dim" and (curves["n_seeds"] == 3).all()
    summ = descent_summary(curves, tol=0.01).set_index("label_noise.p")
    assert summ.loc[0.2, "peak_width"] == 32
    assert summ.loc[0.2, "interpolation_width"] == 32
    assert summ.loc[0.2, "peak_test_error"] == pytest.approx(0.45, abs=0.01)
    assert np.isnan(summ.loc[0.0, "peak_width"])  # monotone: no double descent without noise
    assert summ.loc[0.0, "interpolation_width"] == 16


def test_varied_keys_skip_seed_bookkeeping_and_aliases(tmp_path):
    for i, (target, name) in enumerate([("src.models.vit.ViT", "vit"), ("src.models.cnn.CNN", "cnn")] * 2):
        cfg = config(i, n_train=100 * (1 + i // 2))
        cfg["model"] = {"_target_": target, "name": name}
        cfg["dataset"]["root"] = f"/data/{i}"
        write_run(tmp_path, i, cfg, summary(0.1))
    assert varied_keys(load_runs(tmp_path)) == ["dataset.n_train", "model._target_"]


def test_stop_rules_do_not_split_a_learning_curve(tmp_path):
    """Larger n_train runs often get a larger step cap: the report still fits one curve per model."""
    for i, n in enumerate([100, 200, 400, 800, 1600, 3200]):
        cfg = config(i, n_train=n)
        cfg["trainer"] = {"max_steps": 2000 if n < 800 else 8000, "max_epochs": 100}
        write_run(tmp_path, i, cfg, summary(0.5 * (n / 100) ** -0.5))
    runs = load_runs(tmp_path)
    assert varied_keys(runs) == ["dataset.n_train"]
    files = make_report([tmp_path], tmp_path / "report", n_boot=50)
    fits = pd.read_csv(next(p for p in files if p.name == "learning_curve_fits.csv"))
    assert len(fits) == 1 and fits["alpha"].iloc[0] == pytest.approx(-0.5, abs=1e-6)
    by_steps = make_report([tmp_path], tmp_path / "report2", n_boot=50, by=["dataset.n_train", "trainer.max_steps"])
    assert len(pd.read_csv(next(p for p in by_steps if p.name == "learning_curve_fits.csv"))) == 2
    with pytest.raises(ValueError, match="trainer.max_stepz: no such config key"):
        make_report([tmp_path], tmp_path / "report3", by=["trainer.max_stepz"])


def _promised(files: list[Path], out: Path, names: set[str]) -> None:
    written = {p.relative_to(out).as_posix() for p in files}
    assert names <= written, names - written
    for p in files:
        assert p.exists() and p.stat().st_size > 0
        if p.suffix == ".png":
            with Image.open(p) as im:
                im.verify()
                assert im.size[0] > 200 and im.size[1] > 200


def test_report_learning_curve_sweep_writes_every_promised_file(tmp_path, capsys):
    power_law_sweep(tmp_path / "sweep", seeds=3, sizes=SIZES[:5], patch=4)
    power_law_sweep(tmp_path / "sweep" / "more", seeds=3, sizes=SIZES[:5], patch=8, alpha=-0.4, rng=3)
    out = tmp_path / "report"
    files = make_report([tmp_path / "sweep"], out, n_boot=100)
    _promised(files, out, {"report.md", "tables/results.csv", "tables/results.md", "tables/learning_curve_fits.csv",
                           "figures/results_bars.png", "figures/history.png", "figures/learning_curves.png"})
    text = (out / "report.md").read_text()
    assert "`dataset.n_train`" in text and "`model.patch`" in text and "## Learning curves" in text
    assert "## Double descent" not in text
    assert "1:01 ± 0:00" in text and "wall time (m:s)" in text  # 61 s of training + evaluation, in m:s


def test_report_double_descent_sweep(tmp_path):
    double_descent_sweep(tmp_path / "sweep", seeds=2)
    out = tmp_path / "report"
    files = make_report([tmp_path / "sweep"], out, n_boot=50)
    _promised(files, out, {"report.md", "tables/double_descent_summary.csv", "tables/double_descent_curves.csv",
                           "figures/double_descent.png", "tables/results.csv", "figures/history.png"})
    assert "## Learning curves" not in (out / "report.md").read_text()


def test_a_report_whose_by_pools_two_recipes_says_why_it_has_no_curves(tmp_path):
    """Review 2026-11-29 (session 53): descent_curves now refuses two recipes pooled into one point; a report whose
    --by leaves out the key that differs must say so in its double-descent section, not stop the whole report."""
    import yaml

    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    for cfg_file in root.glob("*/.hydra/config.yaml"):  # seed 1 under another lr: two recipes, disjoint seeds
        cfg = yaml.safe_load(cfg_file.read_text())
        if cfg["seed"] == 1:
            cfg["optimizer"]["lr"] = 0.002
            cfg_file.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "report"
    make_report([root], out, n_boot=20, by=["model.dim", "label_noise.p"])
    text = (out / "report.md").read_text()
    assert "## Double descent" in text and "No curves:" in text and "optimizer.lr" in text


def curves_frame(test: list[float], train: list[float], sd: float, seeds: int = 3, rng: int = 0,
                 **extra: list[float]) -> pd.DataFrame:
    """Runs whose seed means are exactly ``test``/``train`` per width 1, 2, 4, ... and whose test error
    spreads by ``sd`` over seeds."""
    g = np.random.default_rng(rng)
    rows = []
    for i, (te, tr) in enumerate(zip(test, train, strict=True)):
        z = g.standard_normal(seeds)
        z = (z - z.mean()) / z.std(ddof=1) if seeds > 1 else 0 * z  # mean 0, std 1: the means stay as planted
        for s in range(seeds):
            rows.append({"model.width": 2**i, "label_noise.p": 0.2, "seed": s, "status": "completed",
                         "test_error": te + sd * z[s], "train_error": tr, **{k: v[i] for k, v in extra.items()}})
    return pd.DataFrame(rows)


ISSUE_TEST = [0.60, 0.62, 0.50, 0.40, 0.45, 0.35, 0.30]  # widths 1..64, interpolation at 32
ISSUE_TRAIN = [0.5, 0.45, 0.3, 0.2, 0.05, 0.0, 0.0]


def test_double_descent_peak_searched_near_the_interpolation_threshold():
    summ = descent_summary(descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.01))).iloc[0]
    assert summ["interpolation_width"] == 32
    assert summ["window_lo"] == 16 and summ["window_hi"] == 128  # from the critical width (16: train error 5%)
    assert summ["peak_width"] == 16  # not the seed-noise bump at width 2, outside the window
    assert summ["peak_height"] == pytest.approx(0.05)  # 0.45 over the 0.40 at width 8
    assert summ["peak_z"] == pytest.approx(0.05 / (0.01 * np.sqrt(2 / 3)))
    assert summ["peak_significant"]


def test_double_descent_bump_within_seed_noise_is_not_significant():
    summ = descent_summary(descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.05))).iloc[0]
    assert summ["peak_width"] == 16 and summ["peak_z"] < 2 and not summ["peak_significant"]
    one_seed = descent_summary(descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.0, seeds=1))).iloc[0]
    assert one_seed["peak_width"] == 16 and np.isnan(one_seed["peak_z"]) and not one_seed["peak_significant"]


def test_double_descent_without_interpolation_reports_no_peak():
    summ = descent_summary(descent_curves(curves_frame(ISSUE_TEST, [0.5] * 7, sd=0.01))).iloc[0]
    assert np.isnan(summ["interpolation_width"]) and np.isnan(summ["peak_width"]) and not summ["peak_significant"]
    with pytest.raises(ValueError, match="window=0.5"):
        descent_summary(descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.01)), window=0.5)


def test_double_descent_clean_and_noisy_train_errors_drawn_when_recorded(tmp_path):
    from analysis.figures import plot_double_descent

    extra = {"train_error_clean": [0.5, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2],
             "train_error_noisy_subset": [0.9] * 4 + [0.2, 0, 0]}
    curves = descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.01, **extra))
    assert curves["train_clean_mean"].tolist() == pytest.approx(extra["train_error_clean"])
    assert curves["train_noisy_subset_mean"].tolist() == pytest.approx(extra["train_error_noisy_subset"])
    old = descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.01))  # older runs: no such keys
    assert not any(c.startswith("train_clean") for c in old.columns)
    for name, c in (("new", curves), ("old", old)):
        path = plot_double_descent(c, descent_summary(c), tmp_path / f"{name}.png")
        with Image.open(path) as im:
            assert im.size[0] > 200
    import matplotlib.pyplot as plt
    labels = []
    orig = plt.Axes.legend
    try:  # record the legend labels the figure draws
        def record(self, *a, **k):
            labels.extend(self.get_legend_handles_labels()[1])
            return orig(self, *a, **k)
        plt.Axes.legend = record
        plot_double_descent(curves, descent_summary(curves), tmp_path / "x.png")
    finally:
        plt.Axes.legend = orig
    assert any("clean labels" in s for s in labels) and any("flipped images" in s for s in labels)


def test_analysis_imports_nothing_from_src_but_the_run_dir_contract():
    """analysis/ reads run dirs and Optuna storages only (the attention tool lives in src.attention); it shares the
    run directory's flag rules with the trainer through src.run_contract, which imports nothing heavy."""
    import ast

    for path in (Path(__file__).resolve().parents[1] / "analysis").rglob("*.py"):  # its subpackages too
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            allowed = {"src.run_contract"} | ({"src"} if isinstance(node, ast.ImportFrom) and
                                              [a.name for a in node.names] == ["run_contract"] else set())
            assert not any((n == "src" or n.startswith("src.")) and n not in allowed for n in names), \
                f"{path.name} imports {names}"


def test_the_run_contract_imports_only_the_standard_library():
    import ast

    path = Path(__file__).resolve().parents[1] / "src" / "run_contract.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert all(n in ("__future__", "typing") for n in names), names


def test_report_table_shows_every_group_of_a_study_grid(tmp_path):
    # 5 widths x 3 noise levels = 15 groups: the Markdown table must not stop at the figures' 12 curves
    # (the study run found the cut hid exactly the widest, most telling rows).
    num = 0
    for width in (1, 2, 4, 8, 16):
        for noise in (0.0, 0.1, 0.2):
            write_run(tmp_path / "sweep", num, config(0, width=width, noise=noise), summary(0.1 + width / 100))
            num += 1
    make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=10)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "first 12 of" not in text
    assert text.count("| 16 ") >= 3, "the width-16 rows are in the table"


def test_summary_table_shows_the_binary_scores_and_validation_accuracy_when_recorded():
    """A two-class study (rsna_patch_size) is judged by its AUC: the report table must carry it."""
    runs = pd.DataFrame({"model.patch": [8, 8, 16], "status": ["completed"] * 3, "wall_s": [1.0, 2.0, 3.0],
                         "test_error": [0.1, 0.2, 0.3], "val_error": [0.2, 0.2, 0.4], "test_auc": [0.7, 0.8, 0.6],
                         "val_auc": [0.75, 0.65, 0.5], "test_pf1": [0.1, 0.2, 0.05]})
    table = summary_table(runs, by="model.patch")
    assert {"val_acc_mean", "test_auc_mean", "val_auc_mean", "test_pf1_mean"} <= set(table.columns)
    assert table["test_auc_mean"].tolist() == pytest.approx([0.75, 0.6])
    text = format_table(table)
    assert "test AUC" in text.columns and "val acc (%)" in text.columns
    plain = summary_table(runs.drop(columns=["test_auc", "val_auc", "test_pf1", "val_error"]), by="model.patch")
    assert not any("auc" in c or "val" in c for c in plain.columns)


def test_history_of_runs_evaluated_once_draws_points(tmp_path):
    """With trainer.eval_every covering the whole run there is one row per run: a line of one point is
    invisible, so the figure must draw markers."""
    import matplotlib

    matplotlib.use("Agg")
    from analysis import figures

    hist = pd.DataFrame({"epoch": [4, 4], "model.patch": [4, 8], "test_error": [0.7, 0.75], "test_loss": [2.0, 2.1],
                         "train_error": [0.6, 0.7], "train_loss": [1.9, 2.0]})
    captured = {}
    real = figures.save_figure

    def keep(fig, out):
        captured["lines"] = [ln for ax in fig.axes for ln in ax.get_lines()]
        return real(fig, out)

    figures.save_figure = keep
    try:
        figures.plot_history(hist, ["model.patch"], tmp_path / "h.png")
    finally:
        figures.save_figure = real
    assert captured["lines"] and all(ln.get_marker() == "o" for ln in captured["lines"])


def test_a_one_seed_bump_is_labelled_untested_not_within_noise(tmp_path):
    """With one seed there is no spread (peak_z NaN): the figure must not call the bump seed noise."""
    import matplotlib.pyplot as plt

    from analysis.figures import plot_double_descent

    curves = descent_curves(curves_frame(ISSUE_TEST, ISSUE_TRAIN, sd=0.01))
    summary = descent_summary(curves).assign(peak_width=32.0, peak_test_error=0.45, peak_significant=False,
                                             peak_z=np.nan)
    labels = []
    orig = plt.Axes.legend
    try:
        def record(self, *a, **k):
            labels.extend(self.get_legend_handles_labels()[1])
            return orig(self, *a, **k)
        plt.Axes.legend = record
        plot_double_descent(curves, summary, tmp_path / "x.png")
    finally:
        plt.Axes.legend = orig
    assert any("untested" in s for s in labels) and not any("within seed noise" in s for s in labels)


def tuning_study(root: Path, storage: str | None = None) -> Path:
    """A 5-trial continuous search as the sweeper leaves it: lr, weight decay and dropout unique per trial,
    trials 3 and 4 pruned after 2 of 3 epochs."""
    draws = [(1e-3, 0.01, 0.10), (3e-4, 0.002, 0.25), (1.27e-4, 0.0016, 0.0061), (1.5e-3, 0.0139, 0.234),
             (5.9e-4, 0.0106, 0.0791)]
    val = [0.79, 0.84, 0.7467, 0.8567, 0.8133]
    for i, ((lr, wd, drop), v) in enumerate(zip(draws, val, strict=True)):
        cfg = config(0)
        cfg["optimizer"] = {"lr": lr, "weight_decay": wd}
        cfg["model"]["dropout"] = drop
        if storage:
            cfg["trial"] = {"storage": storage, "study_name": "tune_vit", "number": i}
        pruned = i >= 3
        write_run(root, i, cfg, summary(0.75, status="stopped" if pruned else "completed", trial_number=i,
                                        objective_name="val_error", objective_direction="minimize",
                                        study_name="tune_vit", objective=v, val_error=v, epochs=2 if pruned else 3,
                                        **({"stop_reason": "pruned"} if pruned else {})))
    return root


def test_continuous_tuned_parameters_are_all_reported(tmp_path):
    """Every float a search sampled is unique per trial, so lr, weight decay and dropout map one-to-one onto
    each other; they are different parameters, not aliases, and each must stay in the report."""
    runs = load_runs(tuning_study(tmp_path / "sweep"), optuna_state=False)
    assert varied_keys(runs) == ["model.dropout", "optimizer.lr", "optimizer.weight_decay"]


def test_a_study_report_lists_every_trial_with_its_objective_and_the_best(tmp_path):
    out = tmp_path / "report"
    make_report([tuning_study(tmp_path / "sweep")], out, n_boot=50)
    text = (out / "report.md").read_text()
    trials = text.split("## Trials", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in trials.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 5  # the pruned trials too
    assert sum("pruned" in r for r in rows) == 2
    assert "0.7467" in trials and "1.27e-04" in trials  # objective and the sampled lr, readable
    assert "Best trial: 2" in trials and "val_error = 0.7467" in trials


def test_a_report_of_runs_that_differ_only_in_their_seed_has_one_row_of_all_seeds(tmp_path):
    """`python -m src.train -m seed=0,1,2` then a report: nothing but the seed varies, so the results are one row over
    the three seeds (the mixed-recipe check of 2026-11-29 grouped by no key and stopped the report)."""
    for i in range(3):
        write_run(tmp_path / "sweep", i, config(i), summary(0.1 * (i + 1)), history(0.1 * (i + 1)))
    assert len(summary_table(load_runs(tmp_path / "sweep"), [])) == 1
    make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=50)
    table = pd.read_csv(tmp_path / "report" / "tables" / "results.csv")
    assert len(table) == 1 and table["n_seeds"].tolist() == [3]
    assert table["test_acc_mean"].tolist() == pytest.approx([0.8])


def test_a_study_whose_runs_predate_the_recorded_direction_names_the_best_by_its_objectives_direction(tmp_path):
    """Summaries written before `objective_direction` was recorded: the best trial of a maximised objective (an
    accuracy) is its highest, by the trainer's own rule for the name (src.run_contract), not the lowest."""
    for i, acc in enumerate([0.2, 0.9, 0.5]):
        cfg = {**config(i), "trial": {"storage": None, "study_name": "acc", "number": i}}
        write_run(tmp_path / "sweep", i, cfg, summary(1 - acc, trial_number=i, study_name="acc",
                                                      objective_name="test_acc", objective=acc))
    make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=50)
    trials = (tmp_path / "report" / "report.md").read_text().split("## Trials", 1)[1].split("\n## ", 1)[0]
    assert "Best trial: 1 (maximize), test_acc = 0.9" in trials, trials


def test_two_studies_of_one_name_in_two_storages_are_listed_apart(tmp_path):
    """Two arms of a comparison (with and without a pruner) often share a study name, each in its own storage."""
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"  # storages that do not exist: no state
    tuning_study(tmp_path / "sweep" / "a", storage=a)
    tuning_study(tmp_path / "sweep" / "b", storage=b)
    with pytest.warns(UserWarning) as caught:
        make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=50)
    messages = " | ".join(str(w.message) for w in caught)
    assert "cannot open Optuna study" in messages  # the storages do not exist
    assert "repeat a seed" in messages  # the arms drew the same configurations: one seed each in the results table
    text = (tmp_path / "report" / "report.md").read_text().split("## Trials", 1)[1].split("\n## ", 1)[0]
    assert text.count("Best trial: 2") == 2 and a in text and b in text


def test_history_legend_shows_floats_readably():
    from analysis.figures import group_label

    assert group_label(["model.dropout", "model.patch"], (0.1150324556477333, 4)) == "dropout=0.115, patch=4"


def test_a_seed_run_twice_counts_as_one_seed(tmp_path):
    """The same grid passed in two folders (a rerun beside the first run) repeats every (config, seed): the
    repeats are averaged per seed, never counted as extra seeds that shrink the spread."""
    double_descent_sweep(tmp_path / "a", seeds=2)
    double_descent_sweep(tmp_path / "b", seeds=2)
    runs = load_runs([tmp_path / "a", tmp_path / "b"])
    with pytest.warns(UserWarning, match="repeat a seed"):
        curves = descent_curves(runs)
    assert (curves["n_seeds"] == 2).all()
    with pytest.warns(UserWarning, match="repeat a seed"):
        table = summary_table(runs, ["model.dim", "label_noise.p"])
    assert (table["n_seeds"] == 2).all()


def test_reading_runs_never_creates_a_storage_file(tmp_path):
    """A run's trial.storage can name an SQLite file that is gone (moved, or relative to another cwd): reading the
    runs warns and leaves no empty database behind."""
    missing = tmp_path / "elsewhere" / "optuna.db"
    missing.parent.mkdir()
    tuning_study(tmp_path / "sweep", storage=f"sqlite:///{missing}")
    with pytest.warns(UserWarning, match="no such file"):
        runs = load_runs(tmp_path / "sweep")
    assert not missing.exists() and runs["optuna_state"].isna().all()


def test_a_key_set_from_another_by_a_preset_is_an_alias_not_a_second_width(tmp_path):
    """double_descent_vit sets model.mlp_dim = 2 x model.dim: taken as a second compared key it split every width
    into its own curve, and the report found no threshold and no peak while looking complete."""
    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    for cfg_path in root.glob("*/.hydra/config.yaml"):
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["model"]["mlp_dim"] = 2 * cfg["model"]["dim"]
        cfg_path.write_text(yaml.safe_dump(cfg))
    runs = load_runs(root)
    assert sorted(varied_keys(runs)) == ["label_noise.p", "model.dim"]
    files = make_report([root], tmp_path / "report", n_boot=50)
    summ = pd.read_csv(next(p for p in files if p.name == "double_descent_summary.csv")).set_index("label_noise.p")
    assert summ.loc[0.2, "peak_width"] == 32


def test_runs_without_a_seed_are_never_merged_as_repeats():
    frame = pd.DataFrame({"w": [1, 1, 1, 1], "seed": [np.nan, np.nan, 0, 0], "test_error": [0.1, 0.3, 0.2, 0.4]})
    with pytest.warns(UserWarning, match="repeat a seed"):
        out = one_run_per_seed(frame, ["w"], ["test_error"], "t")
    assert sorted(out["test_error"]) == pytest.approx([0.1, 0.3, 0.3])  # the two seed-0 runs averaged, the rest kept


def test_trial_states_are_read_from_a_journal_file_storage_and_a_missing_one_is_not_created(tmp_path):
    """The sweeper's storages include Optuna's journal file (`journal:///abs/path.log`): analysis opens every URL
    the sweeper writes into trial.storage, and never creates the file it reads."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    log = tmp_path / "optuna.log"
    study = optuna.create_study(study_name="tune_vit",
                                storage=optuna.storages.JournalStorage(JournalFileBackend(str(log))))
    for i in range(5):
        trial = study.ask()
        study.tell(trial, state=optuna.trial.TrialState.PRUNED) if i >= 3 else study.tell(trial, 0.5)
    runs = load_runs(tuning_study(tmp_path / "sweep", storage=f"journal://{log}"))
    assert runs.sort_values("trial_number")["optuna_state"].tolist() == ["COMPLETE"] * 3 + ["PRUNED"] * 2
    missing = tmp_path / "gone.log"
    tuning_study(tmp_path / "sweep2", storage=f"journal://{missing}")
    with pytest.warns(UserWarning, match="no such file"):
        load_runs(tmp_path / "sweep2")
    assert not missing.exists()


def test_runs_that_differ_in_a_stop_rule_are_never_averaged_as_seeds(tmp_path):
    """`trainer.max_epochs=1,6` with one seed: two settings, not two repeats of one (the report averaged 14% and 44%
    accuracy into one row labelled "seeds 1")."""
    for i, (epochs, err) in enumerate([(1, 0.858), (6, 0.556)]):
        cfg = config(0)
        cfg["trainer"] = {"max_epochs": epochs, "max_steps": None}
        write_run(tmp_path / "sweep", i, cfg, summary(err, epochs=epochs), history(err, epochs))
    runs = load_runs(tmp_path / "sweep")
    assert varied_keys(runs) == ["trainer.max_epochs"]
    files = make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=20)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "repeats of one config" not in text and "Varied keys: `trainer.max_epochs`" in text
    table = pd.read_csv(next(p for p in files if p.name == "results.csv"))
    assert table["test_acc_mean"].tolist() == pytest.approx([0.142, 0.444]) and (table["n_seeds"] == 1).all()


def test_a_stop_rule_set_from_another_varied_key_is_named_not_a_second_axis(tmp_path):
    """max_steps scaled with n_train (one value per size) adds no setting of its own: the learning curve stays one
    curve, and the report says which key it follows."""
    for i, n in enumerate([100, 200, 400, 800]):
        cfg = config(0, n_train=n)
        cfg["trainer"] = {"max_steps": 10 * n, "max_epochs": None}
        write_run(tmp_path / "sweep", i, cfg, summary(0.5 * (n / 100) ** -0.5, n_train=n))
    runs = load_runs(tmp_path / "sweep")
    assert varied_keys(runs) == ["dataset.n_train"]
    make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=20)
    assert "`trainer.max_steps` varies with `dataset.n_train`" in (tmp_path / "report" / "report.md").read_text()


def _mark_stalled(root: Path, width: int, p: float, old: bool, test_error: float = 0.9) -> int:
    """Turn the runs of one (width, noise) into stalled ones: written before the contract (failed, objective NaN)
    or after it (a completed result with ``stalled: true``). Returns how many runs were changed."""
    n = 0
    for run in sorted(root.iterdir()):
        cfg = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
        if cfg["model"]["dim"] != width or cfg["label_noise"]["p"] != p:
            continue
        s = json.loads((run / "summary.json").read_text())
        s.update(stop_reason="stalled", test_error=test_error, test_acc=1 - test_error, train_error=0.89,
                 **({"status": "failed", "objective": float("nan"), "error": "stalled: ..."} if old
                    else {"status": "completed", "stalled": True, "objective": test_error}))
        (run / "summary.json").write_text(json.dumps(s))
        n += 1
    return n


@pytest.mark.parametrize("old", [True, False], ids=["before-contract", "after-contract"])
def test_a_stalled_run_stays_in_the_descent_curves_with_its_flag(tmp_path, old):
    """A run stuck at chance is a result: dropping it biased the under-parametrised end of the curve downwards."""
    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    assert _mark_stalled(root, 2, 0.2, old) == 2
    runs = load_runs(root)
    assert runs["stalled"].sum() == 2 and (runs.loc[runs["stalled"], "status"] == "completed").all()
    curves = descent_curves(runs).set_index(["label_noise.p", "model.dim"])
    assert curves.loc[(0.2, 2), "n_seeds"] == 2 and curves.loc[(0.2, 2), "n_stalled"] == 2
    assert curves.loc[(0.2, 2), "test_mean"] == pytest.approx(0.9)
    assert curves["n_stalled"].sum() == 2
    files = make_report([root], tmp_path / "report", n_boot=20)
    names = {p.name for p in files}
    assert {"double_descent.png", "double_descent_without_stalled.png"} <= names
    results = pd.read_csv(next(p for p in files if p.name == "results.csv"))
    assert results["n_stalled"].sum() == 2 and results["n_seeds"].sum() == len(runs)
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Failed runs" not in text and "stalled" in text


def test_a_run_that_ends_at_chance_after_the_epoch_cap_is_flagged_stalled(tmp_path):
    """Found in double_descent_cnn_cifar10: C1 = 4 at 0% noise learned (best test error 60%), then
    collapsed to chance and, its train error flickering in the third decimal, ran to the epoch cap: stop_reason
    max_epochs, `stalled: false`, test error 90%, a spike in the descent curve that looks like a peak."""
    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    run = sorted(root.iterdir())[0]
    s = json.loads((run / "summary.json").read_text())
    s.update(stop_reason="max_epochs", stalled=False, chance_train_error=0.8926, train_error=0.894, test_error=0.8995)
    (run / "summary.json").write_text(json.dumps(s))
    near = sorted(root.iterdir())[1]  # 2 points above chance: a model that learned a little, not flagged
    s = json.loads((near / "summary.json").read_text())
    s.update(chance_train_error=0.8926, train_error=0.87)
    (near / "summary.json").write_text(json.dumps(s))
    rows = [{**json.loads(line), "train_error": 0.87} for line in (near / "metrics.jsonl").read_text().splitlines()]
    (near / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # it never got lower
    runs = load_runs(root).set_index("run_dir")
    assert runs.loc[str(run), "stalled"] and runs.loc[str(run), "status"] == "completed"
    assert not runs.loc[str(near), "stalled"] and runs["stalled"].sum() == 1


def test_diverged_runs_stay_failures_listed_by_configuration(tmp_path):
    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    for run in sorted(root.iterdir())[:2]:  # width 2, noise 0, both seeds
        s = json.loads((run / "summary.json").read_text())
        s.update(status="failed", stop_reason="nonfinite_loss", objective=float("nan"), error="loss is nan")
        (run / "summary.json").write_text(json.dumps(s))
    files = make_report([root], tmp_path / "report", n_boot=20)
    curves = pd.read_csv(next(p for p in files if p.name == "double_descent_curves.csv"))
    assert not ((curves["model.dim"] == 2) & (curves["label_noise.p"] == 0.0)).any()
    failed = pd.read_csv(next(p for p in files if p.name == "failed_runs.csv"))
    assert failed.to_dict("records") == [{"model.dim": 2, "label_noise.p": 0.0, "stop_reason": "nonfinite_loss",
                                          "runs": 2, "seeds": "0, 1", "run dirs": "0, 1", "error": "loss is nan"}]
    assert "## Failed runs" in (tmp_path / "report" / "report.md").read_text()


def test_learning_curve_points_are_geometric_means_on_the_planted_line(tmp_path, monkeypatch):
    """The fit uses the geometric mean over seeds; the figure must draw the same points (arithmetic means of
    multiplicative noise sit above the line by exp(sigma^2 / 2): 4.6% here)."""
    from analysis import figures

    a, alpha, sizes = 2.0, -0.5, SIZES[:5]
    for i, n in enumerate(sizes):
        for s, z in enumerate((-0.3, 0.3)):  # log-noise with mean 0 at every size: the geometric mean is planted
            err = a * n**alpha * np.exp(z)
            write_run(tmp_path / "sweep", 2 * i + s, config(s, n_train=n), summary(err, n_train=n, seed=s))
    runs = load_runs(tmp_path / "sweep")
    fits = fit_learning_curve(runs, by=[], n_boot=0)
    drawn = {}

    def keep(fig, out):
        drawn["fig"] = fig
        return Path(out)

    monkeypatch.setattr(figures, "save_figure", keep)
    figures.plot_learning_curves(runs, fits, tmp_path / "lc.png")
    container = drawn["fig"].axes[0].containers[0]
    x, y = container.lines[0].get_data()
    assert np.allclose(y, a * np.asarray(x, float) ** alpha, rtol=0.01)
    bars = container.lines[2][0].get_segments()  # the error bars: +- one log-space std, asymmetric in y
    lo, hi = np.array([seg[0][1] for seg in bars]), np.array([seg[1][1] for seg in bars])
    assert np.allclose(hi / y, np.exp(0.3 * np.sqrt(2)), rtol=1e-6) and np.allclose(y / lo, hi / y)


def test_low_lr_stops_are_counted_and_named(tmp_path):
    for i, w in enumerate([8, 8, 16, 16]):
        low = i == 1
        write_run(tmp_path / "sweep", i, config(i % 2, width=w),
                  summary(0.2, stop_reason="converged", low_lr_stop=low, lr_at_stop=1e-5 if low else 1e-3,
                          base_lr=1e-3, stalled=False))
    files = make_report([tmp_path / "sweep"], tmp_path / "report", n_boot=20)
    table = pd.read_csv(next(p for p in files if p.name == "results.csv")).set_index("model.dim")
    assert table["n_low_lr_stop"].to_dict() == {8: 1, 16: 0}
    text = (tmp_path / "report" / "report.md").read_text()
    assert "1 run stopped (converged or stalled) with its lr below 10% of its base" in text
    assert str(tmp_path / "sweep" / "1") in text


def test_by_epoch_tables_test_error_per_width_and_noise_at_each_epoch(tmp_path):
    from analysis.by_epoch import by_epoch

    double_descent_sweep(tmp_path)
    table, md = by_epoch(tmp_path, [1, 3])
    assert set(table["epoch"]) == {1, 3} and (table["seeds"] == 3).all()
    row = table[(table["epoch"] == 3) & (table["label_noise.p"] == 0.2) & (table["model.dim"] == 32)].iloc[0]
    assert row["mean"] == pytest.approx(0.45 * (1 + 1 / 3))  # the planted peak, as history() scores epoch 3
    assert md.count("**epoch") == 2 and "| p | model.dim 2 |" in md and "| 0.2 |" in md


def test_a_peak_made_of_runs_stuck_at_chance_is_not_a_significant_double_descent_peak():
    """Found in the CIFAR-10 study: at 0% noise both C1 = 4 runs collapsed to chance (test error 90%)
    between learned widths at 72% and 62%; the report called that a significant peak (z = 14.8) at the threshold.
    A model that never fit its training set is a failed training, not the interpolation peak: the peak is shown
    with its stalled seeds counted and is not called significant."""
    stuck = [0.60, 0.62, 0.50, 0.90, 0.45, 0.35, 0.30]
    frame = curves_frame(stuck, [0.5, 0.45, 0.3, 0.9, 0.0, 0.0, 0.0], sd=0.01)
    frame["stalled"] = frame["model.width"] == 8
    summ = descent_summary(descent_curves(frame)).iloc[0]
    assert summ["peak_width"] == 8 and summ["peak_stalled_seeds"] == 3
    assert summ["peak_z"] > 10 and not summ["peak_significant"]
    learned = descent_summary(descent_curves(frame.assign(stalled=False))).iloc[0]
    assert learned["peak_stalled_seeds"] == 0 and learned["peak_significant"]


def test_the_trials_table_names_a_run_that_ended_at_chance_after_its_epoch_cap(tmp_path):
    """The CIFAR-10 report listed two C1 = 4 / 8 runs that collapsed and ran to the epoch cap as plain
    `completed` while its curves counted them stalled."""
    root = tuning_study(tmp_path / "sweep")
    data = json.loads((root / "1" / "summary.json").read_text())
    data.update(train_error=0.897, chance_train_error=0.9, stop_reason="max_epochs")
    (root / "1" / "summary.json").write_text(json.dumps(data))
    make_report([root], tmp_path / "report", n_boot=50)
    trials = (tmp_path / "report" / "report.md").read_text().split("## Trials", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in trials.splitlines() if line.startswith("| 1 |")]
    assert "completed (stalled: at chance at max_epochs)" in row, row


def test_a_run_that_learned_then_collapsed_is_flagged_like_one_stuck_at_chance(tmp_path):
    """Found in the CIFAR-10 study: C1 = 3 and 6 runs reached 3-6% train error, then collapsed and
    ended at 87% (chance 90%, so outside the 1-point stall margin) with test error 89%; left unflagged, the curves
    without stalled runs showed them as "significant peaks" (z = 9.0 and 6.4). A run whose train error ended far
    above the lowest it reached did not end as a learned model; an unstable run that still learned is kept plain."""
    def run(num, width, errors):
        hist = [{"epoch": e + 1, "step": e + 1, "train_error": err, "test_error": 0.6} for e, err in enumerate(errors)]
        write_run(tmp_path, num, config(0, width=width), summary(0.88, train_error=errors[-1],
                                                                 chance_train_error=0.9), hist)

    run(0, 8, [0.8, 0.3, 0.05, 0.4, 0.87])  # collapsed: 82 points above its best, 3 below chance
    run(1, 16, [0.8, 0.3, 0.13, 0.2, 0.45])  # unstable, but still a learned model
    runs = load_runs(tmp_path).set_index("model.dim")
    assert runs.loc[8, "collapsed"] and runs.loc[8, "stalled"] and runs.loc[8, "min_train_error"] == 0.05
    assert not runs.loc[16, "collapsed"] and not runs.loc[16, "stalled"]


def test_the_chance_flags_skip_runs_that_did_not_finish_and_sets_where_one_class_is_a_majority(tmp_path):
    """Review findings: a pruned trial at chance was turned into a completed, stalled result (into the curves), and
    on a 2%-positive binary set every weighted run (train error >= 0.011) was called stalled."""
    write_run(tmp_path, 0, config(0, width=8), summary(0.9, train_error=0.899, chance_train_error=0.9,
                                                       status="stopped", stop_reason="pruned"), history(0.9))
    write_run(tmp_path, 1, config(0, width=16), summary(0.1, train_error=0.3, chance_train_error=0.02),
              [{"epoch": 1, "step": 1, "train_error": 0.02, "test_error": 0.05},
               {"epoch": 2, "step": 2, "train_error": 0.6, "test_error": 0.1}])
    runs = load_runs(tmp_path).set_index("model.dim")
    assert runs.loc[8, "status"] == "stopped" and not runs.loc[8, "stalled"]
    assert not runs.loc[16, "stalled"] and not runs.loc[16, "collapsed"]


def test_a_moved_sweep_folder_finds_its_optuna_storage_beside_its_runs(tmp_path):
    """A study's committed state/ (or a sweep dir copied to another machine) records its storage at the path it had
    when it ran; the trials' Optuna states were lost from the report once that path was gone."""
    import optuna

    sweep = tuning_study(tmp_path / "sweep", storage=f"sqlite:///{tmp_path}/gone/optuna.db")
    study = optuna.create_study(study_name="tune_vit", storage=f"sqlite:///{sweep}/optuna.db")
    for v in (0.79, 0.84, 0.7467):
        study.add_trial(optuna.trial.create_trial(value=v))
    for _ in range(2):
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED))
    runs = load_runs(sweep).sort_values("trial_number")
    assert list(runs["optuna_state"]) == ["COMPLETE"] * 3 + ["PRUNED"] * 2
    assert not (tmp_path / "gone").exists()  # reading never creates the recorded path


def test_the_double_descent_figure_draws_every_seed_and_no_band_below_zero(tmp_path, monkeypatch):
    from analysis.figures import plot_double_descent

    runs = load_runs(double_descent_sweep(tmp_path / "runs"))
    runs.loc[runs.index[:3], "train_error"] = [0.0, 0.3, 0.0]  # mean 0.1, sd 0.17: mean - sd < 0
    curves = descent_curves(runs)
    kept = captured_figure(monkeypatch)
    plot_double_descent(curves, descent_summary(curves), tmp_path / "dd.png", runs=runs)
    train_ax, test_ax = kept["fig"].axes
    for ax in (train_ax, test_ax):
        seeds = [line for line in ax.get_lines() if line.get_label().startswith("_seeds")]
        assert sum(len(line.get_xdata()) for line in seeds) == len(runs)  # one point per run
        for band in ax.collections:
            for path in band.get_paths():
                assert path.vertices[:, 1].min() >= -1e-9  # an error rate never goes below 0


def test_an_offset_fit_whose_floor_misses_its_points_is_flagged_and_not_drawn_as_a_result(tmp_path, monkeypatch):
    from analysis.figures import plot_learning_curves

    runs = load_runs(power_law_sweep(tmp_path / "ok", a=3.0, c=0.05, noise=0.02, rng=1))
    assert fit_learning_curve(runs, offset=True, n_boot=50).iloc[0]["offset_ok"]
    fit = fit_learning_curve(runs, offset=True, n_boot=50)
    fit.loc[0, "offset"] = 10 * runs["test_error"].min()  # a floor above a measured point
    from analysis.fit_offset import check_offset
    checked = check_offset(fit, runs)
    assert not checked.iloc[0]["offset_ok"] and "floor" in checked.iloc[0]["offset_note"]
    checked.attrs.update(fit.attrs)
    kept = captured_figure(monkeypatch)
    plot_learning_curves(runs, checked, tmp_path / "lc.png")
    labels = [line.get_label() for line in kept["fig"].axes[0].get_lines()]
    assert any("offset model rejected" in s for s in labels)
    assert not any(s.startswith("fit: offset model α") for s in labels)


def test_a_power_law_that_misses_its_points_is_drawn_dashed_and_labelled_curved(tmp_path, monkeypatch):
    from analysis.figures import plot_learning_curves

    runs = load_runs(power_law_sweep(tmp_path / "bent", a=3.0, alpha=-0.7, c=0.04, noise=0.02, rng=1))
    fits = fit_learning_curve(runs, n_boot=0)
    assert fits.iloc[0]["curved"]
    kept = captured_figure(monkeypatch)
    plot_learning_curves(runs, fits, tmp_path / "lc.png")
    (line,) = [ln for ln in kept["fig"].axes[0].get_lines() if ln.get_label().startswith("fit: α")]
    assert "curved" in line.get_label() and "off the line" in line.get_label() and line.get_linestyle() == "--"


def _precision_sweep(root: Path, plan: dict[int, list[tuple[str, str]]]) -> Path:
    """Runs of two settings (``model.patch``), each seed with the (precision, device) its summary records."""
    num = 0
    for patch, runs in plan.items():
        for s, (precision, device) in enumerate(runs):
            write_run(root, num, config(s, patch=patch), summary(0.1 + 0.01 * s, seed=s, precision=precision,
                                                                 device=device))
            num += 1
    return root


def test_a_report_names_the_precision_and_device_its_compared_settings_trained_at(tmp_path):
    """`trainer.precision=auto` times fp32 and bf16 for each model on the machine, so two compared settings can
    train at two precisions while both configs say `auto` (heads_depth's main run: 23 of 24 h1_d1 runs at bf16,
    21 of 24 h4_d1 runs at fp32). No config column shows it, so the report reads the summaries and says so; a mix
    of devices (cuda:0 and cpu) likewise."""
    _precision_sweep(tmp_path / "mixed", {4: [("bf16", "cpu")] * 3,
                                          8: [("fp32", "cpu"), ("fp32", "cuda:0"), ("bf16", "cuda:1")]})
    make_report([tmp_path / "mixed"], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "the compared settings differ in the precision or device they trained at" in text
    table = pd.read_csv(tmp_path / "out" / "tables" / "execution.csv")
    assert table[["model.patch", "precision", "device"]].values.tolist() == [
        [4, "bf16 3", "cpu 3"], [8, "fp32 2, bf16 1", "cuda 2, cpu 1"]]

    _precision_sweep(tmp_path / "one", {4: [("bf16", "cpu")] * 2, 8: [("bf16", "cpu")] * 2})
    make_report([tmp_path / "one"], tmp_path / "out1")
    text = (tmp_path / "out1" / "report.md").read_text()
    assert "Every completed run trained at bf16 on cpu" in text and "differ in the precision" not in text
    assert not (tmp_path / "out1" / "tables" / "execution.csv").exists()


def test_the_fit_table_counts_the_seeds_its_alpha_interval_rests_on(tmp_path):
    """``n_seeds`` is the fewest seeds at any size; the t-interval uses only the seeds with a run at every size.
    With seed 0 missing at the smallest size and seed 1 at the largest, 4 seeds give n_seeds 3 but an interval over 2
    (1 dof): ``n_seeds_ci`` says so in the table, not only in a warning."""
    power_law_sweep(tmp_path, seeds=4, sizes=[256, 512, 1024, 2048])
    for run in tmp_path.iterdir():
        s = json.loads((run / "summary.json").read_text())
        if (s["seed"], s["n_train"]) in ((0, 256), (1, 2048)):
            (run / "summary.json").write_text(json.dumps({**s, "status": "failed"}))
    with pytest.warns(UserWarning, match="seeds 0, 1 lack a run"):
        fits = fit_learning_curve(load_runs([tmp_path]), x="n_train")
    assert fits.loc[0, "n_seeds"] == 3 and fits.loc[0, "n_seeds_ci"] == 2


def test_history_rows_carry_their_runs_flags_not_flags_of_each_epoch(tmp_path):
    """A run that learned from chance: its first epochs' train error sits at chance, but the run is no stalled or
    collapsed result. load_history computed the flags from each epoch's train error, so those rows said stalled."""
    rows = [{"epoch": e, "step": 10 * e, "wall_s": 1.0 * e, "lr": 1e-3, "train_loss": 1.0, "train_error": err,
             "test_error": err} for e, err in enumerate([0.9, 0.9, 0.3, 0.0], start=1)]
    write_run(tmp_path, 0, config(0), summary(0.1, seed=0, chance_train_error=0.9, stalled=False,
                                              best_train_error=0.0), rows)
    hist = load_history([tmp_path])
    assert len(hist) == 4 and not hist["stalled"].any() and not hist["collapsed"].any()


def test_a_precision_that_is_a_compared_setting_is_not_a_confound_and_may_be_grouped_by(tmp_path):
    """A sweep over `trainer.precision` (heads_depth's precision check) compares precisions on purpose: no warning
    when each setting trained at the one it pinned; and `--by precision` (the summary's column) writes the report."""
    num = 0
    for prec in ("bf16", "fp32"):
        for s in range(2):
            cfg = {**config(s), "trainer": {"max_epochs": 3, "precision": prec}}
            write_run(tmp_path / "s", num, cfg, summary(0.1 + 0.01 * s, seed=s, precision=prec, device="cpu"))
            num += 1
    make_report([tmp_path / "s"], tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Precision and device" in text and "Warning" not in text
    make_report([tmp_path / "s"], tmp_path / "out2", by=["precision"])
    assert (tmp_path / "out2" / "report.md").exists()


def test_tables_count_the_runs_that_ended_at_their_cap_under_a_convergence_rule(tmp_path):
    """A study stopped by convergence (trainer.converge_epochs) with an epoch cap: a run that reached the cap has not
    converged, and its error is that of a shorter training than its neighbours'. The tables and descent curves count
    such seeds (n_capped), as they count stalled ones; a study without a convergence rule gets no such column."""
    num = 0
    for width in (8, 16):
        for s in range(3):
            cfg = {**config(s, width=width, noise=0.2),
                   "trainer": {"max_epochs": 500, "converge_epochs": 20, "converge_tol": 0.0}}
            reason = "max_epochs" if (width, s) in ((16, 0), (16, 2)) else "converged"
            write_run(tmp_path / "s", num, cfg, {**summary(0.2, seed=s), "stop_reason": reason})
            num += 1
    runs = load_runs([tmp_path / "s"])
    table = summary_table(runs, ["model.dim"])
    assert table["n_capped"].tolist() == [0, 2]
    assert "at the cap" in format_table(table).columns
    assert descent_curves(runs, width="model.dim")["n_capped"].tolist() == [0, 2]
    plain = tmp_path / "plain"
    write_run(plain, 0, config(0), summary(0.2, seed=0))
    assert "capped" not in load_runs([plain]).columns


def test_a_running_job_does_not_drop_the_whole_training_set_size_from_the_report_fit(tmp_path):
    """A job with no summary.json yet has no `n_train`; the fit's x must still be the images trained on, so the
    size whose config says `n_train: null` (the whole set) stays in the fit (review of 2026-11-29, F1)."""
    rng = np.random.default_rng(0)
    num = 0
    for n in (500, 1000, 2000, None):
        for s in range(3):
            images = 8000 if n is None else n
            err = 2 * images**-0.5 * np.exp(0.02 * rng.standard_normal())
            write_run(tmp_path / "sweep", num, config(s, n_train=n), summary(err, n_train=images, seed=s), history(err))
            num += 1
    reference = make_report([tmp_path / "sweep"], tmp_path / "before", n_boot=0)
    write_run(tmp_path / "sweep", num, config(3, n_train=500), None, history(0.3, epochs=1))  # still running
    files = make_report([tmp_path / "sweep"], tmp_path / "after", n_boot=0)
    [before] = [pd.read_csv(p) for p in reference if p.name == "learning_curve_fits.csv"]
    [after] = [pd.read_csv(p) for p in files if p.name == "learning_curve_fits.csv"]
    assert after.loc[0, "x_max"] == 8000 and after.loc[0, "n_points"] == 4
    assert after.loc[0, "alpha"] == pytest.approx(before.loc[0, "alpha"])


def test_fit_learning_curve_warns_when_completed_runs_have_no_size():
    df = pd.DataFrame({"dataset.n_train": [100, 200, 400, None] * 2, "seed": [0] * 4 + [1] * 4,
                       "test_error": [0.3, 0.2, 0.15, 0.05] * 2, "status": "completed"})
    with pytest.warns(UserWarning, match="2 completed runs have no dataset.n_train"):
        fit_learning_curve(df, n_boot=0)


def test_fit_learning_curve_warns_when_completed_runs_have_no_test_error_and_names_a_size_that_drops_out():
    """Review 2026-12 (F2): completed runs without the fitted metric were dropped without a word; when every seed at a
    size lacked it, the size left the curve unseen. Both are named, as the runs without a size are."""
    df = pd.DataFrame({"dataset.n_train": [100, 200, 400, 800] * 3, "seed": np.repeat([0, 1, 2], 4),
                       "test_error": np.array([0.3, 0.2, 0.15, 0.1] * 3) * np.exp(
                           0.05 * np.random.default_rng(0).standard_normal(12)), "status": "completed"})
    df.loc[df["dataset.n_train"] == 800, "test_error"] = np.nan
    df.loc[(df["dataset.n_train"] == 200) & (df["seed"] == 1), "test_error"] = np.nan
    with pytest.warns(UserWarning, match=r"4 completed runs have no test_error .*: 200 \(1 of 3 runs\), 800 \(3 of 3\)"
                      r"; dataset.n_train = 800 loses every run and drops out of the fit"):
        fit = fit_learning_curve(df, n_boot=0).iloc[0]
    assert fit["x_max"] == 400 and fit["n_points"] == 3
    with pytest.warns(UserWarning, match="8 completed runs have no test_error"):
        slope_difference(pd.concat([df.assign(arch="a"), df.assign(arch="b")]), "arch", "a", "b")


def _two_models(rng: int = 1) -> pd.DataFrame:
    g = np.random.default_rng(rng)
    return pd.DataFrame([{"arch": arch, "dataset.n_train": n, "seed": s, "status": "completed",
                          "test_error": (a * n**-0.5 + c) * np.exp(0.01 * g.standard_normal())}
                         for arch, a, c in (("A", 3, 0.20), ("B", 1, 0.0))
                         for n in (100, 200, 400, 800, 1600, 3200) for s in range(4)])


def test_check_offset_on_fits_read_back_from_a_table_judges_each_group_by_its_own_runs(tmp_path):
    """A table read back from CSV has no attrs: check_offset pooled every group's runs and flagged model A's real
    floor as "above the measured mean" of A and B together (review of 2026-11-29, F2)."""
    from analysis.fit_offset import check_offset

    runs = _two_models()
    fits = fit_learning_curve(runs, by="arch", offset=True, n_boot=20)
    assert fits.set_index("arch").loc["A", "offset_ok"]
    fits.to_csv(tmp_path / "fits.csv", index=False)
    back = pd.read_csv(tmp_path / "fits.csv")
    with pytest.raises(ValueError, match="pass x, y and by"):
        check_offset(back, runs)
    checked = check_offset(back, runs, x="dataset.n_train", y="test_error", by=["arch"])
    assert checked["offset_ok"].tolist() == fits["offset_ok"].tolist()
    assert checked["offset_note"].fillna("").tolist() == fits["offset_note"].fillna("").tolist()


def test_curve_points_leave_out_runs_that_did_not_complete_like_the_fit():
    from analysis.fits import curve_points

    rows = [{"dataset.n_train": n, "seed": s, "status": "completed", "test_error": 1 / np.sqrt(n)}
            for n in (100, 400, 1600) for s in range(3)]
    rows.append({"dataset.n_train": 1600, "seed": 3, "status": "stopped", "test_error": 0.5})
    pts = curve_points(pd.DataFrame(rows), "dataset.n_train", "test_error", []).set_index("dataset.n_train")
    assert pts.loc[1600, "n_seeds"] == 3 and pts.loc[1600, "gmean"] == pytest.approx(0.025)


def test_a_width_with_no_scored_run_is_neither_the_best_width_nor_a_crash():
    """Every run at one width lacks a test error: descent_summary named it the best width (NaN error) or divided by
    zero seeds (review of 2026-11-29, F8)."""
    widths = [1, 2, 4, 8, 16, 32, 64]
    rows = []
    for w in widths:
        for s in range(3):
            test = {1: 0.5, 2: 0.4, 4: 0.35, 8: 0.45, 16: 0.3, 32: 0.25, 64: np.nan}[w] + 0.002 * s
            rows.append({"model.width": w, "seed": s, "label_noise.p": 0.2, "status": "completed",
                         "train_error": 0.0 if w >= 8 else 0.2, "test_error": test})
    curves = descent_curves(pd.DataFrame(rows), width="model.width")
    out = descent_summary(curves).iloc[0]
    assert out["best_width"] == 32 and out["best_test_error"] == pytest.approx(0.252)
    assert out["peak_width"] == 8 and np.isfinite(out["peak_z"])


def test_summary_table_counts_the_seeds_that_hold_each_metric():
    df = pd.DataFrame({"arch": "vit", "seed": range(4), "status": "completed",
                       "test_acc": [0.9, 0.92, 0.91, np.nan], "wall_s": [1.0, 2.0, 3.0, 4.0]})
    table = summary_table(df, by="arch", metrics=["test_acc", "wall_s"])
    assert table.loc[0, "n_seeds"] == 4 and table.loc[0, "test_acc_count"] == 3
    shown = format_table(table)
    assert "(3 of 4 seeds)" in shown.filter(like="acc").iloc[0, 0]
    assert "of 4" not in shown.filter(like="wall").iloc[0, 0]


def _sweep_with_storage(root: Path, name: str, done: int, running: int, err: float):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True)
    storage = f"sqlite:///{root / 'study.db'}"
    study = optuna.create_study(study_name=name, storage=storage)
    for i in range(done + running):
        trial = study.ask()
        s = summary(err + i / 100, study_name=name, trial_number=trial.number, study_storage=storage)
        run = write_run(root, i, config(i), s if i < done else None)
        if i < done:
            trial.set_user_attr("run_dir", str(run))
            study.tell(trial, err + i / 100)
    return storage, study


def test_load_study_gives_a_retried_run_to_the_trial_that_reported_it_only(tmp_path):
    """A retry runs in its failed trial's run dir: the FAIL trial was joined to the retry's result too, and one run
    on disk became two completed rows (review 2026-11-29, F1)."""
    from optuna.trial import TrialState, create_trial

    storage, study = _sweep_with_storage(tmp_path / "sweep", "r", 0, 0, 0.1)
    for with_attr in (True, False):
        first = study.ask()
        run = write_run(tmp_path / "sweep", first.number, config(0),
                        summary(0.1, study_name="r", trial_number=first.number, study_storage=storage))
        if with_attr:
            first.set_user_attr("run_dir", str(run))
        study.tell(first, state=TrialState.FAIL)
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.1,
                                     user_attrs={"retry_of": first.number, "run_dir": str(run)}))
    t = load_study(storage, "r", paths=tmp_path / "sweep")
    assert list(t["state"]) == ["FAIL", "COMPLETE", "FAIL", "COMPLETE"]
    assert t["runs_status"].isna().tolist() == [True, False, True, False]


def test_load_study_joins_by_trial_number_within_its_own_storage(tmp_path):
    """Two sweeps of one study name, each with its own storage, read from their parent folder: a RUNNING trial with no
    run_dir attribute was joined to the other sweep's run of its number (review 2026-11-29, F2)."""
    a, _ = _sweep_with_storage(tmp_path / "A", "s", 1, 1, 0.5)
    _sweep_with_storage(tmp_path / "B", "s", 2, 0, 0.1)
    t = load_study(a, "s", paths=tmp_path).set_index("number")
    assert t.loc[0, "runs_test_error"] == pytest.approx(0.5)
    assert t.loc[1, "state"] == "RUNNING" and pd.isna(t.loc[1, "runs_status"])  # its run has no summary yet


def test_load_study_falls_back_to_the_trial_number_when_a_run_dir_attribute_is_stale(tmp_path):
    """The sweep folder moved (or records read from another cwd): every trial's run_dir attribute names a folder no
    longer there, and every result came back NaN without a word (review 2026-11-29, F3)."""
    import shutil

    storage, _ = _sweep_with_storage(tmp_path / "old", "s", 3, 0, 0.1)
    shutil.move(tmp_path / "old", tmp_path / "new")
    moved = f"sqlite:///{tmp_path / 'new' / 'study.db'}"
    t = load_study(moved, "s", paths=tmp_path / "new")
    assert list(t["runs_test_error"]) == pytest.approx([0.1, 0.11, 0.12])


def test_a_fixed_budget_run_with_the_convergence_rule_at_0_is_not_capped(tmp_path):
    """converge_epochs 0 is the rule off (the trainer and analysis.design read it so); `capped` took it for a rule
    and counted every fixed-budget run as one that did not converge (review 2026-11-29, F5)."""
    from analysis.load import result_flags

    df = pd.DataFrame({"status": "completed", "stop_reason": "max_epochs", "trainer.converge_epochs": [0, None, 20]})
    assert result_flags(df)["capped"].tolist() == [False, False, True]


def test_a_killed_run_with_no_summary_shows_its_trials_state(tmp_path):
    """A job killed before its summary: the run read 'running' with no Optuna state forever, though its trial was told
    FAIL and its Hydra record names the trial (review 2026-11-29, F4)."""
    from optuna.trial import TrialState

    storage, study = _sweep_with_storage(tmp_path / "sweep", "k", 1, 0, 0.1)
    trial = study.ask()
    run = write_run(tmp_path / "sweep", 1, config(1), None, history(0.3, epochs=1))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": 1, "env_set": {
        "VITSWEEP_TRIAL_STUDY": "k", "VITSWEEP_TRIAL_NUMBER": str(trial.number),
        "VITSWEEP_TRIAL_STORAGE": storage}}}}))
    study.tell(trial, state=TrialState.FAIL)
    runs = load_runs(tmp_path / "sweep").set_index("trial_number")
    assert runs.loc[1, "optuna_state"] == "FAIL" and runs.loc[1, "status"] == "failed"
    assert runs.loc[0, "optuna_state"] == "COMPLETE"


def test_by_epoch_keeps_settings_apart_that_the_sweep_varied_besides_noise_and_width(tmp_path):
    """Two weight decays in one sweep were averaged into one cell whose `seeds` counted both (review 2026-11-29, F6)."""
    from analysis.by_epoch import by_epoch

    num = 0
    for wd, err in ((0.0, 0.1), (0.1, 0.4)):
        for w in (8, 16):
            for s in range(2):
                cfg = config(s, width=w)
                cfg["optimizer"]["weight_decay"] = wd
                write_run(tmp_path, num, cfg, summary(err), [{**h, "test_error": err} for h in history(err)])
                num += 1
    table, md = by_epoch(tmp_path, [3])
    assert len(table) == 4 and set(table["seeds"]) == {2}
    assert sorted(table["mean"].round(3).unique()) == [0.1, 0.4]
    assert "optimizer.weight_decay" in md


def test_by_epoch_counts_a_seed_run_twice_as_one_seed_at_its_mean(tmp_path):
    """A (width, seed) run twice in two run dirs (the CIFAR-10 pilot reran C1 = 8 at seeds 0 and 1) was two seeds
    in `seeds`, and weighed twice in the mean: a rerun is the same seed's data subset, noisy labels and init."""
    from analysis.by_epoch import by_epoch

    num = 0
    for w, s, errs in ((8, 0, (0.1, 0.3)), (8, 1, (0.5,)), (16, 0, (0.9,)), (16, 1, (0.9,))):  # (8, 0) run twice
        for err in errs:
            write_run(tmp_path, num, config(s, width=w), summary(err), [{**h, "test_error": err} for h in history(err)])
            num += 1
    table, md = by_epoch(tmp_path, [3])
    row = table[table["model.dim"] == 8].iloc[0]
    assert row["seeds"] == 2 and row["runs"] == 3
    assert row["mean"] == pytest.approx((0.2 + 0.5) / 2)  # seed 0 at the mean of its two runs, then over seeds
    assert "35.0 (2 seeds, 3 runs)" in md


def test_records_copy_the_storage_their_summaries_name_under_any_file_name(tmp_path, capsys):
    """Only a file called optuna.db was copied: a custom-named SQLite storage or a journal was dropped without a word
    and the records lost their trial states and declared grid (review 2026-11-29, F7)."""
    from analysis.records import copy_records

    storage, _ = _sweep_with_storage(tmp_path / "sweep", "s", 2, 0, 0.1)  # sweep/study.db
    copy_records(tmp_path / "sweep", tmp_path / "rec", {str(tmp_path / "sweep"): "rec"})
    assert (tmp_path / "rec" / "study.db").is_file()
    outside, _ = _sweep_with_storage(tmp_path / "elsewhere", "t", 1, 0, 0.1)
    (tmp_path / "elsewhere" / "0").rename(tmp_path / "sweep2")
    copy_records(tmp_path / "sweep2", tmp_path / "rec2")
    assert "outside" in capsys.readouterr().out


def test_replace_rewrites_a_path_prefix_not_any_substring():
    from analysis.records import replace_prefixes

    text = '{"a": "/w/tune_vit/0", "b": "/w/tune_vit_median/0", "c": "/w/tune_vit"}'
    assert replace_prefixes(text, {"/w/tune_vit": "rec"}) == '{"a": "rec/0", "b": "/w/tune_vit_median/0", "c": "rec"}'
    assert replace_prefixes("/w/data/x.npz /w/datax", {"/w/data/": "d/"}) == "d/x.npz /w/datax"


def test_records_find_a_storage_named_by_a_path_relative_to_where_the_sweep_ran(tmp_path, capsys):
    """A sweep run from the repository records `sqlite:///outputs/sweeps/x/optuna.db`; copied from another folder
    that path is not there as written, and the storage is the file of its name at the top of the sweep folder."""
    from analysis.records import copy_records

    _sweep_with_storage(tmp_path / "sweep", "s", 1, 0, 0.1)
    (tmp_path / "sweep" / "study.db").rename(tmp_path / "sweep" / "renamed.db")
    summary_path = tmp_path / "sweep" / "0" / "summary.json"
    s = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**s, "study_storage": "sqlite:///outputs/sweeps/x/renamed.db"}))
    copy_records(tmp_path / "sweep", tmp_path / "rec")
    assert (tmp_path / "rec" / "renamed.db").is_file() and "warning" not in capsys.readouterr().out


def test_an_under_fitting_bump_below_the_critical_width_is_not_the_double_descent_peak():
    """Review 2026-11-29 (stats, 7): the peak window reached down to threshold / 4, where widths still underfit, so
    the committed MNIST CNN summary named C1 = 3 (train error 12%, a third of the threshold C1 = 8) a significant
    peak while its declared test, at the critical width, found none. The window now starts at the critical width
    (the widest below the threshold: where the declared test and Nakkiran et al. place the peak)."""
    test = [0.15, 0.24, 0.27, 0.23, 0.175, 0.156, 0.153]  # widths 1..64: the maximum at 4, under-fitting
    train = [0.3, 0.2, 0.12, 0.04, 0.0, 0.0, 0.0]  # threshold 16, critical width 8
    summ = descent_summary(descent_curves(curves_frame(test, train, sd=0.005))).iloc[0]
    assert summ["interpolation_width"] == 16 and summ["window_lo"] == 8
    assert np.isnan(summ["peak_width"]) and not summ["peak_significant"]


def test_the_peak_window_of_a_curve_without_its_stalled_runs_starts_at_the_full_grids_critical_width():
    """Review 2026-11-29 (diff, 7): without its stalled runs a curve lost its widths 3-4, so its critical width fell
    to 2 (a third of the threshold) and C1 = 2 was named the peak. The window is read on the grid's widths."""
    test = [0.15, 0.30, 0.27, 0.23, 0.175, 0.156, 0.153]  # widths 1..64
    train = [0.3, 0.2, 0.12, 0.0, 0.0, 0.0, 0.0]  # threshold 8, critical width 4
    curves = descent_curves(curves_frame(test, train, sd=0.005))
    kept = curves[curves["model.width"] != 4]  # as if every run at 4 had stalled
    kept.attrs = curves.attrs
    assert descent_summary(kept).iloc[0]["peak_width"] == 2  # read on what is left: the under-fitting bump
    summ = descent_summary(kept, widths=curves["model.width"].unique()).iloc[0]
    assert summ["window_lo"] == 4 and np.isnan(summ["peak_width"])


def test_summary_table_warns_when_a_row_pools_two_recipes_whose_seeds_do_not_overlap(tmp_path):
    """Review 2026-11-29 (analysis): one_run_per_seed finds two recipes only among repeats of one seed, so a table by
    model.dim alone over lr 0.001 on seed 0 and 0.002 on seed 1 gave one row of 2 seeds, silently (descent_curves
    refuses the same frame). The table still pools, as asked, and says which key it averages over."""
    import yaml

    root = double_descent_sweep(tmp_path / "sweep", seeds=2)
    for cfg_file in root.glob("*/.hydra/config.yaml"):
        cfg = yaml.safe_load(cfg_file.read_text())
        if cfg["seed"] == 1:
            cfg["optimizer"]["lr"] = 0.002
            cfg_file.write_text(yaml.safe_dump(cfg))
    runs = load_runs(root)
    with pytest.warns(UserWarning, match=r"(?s)summary_table: rows of .*model.dim.*optimizer.lr"):
        table = summary_table(runs, ["model.dim", "label_noise.p"])
    assert (table["n_seeds"] == 2).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary_table(runs, ["model.dim", "label_noise.p", "optimizer.lr"])  # kept apart: nothing to say


def test_the_reports_note_on_stalled_runs_states_the_thresholds_that_flagged_them():
    """Review 2026-11-30 (stop rules): the sweep report counted "stalled runs (train error at or near chance at the
    end ...)" and "collapsed there from a far lower one" without the numbers behind either flag, while its note on
    loss spikes states its own; a reader could not tell a run at chance from one that learned a little. The note
    names the stall margin the runs were flagged under and the collapse rise."""
    from analysis.report_notes import _flag_notes
    from src.run_contract import COLLAPSE_RISE

    runs = pd.DataFrame({"stalled": [True, True, False], "collapsed": [True, False, False],
                         "trainer.stalled_margin": [0.02, 0.02, 0.02], "run_dir": ["a", "b", "c"]})
    (line,) = [x for x in _flag_notes(runs, []) if "stalled runs" in x]
    assert "within 0.02 of" in line and f"{COLLAPSE_RISE} or more above" in line
    default = runs.drop(columns="trainer.stalled_margin")  # runs that predate the key: the trainer's default
    (line,) = [x for x in _flag_notes(default, []) if "stalled runs" in x]
    assert "within 0.01 of" in line
