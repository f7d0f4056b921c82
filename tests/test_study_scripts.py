"""The study-only scripts under docs/studies/<study>/scripts/ (docs/studies/README.md: each has a test here), run as
their reports run them: on the committed records, on tiny trained runs of the embedded digits set, or on run dirs
written by hand. Outputs go to tmp_path, never into docs/."""
from __future__ import annotations

import ast
import csv
import json
import math
import re
import runpy
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from src.trainer import train
from tests.conftest import TINY, compose_cfg, shared_npz
from tests.helpers import run, write_run

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "docs" / "studies"
SCRIPTS = ["attention/scripts/attention_stats.py", "attention/scripts/declared_test.py",
           "double_descent_cnn_cifar10/scripts/collapses.py", "double_descent_cnn_cifar10/scripts/dead_units.py",
           "heads_depth/scripts/init_epochs_at_chance.py", "heads_depth/scripts/init_probe.py",
           "heads_depth/scripts/orderings.py", "heads_depth/scripts/precision_check.py",
           "heads_depth/scripts/supplement.py",
           "patch_size/scripts/lean_probe.py",
           "rsna_patch_size/scripts/make_synth_tree.py", "rsna_patch_size/scripts/supplement.py",
           "vit_vs_cnn/scripts/bn_recalibration.py"]


@pytest.fixture(autouse=True)
def _restore_threads():
    """Several scripts call torch.set_num_threads(1); the rest of the suite keeps its own setting."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_script(monkeypatch, rel: str, *args) -> None:
    """``python docs/studies/<rel> ARGS`` in this process (sys.argv and sys.path restored afterwards)."""
    path = STUDIES / rel
    monkeypatch.setattr(sys, "argv", [str(path), *map(str, args)])
    monkeypatch.setattr(sys, "path", list(sys.path))
    runpy.run_path(str(path), run_name="__main__")


def load_script(monkeypatch, rel: str) -> dict:
    """The functions of a script whose work sits under ``if __name__ == "__main__"``, without running it."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    return runpy.run_path(str(STUDIES / rel), run_name=Path(rel).stem)


def test_every_study_script_is_tested_here():
    """docs/studies/README.md promises a test here for each script: a new script fails this until it is listed."""
    found = sorted(str(p.relative_to(STUDIES)) for p in STUDIES.glob("*/scripts/*.py"))
    assert found == sorted(SCRIPTS)


@pytest.mark.parametrize("rel", SCRIPTS)
def test_usage_line_names_the_script_itself(rel):
    """The command in a script's docstring is what a reader copies: it must name the script where it lives."""
    doc = (STUDIES / rel).read_text().split('"""')[1]
    named = re.findall(r"python (\S+\.py)", doc)
    assert named and set(named) == {f"docs/studies/{rel}"}, named


# --- double_descent_cnn_cifar10 ---------------------------------------------------------------------------------------


def test_collapses_prints_the_table_of_the_cifar10_report(monkeypatch, capsys):
    """The report's collapse table is the script's output on the committed earlier_cpu records, row for row."""
    records = STUDIES / "double_descent_cnn_cifar10" / "records"
    run_script(monkeypatch, "double_descent_cnn_cifar10/scripts/collapses.py", records / "earlier_cpu",
               records / "earlier_cpu_threshold")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 2 + 10 and lines[0].startswith("| C1 | noise | seed |")
    report = (STUDIES / "double_descent_cnn_cifar10" / "report.md").read_text()
    assert out in report  # every row, in the same order, as one block


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny checkpointed runs on digits (200 images, 16 px), as the scripts expect a study's run dirs:
    a depth-2 ViT, a width-4 ``cnn`` and a ``cnn_vgg`` (BatchNorm)."""
    threads = torch.get_num_threads()

    def make(name: str, *extra: str, vit: bool = False) -> Path:
        base = [o for o in TINY if not o.startswith(("trainer.checkpoint", "dataset.n_train", "model.depth"))
                and (vit or not o.startswith("model."))]
        cfg = compose_cfg([*base, "dataset=digits", "dataset.n_train=200", "trainer.checkpoint=true",
                           "trainer.num_threads=1", *extra])
        run_dir = tmp_path_factory.mktemp(name)
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        train(cfg, run_dir)
        return run_dir

    try:
        return {"vit": make("vit", "model.depth=2", "model.patch=4", vit=True),
                "cnn": make("cnn", "model=cnn", "model.width=4", "trainer.max_epochs=10", "optimizer.lr=3e-3"),
                "vgg": make("vgg", "model=cnn_vgg")}
    finally:
        torch.set_num_threads(threads)


def dead_units_rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    assert lines[0].startswith("run  C1  epoch  units active per ReLU layer (conv1, conv2, conv3, head)")
    return {f[0]: f[1:] for f in (line.split() for line in lines[1:])}


def test_dead_units_reads_a_learned_cnn_and_one_whose_head_died(trained, tmp_path, monkeypatch, capsys):
    """One row per run dir: C1, the checkpoint's epoch, the share of units firing per ReLU layer and the logit spread;
    a head whose hidden units never fire reads 0.00 and 0.000, as the report's collapsed run 17 does."""
    learned, dead = tmp_path / "16", tmp_path / "17"
    learned.symlink_to(trained["cnn"])
    dead.mkdir()
    ck = torch.load(trained["cnn"] / "checkpoint.pt", map_location="cpu", weights_only=False)
    ck["model"]["head.1.bias"] = torch.full_like(ck["model"]["head.1.bias"], -1e4)  # no hidden unit ever fires
    torch.save(ck, dead / "checkpoint.pt")
    run_script(monkeypatch, "double_descent_cnn_cifar10/scripts/dead_units.py", learned, dead)
    rows = dead_units_rows(capsys.readouterr().out)
    assert list(rows) == ["16", "17"]
    c1, epoch, *active, spread = rows["16"]
    assert (c1, epoch) == ("4", "10") and len(active) == 4
    assert all(0 < float(a) <= 1 for a in active) and float(spread) > 0.01
    assert rows["17"][:5] == rows["16"][:5]  # the conv layers are untouched
    assert rows["17"][5:] == ["0.00", "0.000"]


# --- attention --------------------------------------------------------------------------------------------------------


def test_attention_stats_tabulates_each_layer_of_each_run(trained, tmp_path, monkeypatch, capsys):
    """Per run (named as its folder or link in RUNS_DIR) one row per layer plus the rollout; the distances are the
    attention tool's, against the tool's own uniform reference; shares and effective patch counts in range; a layer
    whose class-mean map is the class-mean ink reads ink_corr 1."""
    from src.attention.tool import run as attention_tool

    vit = tmp_path / "vit"
    shutil.copytree(trained["vit"], vit)
    attention_tool(vit, images=1)  # -> vit/attention/attention.npz, 100 images a class (the script's own count)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "h2_d2").symlink_to(vit)
    (runs / "no_maps").mkdir()  # a folder without attention.npz is not a run
    out_csv = tmp_path / "attention_stats.csv"
    run_script(monkeypatch, "attention/scripts/attention_stats.py", runs, out_csv)
    table = pd.read_csv(out_csv)
    assert list(table.columns) == ["run", "layer", "ink_corr", "ink_share", "mean_distance_px", "head_distance_px",
                                   "uniform_distance_px", "eff_patches"]
    assert table["run"].tolist() == ["h2_d2"] * 3 and table["layer"].astype(str).tolist() == ["1", "2", "rollout"]
    z = np.load(vit / "attention" / "attention.npz")
    layers = table.iloc[:2]
    np.testing.assert_allclose(layers["mean_distance_px"], z["mean_distance"].mean(1), atol=6e-4)
    assert layers["head_distance_px"].tolist() == [" ".join(f"{d:.2f}" for d in row) for row in z["mean_distance"]]
    np.testing.assert_allclose(layers["uniform_distance_px"], float(z["uniform_distance"]), atol=6e-4)
    assert ((layers["eff_patches"] >= 1) & (layers["eff_patches"] <= 16 + 1e-3)).all()  # 4 x 4 patches of 4 px
    assert table["ink_share"].between(0, 1).all() and table["ink_corr"].between(-1, 1).all()
    assert table.iloc[2][["mean_distance_px", "eff_patches"]].isna().all()  # the rollout has no distance
    assert "h2_d2" in capsys.readouterr().out

    # planted maps: layer 1 and the rollout are each class's mean ink per patch, layer 2 its negative
    from src.attention.tool import load_test_split

    x, y, _ = load_test_split(vit)
    assert np.bincount(y.numpy()).max() <= 100  # the script's 100 images a class: all of digits' test split
    ink = x[:, 0].float().reshape(len(x), 4, 4, 4, 4).mean((2, 4))  # (image, row, column) over 4 x 4 px patches
    ink = torch.stack([ink[y == c].mean(0) for c in range(10)]).numpy()
    planted = dict(z)
    planted["class_mean_cls"] = np.stack([ink, ink.max() - ink], axis=1)
    planted["class_mean_rollout"] = ink
    np.savez(vit / "attention" / "attention.npz", **planted)
    run_script(monkeypatch, "attention/scripts/attention_stats.py", runs, out_csv)
    assert pd.read_csv(out_csv)["ink_corr"].tolist() == [1.0, -1.0, 1.0]
    with pytest.raises(SystemExit, match="no <run>/attention/attention.npz"):
        run_script(monkeypatch, "attention/scripts/attention_stats.py", runs / "no_maps", tmp_path / "x.csv")


def test_attention_stats_uniform_distance_is_the_reported_16_55_px(monkeypatch):
    """The report's reference, uniform attention over the 8 x 8 grid of 4-px patches, comes from this function."""
    from src.attention import maps

    uniform = load_script(monkeypatch, "attention/scripts/attention_stats.py")["uniform_distance"]
    assert round(uniform(8, 4), 2) == 16.55
    assert uniform(4, 4) == pytest.approx(maps.uniform_attention_distance(4, patch_size=4), rel=1e-6)


@pytest.mark.parametrize("rel", ["attention/scripts/attention_stats.py", "attention/scripts/declared_test.py",
                                 "patch_size/scripts/lean_probe.py"])
def test_script_puts_the_repository_on_sys_path(rel, monkeypatch):
    """These scripts put the repository root on sys.path themselves, so that they run from a checkout."""
    load_script(monkeypatch, rel)
    assert sys.path[0] == str(ROOT)


def test_declared_test_regenerates_the_committed_verdict_table(tmp_path, monkeypatch, capsys):
    """The attention report's verdict is declared_test.md, the script's output on the seeds' attention_stats.csv:
    regenerated byte for byte, printed too; without arguments it prints its usage."""
    seeds = STUDIES / "attention" / "analysis" / "seeds"
    out = tmp_path / "declared_test.md"
    run_script(monkeypatch, "attention/scripts/declared_test.py", seeds / "attention_stats.csv", out)
    assert out.read_text() == (seeds / "declared_test.md").read_text()
    assert capsys.readouterr().out == out.read_text() + "\n"
    with pytest.raises(SystemExit, match="STATS_CSV"):
        run_script(monkeypatch, "attention/scripts/declared_test.py")


def verdict_of(text: str) -> str:
    """The verdict a clause gives: its first verdict phrase (``not reproduced`` before ``reproduced``)."""
    found = re.search(r"\b(not reproduced|inconclusive|reproduced)\b", text.lower())
    assert found, text
    return found.group(1)


def test_the_attention_reports_verdict_says_what_its_declared_test_prints():
    """Each place's verdict in the declared test's table is the verdict the report's verdict row gives that place
    (rollout: the clause naming the rollout; layer 1: the clause naming the first layer): the table read
    "not reproduced" for layer 1 while the report said "inconclusive"."""
    table = (STUDIES / "attention" / "analysis" / "seeds" / "declared_test.md").read_text()
    printed = {line.split("|")[1].strip(): verdict_of(line.split("|")[-2]) for line in table.splitlines()
               if line.startswith(("| layer", "| rollout"))}
    row = next(line for line in (STUDIES / "attention" / "report.md").read_text().splitlines()
               if line.startswith("| **Verdict (declared test"))
    clauses = re.search(r"\*\*(.+?)\*\*", row.split("|")[2]).group(1).split(";")
    names = {"rollout": "rollout", "layer 1": "first layer"}
    said = {place: verdict_of(next(c for c in clauses if names[place] in c)) for place in printed}
    assert printed.keys() == names.keys() and printed == said



def test_the_attention_design_row_says_seed_0_was_seen_before_the_declaration():
    """The declared 3-seed test's seed-0 (4, 3) run is the `cpu` scale's run, number for number, and that run had been
    analysed when the test was declared (the header cites its 0.70 against 0.46): the report's design row must say
    so, with the test on the seeds that were not seen."""
    analysis = STUDIES / "attention" / "analysis"
    cols = ["layer", "ink_corr", "ink_share", "mean_distance_px", "eff_patches"]
    seen = pd.read_csv(analysis / "attention_stats.csv").query("run == 'h4_d3'")[cols].reset_index(drop=True)
    seed0 = pd.read_csv(analysis / "seeds" / "attention_stats.csv").query("run == 'h4_d3_s0'")[cols]
    pd.testing.assert_frame_equal(seen, seed0.reset_index(drop=True))
    row = next(line for line in (STUDIES / "attention" / "report.md").read_text().splitlines()
               if line.startswith("| **Design"))
    assert "seed 0 was seen before the declaration" in row.lower()
    assert "seeds 1 and 2 alone" in row


def test_the_attention_distance_paragraph_reads_locality_against_the_query_independent_reference():
    """Below uniform attention is not "towards their neighbours": a head attending to the same central patches from
    every query lies there too (tests/test_attention.py). The report's paragraph reads the distances against the
    query-independent reference, not the uniform line alone."""
    text = (STUDIES / "attention" / "report.md").read_text()
    para = next(p for p in text.split("\n\n") if p.startswith("**Mean attention distance.**"))
    assert "query-independent" in para
    assert "px: the patch tokens lean slightly towards their neighbours" not in para.replace("\n", " ")  # the claim


# --- vit_vs_cnn -------------------------------------------------------------------------------------------------------

BN_LINE = re.compile(r"(?P<label>.+): train acc (?P<train>\d\.\d{4}), test acc (?P<test>\d\.\d{4}); "
                     r"BN running_var means (?P<var>.+)")


def bn_report(monkeypatch, capsys, run_dir: Path) -> list[dict]:
    run_script(monkeypatch, "vit_vs_cnn/scripts/bn_recalibration.py", run_dir)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    found = [BN_LINE.fullmatch(line) for line in lines]
    assert all(found), lines
    return [{"label": m["label"], "train": float(m["train"]), "test": float(m["test"]),
             "var": [float(v) for v in m["var"].split(", ")]} for m in found]


def test_bn_recalibration_reports_the_run_then_statistics_from_its_training_images(trained, tmp_path,
                                                                                    monkeypatch, capsys):
    """Line 1 is the run as trained (its own step count and recorded accuracies); line 2 recomputes every
    BatchNorm layer's statistics from the run's training images, whatever the checkpoint held: a checkpoint whose
    statistics are still at their start values (mean 0, variance 1) gets the same recomputed line."""
    run_dir = trained["vgg"]
    summary = json.loads((run_dir / "summary.json").read_text())
    as_trained, recomputed = bn_report(monkeypatch, capsys, run_dir)
    assert as_trained["label"] == f"as trained ({summary['steps']} steps, eval mode)"
    assert (as_trained["train"], as_trained["test"]) == (round(summary["train_acc"], 4), round(summary["test_acc"], 4))
    assert len(as_trained["var"]) == len(recomputed["var"]) == 3  # cnn_vgg's three BatchNorm layers

    ck = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    for key in [k for k in ck["model"] if k.endswith("running_var")]:
        ck["model"][key] = torch.ones_like(ck["model"][key])
        ck["model"][key.replace("running_var", "running_mean")].zero_()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    torch.save(ck, fresh / "checkpoint.pt")
    start, again = bn_report(monkeypatch, capsys, fresh)
    assert start["var"] == [1.0, 1.0, 1.0]
    assert again == recomputed

    # the first BatchNorm layer's input does not depend on any BatchNorm: its variance over the training images
    from hydra.utils import instantiate

    from src.data import build_data

    data = build_data(ck["config"]["dataset"], seed=ck["config"]["seed"])
    model = instantiate(ck["model_cfg"])
    model.load_state_dict(ck["model"])
    mean = torch.tensor(data.mean).view(1, -1, 1, 1) * 255
    std = torch.tensor(data.std).view(1, -1, 1, 1) * 255
    with torch.no_grad():
        h = model.features[:5]((data.x_train.float() - mean) / std)  # conv, ReLU, conv, ReLU, max-pool
    assert isinstance(model.features[5], torch.nn.BatchNorm2d)
    assert recomputed["var"][0] == pytest.approx(float(h.var((0, 2, 3)).mean()), rel=0.05)


# --- patch_size -------------------------------------------------------------------------------------------------------

PROBE_LINE = re.compile(r"(\w+) patch (\d+) batch (\d+) lean=(True|False): median step (\d+\.\d{3}) s, "
                        r"(\d+\.\d) img/s")


def test_lean_probe_times_both_variants(monkeypatch, capsys):
    """`lean_probe.py PRECISION PATCH BATCH` prints one line per variant, lean=True first, with img/s = batch / step."""
    run_script(monkeypatch, "patch_size/scripts/lean_probe.py", "bf16", 8, 2)
    lines = capsys.readouterr().out.splitlines()
    found = [PROBE_LINE.fullmatch(line) for line in lines]
    assert len(lines) == 2 and all(found), lines
    assert [m.groups()[:4] for m in found] == [("bf16", "8", "2", "True"), ("bf16", "8", "2", "False")]
    for m in found:
        assert float(m[6]) == pytest.approx(2 / float(m[5]), rel=0.05, abs=0.1)


def test_lean_probe_leaves_out_the_first_step_and_prints_the_median(monkeypatch, capsys):
    """Six interleaved steps a variant: the first (warm-up) is not timed, the median of the other five is printed."""
    durations = {True: [9.0, 1.0, 5.0, 3.0, 7.0], False: [2.0, 2.0, 2.0, 2.0, 8.0]}  # medians 5 and 2
    clock = [0.0, 0.0]  # step 0: one reading a variant (its start), never subtracted
    for step in range(5):
        for lean in (True, False):
            clock += [0.0, durations[lean][step]]
    readings = iter(clock)
    main = load_script(monkeypatch, "patch_size/scripts/lean_probe.py")["main"]
    monkeypatch.setitem(main.__globals__, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    main("fp32", 16, 4)
    assert next(readings, None) is None  # every reading used
    assert capsys.readouterr().out.splitlines() == [
        "fp32 patch 16 batch 4 lean=True: median step 5.000 s, 0.8 img/s",
        "fp32 patch 16 batch 4 lean=False: median step 2.000 s, 2.0 img/s"]


# --- heads_depth ------------------------------------------------------------------------------------------------------

HEADS_DEPTH = STUDIES / "heads_depth"


def test_orderings_regenerates_its_committed_tables_and_markdown(tmp_path, monkeypatch, capsys):
    """The report's orderings.md is the script's output on records/main, and its tables are the committed ones,
    byte for byte."""
    run_script(monkeypatch, "heads_depth/scripts/orderings.py", HEADS_DEPTH / "records" / "main", tmp_path)
    committed = HEADS_DEPTH / "analysis" / "orderings"
    assert capsys.readouterr().out == (committed / "orderings.md").read_text()
    names = ["alpha_by_arch.csv", "error_by_arch.csv", "orderings.csv"]
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == names
    for name in names:
        assert (tmp_path / "tables" / name).read_bytes() == (committed / "tables" / name).read_bytes(), name


def test_orderings_declared_regenerates_declared_md(tmp_path, monkeypatch, capsys):
    """`--declared` writes the committed analysis/declared.md (the declared fit range) and prints it; other
    arguments print the usage."""
    run_script(monkeypatch, "heads_depth/scripts/orderings.py", HEADS_DEPTH / "records" / "main", tmp_path,
               "--declared")
    text = (tmp_path / "declared.md").read_text()
    assert text == (HEADS_DEPTH / "analysis" / "declared.md").read_text()
    assert capsys.readouterr().out == text + "\n"
    with pytest.raises(SystemExit, match="published orderings"):
        run_script(monkeypatch, "heads_depth/scripts/orderings.py", HEADS_DEPTH / "records" / "main")


def test_the_confirmatory_run_regenerates_its_declared_test(tmp_path, monkeypatch, capsys):
    """records/confirm (the confirmatory run, declared before its runs) regenerates analysis/confirm/declared.md,
    whose test line reads the paired interval as declared."""
    run_script(monkeypatch, "heads_depth/scripts/orderings.py", HEADS_DEPTH / "records" / "confirm", tmp_path,
               "--declared")
    text = (tmp_path / "declared.md").read_text()
    assert text == (HEADS_DEPTH / "analysis" / "confirm" / "declared.md").read_text()
    assert "## The declared test" in text and "paired by seed (declared)" in text
    assert "more heads" not in text  # orderings of architectures the confirmatory run did not train are left out


def test_the_confirmatory_test_reads_the_paired_slope_difference_and_says_when_it_cannot(monkeypatch):
    """`confirm_test` (the line `--declared` writes for records/confirm): on records/main's declared range it gives
    the report's paired (4, 3)-vs-CNN figure and "confirmed" (interval below 0), and a positive interval reads
    "refuted"; it is not drawn, and says why, when a declared run is missing or unfinished, or when a declared seed
    drops out of the paired fit."""
    mod = load_script(monkeypatch, "heads_depth/scripts/orderings.py")
    runs = mod["load_runs"](HEADS_DEPTH / "records" / "main", optuna_state=False).copy()
    runs["arch"] = runs.apply(mod["arch_of"], axis=1)
    kept, _ = mod["overfitting_regime"](runs, by="arch")
    study = (runs["study_storage"].iloc[0], runs["study_name"].iloc[0])  # records/main's one study

    def grids(sizes=(256, 512, 1024, 2048, 4096), seeds=(0, 1, 2, 3)):  # as the sweeper records a declared grid
        return {study: {"dataset.n_train": list(sizes), "seed": list(seeds)}}

    line = mod["confirm_test"](runs, kept, "h4_d3", "cnn_w10", grids())
    assert "**-0.202 [-0.252, -0.153]**" in line and line.endswith("**confirmed**")
    assert mod["confirm_test"](runs, kept, "cnn_w10", "h4_d3", grids()).endswith("**refuted**")
    one_gone = runs.drop(runs.index[(runs.arch == "h4_d3") & (runs["dataset.n_train"] == 512) & (runs.seed == 2)])
    assert mod["confirm_test"](one_gone, kept, "h4_d3", "cnn_w10", grids()) == (
        "not drawn: h4_d3's declared grid is unfinished (19 of 20 runs finished, 1 not started)")
    interrupted = runs.copy()
    last = (runs.arch == "cnn_w10") & (runs["dataset.n_train"] == 4096) & (runs.seed == 0)
    interrupted.loc[last, "status"] = "running"
    assert mod["confirm_test"](interrupted, kept, "h4_d3", "cnn_w10", grids()) == (
        "not drawn: cnn_w10's declared grid is unfinished (19 of 20 runs finished, 1 running)")
    smaller = grids(sizes=(512, 1024, 2048, 4096))  # runs outside the declared grid stay out of the fit
    assert "n 512, 1024, 2048, 4096)" in mod["confirm_test"](runs, kept, "h4_d3", "cnn_w10", smaller)
    assert "; 3 seeds;" in mod["confirm_test"](runs, kept, "h4_d3", "cnn_w10", grids(seeds=(0, 1, 2)))
    no_seed_3 = kept[~((kept.arch == "cnn_w10") & (kept.seed == 3) & (kept["dataset.n_train"] == 1024))]
    assert mod["confirm_test"](runs, no_seed_3, "h4_d3", "cnn_w10", grids()) == (
        "not drawn: 3 of the 4 declared seeds have a run at every fitted size")
    assert mod["confirm_test"](runs, kept[kept.arch != "cnn_w10"], "h4_d3", "cnn_w10", grids()).startswith(
        "not drawn: ")


def number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def test_supplement_regenerates_the_earlier_run_tables(tmp_path, monkeypatch, capsys):
    """Run dirs carrying the values of the earlier run's committed runs.csv give back that runs.csv byte for byte,
    and the committed train_vs_test_error.csv (to the 4th decimal: runs.csv keeps 4)."""
    models = {"h1_d1 (ViT)": {"_target_": "src.models.vit.ViT", "heads": 1, "depth": 1},
              "cnn_w10 (CNN)": {"_target_": "src.models.cnn.WidthCNN", "width": 10}}
    runs_csv = HEADS_DEPTH / "records" / "earlier" / "runs.csv"
    with open(runs_csv) as f:
        for i, row in enumerate(csv.DictReader(f)):
            config = {"model": models[row.pop("arch")],
                      "dataset": {"n_train": int(row.pop("dataset.n_train"))}, "seed": int(row.pop("seed"))}
            write_run(tmp_path / "runs", i, config, {k: number(v) for k, v in row.items()})
    out = tmp_path / "out"
    out.mkdir()
    run_script(monkeypatch, "heads_depth/scripts/supplement.py", tmp_path / "runs", out)
    assert (out / "runs.csv").read_bytes() == runs_csv.read_bytes()
    got = pd.read_csv(out / "train_vs_test_error.csv")
    want = pd.read_csv(HEADS_DEPTH / "analysis" / "earlier" / "train_vs_test_error.csv")
    pd.testing.assert_frame_equal(got, want, check_exact=False, atol=2e-4, rtol=0)
    assert "| cnn_w10 (CNN) | 128 |" in capsys.readouterr().out


def test_supplement_on_the_main_records_keeps_the_architectures_apart(tmp_path, monkeypatch):
    """On the current sweep's records the table has one row per architecture and size, as orderings.py counts them
    (its committed error_by_arch.csv)."""
    run_script(monkeypatch, "heads_depth/scripts/supplement.py", HEADS_DEPTH / "records" / "main", tmp_path)
    got = pd.read_csv(tmp_path / "train_vs_test_error.csv")
    want = pd.read_csv(HEADS_DEPTH / "analysis" / "orderings" / "tables" / "error_by_arch.csv")
    got_cells = {(a.split()[0], n): k for a, n, k in got[["arch", "dataset.n_train", "n_seeds"]].itertuples(False)}
    assert got_cells == {(a, n): k for a, n, k in want[["arch", "dataset.n_train", "count"]].itertuples(False)}


def fake_mnist(seen: list):
    """np.load standing in for mnist.npz: records the path it was asked for; 60,000 blank images."""
    def load(path, *args, **kwargs):
        seen.append(Path(path))
        return {"x_train": np.broadcast_to(np.zeros((1, 28, 28), np.uint8), (60000, 28, 28)),
                "y_train": np.arange(60000) % 10}
    return load


class _Built(Exception):
    pass


@pytest.mark.parametrize("mode", ["plain", "ref", "noinit", "zerohead"])
def test_init_probe_builds_the_model_each_mode_names(mode, monkeypatch):
    """plain: vitsweep's ViT with big_vision's init (zero patch-embedding bias); noinit: PyTorch's defaults (non-zero
    bias); zerohead: plain with a zero head; ref: the nn.TransformerEncoder ViT (pre-norm). Stops once built."""
    from src.models.vit import ViT

    probe = load_script(monkeypatch, "heads_depth/scripts/init_probe.py")
    scope = probe["main"].__globals__
    built = []

    def spy(cls):
        class Spy(cls):  # the script patches init_weights on this subclass, never on the real ViT
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                built.append(self)
                raise _Built
        return Spy

    monkeypatch.setitem(scope, "ViT", spy(ViT))
    monkeypatch.setitem(scope, "Ref", spy(scope["Ref"]))
    monkeypatch.setattr(np, "load", fake_mnist([]))
    monkeypatch.setattr(sys, "argv", ["init_probe.py", mode])
    with pytest.raises(_Built):
        probe["main"]()
    (model,) = built
    if mode == "ref":
        assert isinstance(model, scope["Ref"]) and model.enc.layers[0].norm_first
        return
    assert isinstance(model, ViT) and model.head.weight.shape == (10, 128)
    bias = model.patch_embed.proj.bias
    assert bool((bias != 0).any()) == (mode == "noinit")
    assert bool((model.head.weight == 0).all()) == (mode == "zerohead")


def test_init_probe_reads_mnist_from_the_shared_data_folder(monkeypatch):
    """The probe trains on ../shared/data/mnist.npz beside the checkout, where the project keeps MNIST."""
    probe = load_script(monkeypatch, "heads_depth/scripts/init_probe.py")
    seen = []
    load = fake_mnist(seen)

    def stop(path, *args, **kwargs):
        load(path)
        raise _Built

    monkeypatch.setattr(np, "load", stop)
    monkeypatch.setattr(sys, "argv", ["init_probe.py", "plain"])
    with pytest.raises(_Built):
        probe["main"]()
    assert seen == [ROOT.parent / "shared" / "data" / "mnist.npz"]


@pytest.mark.slow
def test_init_probe_prints_the_training_loss_every_50_steps(tmp_path):
    """`init_probe.py plain` trains 300 steps on 1024 MNIST images (about a minute) and prints the loss at steps
    50, 100, ..., 300; it falls below ln 10 (chance)."""
    shared_npz("mnist")
    proc = run([STUDIES / "heads_depth" / "scripts" / "init_probe.py", "plain"], cwd=tmp_path, timeout=600)
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [(r[0], int(r[1])) for r in rows] == [("plain", s) for s in range(50, 301, 50)]
    losses = [float(r[2]) for r in rows]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < math.log(10)


def test_init_epochs_at_chance_prints_when_the_vit_left_chance(tmp_path):
    """`init_epochs_at_chance.py INIT ARCH SEED EPOCHS RUN_DIR`: one JSON line whose epochs and errors are those of
    the run dir's metrics.jsonl (1024 training images)."""
    shared_npz("mnist")
    run_dir = tmp_path / "run"
    proc = run([STUDIES / "heads_depth" / "scripts" / "init_epochs_at_chance.py", "torch", "h4_d3_d32", 0, 1,
                run_dir], cwd=tmp_path, timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["init"], result["arch"], result["seed"]) == ("torch", "h4_d3_d32", 0)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "train_error" in r][-1]
    assert result["final"] == [1, last["train_error"], last["test_error"]]
    assert result["left_chance_epoch(tr<=0.85)"] == (1 if last["train_error"] <= 0.85 else None)
    assert json.loads((run_dir / "summary.json").read_text())["n_train"] == 1024


# --- rsna_patch_size --------------------------------------------------------------------------------------------------


def test_make_synth_tree_writes_the_pipeline_check_tree(tmp_path, monkeypatch, capsys):
    """50 patients x 4 images of 160 x 128 px in every encodable syntax, cancer in the left breast of every 4th
    patient (26 rows), plus one truncated file and one CSV row without a file: 202 rows, 2 unusable."""
    pytest.importorskip("pydicom", reason="needs the dicom extra: pip install 'vitsweep[dicom]'")
    from src.data.dicom import DicomError, read_dicom
    from src.data.synthetic_dicom import available_syntaxes

    out = tmp_path / "rsna_synth"
    run_script(monkeypatch, "rsna_patch_size/scripts/make_synth_tree.py", out)
    printed = capsys.readouterr().out
    assert re.fullmatch(rf"wrote 202 CSV rows under {re.escape(str(out))} in \d+\.\d s; syntaxes "
                        rf"{re.escape(str(available_syntaxes()))}; cancer=1 rows: 26; patients: 51\n", printed)
    table = pd.read_csv(out / "train.csv")
    assert len(table) == 202 and table["patient_id"].nunique() == 51
    cancer = table[table["cancer"] == 1]
    assert set(cancer["laterality"]) == {"L"} and set(cancer["patient_id"]) == {10000 + p for p in range(1, 50, 4)}
    assert {ast.literal_eval(v)["syntax"] for v in table["variant"] if v.startswith("{")} == set(available_syntaxes())
    usable, failed = 0, []
    for pid, iid in table[["patient_id", "image_id"]].itertuples(index=False):
        path = out / "train_images" / str(pid) / f"{iid}.dcm"
        try:
            img, _ = read_dicom(path)
        except (DicomError, FileNotFoundError):
            failed.append(iid)
            continue
        assert img.shape == (160, 128)
        usable += 1
    assert usable == 200 and failed == [900001, 900002]
    assert not (out / "train_images" / "10050" / "900002.dcm").exists()


def test_rsna_supplement_regenerates_synthetic_runs(tmp_path, monkeypatch, capsys):
    """Run dirs carrying the committed synthetic_runs.csv's values give back synthetic_runs.csv and .md byte for
    byte (largest patch first), and print the Markdown."""
    committed = STUDIES / "rsna_patch_size" / "analysis"
    with open(committed / "synthetic_runs.csv") as f:
        for i, row in enumerate(csv.DictReader(f)):
            config = {"model": {"patch": int(row.pop("model.patch"))}}
            write_run(tmp_path / "runs", 2 - i, config, {k: number(v) for k, v in row.items()})  # patch 8 first
    out = tmp_path / "out"
    out.mkdir()
    run_script(monkeypatch, "rsna_patch_size/scripts/supplement.py", tmp_path / "runs", out)
    for name in ("synthetic_runs.csv", "synthetic_runs.md"):
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name
    assert capsys.readouterr().out == (committed / "synthetic_runs.md").read_text()


# --- heads_depth: the precision check -------------------------------------------------------------------------------


def _write_precision_runs(root: Path, error) -> Path:
    """The check's 32 runs written by hand, test error ``error(heads, prec, n_train, seed)``."""
    num = 0
    for heads in (1, 4):
        for prec in ("bf16", "fp32"):
            for n in (1024, 2048):
                for seed in range(4):
                    err = error(heads, prec, n, seed)
                    cfg = {"seed": seed, "dataset": {"n_train": n}, "trainer": {"precision": prec},
                           "model": {"_target_": "src.models.vit.ViT", "heads": heads, "depth": 1}}
                    write_run(root, num, cfg, {"status": "completed", "stop_reason": "converged", "test_error": err,
                                               "train_error": 0.0, "precision": prec, "seed": seed, "wall_s": 60.0,
                                               "machines": ["a CPU"]})
                    num += 1
    return root


def _precision_runs(root: Path, heads_gap: float, bf16_cost: float, rng: int = 0) -> Path:
    """The check's 32 runs: h1_d1 worse than h4_d1 by ``heads_gap``, bf16 worse than fp32 by ``bf16_cost`` (h1_d1
    only), seed noise sd 0.005 drawn per (n_train, seed), the same for both archs and precisions."""
    draws = np.random.default_rng(rng).standard_normal((2, 4))
    return _write_precision_runs(root, lambda heads, prec, n, seed: (
        0.15 + (heads_gap if heads == 1 else 0) + (bf16_cost if prec == "bf16" and heads == 1 else 0)
        + 0.005 * draws[n // 2048, seed]))


@pytest.mark.parametrize("gap, cost, verdict", [(0.03, 0.0, "stands, unconfounded"),
                                                (0.0, 0.03, "confounded with precision"),
                                                (0.0, 0.0, "not resolved at bf16, fp32")])
def test_the_precision_check_applies_its_declared_rule(monkeypatch, tmp_path, gap, cost, verdict):
    """The heads ordering tested within each precision, and the precision effect paired by seed: a planted heads gap
    holds at both precisions; a planted bf16 cost with no heads gap reads as confounded; neither, as not resolved."""
    records = _precision_runs(tmp_path / "runs", gap, cost)
    run_script(monkeypatch, "heads_depth/scripts/precision_check.py", records, tmp_path / "out.md")
    text = (tmp_path / "out.md").read_text()
    assert "Runs: 32 of 32 completed" in text and f"\"4 heads help\" **{verdict}" in text
    shutil.rmtree(records / "0")
    run_script(monkeypatch, "heads_depth/scripts/precision_check.py", records, tmp_path / "out.md")
    assert "**Not yet tested**: 1 runs missing" in (tmp_path / "out.md").read_text()
    # a run outside the declared grid (a seed 4) is refused, not paired with another seed's run
    cfg = {"seed": 4, "dataset": {"n_train": 1024}, "trainer": {"precision": "bf16"},
           "model": {"_target_": "src.models.vit.ViT", "heads": 1, "depth": 1}}
    write_run(records, 99, cfg, {"status": "completed", "stop_reason": "converged", "test_error": 0.2,
                                 "train_error": 0.0, "precision": "bf16", "seed": 4, "wall_s": 60.0,
                                 "machines": ["a CPU"]})
    with pytest.raises(SystemExit, match="outside the declared design"):
        run_script(monkeypatch, "heads_depth/scripts/precision_check.py", records, tmp_path / "out.md")


def test_the_precision_check_counts_seeds_not_runs(monkeypatch, tmp_path):
    """Seed s's n_train 1024 subset is nested in its 2048 one, and both archs train on it, so a seed carries one
    effect to both sizes. Here there is no heads term: h1_d1 and h4_d1 differ only by per-(arch, seed) effects that a
    seed carries to both sizes and both precisions, plus a 0.1-point jitter per (arch, n_train, seed), the same at
    both precisions (no precision effect). That is four seeds' worth of evidence on the ordering, not eight runs a
    side: the seed-paired interval (3 dof) leaves it not resolved, where the pooled Welch as first computed (runs as
    units, about 11.7 dof) put both precisions' intervals above 0."""
    h1, h4 = (0.036, 0.016, 0.034, 0.010), (-0.010, 0.012, -0.008, 0.006)
    jitter = np.random.default_rng(0).normal(0, 0.001, (2, 2, 4))
    records = _write_precision_runs(tmp_path / "runs", lambda heads, prec, n, seed: (
        0.15 + (h1 if heads == 1 else h4)[seed] + jitter[heads // 4, n // 2048, seed]))
    run_script(monkeypatch, "heads_depth/scripts/precision_check.py", records, tmp_path / "out.md")
    text = (tmp_path / "out.md").read_text()
    assert "\"4 heads help\" **not resolved at bf16, fp32**, with no sign of a precision effect" in text
    assert "As first computed (runs as units) it read **stands, unconfounded**" in text


def test_the_precision_checks_seed_paired_interval_covers_where_runs_as_units_did_not(monkeypatch):
    """Coverage at a true heads gap of 0, seed sd 1.5 points, a seed's two sizes correlated 0.7 (nested subsets),
    archs independent, 2000 draws: the seed-paired interval the check applies covers 0.95 (within 0.02); the pooled
    Welch as first computed, which counted a seed's two sizes as two runs, about 0.89."""
    pc = load_script(monkeypatch, "heads_depth/scripts/precision_check.py")
    rng = np.random.default_rng(0)
    cov = 0.015**2 * np.array([[1.0, 0.7], [0.7, 1.0]])
    draws = rng.multivariate_normal([0.0, 0.0], cov, (2000, 2, 4)).transpose(0, 1, 3, 2)  # (draw, arch, size, seed)
    paired = pooled = 0
    for a, b in draws:
        _, lo, hi, _ = pc["over_seeds"](a - b)
        paired += lo <= 0 <= hi
        _, lo, hi, _ = pc["welch_over_sizes"](list(a), list(b))
        pooled += lo <= 0 <= hi
    assert abs(paired / len(draws) - 0.95) < 0.02 and pooled / len(draws) < 0.92, (paired, pooled)


def test_the_committed_precision_check_regenerates_from_its_records(monkeypatch, tmp_path):
    """The report's precision check (analysis/precision_check.md) is the script's output on the committed records."""
    study = STUDIES / "heads_depth"
    run_script(monkeypatch, "heads_depth/scripts/precision_check.py", study / "records" / "precision",
               tmp_path / "out.md", "--main", study / "records" / "main")
    assert (tmp_path / "out.md").read_text() == (study / "analysis" / "precision_check.md").read_text()
