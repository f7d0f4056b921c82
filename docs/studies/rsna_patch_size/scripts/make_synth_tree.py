"""Write the synthetic RSNA-layout tree this study's pipeline check ran on.

    python docs/studies/rsna_patch_size/scripts/make_synth_tree.py /tmp/rsna_synth

Uses the project's own generator ``src.data.synthetic_dicom.make_rsna_tree``: 50 patients x 4 images
(L/R x CC/MLO) of one 160 x 128 phantom, every transfer syntax this environment can encode, 12/14/16
bit, MONOCHROME1/2, with and without a VOI window and rescale, plus one truncated file and one CSV row
without a file. Every 4th patient is "positive" (left breast): the images do not depend on the label,
so nothing a model reports on this tree means anything; it only exercises the pipeline.
"""
import sys
import time
from pathlib import Path

from src.data.synthetic_dicom import available_syntaxes, make_rsna_tree

N_PATIENTS = 50  # 200 images + 2 bad rows: 2 / 202 skipped stays within the default max_skip_fraction 0.01
SIZE = (160, 128)  # pixels (rows, cols) of each stored mammogram: larger than the 64-px model input

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/rsna_synth")
    t0 = time.perf_counter()
    table = make_rsna_tree(out, n_patients=N_PATIENTS, positives=tuple(range(1, N_PATIENTS, 4)), size=SIZE)
    print(f"wrote {len(table)} CSV rows under {out} in {time.perf_counter() - t0:.1f} s; "
          f"syntaxes {available_syntaxes()}; cancer=1 rows: {int(table['cancer'].sum())}; "
          f"patients: {table['patient_id'].nunique()}")
