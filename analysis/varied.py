"""What a sweep varied: the config keys that define its compared settings, and the stop rules that vary
only with them (the report's groups, and ``analysis.by_epoch``'s)."""
from __future__ import annotations

import pandas as pd

# config keys that never count as "what the sweep varied"
IGNORED_PREFIXES = ("hydra.", "trial.study_name", "trial.number", "trial.storage")  # old runs' trial identity
IGNORED_LEAVES = {"seed", "root", "download", "dir", "path", "storage", "output_dir", "num_workers", "device",
                  "progress", "log_every", "checkpoint", "eval_batch_size"}
# how fast a run went, not what it computed: never a compared setting
IGNORED_RUN_SETTINGS = {f"trainer.{k}" for k in ("num_threads", "compile", "channels_last")}
# when a run stops: a compared setting like any other (1 and 6 epochs are two results, not two seeds), unless it
# takes one value per value of other varied keys (max_steps scaled with n_train): then it is named, not an axis
STOP_RULE_KEYS = {f"trainer.{k}" for k in (
    "max_epochs", "max_steps", "max_wall_s", "converge_epochs", "converge_tol", "stalled_margin", "eval_every",
    "train_eval_size")}


def _determined_by(df: pd.DataFrame, key: str, by: list[str]) -> bool:
    """True when ``key`` takes one value within every group of ``by``: grouping by ``by`` never mixes its values."""
    if not by:
        return df[key].astype(str).nunique() <= 1
    return df.astype({c: str for c in [key, *by]}).groupby(by)[key].nunique().max() <= 1


def key_roles(df: pd.DataFrame) -> tuple[list[str], dict[str, list[str]]]:
    """The compared keys (see :func:`varied_keys`) and the stop-rule keys that vary only with them: each such key
    maps to the varied keys it takes one value per value of (``{'trainer.max_steps': ['dataset.n_train']}``)."""
    cols = df.attrs.get("config_columns") or [c for c in df.columns if "." in c or c == "seed"]
    keys = [c for c in cols if c in df.columns and not c.startswith(IGNORED_PREFIXES)
            and c not in IGNORED_RUN_SETTINGS and c.rsplit(".", 1)[-1] not in IGNORED_LEAVES
            and df[c].astype(str).nunique() > 1]
    numeric = pd.api.types.is_numeric_dtype

    def alias(k: str, j: str) -> bool:  # two keys naming the same choice (model._target_ / model.name, mlp_dim / dim)
        a, b = df[k].astype(str), df[j].astype(str)
        if (numeric(df[k]) or numeric(df[j])) and a.nunique() == len(df):
            return False  # a float sampled anew for every run: a parameter of its own
        return a.groupby(b).nunique().max() == 1 and b.groupby(a).nunique().max() == 1

    kept: list[str] = []
    for k in [k for k in keys if k not in STOP_RULE_KEYS]:
        if not any(alias(k, j) for j in kept):
            kept.append(k)
    dependents: dict[str, list[str]] = {}
    for k in [k for k in keys if k in STOP_RULE_KEYS]:
        # a float sampled anew for every run "determines" everything: it never makes a stop rule a dependent
        axes = [j for j in kept if not (pd.api.types.is_float_dtype(df[j]) and df[j].nunique() == len(df))]
        single = [j for j in axes if _determined_by(df, k, [j])]
        if single:
            dependents[k] = single[:1]
        elif axes and _determined_by(df, k, axes):
            dependents[k] = axes
        else:
            kept.append(k)
    return kept, dependents


def varied_keys(df: pd.DataFrame) -> list[str]:
    """Config columns taking more than one value across runs, minus seeds, bookkeeping and execution settings
    (``IGNORED_RUN_SETTINGS``). Runs that differ in a kept key are never averaged as seeds.

    Of keys that map one-to-one onto each other (model._target_ and model.name, or model.mlp_dim set to 2 x model.dim
    by a preset) only the first is kept. A numeric key whose value differs in every run is always kept: in a
    continuous search every sampled float is unique per trial, so lr and weight decay map one-to-one without being
    aliases. A stop-rule key (``STOP_RULE_KEYS``: max_epochs, max_steps, ...) is kept like any other, except when it
    takes one value per value of the other kept keys (max_steps scaled with n_train): it then splits no group and
    :func:`key_roles` names it as a dependent instead."""
    return key_roles(df)[0]
