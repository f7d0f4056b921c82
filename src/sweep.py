"""``python -m src.sweep NAME [overrides...]``: run the study in ``sweeps/NAME.yaml``.

A sweep file is a Hydra experiment config (``# @package _global_``) in the ``sweeps`` group of the
repository root, so this is exactly

    python -m src.train --multirun --config-dir <repo> +sweeps=NAME [overrides...]

which is printed before it runs. Overrides shrink or redirect a study, e.g.
``dataset=digits trainer.max_epochs=1 hydra.sweeper.n_trials=4 hydra.sweep.dir=/tmp/try``.
"""

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "sweeps"


def available() -> list[str]:
    return sorted(p.stem for p in SWEEPS.glob("*.yaml"))


def command(name: str, overrides: list[str]) -> list[str]:
    if not (SWEEPS / f"{name}.yaml").is_file():
        raise SystemExit(f"src.sweep: no sweep {name!r} in {SWEEPS}; available: {', '.join(available())}")
    config_dir = "." if Path.cwd() == ROOT else str(ROOT)
    return ["python", "-m", "src.train", "--multirun", "--config-dir", config_dir, f"+sweeps={name}", *overrides]


def _describe(name: str) -> str:
    for line in (SWEEPS / f"{name}.yaml").read_text().splitlines():
        if line.startswith("# Study:"):
            return line[len("# Study:") :].strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        for name in available():
            print(f"  {name:<20} {_describe(name)}")
        return 0 if args else 2
    cmd = command(args[0], args[1:])
    print("+ " + shlex.join(cmd), flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.call([sys.executable, *cmd[1:]], env=env)


if __name__ == "__main__":
    sys.exit(main())
