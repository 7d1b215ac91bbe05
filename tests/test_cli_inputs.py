"""Inputs people actually have, through the CLI: 0/1 label masks, noise masks, folder-only mask flags, flag
values that could only give an empty or degenerate table (refused up front, exit 2, one line)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cli_helpers import GOOD, folder_flags, make_folder, run_cli
from jaxseg_robust import cli
from jaxseg_robust.runs.grid import prompt_count
from jaxseg_robust.data.datasets import DatasetWarning
from jaxseg_robust.runner.records import latest_records, read_run_records

COMMANDS = [["tetris"], ["breps"], ["grid", "--kind", "box", "--stride", "16"], ["rclicks", "--clickability", "dt"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("flag", [["--mask-rule", ">0"], ["--mask_ignore", "128"]], ids=lambda f: f[0])
def test_folder_mask_flags_with_datasets_alone_are_refused(tmp_path, capsys, command, flag):
    out = tmp_path / "run"
    argv = [*command, "--model", "sam_tiny", "--datasets", "grabcut", "--data-root", str(tmp_path),
            "--out", str(out), "--progress", "none", *flag]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE
    assert flag[0].replace("_", "-") + " applies to --folder masks" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_perturb_refuses_a_mask_rule_no_dataset_uses(tmp_path, capsys):
    (tmp_path / "grabcut").mkdir()
    argv = ["perturb", "--model", "sam_tiny", "--random-init", "--datasets", "grabcut", "--data-root",
            str(tmp_path), "--mask-rule", ">0", "--attacks", "padam", "--out", str(tmp_path / "run"),
            "--progress", "none"]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE and "--mask-rule applies to --folder masks (plain image/mask folders)" in err


def test_one_mask_rule_reads_every_file_and_a_noise_mask_is_named(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    for stem in GOOD[:2]:  # 0/1 label exports next to a 0/255 mask: one rule reads them all
        path = folder / "masks" / f"{stem}.png"
        Image.fromarray((np.asarray(Image.open(path)) > 0).astype(np.uint8)).save(path)
    noise = np.random.default_rng(5).integers(0, 256, np.asarray(Image.open(path)).shape, dtype=np.uint8)
    Image.fromarray(np.asarray(Image.open(folder / "images" / "a0.png"))).save(folder / "images" / "n0.png")
    Image.fromarray(noise).save(folder / "masks" / "n0.png")
    argv = ["tetris", "--model", "sam_tiny", "--mode", "baseline", "--n-clicks", "2", *folder_flags(folder),
            "--progress", "none"]
    with pytest.warns(DatasetWarning) as caught:  # printed to stderr by Python outside pytest
        code, _, err = run_cli([*argv, "--out", str(tmp_path / "run")], capsys)
    assert code == cli.EXIT_PARTIAL, err
    records = latest_records(read_run_records(tmp_path / "run"))
    assert sorted(key[1] for key, r in records.items() if r["status"] == "ok") == [GOOD[2], "n0"]
    for stem in GOOD[:2]:  # failed and named, never an IoU of 0 in the mean
        assert (f"toy/{stem}: mask {folder / 'masks' / stem}.png has no object pixel (rule >128; values in the "
                "file: 0, 1; label or palette-id masks: rule '>0')") in records[("toy", stem)]["error"]
    messages = [str(w.message) for w in caught if issubclass(w.category, DatasetWarning)]
    assert sum("n0.png: not a two-valued mask" in m for m in messages) == 1
    code, _, err = run_cli([*argv, "--mask-rule", ">0", "--out", str(tmp_path / "run_labels")], capsys)
    assert code == cli.EXIT_OK, err  # '>0' reads the 0/1 files, the 0/255 file and the noise alike


@pytest.mark.parametrize("kind, stride, fine", [("click", 48, 47), ("box", 97, 96)])
def test_a_grid_stride_larger_than_every_image_is_refused(tmp_path, capsys, kind, stride, fine):
    folder = make_folder(tmp_path, bad=False)  # 40 x 48 images
    out = tmp_path / "run"
    argv = ["grid", "--kind", kind, "--model", "sam_tiny", *folder_flags(folder), "--out", str(out),
            "--progress", "none", "--stride", str(stride)]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE and not out.exists()
    assert f"--stride {stride} leaves a single" in err and f"--stride {fine} or less" in err
    assert len(err.strip().splitlines()) == 1
    assert prompt_count(kind, fine, 40, 48) >= 2 and prompt_count(kind, stride, 40, 48) == 1


def test_on_bad_pair_error_hints_with_the_flag_spelling(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=True)  # a size-mismatched and an unreadable mask
    argv = ["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(tmp_path / "run"),
            "--progress", "none", "--on-bad-pair", "error"]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE and not (tmp_path / "run").exists()
    first = err.splitlines()[0]
    assert first.startswith("jaxseg-robust tetris: error: toy: 2 problem(s) listing ")
    assert first.endswith("(--on-bad-pair skip or fail to go on):") and "on_bad_pair=" not in err
    assert "b_mismatch.png" in err and "b_unreadable.png" in err
