"""Synthetic DICOM mammograms: the DICOM tests, the preprocessing benchmark and a tree to try the pipeline on.

``phantom`` draws a breast in canonical orientation (chest wall on the left) with a planted bright
square near the top and a burnt-in marker separated from it by background; ``write_dicom`` stores
it the way scanners do (12/14/16 bits, MONOCHROME1/2, rescale, VOI window, mirrored for right
breasts) in any of the transfer syntaxes the competition and pydicom use. JPEG Lossless SV1 has no
pydicom encoder, so ``encode_jpeg_lossless_sv1`` is a minimal one (ITU T.81 process 14, predictor 1).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

BG, TISSUE, SQUARE = 0.0, 0.4, 1.0  # [0, 1] display values of the phantom's parts
SQUARE_ROWS, SQUARE_COLS = slice(16, 28), slice(6, 18)  # in the 80 x 64 canonical phantom
SYNTAXES = ("raw", "rle", "j2k", "j2k_lossy", "jpegls", "jpeg_sv1")


def phantom(h: int = 80, w: int = 64) -> np.ndarray:
    """(h, w) float in [0, 1]: half-ellipse breast against the left edge, bright square, marker on the right."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.where(((y - h / 2) / (0.45 * h)) ** 2 + (x / (0.875 * w)) ** 2 < 1, TISSUE, BG)
    sy, sx = slice(SQUARE_ROWS.start * h // 80, SQUARE_ROWS.stop * h // 80), slice(SQUARE_COLS.start * w // 64,
                                                                               SQUARE_COLS.stop * w // 64)
    img[sy, sx] = SQUARE
    img[int(0.875 * h):int(0.95 * h), int(0.9 * w):int(0.97 * w)] = SQUARE  # "L CC" style marker
    return img


def encode_jpeg_lossless_sv1(arr: np.ndarray, precision: int) -> bytes:
    """Greyscale uint16 (H, W) -> JPEG Lossless, non-hierarchical, first-order prediction (SV1)."""
    h, w = arr.shape
    x = arr.astype(np.int64)
    pred = np.empty_like(x)
    pred[0, 0] = 1 << (precision - 1)
    pred[0, 1:] = x[0, :-1]  # first row: left neighbour
    pred[1:, 0] = x[:-1, 0]  # first column: pixel above
    pred[1:, 1:] = x[1:, :-1]  # SV1: left neighbour
    diff = (x - pred) % 65536
    diff = np.where(diff >= 32768, diff - 65536, diff).ravel()
    ssss = np.where(diff == 0, 0, np.floor(np.log2(np.maximum(np.abs(diff), 1))).astype(np.int64) + 1)
    ssss[diff == -32768] = 16
    # one Huffman table: every category 0..16 has a 5-bit code equal to its value
    value, nbits = 0, 0
    out = bytearray()
    for d, s in zip(diff.tolist(), ssss.tolist(), strict=True):
        code, length = s, 5
        if 0 < s < 16:
            extra = d if d > 0 else d + (1 << s) - 1
            code, length = (code << s) | extra, 5 + s
        value, nbits = (value << length) | code, nbits + length
        while nbits >= 8:
            nbits -= 8
            byte = (value >> nbits) & 0xFF
            out.append(byte)
            if byte == 0xFF:
                out.append(0x00)  # byte stuffing
        value &= (1 << nbits) - 1
    if nbits:
        byte = ((value << (8 - nbits)) | ((1 << (8 - nbits)) - 1)) & 0xFF  # pad with 1 bits
        out.append(byte)
        if byte == 0xFF:
            out.append(0x00)
    counts = [0] * 16
    counts[4] = 17  # 17 codes of length 5
    dht = bytes([0x00, *counts, *range(17)])  # class 0 (DC/lossless), table 0
    sof = bytes([precision, h >> 8, h & 0xFF, w >> 8, w & 0xFF, 1, 1, 0x11, 0])
    sos = bytes([1, 1, 0x00, 1, 0, 0])  # 1 component, table 0; Ss=1 (predictor), Se=0, Ah/Al=0

    def seg(marker: int, payload: bytes) -> bytes:
        return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload

    return b"\xff\xd8" + seg(0xC4, dht) + seg(0xC3, sof) + seg(0xDA, sos) + bytes(out) + b"\xff\xd9"


def write_dicom(path: str | Path, img: np.ndarray, bits: int = 12, photometric: str = "MONOCHROME2",
                laterality: str = "L", window: str | None = None, rescale: tuple[float, float] | None = None,
                syntax: str = "raw", tag_laterality: bool = True) -> Path:
    """Store a canonical [0, 1] image as a mammogram DICOM file.

    window: None, "full" (covers the image's modality range: same display as no window) or
    "narrow" (covers background..tissue: tissue and square both saturate to white).
    rescale: (slope, intercept), stored values = (modality - intercept) / slope.
    """
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import (
        JPEG2000,
        ExplicitVRLittleEndian,
        JPEG2000Lossless,
        JPEGLosslessSV1,
        JPEGLSLossless,
        RLELossless,
        generate_uid,
    )

    top = 2**bits - 1
    display = img[:, ::-1] if laterality == "R" else img  # right breasts have the chest wall on the right
    level = np.round(display * top)
    stored_level = top - level if photometric == "MONOCHROME1" else level
    slope, icpt = rescale or (1.0, 0.0)
    stored = stored_level.astype(np.uint16)

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.2"  # Digital Mammography X-Ray For Presentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.Modality = meta.MediaStorageSOPClassUID, "MG"
    ds.set_pixel_data(stored, photometric, bits)
    if tag_laterality:
        ds.ImageLaterality = laterality
    if rescale:
        ds.RescaleSlope, ds.RescaleIntercept = slope, icpt
    if window:
        modality = stored.astype(np.float64) * slope + icpt
        lo, hi = float(modality.min()), float(modality.max())
        if window == "narrow":  # background .. tissue, in modality units (MONOCHROME1 inverts the order)
            tissue = np.round(TISSUE * top)
            t = (top - tissue if photometric == "MONOCHROME1" else tissue) * slope + icpt
            lo, hi = (t, hi) if photometric == "MONOCHROME1" else (lo, t)
        ds.WindowWidth = hi - lo + 1  # pydicom's linear window maps [lo, hi] exactly onto the output range
        ds.WindowCenter = (lo + hi) / 2 + 0.5
    if syntax == "rle":
        ds.compress(RLELossless)
    elif syntax == "j2k":
        ds.compress(JPEG2000Lossless)
    elif syntax == "j2k_lossy":
        ds.compress(JPEG2000, j2k_cr=[4])
    elif syntax == "jpegls":
        ds.compress(JPEGLSLossless)
    elif syntax == "jpeg_sv1":
        ds.PixelData = encapsulate([encode_jpeg_lossless_sv1(stored, bits)])
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = JPEGLosslessSV1
    elif syntax != "raw":
        raise ValueError(f"syntax={syntax!r}: one of {SYNTAXES}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)
    return path


def available_syntaxes() -> list[str]:
    """The syntaxes this environment can encode (JPEG-LS needs pyjpegls, JPEG 2000 pylibjpeg-openjpeg)."""
    from pydicom.pixels.encoders import JPEG2000LosslessEncoder, JPEGLSLosslessEncoder

    return [s for s in SYNTAXES if not (s == "jpegls" and not JPEGLSLosslessEncoder.is_available)
            and not (s.startswith("j2k") and not JPEG2000LosslessEncoder.is_available)]


def make_rsna_tree(root: str | Path, n_patients: int = 8, positives: tuple[int, ...] = (1, 5),
                   size: tuple[int, int] = (80, 64), corrupt: bool = True, missing: bool = True,
                   syntaxes: list[str] | None = None) -> pd.DataFrame:
    """RSNA layout under ``root``: 4 images a patient (L/R x CC/MLO), encodings and bit depths cycled.

    Patients in ``positives`` have cancer in their left breast. With ``corrupt``/``missing`` one extra
    patient gets a truncated file and a CSV row without a file. Returns train.csv as a DataFrame with
    an extra ``variant`` column (how each file was written) that the loader ignores.
    """
    root = Path(root)
    syntaxes = syntaxes or available_syntaxes()
    img = phantom(*size)
    rows, k = [], 0
    for p in range(n_patients):
        pid = 10000 + p
        for lat in ("L", "R"):
            for view in ("CC", "MLO"):
                iid = 500000 + k
                variant = dict(bits=(12, 16, 14)[k % 3], photometric=("MONOCHROME2", "MONOCHROME1")[(k // 3) % 2],
                               window=(None, "full")[(k // 2) % 2], syntax=syntaxes[k % len(syntaxes)],
                               rescale=(2.0, -1000.0) if k % 5 == 4 else None)
                write_dicom(root / "train_images" / str(pid) / f"{iid}.dcm", img, laterality=lat, **variant)
                cancer = int(p in positives and lat == "L")
                rows.append(dict(site_id=1, patient_id=pid, image_id=iid, laterality=lat, view=view, age=55,
                                 cancer=cancer, biopsy=cancer, invasive=cancer, BIRADS=None, implant=0, density="B",
                                 machine_id=49, difficult_negative_case=False, variant=str(variant)))
                k += 1
    bad_pid = 10000 + n_patients
    if corrupt:
        path = write_dicom(root / "train_images" / str(bad_pid) / "900001.dcm", img)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 3000])  # truncated pixel data
        rows.append(dict(rows[0], patient_id=bad_pid, image_id=900001, cancer=0, variant="truncated"))
    if missing:
        rows.append(dict(rows[0], patient_id=bad_pid, image_id=900002, cancer=0, variant="missing"))
    table = pd.DataFrame(rows)
    table.to_csv(root / "train.csv", index=False)
    return table


if __name__ == "__main__":  # python -m src.data.synthetic_dicom OUT [N_PATIENTS]: a synthetic RSNA tree
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/rsna_synthetic")
    n_patients = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    table = make_rsna_tree(out, n_patients=n_patients, positives=tuple(range(1, 24, 4)))
    print(f"wrote {len(table)} CSV rows under {out} (train.csv, train_images/), one truncated file and one missing")
