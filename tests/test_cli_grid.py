"""End-to-end tests of `jaxseg-robust grid` (click and box kinds) and their report, with the tiny random SAM."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from jaxseg_robust import cli
from jaxseg_robust.attacks.grid.clicks import RECORDS_FORMAT as CLICK_GRID_RECORDS_FORMAT
from jaxseg_robust.runs.grid import crop_outputs, heatmap_path
from jaxseg_robust.reports.grid import grid_table, load_heatmaps, to_csv, to_markdown

from cli_helpers import (
    GOOD,
    HEIGHT,
    WIDTH,
    assert_argparse_rejects,
    assert_command_error,
    assert_resume_refused,
    assert_png,
    assert_resume_skips_everything,
    assert_timed_summary,
    folder_flags,
    make_folder,
    records_by_status,
    run_captured,
    run_cli,
    table_cells,
)

CLICK_STRIDE, BOX_STRIDE = 4, 8


def grid_argv(kind, folder, out, *extra: str) -> list[str]:
    stride = CLICK_STRIDE if kind == "click" else BOX_STRIDE
    return ["grid", "--kind", kind, "--model", "sam_tiny", *folder_flags(folder), "--out", str(out),
            "--stride", str(stride), "--chunk-size", "32", "--progress", "none", *extra]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("grid"))


def _grid_run(kind, folder, tmp_path_factory):
    """One ``--kind`` grid over the module's folder (3 good, 2 bad instances): (run dir, code, stdout, stderr)."""
    out = tmp_path_factory.mktemp(kind) / "run"
    return out, *run_captured(grid_argv(kind, folder, out))


@pytest.fixture(scope="module")
def click_run(folder, tmp_path_factory):
    return _grid_run("click", folder, tmp_path_factory)


@pytest.fixture(scope="module")
def box_run(folder, tmp_path_factory):
    return _grid_run("box", folder, tmp_path_factory)


def test_click_grid_records_heatmaps_and_extremes(click_run):
    out, code, stdout, stderr = click_run
    assert code == cli.EXIT_PARTIAL, stderr
    ok, _, records = records_by_status(out)
    assert set(ok) == set(GOOD) and len(records) == 5
    rows, cols = math.ceil(HEIGHT / CLICK_STRIDE), math.ceil(WIDTH / CLICK_STRIDE)
    for name, record in ok.items():
        payload = record["payload"]
        assert payload["heatmaps"] == heatmap_path("toy", name).as_posix()
        maps = load_heatmaps(out, payload)
        assert maps["iou"].shape == maps["biou"].shape == (rows, cols) == tuple(payload["grid_shape"])
        np.testing.assert_array_equal(maps["rows"], np.arange(0, HEIGHT, CLICK_STRIDE))
        assert payload["iou_min"] == pytest.approx(np.nanmin(maps["iou"]))
        assert payload["iou_max"] == pytest.approx(np.nanmax(maps["iou"]))
        x, y = payload["iou_argmax_xy"]
        assert maps["iou"][y // CLICK_STRIDE, x // CLICK_STRIDE] == pytest.approx(payload["iou_max"])
        assert payload["n_evaluated"] == rows * cols and maps["evaluated"].all()
        assert 0 <= payload["baseline_click_xy"][0] < WIDTH and 0 <= payload["baseline_click_xy"][1] < HEIGHT
        assert payload["grid_click_positive"] is True and "baseline_click" not in payload
        assert 0.0 <= payload["baseline_iou"] <= 1.0
        assert payload["source"]["size"] == [HEIGHT, WIDTH]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["protocol"] == "grid" and manifest["config"]["kind"] == "click"
    assert manifest["config"]["multimask_output"] is True and manifest["config"]["stride"] == CLICK_STRIDE
    assert manifest["config"]["records_format"] == CLICK_GRID_RECORDS_FORMAT
    cells = table_cells(stdout)
    assert cells[:3] == ["toy", "3", "2"]
    assert float(cells[3]) == pytest.approx(100 * np.mean([r["payload"]["iou_min"] for r in ok.values()]), abs=0.006)
    assert float(cells[5]) == pytest.approx(100 * np.mean([r["payload"]["baseline_iou"] for r in ok.values()]),
                                            abs=0.006)
    with open(out / "summary.csv", newline="") as handle:
        assert list(csv.DictReader(handle))[0]["failed"] == "2"


def test_box_grid_records_heatmaps_and_extremes(box_run):
    out, code, stdout, stderr = box_run
    assert code == cli.EXIT_PARTIAL, stderr
    ok, _, _ = records_by_status(out)
    assert set(ok) == set(GOOD)
    sizes_h, sizes_w = 2 * HEIGHT // BOX_STRIDE + 1, 2 * WIDTH // BOX_STRIDE + 1
    for record in ok.values():
        payload = record["payload"]
        maps = load_heatmaps(out, payload)
        assert maps["iou"].shape == (sizes_h, sizes_w) and maps["corner_heatmap"].shape == (HEIGHT, WIDTH)
        np.testing.assert_array_equal(maps["widths"], np.arange(0, 2 * WIDTH + 1, BOX_STRIDE))
        assert payload["iou_min"] == pytest.approx(np.nanmin(maps["iou"]))
        assert payload["biou_max"] == pytest.approx(np.nanmax(maps["biou"]))
        assert payload["iou_min"] <= payload["iou_max"] and 0.0 <= payload["tight_iou"] <= 1.0
        x1, y1, x2, y2 = payload["tight_box"]
        assert 0 <= x1 <= x2 < WIDTH and 0 <= y1 <= y2 < HEIGHT
    assert "IoU Tight box (single mask)" in stdout  # the box grid decodes every box with the single-mask output
    with open(out / "summary.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    assert float(row["iou_tight_single"]) == pytest.approx(np.mean([r["payload"]["tight_iou"] for r in ok.values()]))
    assert "iou_tight" not in row and "biou_tight_single" in row


def test_seconds_per_instance_and_compile_time_of_both_grids(click_run, box_run):
    assert_timed_summary(click_run[0])
    assert_timed_summary(box_run[0])


def test_resume_skips_and_a_mismatch_is_refused(folder, click_run, capsys):
    out, _, stdout, _ = click_run
    assert_resume_skips_everything(grid_argv("click", folder, out), out, stdout, capsys, expected_code=cli.EXIT_PARTIAL,
                                   skipped="0 ok, 0 failed, 5 skipped")
    assert_resume_refused(grid_argv("click", folder, out, "--region", "object"), capsys, "region")


def test_reports_have_every_table_and_plot(click_run, box_run, tmp_path, capsys):
    for run, kind in ((click_run, "click"), (box_run, "box")):
        out = run[0]
        report = tmp_path / kind
        code, _, err = run_cli(["report", str(out), "--out", str(report)], capsys)
        assert code == cli.EXIT_OK, err
        names = {p.name for p in report.iterdir()}
        assert {"grid.md", "grid.csv", "report.md"} <= names
        if kind == "click":
            expected = {f"heatmap_toy_{name}.png" for name in GOOD}
        else:
            expected = {f"{what}_toy_{name}.png" for name in GOOD for what in ("boxgrid", "corners")}
        assert expected <= names
        for png in report.glob("*.png"):
            assert_png(png)
        text = (report / "report.md").read_text()
        assert "toy/b_unreadable" in text and all(f"({p})" in text for p in expected)
    # the default output folder is RUN_DIR/report
    code, stdout, _ = run_cli(["report", str(click_run[0])], capsys)
    assert code == cli.EXIT_OK and (click_run[0] / "report" / "grid.md").is_file() and "wrote" in stdout


@pytest.mark.parametrize("kind, extra, message", [
    ("box", ["--region", "object"], "--region applies to --kind click"),
    ("box", ["--prefix", "baseline"], "--prefix applies"),
    ("click", ["--no-corner-heatmap"], "--kind box"),
    ("click", ["--thresh", "1"], "--thresh"),
    ("click", ["--model", "no_such_model"], "unknown model"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, kind, extra, message):
    folder = make_folder(tmp_path, bad=False)
    assert_command_error("grid", grid_argv(kind, folder, tmp_path / "run", *extra), capsys, message)


@pytest.mark.parametrize("argv, message", [
    (["--kind", "click", "--stride", "0"], "positive integer"),
    (["--kind", "circle"], "invalid choice"),
    ([], "--kind"),
    (["--kind", "box", "--multimask", "--single-mask"], "not allowed"),
])
def test_argparse_rejects_bad_values(tmp_path, capsys, argv, message):
    assert_argparse_rejects("grid", argv, tmp_path, capsys, message)


def test_report_of_a_non_run_directory_exits_2(tmp_path, capsys):
    code, _, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == cli.EXIT_FAILURE and "neither a run directory" in err


# ---- pure pieces ------------------------------------------------------------------------------

def test_crop_outputs_keeps_the_image_part_of_frame_sized_grids():
    frame_rows, frame_cols = 16, 16  # 64 x 64 frame at stride 4
    outputs = {"iou": np.arange(frame_rows * frame_cols, dtype=np.float32).reshape(frame_rows, frame_cols),
               "biou": np.zeros((frame_rows, frame_cols), np.float32), "evaluated": np.ones((16, 16), bool),
               "rows": np.arange(0, 64, 4), "cols": np.arange(0, 64, 4), "iou_min": np.float32(0.1)}
    payload, arrays = crop_outputs("click", outputs, (41, 48), 4)
    assert arrays["iou"].shape == (11, 12) and arrays["rows"][-1] == 40 and arrays["cols"][-1] == 44
    assert payload == {"iou_min": np.float32(0.1), "grid_shape": [11, 12]}
    boxes = {"iou": np.full((33, 33), 0.5, np.float32), "biou": np.linspace(0, 1, 33 * 33).reshape(33, 33),
             "iou_reference": np.zeros((33, 33)), "valid": np.ones((33, 33), bool), "heights": np.arange(0, 129, 4),
             "widths": np.arange(0, 129, 4), "corner_heatmap": np.zeros((64, 64))}
    payload, arrays = crop_outputs("box", boxes, (40, 20), 4)
    assert arrays["iou"].shape == (21, 11) and arrays["heights"][-1] == 80 and arrays["widths"][-1] == 40
    assert arrays["corner_heatmap"].shape == (40, 20)
    assert payload["biou_max"] == pytest.approx(float(boxes["biou"][20, 10]))


def test_heatmap_paths_are_safe_and_distinct():
    assert heatmap_path("toy", "a0").as_posix() == "heatmaps/toy/a0.npz"
    odd = {heatmap_path("d s", "x/1"), heatmap_path("d s", "x 1"), heatmap_path("d_s", "x_1")}
    assert len(odd) == 3 and all(".." not in p.as_posix() and " " not in p.as_posix() for p in odd)


def test_grid_table_means_nan_failed_and_errors():
    def record(dataset, name, status="ok", **payload):
        return {"dataset": dataset, "id": name, "status": status, "payload": payload}

    click = dict(iou_min=0.2, iou_max=0.8, baseline_iou=0.6, biou_min=0.1, biou_max=0.4, baseline_biou=0.3)
    records = [record("a", "1", **click), record("a", "2", **{**click, "iou_min": None, "iou_max": 0.6}),
               record("a", "3", status="failed"), record("b", "1", **click)]
    table = grid_table(records, "click")
    a, b, mean = table.rows
    assert (a.ok, a.failed, mean.ok, mean.failed) == (2, 1, 3, 1)
    assert a.values["iou_min"] == pytest.approx(0.2) and a.values["iou_max"] == pytest.approx(0.7)
    assert mean.values["iou_max"] == pytest.approx(0.75)
    assert "| a | 2 | 1 | 20.00 | 70.00 | 60.00 |" in to_markdown(table)
    assert to_csv(table).splitlines()[0] == "dataset,ok,failed,iou_min,iou_max,iou_base,biou_min,biou_max,biou_base"
    box = dict(iou_min=0.2, iou_max=0.8, tight_iou=0.6, biou_min=0.1, biou_max=0.4, tight_biou=0.3)
    single, multimask = grid_table([record("a", "1", **box)], "box"), grid_table([record("a", "1", **box)], "box", True)
    assert "IoU Tight box (single mask)" in to_markdown(single)  # the command's default for boxes
    assert "IoU Tight box (multimask + selection)" in to_markdown(multimask)
    assert to_csv(single).splitlines()[0] == ("dataset,ok,failed,iou_min,iou_max,iou_tight_single,biou_min,biou_max,"
                                              "biou_tight_single")
    assert "iou_tight_multimask" in to_csv(multimask).splitlines()[0]
    with pytest.raises(ValueError, match="a/1"):
        grid_table([record("a", "1", **click)], "box")
    with pytest.raises(ValueError, match="kind"):
        grid_table([], "circle")


def test_help_says_how_to_pick_the_device(capsys):
    from cli_helpers import help_text

    assert "JAX_PLATFORMS=cpu|cuda|tpu" in help_text("grid", capsys)


def test_startup_lines_on_stderr(click_run):
    *_, stderr = click_run
    assert "loading sam_tiny ..." in stderr and "compiling the click grid program for bucket 64x64" in stderr


def test_click_grid_heatmap_marks_the_recorded_xy_clicks_where_they_are(monkeypatch):
    import jaxseg_robust.reports.figures as figures
    from jaxseg_robust.reports.grid import box_grid_figure, click_grid_figure

    drawn = {}
    monkeypatch.setattr(figures, "heatmap_figure", lambda *args, **kwargs: drawn.update(kwargs))
    payload = {"baseline_click_xy": [7, 3], "iou_argmin_xy": [-1, -1], "iou_argmax_xy": [12, 5], "iou_min": 0.1,
               "iou_max": 0.9, "baseline_iou": 0.5}
    maps = {"iou": np.zeros((6, 13)), "rows": np.arange(6), "cols": np.arange(13)}
    click_grid_figure({"dataset": "d", "id": "1", "payload": payload}, maps)
    assert drawn["markers"] == {"baseline click": (7, 3), "max": (12, 5)}  # (x, y) as recorded; no extreme: none
    box = {"tight_hw": [4, 9], "iou_argmin_hw": [0, 2], "iou_argmax_hw": [5, 8], "iou_min": 0.0, "iou_max": 0.9,
           "tight_iou": 0.8}
    maps = {"iou": np.zeros((6, 13)), "heights": np.arange(6), "widths": np.arange(13)}
    box_grid_figure({"dataset": "d", "id": "1", "payload": box}, maps)
    assert drawn["markers"] == {"tight box": (9, 4), "min": (2, 0), "max": (8, 5)}  # (h, w) drawn at (w, h)
