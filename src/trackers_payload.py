"""What every experiment tracker is sent, taken from the run's records: the config flattened to params, the
finite numbers of an evaluation row, the rows a resumed run dir keeps (sent first by a tracker run that starts on
it) and the summary keys a tracker shows. Used by ``src.trackers_tensorboard`` and ``src.trackers_mlflow``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra_plugins.vitsweep_sweeper.protocol import flatten_config

SUMMARY_TAGS = ("status", "stop_reason", "objective_name", "stalled", "collapsed")


def flat_params(cfg: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """The config as ``{"model.dim": 64, ...}``; values that are not numbers, strings or bools as JSON text."""
    out = {}
    for k, v in flatten_config({k: v for k, v in cfg.items() if k != "logger"}).items():
        out[k] = v if isinstance(v, (str, int, float, bool)) else json.dumps(v)
    return out


def numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of an evaluation row (bools as 0/1), ``step`` left out (it is the x axis); what
    ``metrics.jsonl`` writes as null (a NaN, e.g. ``train_error_noisy_subset`` without label noise) is left out."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


def kept_rows(run_dir: Path, resume_step: int, logged_through: int = -1) -> list[dict]:
    """The rows ``metrics.jsonl`` keeps up to ``resume_step`` (a resume has cut it back to its checkpoint) beyond
    ``logged_through``, the last step a tracker run holds (-1: none): what a tracker run that starts on a resumed run
    dir lacks (all of them for a tracker added on resume or a run dir copied or moved; the gap for one dropped at an
    earlier start, or absent from one) and sends first, so that its curve is the run's whole curve."""
    path = Path(run_dir) / "metrics.jsonl"
    if resume_step <= 0 or not path.is_file():
        return []
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [r for r in rows if logged_through < int(r.get("step", 0)) <= resume_step]
