"""Shared pieces of the CLI tests: a generated image/mask folder, running the CLI, checking its outputs.

The folder (`make_folder`): ``root/toy/{images,masks}`` with three good
HEIGHT x WIDTH pairs (random RGB image, an elliptic object brightened in the
image) and, with ``bad``, a pair whose mask has another size and one whose
mask is not a PNG: the run records those two as failed (exit code 1).
"""

from __future__ import annotations

import io
import pathlib
import sys

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.reports.figures import FIGURE_PX
from jaxseg_robust.runner.records import latest_records, read_run_records

HEIGHT, WIDTH = 40, 48
GOOD = ("a0", "a1", "a2")
BAD = ("b_mismatch", "b_unreadable")
# argparse rejections shared by the attack commands (tetris, breps)
ATTACK_ARGPARSE_ERRORS = [
    (["--n_opt_steps", "0"], "positive integer"),
    (["--lr_mult", "abc"], "expected a number"),
    (["--mode", "median"], "invalid choice"),
]


def write_pair(root: pathlib.Path, stem: str, seed: int, mask_hw=(HEIGHT, WIDTH)) -> None:
    """Writes ``root/images/<stem>.png`` (uint8 RGB, HEIGHT x WIDTH) and ``root/masks/<stem>.png`` (0/255)."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:mask_hw[0], :mask_hw[1]]
    cy, cx = rng.uniform(0.4, 0.6) * mask_hw[0], rng.uniform(0.4, 0.6) * mask_hw[1]
    mask = ((yy - cy) / (0.3 * mask_hw[0])) ** 2 + ((xx - cx) / (0.25 * mask_hw[1])) ** 2 <= 1
    if mask_hw == (HEIGHT, WIDTH):
        image[mask] = (image[mask] // 2 + 100).astype(np.uint8)
    Image.fromarray(image).save(root / "images" / f"{stem}.png")
    Image.fromarray(mask.astype(np.uint8) * 255).save(root / "masks" / f"{stem}.png")


def make_folder(root: pathlib.Path, bad: bool = True) -> pathlib.Path:
    """``root/toy/{images,masks}``: three good pairs; with ``bad`` a size-mismatched and an unreadable mask."""
    folder = root / "toy"
    (folder / "images").mkdir(parents=True)
    (folder / "masks").mkdir()
    for index, stem in enumerate(GOOD):
        write_pair(folder, stem, index)
    if bad:
        write_pair(folder, "b_mismatch", 10, mask_hw=(HEIGHT - 3, WIDTH))
        write_pair(folder, "b_unreadable", 11)
        (folder / "masks" / "b_unreadable.png").write_bytes(b"this is not a png")
    return folder


def folder_flags(folder: pathlib.Path) -> list[str]:
    """``--folder IMAGES MASKS`` of a `make_folder` folder."""
    return ["--folder", str(folder / "images"), str(folder / "masks")]


def run_cli(argv, capsys):
    """``cli.main(argv)`` -> (exit code, stdout, stderr), captured by ``capsys``."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


class Capture:
    """Captures stdout/stderr in a module-scoped fixture (capsys is function-scoped)."""

    def __enter__(self):
        self._saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self._out, self._err = io.StringIO(), io.StringIO()
        return self

    def __exit__(self, *exc):
        sys.stdout, sys.stderr = self._saved
        self.out, self.err = self._out.getvalue(), self._err.getvalue()


def run_captured(argv) -> tuple[int, str, str]:
    """``cli.main(argv)`` -> (exit code, stdout, stderr) without capsys (for module-scoped fixtures)."""
    with Capture() as capture:
        code = cli.main(argv)
    return code, capture.out, capture.err


def run_on_new_folder(tmp_path_factory, name: str, make_argv) -> tuple:
    """`make_folder` (3 good, 2 bad pairs) in a new temp dir, then ``make_argv(folder, out)`` run captured.

    Returns:
      (folder, run directory, exit code, stdout, stderr).
    """
    root = tmp_path_factory.mktemp(name)
    folder = make_folder(root)
    out = root / "run"
    return folder, out, *run_captured(make_argv(folder, out))


def help_text(command: str, capsys) -> str:
    """``jaxseg-robust COMMAND --help``: checks it exits 0 and lists the exit codes; returns the text."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes" in out
    return out


def assert_command_error(command: str, argv, capsys, message: str) -> None:
    """Running ``argv`` exits 2 with ``jaxseg-robust COMMAND: error: ...`` naming ``message`` on stderr."""
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE
    assert f"jaxseg-robust {command}: error:" in err and message in err


def assert_argparse_rejects(command: str, extra, tmp_path, capsys, message: str) -> None:
    """argparse refuses ``COMMAND --model sam_tiny --datasets grabcut --out TMP *extra`` (exit 2, ``message``)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--model", "sam_tiny", "--datasets", "grabcut", "--out", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def records_by_status(out) -> tuple[dict, dict, dict]:
    """(instance id -> ok record, instance id -> failed record, (dataset, id) -> latest record) of a run."""
    records = latest_records(read_run_records(out))
    ok = {key[1]: r for key, r in records.items() if r["status"] == "ok"}
    failed = {key[1]: r for key, r in records.items() if r["status"] == "failed"}
    return ok, failed, records


def table_lines(stdout: str) -> list[str]:
    """The Markdown table lines (``| ...``) of a command's output."""
    return [line for line in stdout.splitlines() if line.startswith("|")]


def table_cells(stdout: str, dataset: str = "toy") -> list[str]:
    """The stripped cells of ``dataset``'s row of the printed table."""
    row = next(line for line in stdout.splitlines() if line.startswith(f"| {dataset} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def assert_resume_skips_everything(argv, out: pathlib.Path, first_stdout: str, capsys, *, expected_code: int,
                                   skipped: str) -> None:
    """Rerunning ``argv`` into ``out`` records nothing new, says ``skipped`` and prints the first run's table."""
    before = (out / "records.jsonl").read_bytes()
    code, again, err = run_cli(argv, capsys)
    assert code == expected_code, err
    assert (out / "records.jsonl").read_bytes() == before
    assert skipped in again
    assert table_lines(first_stdout) and table_lines(first_stdout) == table_lines(again)


def assert_resume_refused(argv, capsys, setting: str) -> None:
    """Rerunning into a run directory with a changed ``setting`` exits 2 naming it and --allow-manifest-mismatch."""
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_FAILURE
    assert setting in err and "--allow-manifest-mismatch" in err


def assert_png(path, size=FIGURE_PX):
    """A PNG of the stated (width, height) that is not blank (many distinct colours, real contrast)."""
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == size
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.std() > 10
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50


def assert_timed_summary(out) -> None:
    """Every ok instance of the run has positive device and wall seconds in ``timings.jsonl``, every compiled
    bucket positive seconds in ``compile.jsonl``, and ``summary.md`` / ``summary.csv`` show their per-dataset
    means and the compile total (and how many programs came from the compilation cache)."""
    import csv  # noqa: PLC0415

    from jaxseg_robust.reports.artifacts import read_compile_events, read_timings  # noqa: PLC0415

    _, _, records = records_by_status(out)
    timings = read_timings(out)
    ok = {key for key, record in records.items() if record["status"] == "ok"}
    assert ok and ok <= set(timings)
    for key in ok:
        assert timings[key]["seconds"] > 0 and timings[key]["wall_seconds"] >= timings[key]["seconds"]
    events = read_compile_events(out)
    assert events and all(event["seconds"] > 0 and len(event["frame"]) == 2 for event in events)
    with open(out / "summary.csv", newline="") as handle:
        rows = {row["dataset"]: row for row in csv.DictReader(handle)}
    for dataset in {key[0] for key in ok}:
        mine = [timings[key] for key in ok if key[0] == dataset]
        assert float(rows[dataset]["sec_device"]) == pytest.approx(np.mean([t["seconds"] for t in mine]))
        assert float(rows[dataset]["sec_wall"]) == pytest.approx(np.mean([t["wall_seconds"] for t in mine]))
        assert float(rows[dataset]["compile_sec"]) == pytest.approx(sum(e["seconds"] for e in events))
    markdown = (out / "summary.md").read_text()
    assert "| dataset | timed | s/instance device | s/instance wall |" in markdown
    cached = sum(bool(e.get("from_cache")) for e in events)  # the test session's cache is off (conftest): 0
    assert f"compile: {sum(e['seconds'] for e in events):.1f} s for {len(events)} bucket program(s), {cached} from " \
        "the cache" in markdown
    assert_device_busy_line(out, markdown)


def assert_device_busy_line(out, markdown: str) -> None:
    """The compile line of ``markdown`` ends with the run's device busy share, a share of a positive wall
    time after compile that `reports.timing_summary.device_busy` reads back from the side files."""
    from jaxseg_robust.reports.artifacts import read_compile_events, read_timing_lines  # noqa: PLC0415
    from jaxseg_robust.reports.timing_summary import device_busy  # noqa: PLC0415

    busy = device_busy(read_timing_lines(out), read_compile_events(out))
    assert busy is not None and busy.wall > 0 and 0 < busy.busy <= busy.wall + 1e-6
    [compile_line] = [line for line in markdown.splitlines() if line.startswith("compile: ")]
    assert compile_line.endswith(f"; device busy {100 * busy.share:.0f} % of {busy.wall:.1f} s after compile")
