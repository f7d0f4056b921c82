"""Decode one DICOM image into a float image in [0, 1] and preprocess it for training.

Display pipeline, in the order a DICOM viewer applies it (PS3.3 C.11):
  stored values -> Modality LUT / rescale slope+intercept -> VOI LUT or window centre/width
  -> [0, 1] (the VOI output range; min-max of the image when no VOI is present)
  -> MONOCHROME1 inverted, so dense tissue is bright in every image.
Then for training (``preprocess``): crop to the breast's bounding box, flip so every breast has its
chest wall on the left, resize preserving aspect ratio, pad to a square, quantise to uint8.

Compressed transfer syntaxes need pydicom's decoder plugins (``pip install 'vitsweep[dicom]'``):
JPEG 2000 via pylibjpeg-openjpeg; JPEG Lossless SV1, JPEG baseline/extended and JPEG-LS via
pylibjpeg-libjpeg. RLE Lossless and deflate decode natively.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

EXTRA_HINT = "pip install 'vitsweep[dicom]'"
CROP_THRESHOLD = 0.1  # [0, 1] intensity above which a pixel counts as tissue for the bounding box
CROP_MIN_FRACTION = 0.01  # a row/column belongs to the breast when this share of its pixels is tissue


class DicomError(RuntimeError):
    """A file that cannot become a training image; ``str(err)`` is the reason written to skipped.csv."""


class MissingDecoderError(DicomError):
    """The file's transfer syntax needs a decoder plugin that is not installed."""


def _pydicom():
    try:
        import pydicom
        import pydicom.pixels  # noqa: F401  (pydicom >= 3)
    except ImportError as err:
        raise ImportError(f"DICOM datasets need pydicom>=3 and its decoder plugins: {EXTRA_HINT}") from err
    return pydicom


def require_decoder(uid) -> None:
    """Raise MissingDecoderError naming the pip extra when ``uid`` has no usable decoder plugin."""
    from pydicom.pixels.decoders.base import get_decoder

    if not uid.is_compressed:
        return
    try:
        decoder = get_decoder(uid)
    except NotImplementedError as err:
        raise MissingDecoderError(f"pydicom has no decoder for transfer syntax {uid.name} ({uid})") from err
    if not decoder.is_available:
        missing = "; ".join(decoder.missing_dependencies)
        raise MissingDecoderError(
            f"no installed decoder for transfer syntax {uid.name} ({uid}): {EXTRA_HINT} (plugins: {missing})")


def read_dicom(path: str | Path) -> tuple[np.ndarray, str | None]:
    """Read one single-frame greyscale DICOM file -> (float32 (H, W) image in [0, 1], laterality or None).

    Raises DicomError (or MissingDecoderError) with a one-line reason for files that cannot be used.
    """
    pydicom = _pydicom()
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    try:
        ds = pydicom.dcmread(path)
    except Exception as err:  # pydicom raises several types for a damaged header
        raise DicomError(f"unreadable DICOM header: {type(err).__name__}: {err}") from err
    if "PixelData" not in ds:
        raise DicomError("no Pixel Data element")
    tsyntax = ds.file_meta.get("TransferSyntaxUID")
    if tsyntax is None:
        raise DicomError("no Transfer Syntax UID in the file meta information")
    require_decoder(tsyntax)
    for keyword, name in (("RescaleSlope", "Rescale Slope"), ("RescaleIntercept", "Rescale Intercept")):
        if keyword in ds and ds[keyword].value in (None, ""):  # pydicom would multiply by None: a bare TypeError
            raise DicomError(f"{name} is present but empty: the modality transform is undefined")
    frames = int(ds.get("NumberOfFrames") or 1)
    if frames != 1 or int(ds.get("SamplesPerPixel", 1)) != 1:
        raise DicomError(f"only single-frame greyscale images are supported (frames={frames}, "
                         f"samples per pixel={ds.get('SamplesPerPixel')})")
    try:
        stored = ds.pixel_array
    except Exception as err:  # truncated or corrupt pixel data
        raise DicomError(f"pixel data could not be decoded ({tsyntax.name}): {type(err).__name__}: {err}") from err
    img = to_unit_float(stored, ds, apply_modality_lut, apply_voi_lut)
    laterality = ds.get("ImageLaterality") or ds.get("Laterality") or None
    return img, (str(laterality).upper() if laterality else None)


def _voi_output_range(ds) -> tuple[float, float] | None:
    """(output for values below the window, output for values above it) of apply_voi_lut for ``ds``.

    None when no VOI is present. For a window it is pydicom's (y_min, y_max), which a negative RescaleSlope
    reverses (y_min > y_max): it is not sorted, so values above the window still become 1 (PS3.3 C.11.2.1.2).
    """
    # the same choice as apply_voi_lut: a LUT item with descriptor and data, else a window with both values
    seq = ds.get("VOILUTSequence")
    if seq and None not in (seq[0].get("LUTDescriptor"), seq[0].get("LUTData")):
        from pydicom.pixels.processing import apply_voi

        # the LUT's entries as pydicom reads them (LUT Data may be US or OW bytes): look up every mapped input
        entries, first = ds.VOILUTSequence[0].LUTDescriptor[:2]
        lut = apply_voi(np.arange(int(first), int(first) + (int(entries) or 2**16)), ds)
        return float(lut.min()), float(lut.max())
    if ds.get("WindowCenter") is None or ds.get("WindowWidth") is None:  # absent or empty: no VOI is applied
        return None
    # the output range pydicom's apply_windowing maps the window onto
    if ds.get("ModalityLUTSequence"):
        lo, hi = 0.0, 2.0 ** int(ds.ModalityLUTSequence[0].LUTDescriptor[2]) - 1
    elif int(ds.PixelRepresentation) == 0:
        lo, hi = 0.0, 2.0 ** int(ds.BitsStored) - 1
    else:
        lo, hi = -(2.0 ** (int(ds.BitsStored) - 1)), 2.0 ** (int(ds.BitsStored) - 1) - 1
    if "RescaleSlope" in ds and "RescaleIntercept" in ds and not ds.get("ModalityLUTSequence"):
        slope, icpt = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        lo, hi = lo * slope + icpt, hi * slope + icpt
    return lo, hi


def to_unit_float(stored: np.ndarray, ds, apply_modality_lut, apply_voi_lut) -> np.ndarray:
    """Stored values -> modality values -> VOI (LUT or window) -> [0, 1], MONOCHROME1 inverted."""
    x = apply_modality_lut(stored, ds)  # rescale slope/intercept or the Modality LUT
    voi_range = _voi_output_range(ds)
    if voi_range is not None:
        x = apply_voi_lut(x, ds)  # VOI LUT Sequence preferred, else window centre/width (+ VOILUTFunction)
        lo, hi = voi_range
    else:
        lo, hi = float(x.min()), float(x.max())  # no VOI: stretch the image's own range
    span = hi - lo  # negative for a window under a negative RescaleSlope (see _voi_output_range)
    x = (np.asarray(x, dtype=np.float32) - lo) / (span if abs(span) > 1e-12 else 1e-12)
    np.clip(x, 0.0, 1.0, out=x)
    if str(ds.get("PhotometricInterpretation", "MONOCHROME2")).upper() == "MONOCHROME1":
        x = 1.0 - x
    return x


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """[start, stop) of the longest run of True in a 1-D mask ((0, len) when none is True)."""
    if not mask.any():
        return 0, len(mask)
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    k = int(np.argmax(stops - starts))
    return int(starts[k]), int(stops[k])


def breast_bbox(img: np.ndarray, threshold: float = CROP_THRESHOLD) -> tuple[slice, slice]:
    """Bounding box of the largest contiguous block of tissue rows and columns.

    Taking the longest run (not the extent of all bright pixels) drops burnt-in markers such as
    "L CC" that are separated from the breast by background.
    """
    tissue = img > threshold
    c0, c1 = _longest_run(tissue.mean(axis=0) > CROP_MIN_FRACTION)
    r0, r1 = _longest_run(tissue[:, c0:c1].mean(axis=1) > CROP_MIN_FRACTION)
    return slice(r0, r1), slice(c0, c1)


def orient(img: np.ndarray, laterality: str | None) -> np.ndarray:
    """Mirror so the chest wall is on the left: right breasts (R) are flipped; unknown laterality
    falls back to putting the brighter half on the left."""
    if laterality in ("R", "L"):
        flip = laterality == "R"
    else:
        half = img.shape[1] // 2
        flip = img[:, :half].sum() < img[:, img.shape[1] - half:].sum()
    return img[:, ::-1] if flip else img


def resize_pad(img: np.ndarray, size: int) -> np.ndarray:
    """Resize (antialiased bilinear) so the longer side is ``size``, centre on a zero size x size canvas."""
    from PIL import Image

    h, w = img.shape
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    small = np.asarray(Image.fromarray(np.ascontiguousarray(img, dtype=np.float32))
                       .resize((nw, nh), Image.BILINEAR, reducing_gap=None), dtype=np.float32)
    out = np.zeros((size, size), dtype=np.float32)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top:top + nh, left:left + nw] = small
    return out


def preprocess(path: str | Path, image_size: int, crop: bool = True, flip: bool = True,
               laterality: str | None = None) -> np.ndarray:
    """One DICOM file -> uint8 (image_size, image_size) training image.

    ``laterality`` (L/R) from the CSV overrides the DICOM's ImageLaterality tag.
    """
    img, tag_laterality = read_dicom(path)
    if crop:
        rows, cols = breast_bbox(img)
        img = img[rows, cols]
    if flip:
        img = orient(img, (laterality or tag_laterality or "").upper() or None)
    img = resize_pad(img, image_size)
    return np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8)
