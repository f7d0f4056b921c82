"""Every study's recipe table (its sweep file's header) matches the config the sweep file composes, at every
named scale, and a scale changes only sizes, seeds and the grid, never the recipe; and each committed arm's runs are
what the command its report gives composes today (``ARMS``, at the end).

A table row reads ``# | setting | paper (section) | key = value; key = value | reason |``. ``key@choice``
checks the key with that sweeper preset applied (``arch@cnn_w10``: the ``arch=cnn_w10`` preset's overrides).
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hydra_plugins.vitsweep_sweeper._protocol import flatten_config
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


# --- Each committed arm's runs against what its report's command composes today ----------------------------------
# A record is never rewritten, but the sweep and scale files it ran from can be: an lr, a cap or a seed list changed
# after a study ran (with its recipe table, so the tests above pass) leaves records that no longer are what the
# report's command trains, and every analysis still regenerates from them. So each arm's runs are checked against
# the command its report gives for them, composed today: the command part of every run's overrides is that command's,
# each run's sweep point lies in the grid the command composes, and each run's `.hydra/config.yaml` is the config the
# command composes at that point, key for key, but for the keys below and the differences its report states. A
# command's `hydra.*` overrides (tune_vit's trial count and pruner) are composed into the grid but are not in a run's
# overrides.yaml, so they are checked against the report only.

# Not compared: how a run printed, checkpointed and logged, and `dataset.root`, the data file by the path of the machine
# that ran it (the GPU sittings read `.gpudata/` archives, prefixes of the dataset that their reports describe)
NOT_RECIPE = ("dataset.root", "trainer.progress", "trainer.checkpoint_every", "logger")
# Keys added to the config after some records were written, at the value today's config gives them: model.attention
# (7721e69, 2026-11-26: the attention's code path, one function) is missing from runs that trained before it
ADDED_SINCE = {"model.attention": "auto"}


@dataclasses.dataclass(frozen=True)
class Arm:
    """How a report gives the command an arm ran: ``command`` (shell variables expanded), quoted in ``source``
    (the study's report unless given) verbatim, or by each of ``quoted`` where the report gives it in parts; and
    ``differs``, the keys whose recorded values today's composition no longer gives, each ``key: (recorded value,
    the words of the report that state it)`` (None where no report states it)."""
    command: str
    quoted: tuple[str, ...] = ()
    differs: dict = dataclasses.field(default_factory=dict)
    source: str | None = None


MNIST, CIFAR = "dataset.root=../shared/data/mnist.npz", "dataset.root=../shared/data/cifar10.npz"
SWEEP = "python -m src.sweep"
DDC, DDC10, DDV = (f"{SWEEP} {s}" for s in ("double_descent_cnn", "double_descent_cnn_cifar10", "double_descent_vit"))
RERUN = "dataset.n_train=1000 trainer.max_epochs=4 trainer.eval_every=4 trainer.num_threads=1 trainer.progress=false"
TV = ("dataset.root=/work/shared/data/cifar10.npz dataset.n_train=1000 dataset.val_size=300 dataset.test_size=2000 "
      "trainer.max_epochs=3 hydra.sweeper.n_trials=5 trainer.num_threads=1 trainer.progress=false")
EARLIER = {"trainer.max_epochs": (1000, "## Earlier run (`scale=cpu` + `scale=cpu_threshold`, n_train 2048, lr 0.05, "
                                        "1000-epoch cap)")}
ARMS = {
    "attention/seeds": Arm(f"{SWEEP} attention scale=cpu3 {MNIST}"),
    "double_descent_cnn/pilot_gpu": Arm(f"{DDC} scale=pilot"),
    "double_descent_cnn/main": Arm(f"{DDC} scale=cpu {MNIST}"),
    "double_descent_cnn/main_seed6": Arm(f"{DDC} scale=cpu_seed6 {MNIST}", (
        f"`{DDC} scale=cpu {MNIST}`", "plus seed 6 (`scale=cpu_seed6`, its own study)")),
    "double_descent_cnn/main_seeds789": Arm(f"{DDC} scale=cpu_seeds789 {MNIST}"),
    "double_descent_cnn/main_fixed": Arm(f"{DDC} scale=cpu_fixed trainer.converge_epochs=null {MNIST}"),
    "double_descent_cnn/main_fixed_seeds789": Arm(
        f"{DDC} scale=cpu_fixed_seeds789 trainer.converge_epochs=null {MNIST}"),
    "double_descent_cnn_cifar10/earlier_cpu": Arm(f"{DDC10} scale=cpu {CIFAR}", differs=EARLIER),
    "double_descent_cnn_cifar10/earlier_cpu_threshold": Arm(f"{DDC10} scale=cpu_threshold {CIFAR}", differs=EARLIER),
    "double_descent_cnn_cifar10/pilot_gpu": Arm(f"{DDC10} scale=pilot"),
    "double_descent_cnn_cifar10/pilot_gpu_threshold": Arm(f"{DDC10} scale=pilot"),
    "double_descent_cnn_cifar10/main": Arm(f"{DDC10} scale=main"),
    "double_descent_cnn_cifar10/main_fixed": Arm(
        f"{DDC10} scale=main trainer.converge_epochs=null",
        (f"`{DDC10} scale=main` (convergence arm) and the same with `trainer.converge_epochs=null`",)),
    # the pilot ran before precision was pinned: `auto`, which is bf16 autocast on CUDA (every summary says bf16)
    "double_descent_vit/pilot_gpu": Arm(f"{DDV} scale=pilot", differs={"trainer.precision": (
        "auto", "the pilot ran with `trainer.precision=auto`, which chose bf16 autocast on its CUDA GPU")}),
    "double_descent_vit/main": Arm(f"{DDV} scale=cpu {MNIST}", differs={"trainer.precision": (
        "auto", "The run started on 2026-11-26 12:00 in fp32 (`precision=auto` chose fp32 then), finished 5 runs in "
                "two sittings ([records/main](records/main), superseded)")}),
    "double_descent_vit/main_bf16": Arm(f"{DDV} scale=cpu {MNIST}"),
    "double_descent_vit/main_gpu": Arm(f"{DDV} scale=cpu {MNIST}", (
        f"`{DDV} scale=cpu {MNIST}`", "([records/main_gpu](records/main_gpu); the same sweep file and scale)")),
    "double_descent_vit/fixed_bf16": Arm(f"{DDV} scale=cpu_fixed trainer.converge_epochs=null {MNIST}"),
    "heads_depth/main": Arm(f"{SWEEP} heads_depth scale=cpu {MNIST}"),
    "heads_depth/precision": Arm(f"{SWEEP} heads_depth scale=cpu_precision {MNIST}"),
    # the report links the scale file, whose header gives the command
    "heads_depth/confirm": Arm(f"{SWEEP} heads_depth scale=cpu_confirm {MNIST}", (
        f"# Run: {SWEEP} heads_depth scale=cpu_confirm {MNIST}",), source="sweeps/scales/heads_depth/cpu_confirm.yaml"),
    "patch_size/rerun": Arm(f"{SWEEP} patch_size dataset.root=/work/shared/data/cifar10.npz {RERUN} "
                            "hydra.sweep.dir=/work/reruns/patch_size"),
    "vit_vs_cnn/rerun": Arm(f"{SWEEP} vit_vs_cnn dataset.root=/work/shared/data/cifar10.npz {RERUN} "
                            "hydra.sweep.dir=/work/reruns/vit_vs_cnn"),
    "tune_vit/rerun_median": Arm(
        f"{SWEEP} tune_vit {TV} hydra.sweeper.pruner.n_startup_trials=2 hydra.sweep.dir=/work/reruns/tune_vit_median",
        (f'TV="{TV}"', f"{SWEEP} tune_vit $TV hydra.sweeper.pruner.n_startup_trials=2 "
                       "hydra.sweep.dir=/work/reruns/tune_vit_median")),
    "tune_vit/rerun_none": Arm(
        f"{SWEEP} tune_vit {TV} hydra/sweeper/pruner=none hydra.sweep.dir=/work/reruns/tune_vit_none",
        (f'TV="{TV}"', f"{SWEEP} tune_vit $TV hydra/sweeper/pruner=none hydra.sweep.dir=/work/reruns/tune_vit_none")),
}


def committed_arms() -> list[str]:
    """Every ``<study>/<arm>`` under docs/studies with run records (a folder holding ``*/.hydra/config.yaml``)."""
    return sorted({"/".join(p.relative_to(REPORTS).parts[::2][:2]) for p in REPORTS.glob("*/records/*/*/.hydra")})


def one_line(text: str) -> str:
    return " ".join(text.replace("\\\n", " ").split())


def key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def is_group(key: str) -> bool:
    return "." not in key and (CONF / key).is_dir()


def not_recipe(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in NOT_RECIPE)


@functools.cache
def parse(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(override).value()


def allows(key: str, expr: str, value) -> bool:
    """Whether the sweep expression ``expr`` gives ``value`` (a range taken with its stop, as the samplers do)."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    sweep_ = parse(f"{key}={expr}")
    if isinstance(sweep_, ChoiceSweep):
        return value in sweep_.list
    if isinstance(sweep_, RangeSweep):
        return sweep_.start <= value <= sweep_.stop and (value - sweep_.start) % sweep_.step == 0
    if isinstance(sweep_, IntervalSweep):
        return sweep_.start <= value <= sweep_.end
    raise AssertionError(f"{key}={expr}: not a sweep expression")


@functools.cache
def composed(name: str, overrides: tuple[str, ...]) -> tuple[dict, dict]:
    """Study ``name`` composed with ``overrides``: its config less ``hydra``, flattened, and its sweeper's settings,
    as plain dicts (composed once per command and group choice, not once per run: composing is the test's time)."""
    cfg = OmegaConf.to_container(compose_study(name, None, overrides), resolve=False)
    sweeper = cfg.pop("hydra")["sweeper"]
    return flatten_config(cfg), sweeper


def point_in_grid(sweeper: dict, record: dict, overrides: list[str]) -> tuple[list[str], list[str]]:
    """The overrides of the point of today's grid (the ``sweeper``'s params and presets) that the run with config
    ``record`` and sweep-point overrides ``overrides`` is, and what of the run no point of the grid gives. A preset's
    choice is the one whose items agree with the record (the most specific where several do: ``h1_d1_5v8`` over
    ``h1_d1``); a group's choice is read from the overrides, every other key's value from the config."""
    given = {key_of(o): o.split("=", 1)[1] for o in overrides}
    presets, point, wrong = sweeper.get("presets") or {}, [], []
    for key, expr in sweeper["params"].items():
        if key in presets:
            fits = [list(items) for choice, items in presets[key].items() if allows(key, expr, parse(f"x={choice}"))
                    and all(is_group(key_of(i)) or record.get(key_of(i), "<absent>") == parse(i) for i in items)]
            point += max(fits, key=len) if fits else []
            wrong += [] if fits else [f"no choice of {key}={expr} gives this run"]
        elif is_group(key):
            point.append(f"{key}={given.get(key)}")
            wrong += [] if allows(key, expr, given.get(key)) else [f"{key}={given.get(key)} is not in {expr}"]
        else:
            point.append(f"{key}={record.get(key)}")
            wrong += [] if allows(key, expr, record.get(key)) else [f"{key}={record.get(key)!r} is not in {expr}"]
    return point, wrong


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where built: 1130 runs' configs are read


def run_records(run: pathlib.Path, name: str) -> tuple[list[str], list[str], dict]:
    """A run's sweep-point overrides, the command line's overrides, and its config, flattened."""
    overrides = yaml.load((run / ".hydra" / "overrides.yaml").read_text(), Loader=LOADER)
    start = overrides.index(f"+sweeps={name}")  # the sweeper's point comes first, then the command line's
    config = flatten_config(yaml.load((run / ".hydra" / "config.yaml").read_text(), Loader=LOADER))
    return overrides[:start], overrides[start + 1:], config


def groups(overrides) -> tuple[str, ...]:
    return tuple(sorted(o for o in overrides if is_group(key_of(o))))


def mismatches(arm: Arm, run: pathlib.Path) -> list[str]:
    """What of ``run``'s records the arm's command, composed today at the run's grid point, does not give."""
    name, *given = shlex.split(arm.command)[3:]
    command = sweep.scale_override(name, given)
    at, ran, record = run_records(run, name)
    ran = sorted(o for o in ran if not not_recipe(key_of(o)))
    gives = sorted(o for o in command if not not_recipe(key_of(o)) and not key_of(o).startswith(("hydra.", "hydra/")))
    wrong = [] if ran == gives else [f"ran `{' '.join(ran)}`, the report's command gives `{' '.join(gives)}`"]
    point, off_grid = point_in_grid(composed(name, (*command, *groups(at)))[1], record, at)
    expected = {**composed(name, (*command, *groups(point)))[0],
                **{key_of(o): parse(o) for o in point if not is_group(key_of(o))}}
    if off_grid:  # then no config of the grid is this run's to compare with
        return wrong + off_grid
    for key in sorted(set(record) | set(expected)):
        have, want = record.get(key, "<absent>"), expected.get(key, "<absent>")
        if not_recipe(key) or have == want or have == "<absent>" and ADDED_SINCE.get(key, "<absent>") == want:
            continue
        if key not in arm.differs or arm.differs[key][0] != have:
            wrong.append(f"{key}: recorded {have!r}, the command composes {want!r}")
    wrong += [f"{key}: the stated difference is gone (recorded {record.get(key)!r}, composed {expected.get(key)!r})"
              for key, (value, _) in arm.differs.items() if record.get(key) != value or expected.get(key) == value]
    return wrong


def test_every_committed_arm_names_the_command_its_report_gives():
    assert sorted(ARMS) == committed_arms()


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_a_committed_arms_runs_are_what_its_reports_command_composes_today(arm):
    """Each run of the arm: its command line's overrides are the command's (but for NOT_RECIPE), its point lies in
    the grid the command composes today, and its config is what the command composes there (but for NOT_RECIPE,
    ADDED_SINCE and the differences the report states); and the arm holds no more runs than that grid."""
    spec = ARMS[arm]
    study, folder = arm.split("/")
    source = one_line((ROOT / (spec.source or f"docs/studies/{study}/report.md")).read_text())
    for text in spec.quoted or (spec.command,):
        assert one_line(text) in source, f"{arm}: {spec.source or 'the report'} does not quote {text!r}"
    for key, (_, stated) in spec.differs.items():
        assert stated is None or one_line(stated) in source, f"{arm}: the report does not state its {key}"
    runs = sorted(run.parent for run in (REPORTS / study / "records" / folder).glob("*/.hydra"))
    command = sweep.scale_override(study, shlex.split(spec.command)[4:])
    grid = composed(study, (*command, *groups(run_records(runs[0], study)[0])))[1]
    assert len(runs) <= grid["n_trials"], f"{arm}: {len(runs)} runs, the command's grid has {grid['n_trials']}"
    wrong = {run.name: m for run in runs if (m := mismatches(spec, run))}
    first = next(iter(wrong), None)
    assert not wrong, f"{arm}: {len(wrong)} of {len(runs)} runs differ; run {first}: {wrong.get(first)}"


def test_the_records_check_sees_a_changed_recipe_value_and_a_run_off_the_grid():
    """The check itself: a command that composes another lr than a run's (as a sweep file edited after the run
    would), or a grid without the run's seed, is named; the run's own command is not."""
    run = REPORTS / "double_descent_cnn" / "records" / "main_seed6" / "0"
    assert mismatches(Arm(f"{DDC} scale=cpu_seed6 {MNIST}"), run) == []
    assert "optimizer.lr: recorded 0.05, the command composes 0.02" in \
        mismatches(Arm(f"{DDC} scale=cpu_seed6 {MNIST} optimizer.lr=0.02"), run)
    assert "seed=6 is not in choice(7, 8, 9)" in mismatches(Arm(f"{DDC} scale=cpu_seeds789 {MNIST}"), run)
