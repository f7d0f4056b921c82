"""Every study's recipe table (its sweep file's header) matches the config the sweep file composes, at every
named scale, and a scale changes only sizes, seeds and the grid, never the recipe.

A table row reads ``# | setting | paper (section) | key = value; key = value | reason |``. ``key@choice``
checks the key with that sweeper preset applied (``arch@cnn_w10``: the ``arch=cnn_w10`` preset's overrides).
"""
from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src import sweep
from tests.conftest import CONF, ROOT, compose_cfg

STUDIES = sorted(p.name for p in sweep.SCALES.iterdir() if p.is_dir())  # studies with named scales
EPFL = ["attention", "double_descent_cnn", "double_descent_cnn_cifar10", "double_descent_vit",
        "double_descent_vit_cifar10", "heads_depth"]
# The settings every EPFL recipe table states (first column, case-insensitive substring). Precision too: the paper
# states none, and `auto` picks one per run by timing, so a grid can mix them (heads_depth's and attention's did)
SETTINGS = ["optimizer", "lr", "schedule", "batch", "stop rule", "image size", "label noise", "seeds",
            "training-set size", "precision"]
# Keys a scale may change: sizes, caps, seeds and the grid. Everything else is the recipe.
SIZE_KEYS = ("dataset.n_train", "trainer.max_epochs", "trainer.max_steps", "hydra.sweeper.params",
             "hydra.sweeper.n_trials", "hydra.sweeper.n_jobs")
# Keys a scale may sweep as arms although `paper` fixes them (a pilot's size and lr ladders, a weight-decay arm):
# the ladder must hold the paper's own value, so the recipe is one of the arms. A precision arm under the recipe's
# `auto` pins the values `auto` chooses between (heads_depth's precision check).
ARM_KEYS = ("dataset.n_train", "optimizer.lr", "optimizer.weight_decay", "trainer.precision")
AUTO_CHOOSES = {"trainer.precision": {"fp32", "bf16"}}


@functools.cache
def compose_study(name: str, scale: str | None, extra: tuple[str, ...] = ()):
    """The study's config at a scale, composed once per session (read-only: the tests share it)."""
    scaled = [f"+sweeps/scales/{name}={scale}"] if scale else []
    overrides = [f"hydra.searchpath=[file://{ROOT}]", f"+sweeps={name}", *scaled, *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def table(name: str) -> list[tuple[str, str, str]]:
    """(setting, key, expected value as written) for every ``key = value`` of the sweep file's recipe table."""
    rows = []
    for line in (sweep.SWEEPS / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("# | ") or line.startswith("# | setting") or line.startswith("# |---"):
            continue
        cells = [c.strip() for c in line[2:].strip().strip("|").split(" | ")]
        assert len(cells) in (3, 4), f"{name}: a recipe row needs 4 cells: {line!r}"
        for check in cells[2].split("; "):
            key, sep, value = check.partition(" = ")
            assert sep, f"{name}: {cells[0]!r} names no `key = value` in {cells[2]!r}"
            rows.append((cells[0], key.strip(), value.strip()))
    return rows


def preset(cfg, choice: str) -> list[str]:
    for options in (cfg.hydra.sweeper.get("presets") or {}).values():
        if choice in options:
            return list(options[choice])
    raise AssertionError(f"no sweeper preset has a choice {choice!r}")


def same(actual, expected: str) -> bool:
    if isinstance(actual, str) and actual.startswith("choice("):
        return actual.replace(" ", "") == expected.replace(" ", "")
    if OmegaConf.is_config(actual):
        actual = OmegaConf.to_container(actual)
    if isinstance(actual, list):
        return [str(a) for a in actual] == [s.strip() for s in expected.strip("[]").split(",")]
    want = yaml.safe_load(expected)
    if isinstance(actual, float) or isinstance(want, float):
        return float(actual) == pytest.approx(float(want), rel=1e-12)
    return actual == want


def check_rows(name: str, scale: str | None, rows) -> list[str]:
    base = compose_study(name, scale)
    wrong = []
    for setting, key, value in rows:
        path, _, choice = key.partition("@")
        cfg = compose_study(name, scale, tuple(preset(base, choice))) if choice else base
        actual = OmegaConf.select(cfg, path, default="<missing>")
        if not same(actual, value):
            wrong.append(f"{setting}: {key} is {actual!r}, the table says {value}")
    return wrong


def is_size(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") or key.startswith(k + "[") for k in SIZE_KEYS)


def pinned(item, cfg) -> bool:
    """A preset item that pins a value the recipe's ``auto`` chooses between (heads_depth's cpu_confirm gives each
    architecture the precision `auto` gave it): an arm under the recipe, as ARM_KEYS allows in the grid."""
    key, sep, value = str(item).partition("=")
    return bool(sep) and key in AUTO_CHOOSES and OmegaConf.select(cfg, key) == "auto" and value in AUTO_CHOOSES[key]


def recipe(cfg) -> dict:
    """The composed config without its size keys, flattened to dotted keys (the sweeper's own settings kept, its
    presets too, less their `pinned` items; the study's name is not recipe: a scale names its own study)."""
    flat = {}

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            sweeper = key == "hydra.sweeper" or key.startswith("hydra.sweeper.")
            if is_size(key) or key.startswith("hydra.") and not sweeper or key == "hydra.sweeper.study_name":
                continue
            if isinstance(v, dict):
                walk(v, key + ".")
            elif isinstance(v, list) and key.startswith("hydra.sweeper.presets."):
                flat[key] = [item for item in v if not pinned(item, cfg)]
            else:
                flat[key] = v
    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return flat


def choices(expr: str) -> set[str]:
    m = re.fullmatch(r"choice\((.*)\)", expr.replace(" ", ""))
    assert m, f"grid expression {expr!r} is not a choice(...)"
    return set(m.group(1).split(","))


@pytest.mark.parametrize("name", sweep.available())
def test_recipe_table_matches_the_composed_config(name):
    rows = table(name)
    assert len(rows) >= 10, f"{name}: the recipe table states only {len(rows)} checked values"
    assert check_rows(name, "paper" if name in STUDIES else None, rows) == []


@pytest.mark.parametrize("name", EPFL)
def test_epfl_tables_state_every_published_setting(name):
    settings = " ".join(s.lower() for s, _, _ in table(name))
    assert [s for s in SETTINGS if s not in settings] == []


@pytest.mark.parametrize("name", STUDIES)
def test_every_scale_keeps_the_paper_recipe(name):
    paper = compose_study(name, "paper")
    for scale in sweep.scales(name):
        cfg = compose_study(name, scale)
        recipe_rows = [r for r in table(name) if not is_size(r[1].partition("@")[0])]
        assert check_rows(name, scale, recipe_rows) == [], f"scale {scale}"
        assert recipe(cfg) == recipe(paper), f"scale {scale} changes recipe keys"
        for key, expr in cfg.hydra.sweeper.params.items():
            if key == "seed":  # fresh seeds (a main run after its pilot) are not a recipe change
                continue
            if key in ARM_KEYS and key not in paper.hydra.sweeper.params:
                own = OmegaConf.select(paper, key)
                if own == "auto" and key in AUTO_CHOOSES:
                    assert choices(expr) <= AUTO_CHOOSES[key], f"scale {scale}: {key}={expr}"
                    continue
                assert is_size(key) or any(same(own, c) for c in choices(expr)), \
                    f"scale {scale}: {key}={expr} lacks the recipe's {own}"
                continue
            assert key in paper.hydra.sweeper.params, f"scale {scale} sweeps {key}, which `paper` does not"
            assert choices(expr) <= choices(paper.hydra.sweeper.params[key]), f"scale {scale}: {key}={expr}"


def test_a_scale_that_changes_a_sweeper_preset_changes_the_recipe():
    """A preset is recipe (heads_depth's cnn_w10 sets the CNN's SGD lr): a scale that rewrote one would train another
    recipe under the study's name. `recipe` skipped all of `hydra.sweeper` (its `hydra.` rule caught the key
    `hydra.sweeper` itself), so such a scale passed `test_every_scale_keeps_the_paper_recipe` (review 2026-11-30)."""
    paper = compose_study("heads_depth", "paper")
    lr01 = '["model=cnn","model.width=10","optimizer=sgd","optimizer.lr=0.1","optimizer.momentum=0.9",' \
           '"optimizer.weight_decay=0.0"]'
    changed = compose_study("heads_depth", "cpu", (f"hydra.sweeper.presets.arch.cnn_w10={lr01}",))
    assert recipe(changed) != recipe(paper)
    assert "hydra.sweeper.presets.arch.cnn_w10" in recipe(paper)


def test_the_scale_override_of_a_shrunk_study_differs_from_paper():
    paper, cpu = compose_study("heads_depth", "paper"), compose_study("heads_depth", "cpu")
    assert choices(cpu.hydra.sweeper.params.arch) < choices(paper.hydra.sweeper.params.arch)
    assert cpu.hydra.sweeper.n_trials == 5 * 6 * 4


def test_sweep_translates_a_scale_into_a_plain_hydra_override():
    cmd = sweep.command("heads_depth", ["scale=cpu", "dataset.root=x"])
    assert cmd[-2:] == ["+sweeps/scales/heads_depth=cpu", "dataset.root=x"]
    assert "+sweeps/scales/heads_depth=paper" in sweep.command("heads_depth", [])
    assert not any("scales" in c for c in sweep.command("mnist_vit", []))  # a study without scales
    with pytest.raises(SystemExit, match="scales: cpu, cpu_confirm, cpu_precision, paper, smoke"):
        sweep.command("heads_depth", ["scale=huge"])
    with pytest.raises(SystemExit, match="runs at the size its sweep file states"):
        sweep.command("mnist_vit", ["scale=cpu"])


@pytest.mark.slow
def test_the_printed_command_runs_as_printed(tmp_path):
    """The plain Hydra command ``src.sweep NAME scale=smoke`` prints finishes the study when run as printed."""
    shrink = ["dataset=digits", "dataset.n_train=100", "trainer.progress=false", "trainer.checkpoint=false",
              "trainer.precision=fp32", f"hydra.sweep.dir={tmp_path}"]
    cmd = sweep.command("double_descent_cnn", ["scale=smoke", *shrink])
    assert cmd[:4] == ["python", "-m", "src.train", "--multirun"] and "+sweeps/scales/double_descent_cnn=smoke" in cmd
    subprocess.run([sys.executable, *cmd[1:]], cwd=ROOT, check=True, capture_output=True, timeout=600)
    summaries = list(tmp_path.rglob("summary.json"))
    assert len(summaries) == 2 and all('"status": "completed"' in p.read_text() for p in summaries)


@pytest.mark.parametrize("name", sweep.available())
def test_every_preset_of_a_study_builds_its_model(name):
    """Every sweeper preset, applied to the composed study, gives a config its model accepts (a ViT-only key left
    in a study's `model:` block stopped the cnn_w10 preset with an unexpected keyword)."""
    from src.data import build_data
    from src.run_setup import build_model

    base = compose_study(name, "paper" if name in STUDIES else None)
    presets = [list(p) for options in (base.hydra.sweeper.get("presets") or {}).values() for p in options.values()]
    for overrides in presets or [[]]:
        cfg = compose_study(name, "paper" if name in STUDIES else None, tuple(overrides))
        size = cfg.dataset.image_size or 32
        data = build_data(compose_cfg(["dataset=synthetic", "dataset.num_train=8", "dataset.num_test=4",
                                       f"dataset.image_size={size}"]).dataset, seed=0)
        build_model(cfg.model, data)


@pytest.mark.parametrize("name", sweep.available())
def test_help_describes_each_study_without_stopping_mid_phrase(name):
    """`python -m src.sweep --help` listed "attention maps of MNIST ViTs ... (heads, layers) =": the header's first
    line, cut wherever it wrapped. Now a description is the whole paragraph or ends at a clause, marked."""
    text = sweep._describe(name)
    assert 10 < len(text) <= 95, text
    assert not text.rstrip(" .").endswith(("=", "(", "--", ",")), text
    assert text.count("(") == text.count(")") or text.endswith("..."), text


@pytest.mark.parametrize("sweep", sorted(p.name for p in (ROOT / "sweeps" / "scales").iterdir() if p.is_dir()))
def test_a_sweep_headers_scale_list_names_every_scale_it_has(sweep):
    """The `# Scales` paragraph of a sweep file's header names each file of sweeps/scales/<sweep>/ (five headers
    had left out a scale added later: cpu3, cpu_fixed, main, cpu_precision)."""
    lines = (ROOT / "sweeps" / f"{sweep}.yaml").read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("# Scales")), None)
    assert start is not None, f"sweeps/{sweep}.yaml has no '# Scales' paragraph in its header"
    end = next((i for i in range(start, len(lines)) if lines[i].strip() == "#"), len(lines))
    paragraph = " ".join(lines[start:end])
    # named as `<scale> = ...` (or `<scale> and <other> = ...`), not merely a word of the prose ("the paper")
    missing = [p.stem for p in sorted((ROOT / "sweeps" / "scales" / sweep).glob("*.yaml"))
               if not re.search(rf"(?<![\w-]){p.stem}(?![\w-])\s*(=|and\s)", paragraph)]
    assert not missing, f"sweeps/{sweep}.yaml's '# Scales' paragraph does not name {missing}"


REPORTS = ROOT / "docs" / "studies"


def header_rows(name: str) -> list[str]:
    """The sweep file's recipe table rows, as markdown lines."""
    return [line[2:].rstrip() for line in (sweep.SWEEPS / f"{name}.yaml").read_text().splitlines()
            if line.startswith("# | ") and not line.startswith(("# | setting", "# |---"))]


def copied_tables() -> list[str]:
    return sorted(p.parent.name for p in REPORTS.glob("*/report.md")
                  if "<!-- recipe table: generated from the sweep file's header -->" in p.read_text())


@pytest.mark.parametrize("name", copied_tables())
def test_a_reports_copy_of_the_recipe_table_is_the_sweep_headers(name):
    """A report that carries the recipe table carries the sweep header's rows word for word: a copy that drifted
    told readers a setting was the paper's after the header had marked it "not stated: our choice"."""
    text = (REPORTS / name / "report.md").read_text()
    block = text.split("<!-- recipe table: generated from the sweep file's header -->", 1)[1]
    block = block.split("<!-- end recipe table -->", 1)[0]
    def cells(row):
        return tuple(c.strip() for c in row.strip().strip("|").split(" | "))

    rows = [cells(r) for r in header_rows(name)]
    settings = {row[0] for row in rows}
    copied = [cells(line) for line in block.splitlines() if line.startswith("| ") and cells(line)[0] in settings]
    assert [r for r in rows if r not in copied] == [], f"{name}: rows of the header missing or changed in the report"
    assert [r for r in copied if r not in rows] == [], f"{name}: rows of the report the header does not have"


def record_scales(name: str) -> set[str]:
    """The scales whose runs are committed under ``docs/studies/NAME/records`` (each run's Hydra overrides)."""
    found = set()
    for path in (ROOT / "docs" / "studies" / name / "records").glob("**/.hydra/overrides.yaml"):
        for override in yaml.safe_load(path.read_text()):
            if override.startswith(f"+sweeps/scales/{name}="):
                found.add(override.split("=", 1)[1])
    return found


def sweeper_md_scales(name: str) -> set[str]:
    """The scales docs/sweeper.md's one-command table gives for study ``name`` (the command cell of its rows)."""
    found = set()
    for line in (ROOT / "docs" / "sweeper.md").read_text().splitlines():
        cell = line.split(" | ")[0]
        if line.startswith("| `python -m src.sweep ") and cell.split()[4].rstrip("`") == name:
            found |= set(re.findall(r"\bscale=(\w+)", cell))
    return found


# The scale each study's verdict rests on (its report's declared or main run): the sweep header's `Run:` line
MAIN_SCALE = {"attention": "cpu3", "double_descent_cnn": "cpu", "double_descent_cnn_cifar10": "main",
              "double_descent_vit": "cpu", "heads_depth": "cpu"}


@pytest.mark.parametrize("name", STUDIES)
def test_the_one_command_table_names_every_scale_whose_runs_a_report_reads(name):
    """docs/sweeper.md's "one command per study" gave seeds 2-6 for the MNIST CNN (its verdict reads 2-9: cpu_seeds789,
    cpu_fixed_seeds789 were missing), no command for the CIFAR-10 CNN's declared main run (`scale=main`, only the
    earlier `cpu` design), attention's `cpu` but not the declared test's `cpu3`: rerun as written, a study trained
    another grid than the one its report reads (review 2026-11-30)."""
    assert record_scales(name) - sweeper_md_scales(name) == set()


@pytest.mark.parametrize("name", sorted(MAIN_SCALE))
def test_a_sweep_headers_run_line_names_the_scale_its_verdict_rests_on(name):
    runs = [line for line in (sweep.SWEEPS / f"{name}.yaml").read_text().splitlines() if line.startswith("# Run:")]
    assert len(runs) == 1 and f" scale={MAIN_SCALE[name]} " in runs[0] + " ", runs
    assert MAIN_SCALE[name] in record_scales(name)
