"""``python -m src.sweep NAME [overrides...]``: run the study in ``sweeps/NAME.yaml``.

A sweep file is a Hydra experiment config (``# @package _global_``) in the ``sweeps`` group of the
repository root, so this is exactly

    python -m src.train --multirun --config-dir <repo> +sweeps=NAME [overrides...]

which is printed before it runs. ``scale=S`` picks one of the study's reviewed sizes in
``sweeps/scales/NAME/S.yaml`` (``paper``: the published recipe and size, the default; ``cpu``: what fits a
2-core CPU; ``smoke``: for tests). A scale changes only sizes, seeds and the grid, never the recipe
(``tests/test_recipes.py``); it becomes the plain Hydra override ``+sweeps/scales/NAME=S``:

    python -m src.sweep heads_depth scale=cpu dataset.root=../shared/data/mnist.npz
    + python -m src.train --multirun --config-dir . +sweeps=heads_depth +sweeps/scales/heads_depth=cpu ...

Other overrides redirect a study, e.g. ``dataset.root=... hydra.sweep.dir=/tmp/try``.
"""

import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "sweeps"
SCALES = SWEEPS / "scales"
DEFAULT_SCALE = "paper"


def available() -> list[str]:
    return sorted(p.stem for p in SWEEPS.glob("*.yaml"))


def scales(name: str) -> list[str]:
    """The named scales of study ``name`` (``sweeps/scales/NAME/*.yaml``); empty for a study without any."""
    return sorted(p.stem for p in (SCALES / name).glob("*.yaml"))


def scale_override(name: str, overrides: list[str]) -> list[str]:
    """Replace ``scale=S`` by ``+sweeps/scales/NAME=S`` (``paper`` when the study has scales and none is
    given); an unknown scale stops here, listing the study's scales."""
    # `+scale=S` and `++scale=S` (Hydra's hint for a key the config lacks) mean the scale too: passed on, they ran the
    # default scale with a `scale` key in every run's config that named another (review 2026-11-29)
    given = [o.lstrip("+") for o in overrides if o.lstrip("+").startswith("scale=")]
    rest = [o for o in overrides if not o.lstrip("+").startswith("scale=")]
    known = scales(name)
    if len(given) > 1:
        raise SystemExit(f"src.sweep: scale given {len(given)} times ({', '.join(given)}); give one")
    if not given:
        return [f"+sweeps/scales/{name}={DEFAULT_SCALE}", *rest] if DEFAULT_SCALE in known else rest
    scale = given[0].split("=", 1)[1]
    if scale not in known:
        choices = ", ".join(known) if known else "none: this study runs at the size its sweep file states"
        raise SystemExit(f"src.sweep: {name} has no scale {scale!r} (sweeps/scales/{name}/{scale}.yaml); "
                         f"scales: {choices}")
    return [f"+sweeps/scales/{name}={scale}", *rest]


def command(name: str, overrides: list[str]) -> list[str]:
    if not (SWEEPS / f"{name}.yaml").is_file():
        raise SystemExit(f"src.sweep: no sweep {name!r} in {SWEEPS}; available: {', '.join(available())}")
    config_dir = "." if Path.cwd() == ROOT else str(ROOT)
    return ["python", "-m", "src.train", "--multirun", "--config-dir", config_dir, f"+sweeps={name}",
            *scale_override(name, overrides)]


def _describe(name: str, width: int = 90) -> str:
    """The study's "# Study:" header paragraph, cut at its first sentence or clause end within ``width`` characters
    (else at a word, with an ellipsis), so ``--help`` never stops mid-phrase."""
    lines = (SWEEPS / f"{name}.yaml").read_text().splitlines()
    text = ""
    for i, line in enumerate(lines):
        if line.startswith("# Study:"):
            text = line[len("# Study:"):].strip()
            for more in lines[i + 1:]:
                body = more[1:].strip() if more.startswith("#") else ""
                if not body or body.split(":", 1)[0] in ("Published", "Run", "Scales", "Declared test", "Recipe"):
                    break
                text += " " + body
            break
    if len(text) <= width:
        return text
    depth, cuts = 0, []  # clause ends outside parentheses, within width
    for i, ch in enumerate(text[:width]):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text[i:i + 2] in (". ", "; ", ": ", ", ") and i > width // 3:
            cuts.append(i)
    if cuts:
        return text[:cuts[-1]] + ("." if text[cuts[-1]] == "." else " ...")
    return text[:text.rfind(" ", 0, width)].rstrip(",;:(- ") + " ..."


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        for name in available():
            print(f"  {name:<27} {_describe(name)}")
            if scales(name):
                print(f"  {'':<27} scales: {', '.join(scales(name))}")
        return 0 if args else 2
    cmd = command(args[0], args[1:])
    print("+ " + shlex.join(cmd), flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # exec, not a child: Ctrl-C and SIGTERM reach the sweep itself, which hands its running trials back (a parent
    # waiting in subprocess.call killed the child 0.25 s after Ctrl-C, and SIGTERM stopped only the parent)
    os.execve(sys.executable, [sys.executable, *cmd[1:]], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
