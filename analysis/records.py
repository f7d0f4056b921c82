"""``python -m analysis.records SRC DST [--replace OLD=NEW ...]``: a study's compact records, to commit beside its
report.

From every run dir under SRC it copies what the analysis reads (``summary.json``, ``metrics.jsonl``,
``.hydra/config.yaml``, ``.hydra/overrides.yaml``), ``config.json`` (with the summary, it lets a finished run resumed
from these records return without its checkpoint) and the sweep's Optuna storage (``optuna.db``), never
checkpoints, logs or the ``previous-*`` folders a restart moved aside, keeping the folder layout. A storage the
runs' summaries name by another file name (a custom SQLite file, a journal) is copied too when it lies under SRC; one
outside SRC, or missing, is named in a warning. Each ``--replace`` rewrites a path prefix (where it ends a path
component) in the text records (an absolute ``dataset.root`` or sweep dir of the machine that ran it
becomes one relative to the repository, so the records read the same on any clone). A file that already exists in
DST is never overwritten: records are moved aside by hand, not replaced by a second copy. ``python -m
analysis.records DIR --in-place --replace OLD=NEW`` rewrites the paths of records already committed.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from hydra_plugins.vitsweep_sweeper.protocol import storage_file

RUN_FILES = ("summary.json", "config.json", "metrics.jsonl", ".hydra/config.yaml", ".hydra/overrides.yaml")
SWEEP_FILES = ("optuna.db",)
MOVED_ASIDE = "previous-"  # src.checkpoint moves a restarted run's old records into previous-<time>/


def _is_record(path: Path) -> bool:
    if path.name in SWEEP_FILES:
        return True
    run = path.parent.parent if path.parent.name == ".hydra" else path.parent
    if run.name.startswith(MOVED_ASIDE):  # an interrupted attempt's files, superseded by the run dir's own
        return False
    return any(path == run / f for f in RUN_FILES)


ATTR_TABLES = ("trial_user_attributes", "trial_system_attributes", "study_user_attributes",
               "study_system_attributes")


def replace_prefixes(text: str, replace: dict[str, str]) -> str:
    """``text`` with each path prefix ``OLD`` of ``replace`` rewritten to ``NEW`` where it ends a path component
    (followed by ``/``, a quote, a space or the end, not by more of a name: ``/x/tune_vit`` leaves
    ``/x/tune_vit_median`` alone); longer prefixes first."""
    for old, new in sorted(replace.items(), key=lambda kv: -len(kv[0])):
        end = "" if old.endswith("/") else r"(?![\w.-])"  # a prefix ending in / ends its component already
        text = re.sub(re.escape(old) + end, lambda _m, new=new: new, text)
    return text


def _replace_in_storage(db: Path, replace: dict[str, str]) -> None:
    """Rewrite path prefixes inside an Optuna SQLite storage's attribute values (run dirs, storage URLs), compared as
    the decoded strings (a non-ASCII path is stored JSON-escaped)."""
    import sqlite3

    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for table in ATTR_TABLES:
            if table not in tables:
                continue
            rows = con.execute(f"SELECT rowid, value_json FROM {table}").fetchall()
            for rowid, value in rows:
                try:
                    decoded = json.loads(value)
                except (TypeError, json.JSONDecodeError):
                    continue
                if isinstance(decoded, str):
                    new = replace_prefixes(decoded, replace)
                    if new != decoded:
                        con.execute(f"UPDATE {table} SET value_json = ? WHERE rowid = ?", (json.dumps(new), rowid))


def _storages_named(src: Path) -> set[Path]:
    """The storage files the summaries under ``src`` name (a study's storage need not be called optuna.db). A path
    that is not there as written (relative to the folder the sweep ran from, or the folder moved) is taken to be
    the file of its name at the top of ``src``, where the sweeper keeps it, when there is one."""
    found = set()
    for summary in src.rglob("summary.json"):
        try:
            url = json.loads(summary.read_text()).get("study_storage")
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
        path = storage_file(url)
        if path is not None:
            found.add(path if path.is_file() or not (src / path.name).is_file() else src / path.name)
    return found


def _is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == b"SQLite format 3\x00"


def copy_records(src: str | Path, dst: str | Path, replace: dict[str, str] | None = None) -> list[Path]:
    """Copy the records under ``src`` into ``dst`` (see the module docstring); returns the files written."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise SystemExit(f"{src}: no such sweep or run folder")
    replace = dict(sorted((replace or {}).items(), key=lambda kv: -len(kv[0])))  # longer prefixes first
    named = _storages_named(src)  # the summaries read once
    storages = {p.resolve() for p in named if p.is_file()}
    for missing in sorted(p for p in named if not p.is_file()):
        print(f"warning: the runs under {src} name the Optuna storage {missing}, which does not exist here: the "
              "records will carry no trial states nor declared grid")
    inside = {p for p in storages if p.is_relative_to(src.resolve())}
    for outside in sorted(storages - inside):
        print(f"warning: the Optuna storage {outside} lies outside {src} and is not copied: copy it beside the records "
              "by hand (and --replace its path) to keep the trial states and the declared grid")
    written = []
    for path in sorted(p for p in src.rglob("*") if p.is_file() and (_is_record(p) or p.resolve() in inside)):
        out = dst / path.relative_to(src)
        if out.exists():
            raise SystemExit(f"{out} exists: records are never overwritten (move the old folder aside first)")
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.name in SWEEP_FILES or (path.resolve() in inside and _is_sqlite(path)):
            shutil.copy2(path, out)
            _replace_in_storage(out, replace)
        else:  # a text record, or a journal storage (JSON lines)
            out.write_text(replace_prefixes(path.read_text(), replace))
        written.append(out)
    return written


def rewrite_paths(root: str | Path, replace: dict[str, str]) -> list[Path]:
    """Rewrite path prefixes in place in the records already under ``root`` (its text records, hydra.yaml too, and
    its Optuna storages); returns the files that changed. Longer prefixes are replaced first."""
    order = dict(sorted(replace.items(), key=lambda kv: -len(kv[0])))
    changed = []
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file():
            continue
        if path.name in SWEEP_FILES or (path.suffix == ".db" and _is_sqlite(path)):
            before = path.read_bytes()
            _replace_in_storage(path, order)
            if path.read_bytes() != before:
                changed.append(path)
        elif path.suffix in (".yaml", ".json", ".jsonl"):
            text = path.read_text()
            new = replace_prefixes(text, order)
            if new != text:
                path.write_text(new)
                changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m analysis.records", description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst", nargs="?", help="where to copy the records (omit with --in-place)")
    ap.add_argument("--in-place", action="store_true", help="rewrite the paths of the records under SRC in place")
    ap.add_argument("--replace", action="append", default=[], metavar="OLD=NEW",
                    help="rewrite a path prefix in the text records (repeatable)")
    a = ap.parse_args(argv)
    pairs = dict(r.split("=", 1) for r in a.replace)
    if a.in_place:
        print(f"{a.src}: {len(rewrite_paths(a.src, pairs))} files rewritten")
        return
    if not a.dst:
        ap.error("give DST, or --in-place")
    files = copy_records(a.src, a.dst, pairs)
    print(f"{a.dst}: {len(files)} files from {a.src}")


if __name__ == "__main__":
    main()
