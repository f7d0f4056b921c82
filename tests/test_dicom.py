"""DICOM decoding and the RSNA mammography loader on a synthetic RSNA-layout tree built with pydicom."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pydicom = pytest.importorskip("pydicom", reason="needs the dicom extra: pip install 'vitsweep[dicom]'")

from src.data import mammo  # noqa: E402
from src.data.dicom import DicomError, MissingDecoderError, preprocess, read_dicom  # noqa: E402
from src.data.synthetic_dicom import SQUARE_COLS, SQUARE_ROWS, available_syntaxes, make_rsna_tree, phantom, write_dicom  # noqa: E402

SIZE = 32  # output pixels: small keeps the suite fast


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("rsna")
    table = make_rsna_tree(root)
    return root, table


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Canonical file: left breast, MONOCHROME2, 16 bit, no window, uncompressed."""
    path = write_dicom(tmp_path_factory.mktemp("ref") / "ref.dcm", phantom(), bits=16)
    return preprocess(path, SIZE)


def test_reference_has_square_top_left_and_marker_cropped(reference):
    # crop 72 x 56 breast box (marker dropped), scale 32/72, centred: square centre (22, 12) -> (8, 8)
    assert reference[8, 8] == 255 and reference[6:10, 6:10].min() > 200
    assert reference[:, :SIZE // 2].mean() > 1.5 * reference[:, SIZE // 2:].mean()  # chest wall on the left
    assert reference[30, 28] == 0  # where the marker would land without the crop


def test_unit_range_and_inversion(tmp_path):
    img = phantom()
    for photometric in ("MONOCHROME2", "MONOCHROME1"):
        x, lat = read_dicom(write_dicom(tmp_path / f"{photometric}.dcm", img, bits=12, photometric=photometric))
        assert x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0 and lat == "L"
        assert x[SQUARE_ROWS, SQUARE_COLS].min() == 1.0, photometric  # planted square bright after inversion
        assert x[0, -1] == 0.0  # background dark
        np.testing.assert_allclose(x, img, atol=1e-3)


@pytest.mark.parametrize("syntax", available_syntaxes())
@pytest.mark.parametrize("bits,photometric,laterality,window,rescale", [
    (12, "MONOCHROME2", "R", None, None),
    (16, "MONOCHROME1", "R", "full", None),
    (14, "MONOCHROME1", "L", "full", (2.0, -1000.0)),
    (12, "MONOCHROME2", "L", None, (0.5, 100.0)),
])
def test_every_encoding_matches_reference(tmp_path, reference, syntax, bits, photometric, laterality, window, rescale):
    path = write_dicom(tmp_path / "x.dcm", phantom(), bits, photometric, laterality, window, rescale, syntax)
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID.is_compressed == (syntax != "raw")
    out = preprocess(path, SIZE)
    diff = np.abs(out.astype(int) - reference)
    assert diff.mean() < (1.0 if syntax == "j2k_lossy" else 0.1) and diff.max() <= (40 if syntax == "j2k_lossy" else 2)


def test_window_is_applied_in_modality_units(tmp_path):
    # a narrow window (background..tissue, given after rescale) saturates tissue to white
    path = write_dicom(tmp_path / "n.dcm", phantom(), 12, "MONOCHROME1", "R", "narrow", (2.0, -1000.0))
    x, _ = read_dicom(path)
    tissue = x[:, ::-1][40, 30]  # stored mirrored (right breast)
    assert tissue == 1.0 and x[0, 0] == 0.0


def test_flip_uses_csv_laterality_over_tag_and_falls_back_to_intensity(tmp_path, reference):
    right_untagged = write_dicom(tmp_path / "r.dcm", phantom(), laterality="R", tag_laterality=False)
    assert read_dicom(right_untagged)[1] is None
    np.testing.assert_array_equal(preprocess(right_untagged, SIZE), reference)  # brighter half -> left
    np.testing.assert_array_equal(preprocess(right_untagged, SIZE, laterality="R"), reference)
    assert not np.array_equal(preprocess(right_untagged, SIZE, laterality="L"), reference)
    assert not np.array_equal(preprocess(right_untagged, SIZE, flip=False), reference)


def test_jpeg_lossless_sv1_decodes_exactly(tmp_path):
    img = phantom() * 0.9 + np.random.default_rng(0).random((80, 64)) * 0.1  # noisy: all diff categories
    for bits in (12, 16):
        raw = pydicom.dcmread(write_dicom(tmp_path / "raw.dcm", img, bits)).pixel_array
        sv1 = pydicom.dcmread(write_dicom(tmp_path / "sv1.dcm", img, bits, syntax="jpeg_sv1"))
        assert sv1.file_meta.TransferSyntaxUID == "1.2.840.10008.1.2.4.70"
        np.testing.assert_array_equal(sv1.pixel_array, raw)


@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small_RLE.dcm", "MR_small_jpeg_ls_lossless.dcm",
                                  "MR_small_jp2klossless.dcm", "JPEG2000.dcm", "693_J2KI.dcm", "JPGExtended.dcm",
                                  "JPEGLSNearLossless_16.dcm", "image_dfl.dcm"])
def test_pydicom_bundled_files_decode(name):
    from pydicom.data import get_testdata_file

    path = get_testdata_file(name, download=False)
    if path is None:
        pytest.skip(f"{name} not bundled with this pydicom")
    x, _ = read_dicom(path)
    assert x.ndim == 2 and x.dtype == np.float32 and 0.0 <= x.min() < x.max() <= 1.0
    out = preprocess(path, SIZE, crop=False, flip=False)
    h, w = x.shape
    content = round(h * SIZE / max(h, w)) * round(w * SIZE / max(h, w)) / SIZE**2  # rest is padding
    assert out.shape == (SIZE, SIZE) and out.mean() / 255 == pytest.approx(x.mean() * content, rel=0.05, abs=2e-3)


def test_bad_files_give_reasons(tmp_path, monkeypatch):
    from pydicom.data import get_testdata_file

    truncated = get_testdata_file("MR_truncated.dcm", download=False)
    if truncated:
        with pytest.raises(Exception, match="less than expected"):
            read_dicom(truncated)
    (tmp_path / "junk.dcm").write_bytes(b"not a dicom file at all" * 10)
    with pytest.raises(Exception, match="DICOM"):
        read_dicom(tmp_path / "junk.dcm")

    class NoPlugin:
        is_available, missing_dependencies = False, ["pylibjpeg - requires pylibjpeg-openjpeg"]

    path = write_dicom(tmp_path / "j2k.dcm", phantom(), syntax="j2k")
    monkeypatch.setattr("pydicom.pixels.decoders.base.get_decoder", lambda uid: NoPlugin())
    with pytest.raises(MissingDecoderError, match=r"pip install 'vitsweep\[dicom\]'"):
        read_dicom(path)


# ------------------------------------------------------------------------------------- loader
def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process ('' for anonymous memory); Linux only."""
    try:
        lines = open("/proc/self/maps").read().splitlines()
    except OSError:
        pytest.skip("needs /proc/self/maps")
    for line in lines:
        parts = line.split(maxsplit=5)
        lo, hi = (int(a, 16) for a in parts[0].split("-"))
        if lo <= address < hi:
            return parts[5] if len(parts) > 5 else ""
    return ""


def _load(root, cache, **kw):
    args = dict(image_size=SIZE, test_fraction=0.25, max_skip_fraction=0.1, cache_dir=cache, workers=0)
    return mammo.load_rsna(root, **{**args, **kw})


def test_patient_level_split_and_skip_report(tree, tmp_path):
    root, table = tree
    s = _load(root, tmp_path, val_size=4)
    ids = {name: set(np.load(f"{s.info['cache_dir']}/patients.npy")[a:b]) for name, (a, b) in
           {"train": (0, len(s.y_train)), "val": (len(s.y_train), len(s.y_train) + len(s.y_val)),
            "test": (len(s.y_train) + len(s.y_val), None)}.items()}
    assert not (ids["train"] & ids["test"] or ids["train"] & ids["val"] or ids["val"] & ids["test"])
    assert s.info["patients_test"] == 2 and s.info["patients_train"] + s.info["patients_val"] == 6
    assert len(s.y_train) + len(s.y_val) + len(s.y_test) == len(table) - 2 and len(s.y_val) >= 4
    assert s.y_train.sum() > 0 and s.y_test.sum() > 0  # stratified: positives on both sides
    assert s.x_train.dtype == s.x_train.dtype and s.x_train.shape[1:] == (1, SIZE, SIZE) and s.num_classes == 2
    assert _mapped_file(s.x_train.data_ptr()).endswith("images.npy")  # a view of the cache, not a copy
    assert _mapped_file(s.x_test.data_ptr()).endswith("images.npy")

    skipped = pd.read_csv(s.info["skipped_csv"])
    reasons = dict(zip(skipped["path"].str.rsplit("/", n=1).str[-1], skipped["reason"], strict=True))
    assert set(reasons) == {"900001.dcm", "900002.dcm"} and reasons["900002.dcm"] == "file not found"
    assert "could not be decoded" in reasons["900001.dcm"] and s.info["skipped"] == 2
    # rows keep their labels through the reordering
    labels = dict(zip(table["image_id"].astype(str) + ".dcm", table["cancer"], strict=True))
    paths = np.load(f"{s.info['cache_dir']}/paths.npy")
    y_all = np.concatenate([s.y_train, s.y_val, s.y_test])
    assert all(labels[p.rsplit("/", 1)[-1]] == y for p, y in zip(paths, y_all, strict=True))

    with pytest.raises(RuntimeError, match=r"2 of 34 DICOM images .*max_skip_fraction=0.01.*skipped.csv"):
        _load(root, tmp_path, max_skip_fraction=0.01)  # same cache, stricter threshold


def test_cache_reused_and_rebuilt_when_a_setting_changes(tree, tmp_path, monkeypatch):
    root, _ = tree
    first = _load(root, tmp_path)
    assert not first.info["cache_reused"]
    calls = []
    real = mammo.preprocess
    monkeypatch.setattr(mammo, "preprocess", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = _load(root, tmp_path, n_train=20, balance="pos_weight")
    assert again.info["cache_reused"] and calls == [] and again.info["cache_dir"] == first.info["cache_dir"]
    assert len(again.y_train) == 20
    torch_equal = (again.x_train == first.x_train[:20]).all()
    assert torch_equal and again.class_weights is not None
    n_pos, n_neg = int(again.y_train.sum()), int((again.y_train == 0).sum())
    assert again.class_weights.tolist() == pytest.approx([1.0, n_neg / n_pos])

    changed = _load(root, tmp_path, crop=False)
    assert not changed.info["cache_reused"] and changed.info["cache_dir"] != first.info["cache_dir"]
    assert len(calls) == 33  # every present file decoded again
    assert not (changed.x_train == first.x_train).all()


def test_sampler_balance_and_ratio(tree, tmp_path):
    s = _load(tree[0], tmp_path, balance="sampler")
    w, y = s.sample_weights, s.y_train
    assert w.shape == y.shape and w[y == 1].sum() == pytest.approx(w[y == 0].sum())
    assert s.info["class_ratio_train"][1] == pytest.approx(float(y.float().mean()), abs=1e-4)
    assert 0 < s.mean[0] < 1 and 0 < s.std[0] < 1


def test_parallel_build_matches_serial(tree, tmp_path):
    serial = _load(tree[0], tmp_path / "a")
    parallel = _load(tree[0], tmp_path / "b", workers=2)
    assert (serial.x_train == parallel.x_train).all() and (serial.x_test == parallel.x_test).all()
    meta = json.loads((tmp_path / "b" / parallel.info["cache_dir"].rsplit("/", 1)[-1] / "meta.json").read_text())
    assert meta["workers"] == 2 and meta["n_images"] == 32


def test_csv_errors_name_the_problem(tree, tmp_path):
    root, table = tree
    bad = tmp_path / "bad"
    bad.mkdir()
    table.drop(columns=["cancer", "laterality"]).to_csv(bad / "train.csv", index=False)
    with pytest.raises(ValueError, match=r"\['laterality', 'cancer'\]"):
        mammo.load_rsna(bad, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="cannot be downloaded"):
        mammo.load_rsna(root, download=True)
    with pytest.raises(ValueError, match="dataset.balance"):
        _load(root, tmp_path, balance="oversample")


def test_dicom_folder_with_string_labels(tree, tmp_path):
    root, table = tree
    files = [f"train_images/{p}/{i}.dcm" for p, i in zip(table.patient_id, table.image_id, strict=True)]
    csv = pd.DataFrame({"file": files,
                        "finding": np.where(table.cancer == 1, "malignant", "benign"), "pid": table.patient_id})
    csv.to_csv(tmp_path / "labels.csv", index=False)
    s = mammo.load_dicom_folder(root, str(tmp_path / "labels.csv"), "file", "finding", patient_column="pid",
                                image_size=SIZE, max_skip_fraction=0.1, cache_dir=tmp_path, workers=0, augment="none")
    assert s.classes == ["benign", "malignant"] and s.num_classes == 2 and s.info["skipped"] == 2


def test_one_epoch_training_reports_binary_metrics(tree, tmp_path):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from src.trainer import train

    root, _ = tree
    conf = Path(__file__).resolve().parents[1] / "conf"
    overrides = ["dataset=rsna_mammo", f"dataset.root={root}", f"dataset.image_size={SIZE}",
                 f"dataset.cache_dir={tmp_path}", "dataset.max_skip_fraction=0.1", "dataset.workers=0",
                 "dataset.val_size=4", "dataset.balance=sampler", "model.patch=8", "model.dim=32", "model.depth=1",
                 "model.heads=2", "model.mlp_dim=64", "trainer.max_epochs=1", "trainer.batch_size=8",
                 "trainer.progress=false", "trainer.device=cpu", "trainer.precision=fp32", "trainer.checkpoint=false"]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    train(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["dataset"] == "rsna_mammo" and summary["skipped"] == 2
    for key in ("test_auc", "test_pf1", "test_sensitivity", "test_specificity", "test_balanced_acc", "val_error"):
        assert 0.0 <= summary[key] <= 1.0, key


@pytest.mark.faults
def test_decode_workers_stop_when_the_process_building_the_cache_dies(tmp_path):
    """A run killed (SIGKILL, out of memory) while it decoded a DICOM cache left its forked decode workers alive,
    blocked for ever on the pool's queue (they hold its write end too, so it never reads EOF)."""
    from tests.helpers import run_marked, wait_until_gone

    marked = run_marked("import os\n"
                        "from src.data import mammo\n"
                        "pool = mammo._decode_pool(2)\n"
                        "pool.submit(os.getpid).result()\n"  # the workers are up
                        "os._exit(9)\n")
    wait_until_gone(marked, "the orphaned decode workers to stop")


RAMP = [[0, 1000, 2000, 3000, 4095]]  # stored values of the one-row images below


def write_ramp(path, bits_stored=12, **elements):
    """A one-row MG image of RAMP (MONOCHROME2, 16 bits allocated, ``bits_stored`` stored), uncompressed, with
    ``elements`` set: a keyword's value, or (VR, value) to write the element as that VR (empty with None)."""
    from pydicom.datadict import tag_for_keyword
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = "1.2.840.10008.5.1.4.1.1.1.2", generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta, ds.SOPClassUID, ds.Modality = meta, meta.MediaStorageSOPClassUID, "MG"
    ds.set_pixel_data(np.array(RAMP, dtype=np.uint16), "MONOCHROME2", bits_stored)
    for key, value in elements.items():
        if isinstance(value, tuple):
            ds.add_new(tag_for_keyword(key), *value)
        else:
            setattr(ds, key, value)
    ds.save_as(path, enforce_file_format=True)
    return path


def test_window_with_negative_rescale_slope_keeps_high_modality_values_bright(tmp_path):
    # PS3.3 C.11.2.1.2: values below the window map to the minimum output, above it to the maximum, whatever the
    # sign of RescaleSlope; a window covering the whole modality range must display like no window at all
    rescale = dict(RescaleSlope=-1, RescaleIntercept=4095)  # modality = 4095 - stored: 4095, 3095, ..., 0
    plain, _ = read_dicom(write_ramp(tmp_path / "plain.dcm", **rescale))
    windowed, _ = read_dicom(write_ramp(tmp_path / "window.dcm", WindowCenter=2048, WindowWidth=4096, **rescale))
    np.testing.assert_allclose(plain, [[1.0, 3095 / 4095, 2095 / 4095, 1095 / 4095, 0.0]], atol=1e-6)
    np.testing.assert_allclose(windowed, plain, atol=1e-3)


def test_voi_lut_with_ow_lut_data_decodes(tmp_path):
    # LUT Data (0028,3006) is US or OW; stored as OW pydicom hands it back as bytes, which apply_voi_lut parses
    from pydicom.dataset import Dataset

    lut_values = np.round(np.linspace(0, 65535, 4096)).astype(np.uint16)
    images = []
    for vr, value in (("US", [int(v) for v in lut_values]), ("OW", lut_values.astype("<u2").tobytes())):
        item = Dataset()
        item.LUTDescriptor = [4096, 0, 16]
        item.add_new(0x00283006, vr, value)
        images.append(read_dicom(write_ramp(tmp_path / f"{vr}.dcm", VOILUTSequence=[item]))[0])
    np.testing.assert_allclose(images[0], [[0.0, 1000 / 4095, 2000 / 4095, 3000 / 4095, 1.0]], atol=1e-4)
    np.testing.assert_array_equal(images[1], images[0])


def test_empty_window_elements_count_as_no_voi(tmp_path):
    # Window Center/Width present but empty: pydicom's apply_voi_lut applies no VOI, so the image must be stretched
    # over its own range (as without the elements), not divided by the 16-bit stored range
    path = write_ramp(tmp_path / "empty_window.dcm", bits_stored=16, WindowCenter=("DS", None),
                      WindowWidth=("DS", None))
    x, _ = read_dicom(path)
    np.testing.assert_allclose(x, [[0.0, 1000 / 4095, 2000 / 4095, 3000 / 4095, 1.0]], atol=1e-6)


@pytest.mark.parametrize("elements", [dict(RescaleSlope=("DS", None), RescaleIntercept=0),
                                      dict(RescaleSlope=1, RescaleIntercept=("DS", None))])
def test_an_empty_rescale_element_is_skipped_with_a_reason_that_names_it(tmp_path, elements):
    # pydicom's modality transform multiplies by the empty value: the skip report read "TypeError: unsupported operand
    # type(s) for *: 'float' and 'NoneType'", which names neither the element nor the file's fault
    path = write_ramp(tmp_path / "empty_rescale.dcm", **elements)
    with pytest.raises(DicomError, match=r"Rescale (Slope|Intercept) is present but empty"):
        read_dicom(path)
