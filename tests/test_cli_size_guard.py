"""The size guard of every command (--max-side): large images are downsized on load, and the record says so."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from PIL import Image

from cli_helpers import GOOD, HEIGHT, WIDTH, folder_flags, make_folder, records_by_status, run_cli
from jaxseg_robust import cli
from jaxseg_robust.data.datasets import (
    DEFAULT_MAX_SIDE,
    ResizedInstanceRef,
    guard_size,
    list_dataset_folder,
)
from jaxseg_robust.data.instances import InstanceRef, make_instance
from jaxseg_robust.runner.engine import run
from jaxseg_robust.runner.records import latest_records, read_run_records

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import runner_toy as toy  # noqa: E402


def _ref(height, width, seed=0):
    rng = np.random.default_rng(seed)
    gt = rng.integers(-1, 2, (height, width)).astype(np.int8)
    instance = make_instance("x", rng.integers(0, 256, (height, width, 3), dtype=np.uint8), gt, dataset="d")
    return InstanceRef("x", height, width, lambda: instance, "d", fingerprint="t"), instance


def test_guard_downsizes_only_what_exceeds_the_cap_and_describes_it():
    big, original = _ref(300, 400)
    small, _ = _ref(30, 40, seed=1)
    guarded = guard_size([big, small], 100)
    assert guarded[1] is small
    resized = guarded[0]
    assert isinstance(resized, ResizedInstanceRef) and resized.size == (75, 100) and resized.key == big.key
    note = resized.resize_note
    assert note["original_size"] == [300, 400] and note["size"] == [75, 100] and note["scale"] == [0.25, 0.25]
    assert note["max_side"] == 100 and "x0 = (x + 0.5) * W0 / w - 0.5" in note["map_back"]
    loaded = resized.load()
    assert loaded.size == (75, 100) and loaded.image.dtype == np.uint8
    assert set(np.unique(loaded.gt)) <= {-1, 0, 1}  # nearest neighbour keeps the labels, ignore included
    expected = np.asarray(Image.fromarray(original.image).resize((100, 75), Image.BILINEAR))
    np.testing.assert_array_equal(loaded.image, expected)
    assert guard_size([big], 0) == [big] and guard_size([big], None) == [big]
    with pytest.raises(ValueError, match="max_side"):
        guard_size([big], -1)
    twice = guard_size(guard_size([big], 200), 100)[0]  # a second cap keeps the size on disk
    assert twice.resize_note["original_size"] == [300, 400] and twice.size == (75, 100)
    assert DEFAULT_MAX_SIDE == 2048


def test_the_record_of_a_resized_instance_says_so(tmp_path):
    instances = toy.toy_instances(2, sizes=((12, 5),))
    refs = [InstanceRef(i.id, *i.size, (lambda i=i: i), i.dataset, fingerprint=i.id) for i in instances]
    guarded = guard_size(refs, 6)
    run(guarded, toy.toy_batch_fn, tmp_path, 2, progress="none")
    records = latest_records(read_run_records(tmp_path))
    for ref in guarded:
        record = records[ref.key]
        assert record["status"] == "ok" and record["resized"]["original_size"] == [12, 5]
        assert record["resized"]["size"] == [6, 3] and record["payload"]["gt_counts"][0] >= 0


def test_the_tetris_protocol_cap_is_recorded_as_a_resize(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(tmp_path / "images" / "scene.png")
    ids = np.zeros((40, 60, 3), np.uint8)
    ids[5:30, 10:50, 0] = 5  # packed id 5 (R + 256 G + 65536 B)
    Image.fromarray(ids).save(tmp_path / "masks" / "scene.png")
    capped = list_dataset_folder("tetris", tmp_path, max_side=30)
    assert [r.id for r in capped] == ["scene#5"] and capped[0].size == (20, 30)
    assert capped[0].resize_note["original_size"] == [40, 60] and "TETRIS" in capped[0].resize_note["method"]
    assert not hasattr(list_dataset_folder("tetris", tmp_path, max_side=0)[0], "resize_note")


def test_run_commands_apply_the_guard_to_every_source_and_record_it(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    out = tmp_path / "run"
    argv = ["grid", "--kind", "box", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out),
            "--stride", "16", "--progress", "none", "--max-side", str(WIDTH // 2)]
    code, stdout, err = run_cli(argv, capsys)
    assert code == cli.EXIT_OK, err
    ok, _, _ = records_by_status(out)
    assert sorted(ok) == list(GOOD)
    for record in ok.values():
        assert record["resized"]["original_size"] == [HEIGHT, WIDTH]
        assert record["resized"]["size"] == [HEIGHT // 2, WIDTH // 2]
        assert record["resized"]["scale"] == [0.5, 0.5]
    said = [line for line in err.splitlines() if line.startswith("resized ")]  # one console line per instance
    assert said == [f"resized toy/{stem}: {HEIGHT}x{WIDTH} -> {HEIGHT // 2}x{WIDTH // 2} (--max-side {WIDTH // 2})"
                    for stem in GOOD]
    count = "3 of 3 instances were resized on load"
    assert stdout.strip().splitlines()[-1].startswith(count)  # the command's final line
    assert count in (out / "summary.md").read_text()
    unguarded = [*argv[:-1], "0"]
    unguarded[unguarded.index(str(out))] = str(tmp_path / "unguarded")
    code, stdout, err = run_cli(unguarded, capsys)  # --max-side 0: no guard, nothing said
    assert code == cli.EXIT_OK, err
    assert "resized " not in err and "were resized" not in stdout


def test_tetris_max_side_without_a_tetris_dataset_is_refused(tmp_path, capsys):
    folder = make_folder(tmp_path, bad=False)
    code, _, err = run_cli(["tetris", "--model", "sam_tiny", *folder_flags(folder), "--out", str(tmp_path / "r"),
                            "--tetris-max-side", "512"], capsys)
    assert code == cli.EXIT_FAILURE
    assert "--tetris-max-side is the TETRIS dataset's protocol cap" in err and "--max-side" in err
