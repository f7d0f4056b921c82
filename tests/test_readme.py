"""The README's commands still run, and every relative link in the README and docs/ resolves.

A fenced block whose info string is ``bash runnable`` is run here, command by command, in one temporary working
directory per block (so a block may analyse what its first command wrote), on the embedded ``digits`` data at a
tiny scale. Each command keeps its own overrides; the test only

- drops ``dataset.root=...`` and ``dataset.image_size=...`` (the README may point at ``../shared/data``) and
  appends the tiny-scale suffix of its kind (``TINY``), whose ``dataset=digits`` wins over the command's dataset
  (Hydra applies the last of two overrides of one key);
- for ``python -m src.sweep NAME``, swaps the scale for the study's ``smoke`` scale (the ``scale=`` token is
  dropped when the study has none);
- replaces ``python`` by this interpreter.

A command whose kind has no suffix here fails the test: add its kind to ``kind`` and ``TINY``.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "bash runnable"
MAX_README_LINES = 250

# The tiny-scale suffix appended to each kind of command (one CPU thread, fp32, no progress bars).
# Scoring dominates a 3-step run, so the scored train and test images are cut too.
TRAIN_TINY = ["dataset=digits", "dataset.n_train=256", "dataset.test_size=100", "trainer.train_eval_size=64",
              "trainer.max_epochs=1", "trainer.max_steps=3", "trainer.progress=false", "trainer.num_threads=1",
              "trainer.device=cpu", "trainer.precision=fp32"]
TINY = {
    "train": TRAIN_TINY,                                           # python -m src.train [overrides]
    "multirun": TRAIN_TINY,                                        # python -m src.train -m [grid]
    "optuna": [*TRAIN_TINY, "hydra.sweeper.n_trials=2"],           # -m with hydra/sweeper=vitsweep
    "study": [*TRAIN_TINY, "hydra.sweeper.n_trials=2"],          # at the study's smoke scale (see `rewrite`)
    "analysis": [],                                                # python -m analysis.report DIR ...
}
SLOW_KINDS = {"study"}  # a study starts a worker pool (~35 s on a loaded 2-core CPU): `make test-all` runs it
DROPPED = ("dataset.root=", "dataset.image_size=")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block in ``text``."""
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(r"^```([^\n`]*)\n(.*?)^```", text, re.M | re.S)]


def commands(body: str) -> list[list[str]]:
    """The commands of one block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n", " ", body)
    return [toks for line in joined.splitlines() if (toks := shlex.split(line, comments=True))]


def kind(tokens: list[str]) -> str:
    if tokens[:3] == ["python", "-m", "src.train"]:
        if "-m" in tokens[3:] or "--multirun" in tokens[3:]:
            return "optuna" if "hydra/sweeper=vitsweep" in tokens else "multirun"
        return "train"
    if tokens[:3] == ["python", "-m", "src.sweep"]:
        return "study"
    if tokens[:3] == ["python", "-m", "analysis.report"]:
        return "analysis"
    raise AssertionError(f"README command of no known kind, so no tiny scale for it: {shlex.join(tokens)}; "
                         "add its kind to tests/test_readme.py (kind, TINY)")


def rewrite(tokens: list[str]) -> list[str]:
    """The command at a tiny scale on digits (see the module docstring)."""
    k = kind(tokens)
    if k == "analysis":
        return [sys.executable, *tokens[1:]]
    out = [t for t in tokens[1:] if not t.startswith(DROPPED)]
    if k == "study":
        name = out[2]
        out = [t for t in out if not t.startswith("scale=")]
        if (ROOT / "sweeps" / "scales" / name / "smoke.yaml").is_file():
            out.insert(3, "scale=smoke")
    return [sys.executable, *out, *TINY[k]]


def block_kinds(cmds: list[list[str]]) -> set[str]:
    return {kind(c) for c in cmds}


def runnable_blocks() -> list[list[list[str]]]:
    return [commands(body) for info, body in fenced_blocks(README.read_text()) if info == MARKER]


def run_block(cmds: list[list[str]], cwd: Path) -> None:
    """Run the commands in order in ``cwd``; fail naming the first one that exits non-zero."""
    env = {**os.environ, "VITSWEEP_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1",
           "VITSWEEP_MALLOC": "default"}  # no restart under lean malloc settings: one interpreter start per command
    for tokens in cmds:
        cmd = rewrite(tokens)
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (f"README command failed (exit {done.returncode}):\n  {shlex.join(tokens)}\n"
                                      f"run as:\n  {shlex.join(cmd)}\n--- output tail ---\n"
                                      f"{(done.stdout + done.stderr)[-3000:]}")


def _params():
    out = []
    for i, cmds in enumerate(runnable_blocks()):
        kinds = block_kinds(cmds)
        marks = [pytest.mark.slow] if kinds & SLOW_KINDS else []
        out.append(pytest.param(cmds, id=f"block{i}-{'+'.join(sorted(kinds))}", marks=marks))
    return out


@pytest.mark.parametrize("cmds", _params())
def test_readme_block_runs(cmds, tmp_path):
    run_block(cmds, tmp_path)


def test_readme_marks_a_run_a_multirun_a_sweep_and_a_study():
    """The runnable marker is in use for each kind the README teaches (a renamed marker would test nothing)."""
    kinds = set().union(*(block_kinds(c) for c in runnable_blocks()))
    assert {"train", "multirun", "analysis", "optuna", "study"} <= kinds, kinds


def test_rewrite_keeps_the_commands_overrides_and_appends_the_tiny_scale():
    cmd = rewrite(shlex.split("python -m src.sweep double_descent_cnn scale=cpu dataset.root=../shared/data/m.npz"))
    assert cmd[:5] == [sys.executable, "-m", "src.sweep", "double_descent_cnn", "scale=smoke"]
    assert not any(t.startswith(DROPPED) for t in cmd) and cmd[-len(TINY["study"]):] == TINY["study"]
    cmd = rewrite(shlex.split("python -m src.train -m 'model.patch=choice(2,4)' hydra/sweeper=vitsweep"))
    assert "model.patch=choice(2,4)" in cmd and cmd[-1] == "hydra.sweeper.n_trials=2"


def test_a_broken_command_fails_the_block(tmp_path):
    """A removed key in a README command makes this test module fail, naming the command."""
    with pytest.raises(AssertionError, match="README command failed"):
        run_block([shlex.split("python -m src.train optimizer.scale_lr_by_width=true")], tmp_path)


def test_readme_is_a_short_guide():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; move reference pages to docs/ (limit {MAX_README_LINES})"


# --- links -------------------------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def link_pages() -> list[Path]:
    """README.md, the docs pages and each study's hand-written report (generated reports under a study's analysis/
    and the benchmark outputs are left out)."""
    docs = ROOT / "docs"
    return [README, *sorted(docs.glob("*.md")), docs / "benchmarks" / "README.md", docs / "studies" / "README.md",
            *sorted(docs.glob("studies/*/report.md"))]


@pytest.mark.parametrize("page", link_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    if not page.is_file():
        pytest.skip(f"{page} not present")
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.name}: broken links: {broken}"
