"""Which studies a declared test pools, with their seeds and when they ran, and the reading before each joined."""
from __future__ import annotations

import warnings
from collections.abc import Callable

import pandas as pd

from analysis.design.grid import SEED
from analysis.studies import studies_of

Study = tuple[str, str]


def study_order(df: pd.DataFrame) -> list[Study]:
    """The (storage, name) of each study the runs name, in the order the runs were given (first appearance), the
    studies ``with_capped`` borrowed aside."""
    if not {"study_storage", "study_name"} <= set(df.columns):
        return []
    borrowed = {tuple(b) for b in df.attrs.get("borrowed_studies", ())}
    pairs = df[["study_storage", "study_name"]].dropna().drop_duplicates().itertuples(index=False, name=None)
    return [p for p in pairs if p not in borrowed]


def study_times(df: pd.DataFrame) -> dict[Study, tuple[pd.Timestamp, pd.Timestamp]]:
    """(first trial's start, last trial's end) of each study the runs name, from its Optuna storage (UTC, as the
    sweeper records them); a study whose storage cannot be read is left out."""
    import optuna

    from hydra_plugins.vitsweep_sweeper.protocol import open_existing_storage

    out = {}
    for storage, name, _, found in studies_of(df):
        try:
            trials = optuna.load_study(study_name=name, storage=open_existing_storage(found)).get_trials(deepcopy=False)
        except Exception as e:  # moved storage, another machine's server
            warnings.warn(f"cannot read when study '{name}' ran ({e})", stacklevel=2)
            continue
        starts = [t.datetime_start for t in trials if t.datetime_start]
        ends = [t.datetime_complete for t in trials if t.datetime_complete]
        if starts and ends:
            out[(storage, name)] = (pd.Timestamp(min(starts)), pd.Timestamp(max(ends)))
    return out


def seed_span(seeds) -> str:
    """``seed 6``, ``seeds 2-5``, ``seeds 0, 2-4``: sorted integer seeds as runs of consecutive values."""
    s = sorted({int(v) for v in seeds if pd.notna(v)})
    if not s:
        return "no seed"
    parts, start = [], s[0]
    for a, b in zip(s, [*s[1:], None], strict=True):
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return f"seed{'s' if len(s) > 1 else ''} {', '.join(parts)}"


def _when(span: tuple[pd.Timestamp, pd.Timestamp] | None, day: str | None) -> str:
    if span is None:
        return "when it ran not recorded"
    a, b = span
    first = a.strftime("%H:%M") if a.strftime("%Y-%m-%d") == day else a.strftime("%Y-%m-%d %H:%M")
    last = b.strftime("%H:%M") if b.strftime("%Y-%m-%d") == a.strftime("%Y-%m-%d") else b.strftime("%Y-%m-%d %H:%M")
    return f"{first}-{last} UTC"


def sources_markdown(df: pd.DataFrame, reading: Callable[[list[Study]], list] | None = None,
                     times: dict[Study, tuple[pd.Timestamp, pd.Timestamp]] | None = None) -> str:
    """The studies a declared test pools (``study_order``), each with its seeds and when it ran, and the borrowed
    ones (``with_capped``); where more than one feeds the test: which started after the ones before it had finished
    (their seeds joined after those results could be read), and, from ``reading`` (the studies up to each -> its
    ``PeakTest`` list), the verdict on the studies up to each, marked interim and post hoc: the declared test reads
    them pooled. "" where the runs name no study."""
    order = study_order(df)
    if not order:
        return ""
    times = study_times(df) if times is None else times
    seeds = {s: df.loc[(df["study_storage"] == s[0]) & (df["study_name"] == s[1]), SEED] for s in order}
    parts, day = [], None
    for s in order:
        span = times.get(s)
        when = _when(span, day)
        day = span[1].strftime("%Y-%m-%d") if span is not None else day
        parts.append(f"{s[1]} ({seed_span(seeds[s])}; {when})")
    text = "\nStudies read, in the order given: " + ", ".join(parts) + "."
    borrowed = [tuple(b) for b in df.attrs.get("borrowed_studies", ())]
    if borrowed:
        lent = [f"{b[1]} ({seed_span(df.loc[(df['study_storage'] == b[0]) & (df['study_name'] == b[1]), SEED])})"
                for b in borrowed]
        text += (" Runs taken from the convergence arm where they reached the same cap (`--capped-from`): "
                 + ", ".join(lent) + ".")
    if len(order) < 2:
        return text + "\n"
    late = []
    for i, s in enumerate(order[1:], 1):
        before = [times.get(b) for b in order[:i]]
        if times.get(s) is not None and all(b is not None for b in before) \
                and times[s][0] > max(b[1] for b in before):
            late.append(s[1])
    if late:
        one = len(late) == 1
        text += (f" {', '.join(late)} {'' if one else 'each '}started after the last run of the studies before it "
                 f"had finished: {'its' if one else 'their'} seeds joined the test after those studies' results could "
                 "be read (the sweep headers say whether they were declared before).")
    elif times:
        text += " The studies' runs overlap in time."
    if reading is not None:
        rows = []
        for i in range(1, len(order) + 1):
            upto = order[:i]
            held = pd.concat([seeds[s] for s in upto])
            for t in reading(upto):
                rows.append(f"{t.curve}, {seed_span(held)} ({t.seeds} seeds): {t.verdict}")
        text += ("\n\nInterim readings, the same test on the studies up to each, in the order given (post hoc beside "
                 "the declared test, which reads them pooled; with the seeds of the first studies only, a reading "
                 "may differ): " + "; ".join(rows) + ".")
    return text + "\n"


