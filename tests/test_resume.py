"""Runs that survive kills: checkpoints, resume, signals (the `faults` tests kill real training processes)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from src.checkpoint import CHECKPOINT, PREVIOUS
from src.trainer import train
from tests.conftest import ROOT, TINY

TIMING = ("wall_s", "images_per_s")  # measured, so they differ between any two runs
EPOCHS = 12  # the kills land after 2-3 epochs (polled), so the run goes on well past them
VIT = [*TINY, "trainer.checkpoint=true", "trainer.num_threads=1", "dataset.augment=flip_crop", "model.dropout=0.2",
       f"trainer.max_epochs={EPOCHS}", "dataset.n_train=300", "trainer.batch_size=30", "optimizer.lr=3e-3"]
CNN = [o for o in VIT if not o.startswith("model.")] + ["model=cnn", "model.width=4"]


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def start(overrides: list[str], run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "src.train", *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def stop_after(proc: subprocess.Popen, run_dir: Path, rows: int, sig: int, timeout: float = 600) -> None:
    """Send ``sig`` once ``metrics.jsonl`` holds ``rows`` rows (polled: robust on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while len(rows_of(run_dir)) < rows:
        assert proc.poll() is None, f"the run ended before it could be stopped:\n{proc.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.02)
    proc.send_signal(sig)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One uninterrupted run per model, shared by the kill tests."""
    base = tmp_path_factory.mktemp("uninterrupted")
    procs = {m: start(o, base / m) for m, o in (("vit", VIT), ("cnn", CNN))}  # one thread each: both cores at once
    out = {}
    for m, proc in procs.items():
        rc, log = finish(proc)
        assert rc == 0, log[-3000:]
        out[m] = rows_of(base / m), summary_of(base / m)
    return out


@pytest.mark.faults
@pytest.mark.parametrize("model", ["vit", pytest.param("cnn", marks=pytest.mark.slow)])  # the suite's time: the kill
# is the ViT's here; the CNN's exact resume (BatchNorm, augmentation) is test_a_crashed_run_resumes_exactly_... below
def test_sigkilled_then_resumed_equals_uninterrupted(references, model, tmp_path):
    overrides = VIT if model == "vit" else CNN
    proc = start(overrides, tmp_path)
    stop_after(proc, tmp_path, 3, signal.SIGKILL)
    rc, _ = finish(proc)
    assert rc == -signal.SIGKILL and not (tmp_path / "summary.json").exists()
    # a kill between the rotation's two renames leaves only checkpoint.prev.pt, which the resume falls back to
    assert (tmp_path / CHECKPOINT).is_file() or (tmp_path / PREVIOUS).is_file()
    rc, out = finish(start(overrides, tmp_path))
    assert rc == 0, out[-3000:]
    assert "resuming" in out
    ref_rows, ref_summary = references[model]
    rows, summary = rows_of(tmp_path), summary_of(tmp_path)
    assert untimed(rows) == untimed(ref_rows)  # every row, bitwise: no row lost or duplicated
    assert summary["test_error"] == ref_summary["test_error"] and summary["train_loss"] == ref_summary["train_loss"]
    assert summary["status"] == "completed" and summary["epochs"] == EPOCHS
    assert summary["wall_s"] >= rows[2]["wall_s"]  # wall time counts across the restart


@pytest.mark.faults
def test_sigterm_writes_checkpoint_and_interrupted_summary_then_resumes_exactly(references, tmp_path):
    proc = start(VIT, tmp_path)
    stop_after(proc, tmp_path, 2, signal.SIGTERM)
    rc, out = finish(proc)
    assert rc != 0, out[-3000:]
    summary = summary_of(tmp_path)
    assert summary["status"] == "stopped" and summary["stop_reason"] == "interrupted"
    assert 2 <= summary["epochs"] < EPOCHS
    ckpt = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert ckpt["step"] == summary["steps"]  # the checkpoint is the state at the stop, mid-epoch or not
    rc, out = finish(start(VIT, tmp_path))
    assert rc == 0, out[-3000:]
    ref_rows, ref_summary = references["vit"]
    assert untimed(rows_of(tmp_path)) == untimed(ref_rows)
    assert summary_of(tmp_path)["test_error"] == ref_summary["test_error"]
    assert json.loads((tmp_path / "summary.previous.json").read_text())["stop_reason"] == "interrupted"


@pytest.mark.faults
def test_sigterm_fails_a_job_of_a_multirun(tmp_path):
    """Inside a sweep's job process (Hydra's launcher) SIGTERM still checkpoints and ends the job non-zero."""
    proc = subprocess.Popen([sys.executable, "-m", "src.train", "-m", *VIT, "seed=0,1", f"hydra.sweep.dir={tmp_path}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop_after(proc, tmp_path / "0", 1, signal.SIGTERM)
    rc, out = finish(proc)
    assert rc != 0 and summary_of(tmp_path / "0")["stop_reason"] == "interrupted", out[-3000:]
    assert (tmp_path / "0" / CHECKPOINT).is_file() and not (tmp_path / "1").exists()


# ------------------------------------------------------------------ in-process: cheap, no kill needed
def failing_reporter(at_epoch: int):
    def report(value: float, epoch: int) -> bool:
        if epoch == at_epoch:
            raise RuntimeError("worker lost")
        return False
    return report


def test_a_crashed_run_resumes_exactly_and_a_finished_one_is_not_retrained(tiny_cfg, tmp_path):
    # a constant lr: only a schedule whose horizon does not depend on the limits may be extended
    over = ["trainer.checkpoint=true", "trainer.max_epochs=4", "dataset.augment=flip_crop", "model=cnn",
            "model.width=2", "scheduler=constant"]
    ref = train(tiny_cfg(*over), tmp_path / "ref")
    with pytest.raises(RuntimeError, match="worker lost"):
        train(tiny_cfg(*over), tmp_path / "run", reporter=failing_reporter(3))
    crashed = summary_of(tmp_path / "run")
    assert crashed["status"] == "failed" and "worker lost" in crashed["error"]
    resumed = train(tiny_cfg(*over), tmp_path / "run")
    assert untimed(rows_of(tmp_path / "run")) == untimed(rows_of(tmp_path / "ref"))
    assert resumed["test_error"] == ref["test_error"] and resumed["epochs"] == 4
    stamp = (tmp_path / "run" / CHECKPOINT).stat().st_mtime_ns
    again = train(tiny_cfg(*over, "trainer.num_threads=1"), tmp_path / "run")  # a runtime key may differ
    assert again["objective"] == resumed["objective"] and (tmp_path / "run" / CHECKPOINT).stat().st_mtime_ns == stamp
    longer = train(tiny_cfg(*over[:1], "trainer.max_epochs=6", *over[2:]), tmp_path / "run")  # a raised limit
    assert longer["epochs"] == 6 and [r["epoch"] for r in rows_of(tmp_path / "run")] == [1, 2, 3, 4, 5, 6]


class OuterStop(Exception):
    """What the handler that was there before the run's (a sweeper's, a launcher worker's) does with SIGTERM here."""


@pytest.fixture
def outer_sigterm():
    """SIGTERM handled, outside the run's own handler, by raising OuterStop (pytest's default would end the tests)."""
    def outer(signum, frame):
        raise OuterStop(signum)
    old = signal.signal(signal.SIGTERM, outer)
    yield
    signal.signal(signal.SIGTERM, old)


def sigterm_at_epoch(at_epoch: int):
    def report(value: float, epoch: int) -> bool:
        if epoch == at_epoch:
            signal.raise_signal(signal.SIGTERM)
        return False
    return report


def sigterm_in(monkeypatch, name: str) -> None:
    """A SIGTERM to this process as the run's ``src.trainer.<name>`` starts."""
    import src.trainer as trainer

    real = getattr(trainer, name)

    def with_sigterm(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return real(*args, **kwargs)
    monkeypatch.setattr(trainer, name, with_sigterm)


def test_a_second_sigterm_while_a_stopped_run_saves_leaves_its_checkpoint_and_summary_whole(tiny_cfg, tmp_path,
                                                                                           monkeypatch, outer_sigterm):
    """Found by an intermittent failure of test_sigterm_to_the_whole_process_group... (tests/test_sweep_resume.py):
    a SIGTERM to every process of a sweep reaches a launcher worker twice, from the signal and from the launcher's
    stop. The run's handler was removed before its final checkpoint and summary were written, so a second SIGTERM
    in that window met the worker's default handler: it died mid-save (a 0-byte checkpoint.pt.tmp, no summary, the
    sweep's retry back at the last epoch's checkpoint). Under a sweeper's handler the save was cut by its exception."""
    over = ["trainer.checkpoint=true", "trainer.max_epochs=6", "model=cnn", "model.width=2", "scheduler=constant"]
    sigterm_in(monkeypatch, "finish")
    with pytest.raises(SystemExit) as stopped:  # the run's own stop (RunInterrupted), not the outer handler's
        train(tiny_cfg(*over), tmp_path, reporter=sigterm_at_epoch(2))
    assert stopped.value.code == 128 + signal.SIGTERM
    summary = summary_of(tmp_path)
    assert summary["stop_reason"] == "interrupted" and summary["epochs"] == 2, summary
    ckpt = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    assert ckpt["step"] == summary["steps"] and not (tmp_path / f"{CHECKPOINT}.tmp").exists()


def test_a_sigterm_while_a_finished_run_saves_is_handed_on_once_its_records_are_whole(tiny_cfg, tmp_path,
                                                                                      monkeypatch, outer_sigterm):
    """A stop signal that comes as a run ends for another reason does not cut its final save, and is not lost
    either: once the run's records are whole, it goes to the handler that was there before the run's (a sweeper
    hands the trial back, a launcher worker ends before a queued job starts; its retry finds the run done)."""
    over = ["trainer.checkpoint=true", "trainer.max_epochs=3", "model=cnn", "model.width=2", "scheduler=constant"]
    sigterm_in(monkeypatch, "finish")
    with pytest.raises(OuterStop):
        train(tiny_cfg(*over), tmp_path)
    summary = summary_of(tmp_path)
    assert summary["status"] == "completed" and summary["epochs"] == 3, summary
    assert torch.load(tmp_path / CHECKPOINT, weights_only=True)["step"] == summary["steps"]
    monkeypatch.undo()
    again = train(tiny_cfg(*over), tmp_path)  # the sweep's retry: done, not trained again
    assert again["steps"] == summary["steps"] and again["objective"] == summary["objective"]


@pytest.mark.parametrize("first, longer", [
    (["trainer.max_epochs=2"], ["trainer.max_epochs=3"]),  # a finished cosine run
    (["trainer.max_epochs=2", "trainer.max_steps=5"], ["trainer.max_epochs=2", "trainer.max_steps=7"]),  # unfinished
])
def test_extending_a_cosine_run_is_refused_before_any_work(tiny_cfg, tmp_path, first, longer):
    """Defect: raising max_epochs on a finished cosine run re-annealed the lr over the new horizon (per-epoch lr
    1.7e-3, 1.5e-5, 5.2e-4, 4e-6) and nothing in its records said so. The lr path would no longer be the one its
    config describes, so the extension is refused and the message names the fixes."""
    train(tiny_cfg("trainer.checkpoint=true", "scheduler=cosine", *first), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fixes = r"(?s)trainer.max_.*horizon(?=.*scheduler=constant)(?=.*trainer.resume=never)"
    with pytest.raises(ValueError, match=fixes):
        train(tiny_cfg("trainer.checkpoint=true", "scheduler=cosine", *longer), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_cosine_run_may_get_more_wall_time_or_an_unchanged_horizon(tiny_cfg, tmp_path):
    over = ["trainer.checkpoint=true", "scheduler=cosine", "trainer.max_epochs=10", "trainer.max_steps=6"]
    first = train(tiny_cfg(*over, "trainer.max_wall_s=600"), tmp_path)
    assert first["stop_reason"] == "max_steps"
    # the step limit sets the horizon (6 < 10 x 4 steps): raising the epoch cap leaves the lr path unchanged
    again = train(tiny_cfg(*over[:2], "trainer.max_epochs=20", over[3], "trainer.max_wall_s=1200"), tmp_path)
    assert again["steps"] == 6 and again["objective"] == first["objective"]


def test_a_changed_config_refuses_to_resume_and_names_the_keys(tiny_cfg, tmp_path):
    train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=1"), tmp_path)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"(?s)model.dim: 32 -> 48.*optimizer.lr.*trainer.resume=never"):
        train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=2", "model.dim=48", "optimizer.lr=0.01",
                       "+trial.number=3", "trainer.progress=true"), tmp_path)
    assert (tmp_path / "metrics.jsonl").read_text() == before


def test_trial_and_runtime_keys_do_not_block_a_resume(tiny_cfg, tmp_path):
    over = ["trainer.checkpoint=true", "trainer.max_epochs=3"]
    with pytest.raises(RuntimeError):
        train(tiny_cfg(*over, "+trial.number=1", "+trial.study_name=a"), tmp_path, reporter=failing_reporter(2))
    summary = train(tiny_cfg(*over, "+trial.number=7", "+trial.study_name=b", "trainer.log_every=3"), tmp_path)
    assert summary["status"] == "completed" and [r["epoch"] for r in rows_of(tmp_path)] == [1, 2, 3]


def test_a_corrupt_last_checkpoint_falls_back_to_the_previous_one(tiny_cfg, tmp_path, caplog):
    over = ["trainer.checkpoint=true", "trainer.max_epochs=4"]
    ref = train(tiny_cfg(*over), tmp_path / "ref")
    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        train(tiny_cfg(*over), run, reporter=failing_reporter(3))  # checkpoints of epochs 1 and 2 exist
    (run / CHECKPOINT).write_bytes((run / CHECKPOINT).read_bytes()[:500])  # truncated mid-write
    resumed = train(tiny_cfg(*over), run)
    assert f"{run / CHECKPOINT} is unreadable" in caplog.text
    assert untimed(rows_of(run)) == untimed(rows_of(tmp_path / "ref")) and resumed["test_error"] == ref["test_error"]


def test_a_checkpoint_of_another_shape_falls_back_then_starts_afresh(tiny_cfg, tmp_path, caplog):
    over = ["trainer.checkpoint=true", "trainer.max_epochs=3"]
    with pytest.raises(RuntimeError):
        train(tiny_cfg(*over), tmp_path, reporter=failing_reporter(2))
    for name in (CHECKPOINT, PREVIOUS):
        if (tmp_path / name).exists():
            ckpt = torch.load(tmp_path / name, weights_only=True)
            ckpt["model"] = {k: torch.zeros(3) for k in ckpt["model"]}
            torch.save(ckpt, tmp_path / name)
    summary = train(tiny_cfg(*over), tmp_path)
    assert "does not fit this run" in caplog.text and "starting afresh" in caplog.text
    assert summary["status"] == "completed" and [r["epoch"] for r in rows_of(tmp_path)] == [1, 2, 3]
    assert list(tmp_path.glob("previous-*/metrics.jsonl"))  # the old records were moved aside, not deleted


@pytest.mark.parametrize("change", ["labels_sha256", "test_labels_sha256", "mean"])
def test_a_checkpoint_trained_on_other_data_is_not_continued(tiny_cfg, tmp_path, change):
    """A run dir's data may move (dataset.root is a runtime key: another machine's copy), but a checkpoint continued
    on other content (another file behind the same key, other noisy labels, another test set) would finish a run that
    trained on two datasets and looks like one. The checkpoint records the labels' digests and the images'
    statistics; a resume on data that differs is an error that names it and leaves the run's files as they were
    (starting afresh would discard its training for what is likely a wrong path)."""
    from src.run_state import OtherDataError

    over = ["trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=3"]
    train(tiny_cfg(*over, "trainer.max_steps=5"), tmp_path)
    for name in (CHECKPOINT, PREVIOUS):
        if (tmp_path / name).exists():
            ckpt = torch.load(tmp_path / name, weights_only=True)
            assert len(ckpt["data"]["labels_sha256"]) == len(ckpt["data"]["test_labels_sha256"]) == 64
            if change == "mean":
                ckpt["data"]["mean"] = [m + 1e-3 for m in ckpt["data"]["mean"]]
            else:
                ckpt["data"][change] = "0" * 64
            torch.save(ckpt, tmp_path / name)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(OtherDataError, match="trained on other data .* differ"):
        train(tiny_cfg(*over), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_a_checkpoint_without_a_label_digest_still_resumes(tiny_cfg, tmp_path):
    """Checkpoints written before the digest (a study's interrupted runs) resume on the statistics alone."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=3"]
    train(tiny_cfg(*over, "trainer.max_steps=5"), tmp_path)
    for name in (CHECKPOINT, PREVIOUS):
        if (tmp_path / name).exists():
            ckpt = torch.load(tmp_path / name, weights_only=True)
            del ckpt["data"]["labels_sha256"], ckpt["data"]["test_labels_sha256"]
            torch.save(ckpt, tmp_path / name)
    train(tiny_cfg(*over), tmp_path)  # the evaluation of half-trained epoch 2 (step 5) leaves the extended run
    assert [(r["epoch"], r["step"]) for r in rows_of(tmp_path)] == [(1, 4), (2, 8), (3, 12)]


def test_a_run_extended_past_a_stop_mid_epoch_records_what_an_uninterrupted_run_does(tiny_cfg, tmp_path):
    """Review 2026-11-29 (trainer, 1): a step limit that stopped a run mid-epoch evaluated the half-trained model;
    extended, the run kept that row (two rows for one epoch) and its best_test_error / best_val_error, which could be
    a model the uninterrupted run never evaluated (best_val_error 0.045 against 0.05 in the review)."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=3", "dataset.val_size=40"]
    whole = train(tiny_cfg(*over), tmp_path / "whole")
    train(tiny_cfg(*over, "trainer.max_steps=5"), tmp_path / "cut")
    assert [(r["epoch"], r["step"]) for r in rows_of(tmp_path / "cut")] == [(1, 4), (2, 5)]
    cut = train(tiny_cfg(*over), tmp_path / "cut")
    drop = ("wall_s", "images_per_s")
    assert ([{k: v for k, v in r.items() if k not in drop} for r in rows_of(tmp_path / "cut")]
            == [{k: v for k, v in r.items() if k not in drop} for r in rows_of(tmp_path / "whole")])
    for key in ("best_test_error", "best_val_error", "test_error", "epochs", "steps"):
        assert cut[key] == whole[key], key

def test_a_step_limit_on_the_batch_where_the_run_converges_records_the_convergence(tiny_cfg, tmp_path):
    """Review 2026-11-29 (session 53, trainer): max_steps firing on the last batch of the epoch whose evaluation
    converged (or stalled) kept max_steps as the reason; the run read as stopped, and extended it trained on past the
    epoch where an uninterrupted run stops (stalled at 3 against converged at 4 in the review)."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=30", "trainer.converge_epochs=2",
            "trainer.converge_tol=1.0"]  # 4 steps an epoch: the third evaluation ends the run
    whole = train(tiny_cfg(*over), tmp_path / "whole")
    assert whole["epochs"] == 3 and whole["stop_reason"] in ("converged", "stalled")
    cut = train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "cut")  # the limit fires on epoch 3's last batch
    assert (cut["stop_reason"], summary_of(tmp_path / "cut")["status"]) == (whole["stop_reason"], "completed")
    train(tiny_cfg(*over), tmp_path / "cut")
    assert untimed(rows_of(tmp_path / "cut")) == untimed(rows_of(tmp_path / "whole"))


def test_resume_never_moves_the_old_files_aside(tiny_cfg, tmp_path):
    train(tiny_cfg("trainer.checkpoint=true"), tmp_path)
    old = (tmp_path / "metrics.jsonl").read_text()
    train(tiny_cfg("trainer.checkpoint=true", "trainer.resume=never", "optimizer.lr=0.01"), tmp_path)
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / "metrics.jsonl").read_text() == old
    assert {p.name for p in previous.iterdir()} == {"metrics.jsonl", "summary.json", "config.json", CHECKPOINT}
    assert summary_of(tmp_path)["status"] == "completed"


def test_resume_never_moves_aside_the_replaced_starts_summary_too(tiny_cfg, tmp_path):
    """Review 2026-11-29 (user path, 6): summary.previous.json (the summary of a start a resume replaced) stayed in
    the dir after trainer.resume=never, so the fresh run's dir held the old run's summary as its own history."""
    train(tiny_cfg("trainer.checkpoint=true"), tmp_path)
    (tmp_path / "summary.previous.json").write_text('{"status": "interrupted", "steps": 32}')
    train(tiny_cfg("trainer.checkpoint=true", "trainer.resume=never", "optimizer.lr=0.01"), tmp_path)
    (previous,) = tmp_path.glob("previous-*")
    assert not (tmp_path / "summary.previous.json").exists()
    assert (previous / "summary.previous.json").read_text() == '{"status": "interrupted", "steps": 32}'


def test_checkpoints_are_atomic_keep_the_previous_and_load_weights_only(tiny_cfg, tmp_path):
    train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=3", "trainer.checkpoint_every=1"), tmp_path)
    last = torch.load(tmp_path / CHECKPOINT, weights_only=True)
    prev = torch.load(tmp_path / PREVIOUS, weights_only=True)
    assert (last["epoch"], prev["epoch"]) == (3, 2) and not list(tmp_path.glob("*.tmp"))
    assert {"model", "model_cfg", "data", "optimizer", "rng", "loader", "rules", "config"} <= last.keys()
    assert last["rng"]["torch"].dtype == torch.uint8 and last["loader"]["gen"].dtype == torch.uint8


def test_checkpoint_every_zero_writes_only_at_the_end(tiny_cfg, tmp_path):
    with pytest.raises(RuntimeError):
        train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=3", "trainer.checkpoint_every=0"), tmp_path,
              reporter=failing_reporter(2))  # epoch 1 ended without a checkpoint
    assert not (tmp_path / CHECKPOINT).exists()


def test_a_nonfinite_run_is_final(tiny_cfg, tmp_path):
    over = ["optimizer.lr=1e30", "trainer.max_epochs=20", "trainer.log_every=1", "model=cnn", "optimizer=sgd",
            "trainer.checkpoint=true"]
    first = train(tiny_cfg(*over), tmp_path)
    assert first["stop_reason"] == "nonfinite_loss"
    assert train(tiny_cfg(*over), tmp_path)["epochs"] == first["epochs"]


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root may write anywhere")
def test_a_read_only_output_folder_fails_before_any_work(tiny_cfg, tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="not writable"):
            train(tiny_cfg(), tmp_path)
    finally:
        tmp_path.chmod(0o755)


def test_a_run_dir_that_cannot_be_created_fails_before_any_work(tiny_cfg, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="cannot create the run dir .* choose a writable hydra.run.dir"):
        train(tiny_cfg(), tmp_path / "file" / "run")


def test_a_mid_epoch_checkpoint_resumes_exactly(tiny_cfg, tmp_path):
    """A stop inside an epoch (here max_steps; SIGTERM does the same) checkpoints the loader's position:
    continuing redraws the epoch's order and augmentations and goes on from the next batch."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "dataset.augment=flip_crop", "trainer.max_epochs=10"]
    ref = train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "ref")  # 4 steps per epoch
    first = train(tiny_cfg(*over, "trainer.max_steps=5"), tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)
    assert first["stop_reason"] == "max_steps" and ckpt["loader"]["batch"] == 1 and not ckpt["epoch_done"]
    resumed = train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "run")
    rows = untimed(rows_of(tmp_path / "run"))  # the evaluation of half-trained epoch 2 (step 5) left on extension
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 4), (2, 8), (3, 12)]
    assert rows == untimed(rows_of(tmp_path / "ref"))
    assert resumed["test_error"] == ref["test_error"] and resumed["train_loss"] == ref["train_loss"]


def test_a_step_limit_on_an_epochs_last_batch_closes_the_epoch(tiny_cfg, tmp_path):
    """max_steps reached on the last batch of an epoch: the epoch was trained whole and evaluated, so a run resumed
    under a higher limit goes on with the next epoch. It resumed into the same epoch, trained no batch and scored
    that epoch a second time (a duplicate row with images_per_s 0). A run that then continues equals one run."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "dataset.augment=flip_crop", "trainer.max_epochs=10"]
    ref = train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "ref")  # 4 steps per epoch
    first = train(tiny_cfg(*over, "trainer.max_steps=8"), tmp_path / "run")
    assert first["stop_reason"] == "max_steps" and first["epochs"] == 2
    resumed = train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "run")
    rows = untimed(rows_of(tmp_path / "run"))
    assert [(r["epoch"], r["step"]) for r in rows] == [(1, 4), (2, 8), (3, 12)]
    assert rows == untimed(rows_of(tmp_path / "ref"))
    assert resumed["test_error"] == ref["test_error"] and resumed["train_loss"] == ref["train_loss"]
    # the step limit and the epoch cap on the same batch: the run reached its cap, and a resume without the step
    # limit trains no further (it trained a third epoch, past the cap, and a third start refused the run)
    capped = [*over[:-1], "trainer.max_epochs=2"]
    first = train(tiny_cfg(*capped, "trainer.max_steps=8"), tmp_path / "capped")
    again = train(tiny_cfg(*capped), tmp_path / "capped")
    assert first["stop_reason"] == again["stop_reason"] == "max_epochs" and again["epochs"] == 2
    assert [(r["epoch"], r["step"]) for r in rows_of(tmp_path / "capped")] == [(1, 4), (2, 8)]

def test_a_run_killed_between_its_final_checkpoint_and_its_summary_trains_no_further(tiny_cfg, tmp_path):
    over = ["trainer.checkpoint=true", "trainer.max_epochs=2"]
    first = train(tiny_cfg(*over), tmp_path)
    (tmp_path / "summary.json").unlink()  # as if SIGKILLed right after the final checkpoint
    again = train(tiny_cfg(*over), tmp_path)
    assert again["epochs"] == 2 and again["test_error"] == first["test_error"] and len(rows_of(tmp_path)) == 2


def test_a_corrupt_checkpoint_with_no_previous_one_warns_and_starts_afresh(tiny_cfg, tmp_path, caplog):
    over = ["trainer.checkpoint=true", "trainer.max_epochs=2", "trainer.checkpoint_every=0"]
    with pytest.raises(RuntimeError):
        train(tiny_cfg(*over), tmp_path, reporter=failing_reporter(1))  # no checkpoint yet
    (tmp_path / CHECKPOINT).write_bytes(b"PK\x03\x04 not a zip")
    summary = train(tiny_cfg(*over), tmp_path)
    assert f"{tmp_path / CHECKPOINT} is unreadable" in caplog.text
    assert summary["status"] == "completed" and [r["epoch"] for r in rows_of(tmp_path)] == [1, 2]
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / CHECKPOINT).read_bytes().startswith(b"PK") and (previous / "summary.json").is_file()


def test_a_summary_names_every_machine_its_run_trained_on(tiny_cfg, tmp_path):
    """A study grid resumed across sessions trains on whatever CPU or GPU each session has (2026-11-27: an AMD
    EPYC, then an Intel Xeon with AMX, for one CPU grid); each run's summary says which machines trained it, in
    order, kept across resumes by its checkpoint."""
    from src.checkpoint import load_checkpoint, save_checkpoint
    from src.run_setup import machine_name

    over = ["trainer.checkpoint=true", "model=cnn", "model.width=2", "scheduler=constant"]
    first = train(tiny_cfg(*over, "trainer.max_epochs=2"), tmp_path)
    here = machine_name(torch.device("cpu"))
    assert first["machines"] == [here] and here.strip()
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    assert ckpt["machines"] == [here]
    ckpt["machines"] = ["Another CPU (family 25 model 17)"]  # as if the first sitting ran elsewhere
    save_checkpoint(tmp_path, ckpt)
    resumed = train(tiny_cfg(*over, "trainer.max_epochs=3"), tmp_path)
    assert resumed["epochs"] == 3 and resumed["machines"] == ["Another CPU (family 25 model 17)", here]
    assert summary_of(tmp_path)["machines"] == resumed["machines"]


def test_a_run_resumed_from_a_checkpoint_that_names_no_machine_says_so(tiny_cfg, tmp_path):
    """Found on 2026-11-28: the ViT grid's 37 runs that trained 70-80% of their epochs on lent H100s (checkpoints of
    2026-11-27, before checkpoints named their machine) and finished on an H200 had summaries naming the H200 alone,
    so the study's machine note counted them as H200 runs. The part trained on an unnamed machine is "not recorded"."""
    from src.checkpoint import load_checkpoint, save_checkpoint
    from src.run_setup import machine_name

    over = ["trainer.checkpoint=true", "model=cnn", "model.width=2", "scheduler=constant"]
    train(tiny_cfg(*over, "trainer.max_epochs=2"), tmp_path)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    del ckpt["machines"]  # as the checkpoints of 2026-11-27 were
    save_checkpoint(tmp_path, ckpt)
    resumed = train(tiny_cfg(*over, "trainer.max_epochs=3"), tmp_path)
    here = machine_name(torch.device("cpu"))
    assert resumed["epochs"] == 3 and resumed["machines"] == ["not recorded", here]
    assert summary_of(tmp_path)["machines"] == resumed["machines"]


def test_a_run_finished_from_its_final_checkpoint_names_only_the_machines_that_trained_it(tiny_cfg, tmp_path):
    """Review finding (2026-11-28): a run killed after its final checkpoint, before its summary, is finished on the next
    start without a step of training; that start's machine was still added to the summary's machines."""
    from src.checkpoint import load_checkpoint, save_checkpoint

    over = ["trainer.checkpoint=true", "model=cnn", "model.width=2", "scheduler=constant", "trainer.max_epochs=2"]
    done = train(tiny_cfg(*over), tmp_path)
    ckpt = load_checkpoint(tmp_path / CHECKPOINT)
    assert ckpt["stop_reason"] == "max_epochs"
    ckpt["machines"] = ["Another CPU (family 25 model 17)"]  # it trained elsewhere and was killed before its summary
    save_checkpoint(tmp_path, ckpt)
    (tmp_path / "summary.json").unlink()
    again = train(tiny_cfg(*over), tmp_path)
    assert again["epochs"] == done["epochs"] == 2 and again["test_error"] == done["test_error"]
    assert again["machines"] == ["Another CPU (family 25 model 17)"] == summary_of(tmp_path)["machines"]


def test_a_finished_run_whose_checkpoints_are_gone_is_not_trained_again(tiny_cfg, tmp_path):
    """Found on a lent H100: 11 converged runs whose trials a stop had handed back came back from committed records,
    which hold no checkpoints, and trained again from scratch (370 epochs each). A finished run needs no checkpoint
    to be done: its summary and the config it ended under (``config.json``) say so, as its final checkpoint would.
    Under another config, with the stop no longer holding, or without checkpoints, it trains again as before."""
    cfg = ("trainer.checkpoint=true", "trainer.max_epochs=2")
    train(tiny_cfg(*cfg), tmp_path)
    first = summary_of(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["trainer"]["max_epochs"] == 2
    for name in (CHECKPOINT, PREVIOUS):
        (tmp_path / name).unlink(missing_ok=True)
    rows = rows_of(tmp_path)
    again = train(tiny_cfg(*cfg), tmp_path)
    assert again == first and rows_of(tmp_path) == rows and not list(tmp_path.glob("previous-*"))
    longer = train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=3"), tmp_path)  # the stop no longer holds
    assert longer["epochs"] == 3 and len(list(tmp_path.glob("previous-*"))) == 1
    for name in (CHECKPOINT, PREVIOUS):
        (tmp_path / name).unlink(missing_ok=True)
    other = train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=3", "optimizer.lr=0.01"), tmp_path)
    assert other["base_lr"] == 0.01 and len(list(tmp_path.glob("previous-*"))) == 2  # another config: trained
    for name in (CHECKPOINT, PREVIOUS):
        (tmp_path / name).unlink(missing_ok=True)
    off = train(tiny_cfg("trainer.checkpoint=false", "trainer.max_epochs=3", "optimizer.lr=0.01"), tmp_path)
    assert off["wall_s"] != other["wall_s"] and len(list(tmp_path.glob("previous-*"))) == 3  # no checkpoints: trained


def _drop_checkpoints(run_dir: Path) -> None:
    for name in (CHECKPOINT, PREVIOUS):
        (run_dir / name).unlink(missing_ok=True)


@pytest.mark.parametrize("change, done", [
    (["trainer.eval_batch_size=64"], True),  # a runtime key that computes nothing else: still the same run
    (["trainer.max_epochs=3"], False),  # another run length (a stop that no longer holds, too)
    (["trainer.max_epochs=1"], False),  # a cap below where the run went: another run
    (["trainer.resume=never"], False),  # asked to start over
    (["dataset.n_train=100"], False),
])
def test_a_checkpoint_free_finished_run_is_returned_only_for_the_same_run(tiny_cfg, tmp_path, change, done):
    """Review of the above: the checkpoint-free return must never hand back a run of another config. A runtime key
    that changes no result keeps it; the run length (a runtime key for checkpoints, which may continue a run), a start
    over or any other key moves the files aside and trains again."""
    base = ("trainer.checkpoint=true", "trainer.max_epochs=2", "scheduler=constant")
    train(tiny_cfg(*base), tmp_path)
    _drop_checkpoints(tmp_path)
    summary = train(tiny_cfg(*base, *change), tmp_path)
    assert (not list(tmp_path.glob("previous-*"))) is done, summary
    if done:
        assert summary == summary_of(tmp_path) and summary["epochs"] == 2


def test_a_checkpoint_free_run_with_a_key_missing_from_its_config_or_an_interrupted_summary_trains_again(tiny_cfg,
                                                                                                       tmp_path):
    cfg = ("trainer.checkpoint=true", "trainer.max_epochs=2")
    train(tiny_cfg(*cfg), tmp_path)
    _drop_checkpoints(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["trainer"]["grad_clip"]  # as if written before the key existed: absent is not null
    (tmp_path / "config.json").write_text(json.dumps(saved))
    train(tiny_cfg(*cfg), tmp_path)
    assert len(list(tmp_path.glob("previous-*"))) == 1
    _drop_checkpoints(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "status": "stopped", "stop_reason": "interrupted"}))
    train(tiny_cfg(*cfg), tmp_path)
    assert len(list(tmp_path.glob("previous-*"))) == 2


def test_a_finished_run_is_not_returned_for_a_shorter_or_other_length_run(tiny_cfg, tmp_path):
    """Found in review: a finished run was returned for any config that differed only in its limits, as long as its
    stop still held, so a run that trained 2 epochs came back for max_epochs=1, and a cosine run's summary for another
    horizon (another lr path from step 0). A lower cap than the run went is refused, as another horizon is."""
    train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=2", "scheduler=constant"), tmp_path)
    with pytest.raises(ValueError, match=r"(?s)trained 2 epochs.*trainer.max_epochs=1.*trainer.resume=never"):
        train(tiny_cfg("trainer.checkpoint=true", "trainer.max_epochs=1", "scheduler=constant"), tmp_path)
    run = tmp_path / "cosine"
    frozen = ("trainer.checkpoint=true", "scheduler=cosine", "optimizer.lr=0", "trainer.converge_epochs=1")
    first = train(tiny_cfg(*frozen, "trainer.max_epochs=5"), run)
    assert first["stop_reason"] in ("converged", "stalled") and first["epochs"] < 5
    with pytest.raises(ValueError, match="horizon"):
        train(tiny_cfg(*frozen, "trainer.max_epochs=4"), run)


def test_a_mid_epoch_stops_evaluation_leaves_the_convergence_history_on_resume(tiny_cfg, tmp_path):
    """A step rule firing inside epoch 2 evaluates the half-trained model there; resumed under a higher limit, that
    epoch was evaluated again and the convergence window held both values (one differing partial value could hold
    off convergence for converge_epochs epochs: review 2026-11-29). The resumed history is the uninterrupted one."""
    over = ["trainer.checkpoint=true", "scheduler=constant", "trainer.max_epochs=10", "trainer.converge_epochs=5"]
    train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "ref")  # 4 steps per epoch
    train(tiny_cfg(*over, "trainer.max_steps=5"), tmp_path / "run")
    partial = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)["rules"]["history"]
    assert [e for e, _ in partial] == [1, 2]  # the stop evaluated epoch 2 after one of its 4 steps
    train(tiny_cfg(*over, "trainer.max_steps=12"), tmp_path / "run")
    ref = torch.load(tmp_path / "ref" / CHECKPOINT, weights_only=True)["rules"]["history"]
    resumed = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)["rules"]["history"]
    assert resumed == ref and [e for e, _ in resumed] == [1, 2, 3]


EXTEND = ["trainer.checkpoint=true", "scheduler=constant", "dataset.val_size=40", "trainer.test_every=4"]


def history_of(run_dir: Path) -> list:
    return torch.load(run_dir / CHECKPOINT, weights_only=True)["rules"]["history"]


def assert_same_run(cut: dict, whole: dict, tmp_path: Path) -> None:
    """The run in tmp_path/cut (stopped, then extended) recorded what the uninterrupted tmp_path/whole did."""
    assert untimed(rows_of(tmp_path / "cut")) == untimed(rows_of(tmp_path / "whole"))
    for key in ("best_test_error", "best_val_error", "best_train_error", "test_error", "epochs", "steps",
                "stop_reason"):
        assert cut.get(key) == whole.get(key), key
    assert history_of(tmp_path / "cut") == history_of(tmp_path / "whole")


@pytest.mark.parametrize("every, first", [(2, "trainer.max_epochs=3"), (2, "trainer.max_steps=12"),
                                          (1, "trainer.max_epochs=3"), (1, "trainer.max_steps=12")])
def test_a_run_extended_past_a_stop_at_an_epochs_end_records_what_an_uninterrupted_run_does(tiny_cfg, tmp_path,
                                                                                             every, first):
    """Review 2026-11-29 (trainer): a run stopped at its epoch cap, or by a step limit on an epoch's last batch, made
    that epoch's evaluation final, which scores the test split and runs even where eval_every says none is due;
    extended, the run kept it: an off-grid row, or a test score the uninterrupted run never made, in metrics.jsonl,
    best_test_error and the convergence history (eval_every=2, test_every=4, 3 then 6 epochs: rows at epochs 2, 3,
    4, 6 against 2, 4, 6). 4 steps an epoch: max_steps=12 fires on epoch 3's last batch."""
    over = [*EXTEND, f"trainer.eval_every={every}", "trainer.max_epochs=6"]
    whole = train(tiny_cfg(*over), tmp_path / "whole")
    assert [(r["epoch"], "test_error" in r) for r in rows_of(tmp_path / "whole")] == (
        [(2, False), (4, True), (6, True)] if every == 2 else [(e, e in (4, 6)) for e in range(1, 7)])
    stopped = train(tiny_cfg(*over, first), tmp_path / "cut")
    assert stopped["epochs"] == 3 and "test_error" in rows_of(tmp_path / "cut")[-1]  # the final evaluation
    cut = train(tiny_cfg(*over), tmp_path / "cut")
    assert_same_run(cut, whole, tmp_path)


@pytest.mark.parametrize("every, first", [(3, "trainer.max_epochs=1"), (3, "trainer.max_steps=4"),
                                          (1, "trainer.max_epochs=3")])
def test_a_run_extended_past_a_stop_at_an_epochs_end_converges_where_an_uninterrupted_run_does(tiny_cfg, tmp_path,
                                                                                                every, first):
    """converge_tol=1.0: a run converges at its first evaluation with one converge_epochs (2) before it. eval_every=3:
    the uninterrupted run converges at epoch 6 (opened by epoch 3); the final evaluation of epoch 1 left in the
    history opened the window at epoch 3. eval_every=1: the uninterrupted run converges at epoch 3, where the capped
    one stopped at max_epochs (the same evaluation converged): extended, it trained on to epoch 4."""
    over = [*EXTEND, "trainer.test_every=null", f"trainer.eval_every={every}", "trainer.max_epochs=9",
            "trainer.converge_epochs=2", "trainer.converge_tol=1.0"]
    whole = train(tiny_cfg(*over), tmp_path / "whole")
    assert whole["stop_reason"] in ("converged", "stalled") and whole["epochs"] == (6 if every == 3 else 3)
    train(tiny_cfg(*over, first), tmp_path / "cut")
    cut = train(tiny_cfg(*over), tmp_path / "cut")
    assert_same_run(cut, whole, tmp_path)


def test_a_final_checkpoint_written_before_it_recorded_its_evaluation_still_extends(tiny_cfg, tmp_path):
    """Checkpoints written before 2026-11-29 do not say whether their final evaluation was due: the extended run
    keeps it, as it did then."""
    over = [*EXTEND, "trainer.eval_every=2", "trainer.max_epochs=6"]
    train(tiny_cfg(*over, "trainer.max_epochs=3"), tmp_path)
    for name in (CHECKPOINT, PREVIOUS):
        if (tmp_path / name).exists():
            ckpt = torch.load(tmp_path / name, weights_only=True)
            ckpt.pop("before_final", None)
            torch.save(ckpt, tmp_path / name)
    extended = train(tiny_cfg(*over), tmp_path)
    assert [(r["epoch"], "test_error" in r) for r in rows_of(tmp_path)] == [(2, False), (3, True), (4, True),
                                                                            (6, True)]
    assert extended["epochs"] == 6


@pytest.mark.parametrize("every, test_every, objective, epochs", [
    (1, "null", "auto", 3), (3, "6", "auto", 3), (3, "6", "test_error", 6)])
def test_a_run_extended_past_its_cap_is_pruned_where_an_uninterrupted_run_is(tiny_cfg, tmp_path, every, test_every,
                                                                              objective, epochs):
    """Found 2026-11-29 (trainer review leftover): the final evaluation of a capped run reports to no pruner (a
    stopping run is not pruned), so a run extended past its cap never told the pruner that epoch's value, which the
    uninterrupted run did, and trained on where that run was pruned. The extension reports the kept evaluation first.
    The reporter prunes at epoch 3. Objective val_error (auto, with a val split): reported at epoch 3 whatever
    test_every says. Objective test_error with test_every=6: the uninterrupted run does not score the test split at
    epoch 3, so nothing is reported there (the capped run's test score came from its stop) and it trains to 6."""
    over = [*EXTEND, f"trainer.eval_every={every}", f"trainer.test_every={test_every}", "trainer.max_epochs=6",
            f"trainer.objective={objective}"]
    whole_calls, cut_calls = [], []
    whole = train(tiny_cfg(*over), tmp_path / "whole", reporter=lambda v, e: whole_calls.append((v, e)) or e == 3)
    assert whole["stop_reason"] == ("pruned" if epochs == 3 else "max_epochs") and whole["epochs"] == epochs
    stopped = train(tiny_cfg(*over, "trainer.max_epochs=3"), tmp_path / "cut",
                    reporter=lambda v, e: cut_calls.append((v, e)) or e == 3)
    assert stopped["stop_reason"] == "max_epochs" and len(cut_calls) == len(range(every, 3, every))
    cut = train(tiny_cfg(*over), tmp_path / "cut", reporter=lambda v, e: cut_calls.append((v, e)) or e == 3)
    assert cut_calls == whole_calls
    assert_same_run(cut, whole, tmp_path)


def test_an_extended_run_reports_its_kept_final_evaluation_once_and_goes_on_when_not_pruned(tiny_cfg, tmp_path):
    """The replayed report of the kept evaluation comes once; a run not pruned there trains on as the uninterrupted
    one, reporting every later evaluation but the final one (epochs 1-5, each once)."""
    over = [*EXTEND, "trainer.max_epochs=6"]
    whole_calls, cut_calls = [], []
    whole = train(tiny_cfg(*over), tmp_path / "whole", reporter=lambda v, e: whole_calls.append((v, e)) and False)
    train(tiny_cfg(*over, "trainer.max_epochs=3"), tmp_path / "cut", reporter=lambda v, e: cut_calls.append((v, e)))
    cut = train(tiny_cfg(*over), tmp_path / "cut", reporter=lambda v, e: cut_calls.append((v, e)))
    assert [e for _, e in whole_calls] == list(range(1, 6)) and cut_calls == whole_calls
    assert_same_run(cut, whole, tmp_path)
