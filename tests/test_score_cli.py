"""End-to-end tests of `jaxseg-robust score` on temporary folders."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.commands import score
from jaxseg_robust.data.examples import example_pairs
from jaxseg_robust.metrics import masks as M

HEIGHT, WIDTH = 30, 40  # d = round(0.02 * 50) = 1


def save(path, mask, scale=255):
    Image.fromarray(np.asarray(mask, np.uint8) * scale).save(path)


def blob(top, left, size=12, shape=(HEIGHT, WIDTH)):
    mask = np.zeros(shape, bool)
    mask[top: top + size, left: left + size] = True
    return mask


def read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def run(argv, capsys):
    code = cli.main(["score", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_shows_an_example(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["score", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "jaxseg-robust score --example" in out
    assert "--gt-ignore 128" in out and "exit codes" in out


def test_example_folders_are_scored(tmp_path, capsys):
    root = tmp_path / "example"
    code, out, err = run(["--example", str(root)], capsys)
    assert code == cli.EXIT_OK, err
    rows = read_csv(root / "scores.csv")
    pairs = {pair.name: pair for pair in example_pairs()}
    assert [row["name"] for row in rows] == sorted(pairs)
    for row in rows:
        pair = pairs[row["name"]]
        expected = M.mask_scores(pair.gt, pair.pred)
        for column in score.SCORE_COLUMNS:
            assert float(row[column]) == pytest.approx(float(getattr(expected, column)), abs=1e-6), column
        assert int(row["boundary_px"]) == M.boundary_width(*pair.gt.shape)
    assert "scored 7, skipped 0; mean IoU" in out
    assert "06_thin_bar_shift3" in out


def test_partial_run_names_every_skipped_file(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    # a: fine; e: GrabCut-style GT with a 128 ignore band (BMP vs PNG prediction).
    save(gt_dir / "a.png", blob(5, 5))
    save(pred_dir / "a.png", blob(6, 7))
    band = blob(3, 3, 16) & ~blob(7, 7, 8)
    grabcut = np.where(blob(5, 5), 255, 0).astype(np.uint8)
    grabcut[band & ~blob(5, 5)] = 128
    Image.fromarray(grabcut).save(gt_dir / "e.bmp")
    save(pred_dir / "e.png", blob(4, 4, 13))
    # b: size mismatch; c: unreadable prediction; d: GT only; f: prediction only.
    save(gt_dir / "b.png", blob(5, 5))
    save(pred_dir / "b.png", blob(5, 5, shape=(HEIGHT + 1, WIDTH)))
    save(gt_dir / "c.png", blob(5, 5))
    (pred_dir / "c.png").write_bytes(b"not an image")
    save(gt_dir / "d.png", blob(5, 5))
    save(pred_dir / "f.png", blob(5, 5))
    out_csv = tmp_path / "out" / "scores.csv"
    code, out, err = run([str(gt_dir), str(pred_dir), "--out", str(out_csv), "--gt-ignore", "128"], capsys)
    assert code == cli.EXIT_PARTIAL
    assert "b: size mismatch" in err and "30x40" in err and "31x40" in err
    assert "c.png: cannot read image" in err
    assert "d.png: no prediction with this stem" in err
    assert "f.png: no GT with this stem" in err
    assert "scored 2, skipped 4" in out
    rows = {row["name"]: row for row in read_csv(out_csv)}
    assert sorted(rows) == ["a", "e"]
    expected_a = M.mask_scores(blob(5, 5), blob(6, 7))
    assert float(rows["a"]["boundary_iou"]) == pytest.approx(float(expected_a.boundary_iou))
    valid = grabcut != 128
    expected_e = M.mask_scores(grabcut == 255, blob(4, 4, 13), valid)
    assert int(rows["e"]["ignore_pixels"]) == int((~valid).sum()) > 0
    for column in score.SCORE_COLUMNS:
        assert float(rows["e"][column]) == pytest.approx(float(getattr(expected_e, column)), abs=1e-6)


def test_sizes_of_one_width_share_a_bucket_and_a_compilation(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    shapes = {"p": (HEIGHT, WIDTH), "q": (WIDTH, HEIGHT), "r": (33, 37)}  # all d = 1
    for name, shape in shapes.items():
        save(gt_dir / f"{name}.png", blob(2, 3, 20, shape))
        save(pred_dir / f"{name}.png", blob(4, 2, 20, shape))
    code, _, err = run([str(gt_dir), str(pred_dir), "--out", str(tmp_path / "s.csv")], capsys)
    assert code == cli.EXIT_OK, err
    rows = {row["name"]: row for row in read_csv(tmp_path / "s.csv")}
    for name, shape in shapes.items():
        expected = M.mask_scores(blob(2, 3, 20, shape), blob(4, 2, 20, shape))
        assert (int(rows[name]["height"]), int(rows[name]["width"])) == shape
        for column in score.SCORE_COLUMNS:
            assert float(rows[name][column]) == pytest.approx(float(getattr(expected, column)), abs=1e-6)
    scores_fn = M.batched_mask_scores(1)
    compiled = scores_fn._cache_size()
    code, _, _ = run([str(gt_dir), str(pred_dir)], capsys)
    assert code == cli.EXIT_OK and scores_fn._cache_size() == compiled


def test_an_empty_gt_is_skipped_by_name_and_an_empty_prediction_gets_a_rule_hint(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    save(gt_dir / "empty.png", np.zeros((HEIGHT, WIDTH)))
    save(pred_dir / "empty.png", np.zeros((HEIGHT, WIDTH)))
    save(gt_dir / "zero_three.png", blob(5, 5))
    save(pred_dir / "zero_three.png", blob(5, 5), scale=3)  # 0/3 file: empty under '>128'
    out_csv = tmp_path / "s.csv"
    code, out, err = run([str(gt_dir), str(pred_dir), "--out", str(out_csv)], capsys)
    assert code == cli.EXIT_PARTIAL
    assert "zero_three.png: pred mask is empty under rule '>128'" in err and "--pred-rule" in err
    skipped = [line for line in err.splitlines() if line.startswith("skipped: ")]
    assert skipped == [f"skipped: {gt_dir / 'empty.png'}: GT mask has no object pixel (--gt-rule >128; "
                       "values in the file: only 0); not scored"]
    rows = {row["name"]: row for row in read_csv(out_csv)}
    assert list(rows) == ["zero_three"] and float(rows["zero_three"]["iou"]) == 0.0  # the empty GT is no 0 or NaN
    assert "scored 1, skipped 1; mean IoU 0.0000," in out
    code, _, _ = run([str(gt_dir), str(pred_dir), "--out", str(out_csv), "--pred-rule", "!=0"], capsys)
    assert float(read_csv(out_csv)[0]["iou"]) == 1.0


@pytest.mark.parametrize("values", [(0, 1), (0, 1, 2, 3)], ids=["zero_one", "palette_ids"])
def test_one_rule_reads_every_file_and_label_masks_fail_by_name(tmp_path, capsys, values):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    labels = np.zeros((HEIGHT, WIDTH), np.uint8)
    for index, value in enumerate(values[1:]):  # one object per non-zero id (DAVIS palette ids 1..3)
        labels[4 + 8 * index: 10 + 8 * index, 5:20] = value
    save(gt_dir / "labels.png", labels, scale=1)
    save(pred_dir / "labels.png", labels > 0)
    save(gt_dir / "white.png", blob(5, 5))  # a 0/255 file next to it: read by the same rule
    save(pred_dir / "white.png", blob(5, 5))
    out_csv = tmp_path / "s.csv"
    code, out, err = run([str(gt_dir), str(pred_dir), "--out", str(out_csv)], capsys)
    assert code == cli.EXIT_PARTIAL and [row["name"] for row in read_csv(out_csv)] == ["white"]
    shown = ", ".join(str(v) for v in values)
    assert (f"skipped: {gt_dir / 'labels.png'}: GT mask has no object pixel (--gt-rule >128; values in the file: "
            f"{shown}; label or palette-id masks: --gt-rule '>0'); not scored") in err.splitlines()
    code, _, err = run([str(gt_dir), str(pred_dir), "--out", str(out_csv), "--gt-rule", ">0"], capsys)
    assert code == cli.EXIT_OK, err
    assert [float(row["iou"]) for row in read_csv(out_csv)] == [1.0, 1.0]  # every id is object, as DAVIS


def test_a_photo_or_noise_as_a_mask_is_scored_with_a_warning_naming_it(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    rng = np.random.default_rng(0)
    save(gt_dir / "noise.png", blob(5, 5))
    Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH), dtype=np.uint8)).save(pred_dir / "noise.png")
    save(gt_dir / "photo.png", blob(5, 5))
    Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(pred_dir / "photo.png")
    save(gt_dir / "clean.png", blob(5, 5))
    colour = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    colour[blob(5, 5)] = (255, 0, 255)  # magenta on black: two colours, channels differ, no warning
    Image.fromarray(colour).save(pred_dir / "clean.png")
    code, _, err = run([str(gt_dir), str(pred_dir)], capsys)
    assert code == cli.EXIT_OK
    assert "noise.png: not a two-valued mask" in err and "photo.png: not a two-valued mask" in err
    assert "clean.png" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gt-rule", "128"], "mask rule"),
        (["--dilation-ratio", "-1"], "dilation_ratio"),
    ],
)
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "gt").mkdir()
    (tmp_path / "pred").mkdir()
    code, _, err = run([str(tmp_path / "gt"), str(tmp_path / "pred"), *argv], capsys)
    assert code == cli.EXIT_FAILURE and message in err


def test_nothing_to_score_exits_2(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    save(gt_dir / "a.png", blob(1, 1))
    save(pred_dir / "b.png", blob(1, 1))
    code, _, err = run([str(gt_dir), str(pred_dir)], capsys)
    assert code == cli.EXIT_FAILURE
    assert "nothing scored" in err and "a.png: no prediction" in err
    code, _, err = run([str(gt_dir), str(tmp_path / "missing")], capsys)
    assert code == cli.EXIT_FAILURE and "missing: not a directory" in err
    code, _, err = run([], capsys)
    assert code == cli.EXIT_FAILURE and "GT_DIR and PRED_DIR" in err
    code, _, err = run([str(gt_dir), "--example", str(tmp_path / "x")], capsys)
    assert code == cli.EXIT_FAILURE and "--example takes no GT_DIR" in err


def test_ambiguous_stems_are_reported(tmp_path, capsys):
    gt_dir, pred_dir = tmp_path / "gt", tmp_path / "pred"
    gt_dir.mkdir()
    pred_dir.mkdir()
    save(gt_dir / "a.png", blob(1, 1))
    save(gt_dir / "a.bmp", blob(1, 1))
    save(pred_dir / "a.png", blob(1, 1))
    save(gt_dir / "b.png", blob(1, 1))
    save(pred_dir / "b.png", blob(1, 1))
    code, _, err = run([str(gt_dir), str(pred_dir)], capsys)
    assert code == cli.EXIT_PARTIAL
    assert "a: several GT files share this stem: a.bmp, a.png" in err
