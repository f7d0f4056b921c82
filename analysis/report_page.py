"""The report page: report.md's lines, its tables (CSV + Markdown) and figures, and every file written."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.tables import to_markdown, write_table

MAX_ROWS = 60  # rows per Markdown table (the CSV has them all): every group of a study grid


class Report:
    def __init__(self, out: Path):
        self.out, self.lines, self.files = out, [], []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, path: Path, caption: str) -> None:
        self.files.append(path)
        self.add(f"![{caption}]({path.relative_to(self.out).as_posix()})", "")

    def table(self, numbers: pd.DataFrame, name: str, formatted: pd.DataFrame | None = None) -> None:
        csv, md = write_table(numbers, self.out / "tables" / name, formatted)
        self.files += [csv, md]
        shown = numbers if formatted is None else formatted
        note = f"\n(first {MAX_ROWS} of {len(shown)} rows; all in the CSV)\n" if len(shown) > MAX_ROWS else ""
        self.add(to_markdown(shown.head(MAX_ROWS)) + note, f"Data: [{csv.name}](tables/{csv.name})", "")

    def write(self) -> Path:
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines) + "\n")
        self.files.insert(0, path)
        return path
