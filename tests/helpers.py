"""Helpers shared by several test modules: the sweeper test app and its command runner, fault-test process
watchers, run-dir writers. Test modules import them from here, never from one another."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from hydra_plugins.vitsweep_sweeper import study as st

ROOT = Path(__file__).resolve().parents[1]


APP = ROOT / "tests" / "sweeper_app" / "app.py"


def run(args, cwd, check=True, env=None, timeout=300):
    """Run a Hydra command line in a subprocess; the repo root is importable as in an install."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def sweep(tmp_path, *overrides, check=True):
    return run([APP, "-m", f"hydra.sweep.dir={tmp_path}", *overrides], cwd=tmp_path, check=check)


def load(tmp_path, name="app"):
    return load_existing(f"sqlite:///{tmp_path}/optuna.db", name)


def load_existing(url, name):
    """A study, read without creating its storage's tables: a test polling a sweep that is still starting leaves
    the storage to the sweep."""
    from hydra_plugins.vitsweep_sweeper.protocol import open_existing_storage

    return optuna.load_study(study_name=name, storage=open_existing_storage(url))


GRID = ["x=choice(0,1,2)", "y=choice(0,1)", "hydra/sweeper/sampler=grid"]  # 6 points


LIVENESS = ["hydra.sweeper.heartbeat_s=0.5", "hydra.sweeper.grace_s=3"]


def counted(study):
    return st.budget_trials(study.get_trials())


def assert_each_point_once(study, n_points=6):
    """Each grid point COMPLETE exactly once among all trials, and the budget's trials are exactly the grid."""
    done = [tuple(sorted(t.params.items())) for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(done) == len(set(done)) == n_points, sorted(done)
    assert len(counted(study)) == n_points


def wait_for(predicate, timeout=120, what="condition", proc=None):
    """Poll ``predicate`` until it is true. With ``proc`` (a Popen with piped output, the process expected to bring
    the condition about): fail at once when it has exited without doing so, with its exit code and output."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - the database may not exist yet
            value = None
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the process exited {proc.returncode} before {what}:\n{(out or '')[-2000:]}\n"
                                 f"{(err or '')[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_marked(code: str) -> Callable[..., list[int]]:
    """Run ``code`` (ending in ``os._exit(9)``) in a Python process whose environment carries a fresh mark (its
    children inherit it), and return
    ``marked(what=b"")``: the live processes with the mark whose command line contains ``what`` (a zombie's environ
    cannot be read, so it does not count). Finds the orphans a killed process left through /proc (Linux)."""
    import tempfile
    import uuid

    if not os.path.isdir("/proc/self"):
        pytest.skip("finds orphaned processes through /proc (Linux)")
    mark = f"VITSWEEP_TEST_MARK={uuid.uuid4().hex}".encode()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VITSWEEP_TEST_MARK": mark.decode().split("=", 1)[1]}
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: the orphans inherit it, and reading a pipe to EOF
        # would wait for them to end
        child = subprocess.run([sys.executable, "-c", code], env=env, timeout=120, stdout=subprocess.DEVNULL,
                               stderr=err, check=False)
        err.seek(0)
        # the code ends with os._exit(9) once it has started what it means to orphan: anything else (an exception
        # before it started them) would leave nothing to find, and the test would pass without testing anything
        assert child.returncode == 9, f"the marked process ended {child.returncode}, not os._exit(9):\n{err.read()}"

    def marked(what: bytes = b"") -> list[int]:
        pids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                if mark in open(f"/proc/{entry}/environ", "rb").read() \
                        and what in open(f"/proc/{entry}/cmdline", "rb").read():
                    pids.append(int(entry))
            except OSError:
                pass
        return pids

    return marked


def wait_until_gone(marked: Callable[..., list[int]], what: str, timeout: float = 30) -> None:
    """Wait for every process ``marked`` lists to end; SIGKILL the ones left (then fail, naming ``what``)."""
    try:
        wait_for(lambda: not marked(), timeout=timeout, what=what)
    finally:
        for pid in marked():
            os.kill(pid, signal.SIGKILL)


def gone(pid):
    """The process has exited: no such pid, or a zombie (exited, not yet reaped by the process that adopted it,
    which in a container without an init may never happen)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def run_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python -m src.train ...` from the repo root."""
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def write_run(root: Path, num: int, config: dict, summary: dict | None, metrics: list[dict] | None = None) -> Path:
    """One run dir as the trainer leaves it: .hydra/*.yaml, metrics.jsonl, summary.json (None: still running)."""
    run = root / str(num)
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([]))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if metrics is not None or summary is None:  # a started run has its metrics.jsonl (empty at first)
        (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics or []))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


SUMMARY_KEYS = {"status", "stop_reason", "epochs", "steps", "wall_s", "train_loss", "train_error", "test_loss",
                "test_error", "test_acc", "best_test_error", "params", "train_images_per_s",
                "noisy_label_fraction", "device", "machines", "precision", "seed", "lr_at_stop", "base_lr",
                "low_lr_stop", "stalled", "collapsed", "best_train_error"}


def captured_figure(monkeypatch) -> dict:
    """Keep the figure a plot function of analysis.figures saves (``kept["fig"]``), to read what it drew."""
    import analysis.figures as figures

    kept = {}
    orig = figures.save_figure

    def keep(fig, out):
        kept["fig"] = fig
        fig.canvas.draw()
        return orig(fig, out)
    monkeypatch.setattr(figures, "save_figure", keep)
    return kept
