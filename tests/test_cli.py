"""The command line a researcher types: `python -m src.train [-m] overrides`."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT, TINY
from tests.test_trainer import SUMMARY_KEYS


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "src.train", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_patch_size_multirun_writes_three_complete_run_dirs(tmp_path):
    done = run_cli("-m", "model.patch=2,4,8", *TINY, f"hydra.sweep.dir={tmp_path}")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0", "1", "2"]
    patches = []
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert SUMMARY_KEYS <= summary.keys() and summary["status"] == "completed"
        assert (run / "metrics.jsonl").read_text().strip() and (run / ".hydra" / "config.yaml").is_file()
        patches.append(int((run / ".hydra" / "overrides.yaml").read_text().split("model.patch=")[1].split()[0]))
    assert patches == [2, 4, 8]


def test_bad_input_exits_nonzero_with_the_key_and_no_summary(tmp_path):
    done = run_cli("model.patch=3", *TINY, f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0
    assert "model.patch=3 does not divide the image size 16" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_unknown_group_option_lists_choices(tmp_path):
    done = run_cli("dataset=imagenet", f"hydra.run.dir={tmp_path}")
    assert done.returncode != 0 and "Available options" in done.stderr and "cifar10" in done.stderr
