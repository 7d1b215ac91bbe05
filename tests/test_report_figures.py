"""What the report figures draw: the evaluated BREPS box, unpainted no-data pixels, fitted colour
scales, the GT outline, and which instances ``--plot-instances`` picks.

The figures are read back from their matplotlib artists (the ``*_figure``
builders the reports save) and, for the corner heatmap, from the saved PNG's
pixels. Real runs: a box grid and a BREPS run with the tiny random SAM on the
generated toy folder (3 good instances, 2 that fail).
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from PIL import Image

from jaxseg_robust import cli
from jaxseg_robust.data.datasets import read_image_rgb
from jaxseg_robust.reports import figures, grid, plot_selection, run_report
from jaxseg_robust.reports.plot_selection import PlotInstances, instances_to_plot
from jaxseg_robust.reports.sources import load_source_gt, load_source_image

from cli_helpers import GOOD, assert_png, folder_flags, make_folder, records_by_status, run_captured


def _gt_of(folder, name: str) -> np.ndarray:
    return np.asarray(read_image_rgb(folder / "masks" / f"{name}.png"))[..., 0] > 128


def _drawn_gt(axes):
    return [artist for artist in axes.get_children() if artist.get_gid() == figures.GT_OUTLINE_GID]


def _close(figure):
    import matplotlib.pyplot as plt

    plt.close(figure)


# ---- real runs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("figures"))


@pytest.fixture(scope="module")
def box_grid_run(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("box_grid") / "run"
    code, _, err = run_captured(["grid", "--kind", "box", "--model", "sam_tiny", *folder_flags(folder),
                                 "--out", str(out), "--stride", "8", "--chunk-size", "32", "--progress", "none"])
    assert code == cli.EXIT_PARTIAL, err  # the two bad pairs fail
    return out


@pytest.fixture(scope="module")
def breps_run(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("breps") / "run"
    code, _, err = run_captured(["breps", "--model", "sam_tiny", *folder_flags(folder), "--out", str(out),
                                 "--n_opt_steps", "3", "--lr_mult", "2", "--progress", "none"])
    assert code == cli.EXIT_PARTIAL, err
    return out


# ---- coordinates and colour scales -------------------------------------------------------------------

def test_record_clicks_xy_reads_the_recorded_x_y_as_they_are():
    xy, positive = figures.record_clicks_xy({"clicks_xy": [[3.5, 10.0], [40.0, 2.0]], "is_positive": [True, False]})
    np.testing.assert_array_equal(xy, [[3.5, 10.0], [40.0, 2.0]])
    assert xy.dtype == np.float32 and positive.tolist() == [True, False]
    assert figures.record_point_xy({"baseline_click_xy": [9, 7]}, "baseline_click_xy") == (9.0, 7.0)
    assert figures.record_point_xy({"iou_argmin_xy": [-1, -1]}, "iou_argmin_xy") is None
    with pytest.raises(ValueError, match="is_positive"):
        figures.record_clicks_xy({"clicks_xy": [[1, 2]], "is_positive": [True, False]})


def test_colour_scale_is_the_finite_data_range():
    values = np.array([[0.93, np.nan, 0.99], [0.95, 0.97, np.nan]])
    assert figures.data_range(values) == (0.93, 0.99)
    low, high = figures.data_range(np.full((2, 2), 0.97))  # identical values: a small range around them
    assert low < 0.97 < high and high - low == pytest.approx(2 * figures.EQUAL_VALUES_PAD)
    assert figures.data_range(np.full((2, 2), np.nan)) == (0.0, 1.0)
    figure = figures.heatmap_figure(values, x_coords=[0, 4, 8], y_coords=[0, 4])
    heat = figure.axes[0].images[-1]
    assert (heat.norm.vmin, heat.norm.vmax) == (0.93, 0.99)
    np.testing.assert_array_equal(np.ma.getmaskarray(heat.get_array()), np.isnan(values))
    assert "0.930 to 0.990" in figure.axes[1].get_ylabel()  # the colour bar states the range
    # 0.93 and 0.99 get the two ends of the map, not one colour
    colours = heat.to_rgba(np.array([0.93, 0.99]))
    assert np.abs(colours[0] - colours[1]).max() > 0.5
    _close(figure)


# ---- item 1: BREPS draws the evaluated box -----------------------------------------------------------

def _rectangles(axes) -> dict:
    from matplotlib.patches import Rectangle

    return {p.get_label(): p for p in axes.patches if isinstance(p, Rectangle)}


def _xyxy(rectangle) -> list[float]:
    return [rectangle.get_x(), rectangle.get_y(), rectangle.get_x() + rectangle.get_width(),
            rectangle.get_y() + rectangle.get_height()]


def test_breps_figure_draws_the_evaluated_box_and_the_clipped_copy_dashed():
    # DAVIS 089 with sam_demo: the reference's clipped copy is far from the evaluated box
    record = {"dataset": "DAVIS", "id": "089", "status": "ok", "payload": {
        "tight_box": [110.0, 60.0, 470.0, 320.0], "tight_iou": 0.8,
        "min": {"iou": 0.127, "box": [95.7, 42.3, 487.5, 336.3], "box_clipped": [95.7, 42.3, 255.0, 143.0]},
        "max": {"iou": 0.9, "box": [100.0, 50.0, 480.0, 330.0], "box_clipped": [100.0, 50.0, 480.0, 330.0]}}}
    image = np.zeros((345, 500, 3), np.uint8)
    figure = run_report.breps_box_figure(record, image, None, "minmax")
    drawn = _rectangles(figure.axes[0])
    assert set(drawn) == {"tight (IoU 80.0)", "min box (IoU 12.7)", "min box_clipped (not evaluated)",
                          "max box (IoU 90.0)"}  # max's copy equals its box: not drawn twice
    np.testing.assert_allclose(_xyxy(drawn["min box (IoU 12.7)"]), record["payload"]["min"]["box"], rtol=1e-6)
    np.testing.assert_allclose(_xyxy(drawn["max box (IoU 90.0)"]), record["payload"]["max"]["box"], rtol=1e-6)
    clipped = drawn["min box_clipped (not evaluated)"]
    np.testing.assert_allclose(_xyxy(clipped), record["payload"]["min"]["box_clipped"], rtol=1e-6)
    assert clipped.get_linestyle() == "--" and clipped.get_linewidth() < drawn["min box (IoU 12.7)"].get_linewidth()
    assert drawn["min box (IoU 12.7)"].get_linestyle() == "-"
    assert run_report.CLIPPED_NOTE in figure.axes[0].get_title()
    labels = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert "min box_clipped (not evaluated)" in labels
    _close(figure)


def test_breps_report_of_a_real_run_draws_each_record_s_evaluated_box(breps_run, folder):
    ok, _, _ = records_by_status(breps_run)
    for name, record in ok.items():
        image = load_source_image(record["payload"])
        gt = load_source_gt(record["payload"])
        np.testing.assert_array_equal(gt, _gt_of(folder, name))
        figure = run_report.breps_box_figure(record, image, gt, "minmax")
        axes = figure.axes[0]
        drawn = _rectangles(axes)
        for attack in ("min", "max"):
            part = record["payload"][attack]
            (label,) = [label for label in drawn if label.startswith(f"{attack} box (")]
            np.testing.assert_allclose(_xyxy(drawn[label]), part["box"], rtol=1e-5, atol=1e-4)
        assert len(_drawn_gt(axes)) == 1
        _close(figure)


def test_report_cli_on_a_real_breps_run_picks_the_worst_or_first_instances(breps_run, tmp_path):
    ok, failed, records = records_by_status(breps_run)
    assert len(failed) == 2
    by_min = sorted(ok, key=lambda name: ok[name]["payload"]["min"]["iou"])
    code, stdout, err = run_captured(["report", str(breps_run), "--out", str(tmp_path / "worst"),
                                      "--plot-instances", "worst", "2"])
    assert code == cli.EXIT_OK, err
    drawn = sorted(p.name for p in (tmp_path / "worst").glob("boxes_*.png"))
    assert drawn == sorted(f"boxes_toy_{name}.png" for name in by_min[:2])
    for path in (tmp_path / "worst").glob("*.png"):
        assert_png(path)
    assert "Instances drawn per dataset: worst 2 (the lowest IoU of MIN first)" in stdout
    first = [key[1] for key, record in records.items() if record["status"] == "ok"][0]
    code, _, err = run_captured(["report", str(breps_run), "--out", str(tmp_path / "first"),
                                 "--plot-instances", "first", "1"])
    assert code == cli.EXIT_OK, err
    assert [p.name for p in (tmp_path / "first").glob("boxes_*.png")] == [f"boxes_toy_{first}.png"]


# ---- item 2: the corner heatmap paints only sampled corners ------------------------------------------

def _png_pixels(figure) -> np.ndarray:
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=figures.DPI, format="png")
    buffer.seek(0)
    return np.asarray(Image.open(buffer).convert("RGB")).astype(np.int16)


def _cell_footprint(axes, cells: np.ndarray, shape) -> np.ndarray:
    """bool[png H, W]: the PNG pixels covered by the data cells (row, col) (1 px margin)."""
    footprint = np.zeros(shape, bool)
    for row, col in cells:
        (x0, y0), (x1, y1) = axes.transData.transform([(col - 0.5, row - 0.5), (col + 0.5, row + 0.5)])
        left, right = int(math.floor(min(x0, x1))) - 1, int(math.ceil(max(x0, x1))) + 1
        top, bottom = shape[0] - int(math.ceil(max(y0, y1))) - 1, shape[0] - int(math.floor(min(y0, y1))) + 1
        footprint[max(top, 0):bottom, max(left, 0):right] = True
    return footprint


def test_corner_heatmap_leaves_pixels_without_a_corner_unpainted(box_grid_run):
    ok, _, _ = records_by_status(box_grid_run)
    record = ok[GOOD[0]]
    maps = grid.load_heatmaps(box_grid_run, record["payload"])
    heat = np.asarray(maps["corner_heatmap"])
    sampled = grid.sampled_corners(record["payload"], maps, heat.shape)
    assert 0 < sampled.sum() < 0.25 * sampled.size
    assert (heat[~sampled] == 0).all() and (heat[sampled] > 0).all()  # the recorded map agrees
    figure = grid.corner_figure(record, maps, load_source_image(record["payload"]), load_source_gt(record["payload"]))
    axes = figure.axes[0]
    shown = axes.images[-1]
    np.testing.assert_array_equal(np.ma.getmaskarray(shown.get_array()), ~sampled)
    assert (shown.norm.vmin, shown.norm.vmax) == pytest.approx((heat[sampled].min(), heat[sampled].max()))
    painted = _png_pixels(figure)
    shown.set_data(np.ma.masked_all(heat.shape))  # the same figure with no heatmap cell painted
    bare = _png_pixels(figure)
    changed = np.abs(painted - bare).max(axis=-1) > 0
    footprint = _cell_footprint(axes, np.argwhere(sampled), changed.shape)
    assert changed.any()
    assert not (changed & ~footprint).any()  # outside the sampled corners the PNG shows the image alone
    _close(figure)


def test_box_grid_report_draws_the_worst_instances_with_fitted_scales(box_grid_run, tmp_path):
    ok, _, _ = records_by_status(box_grid_run)
    worst = min(ok, key=lambda name: ok[name]["payload"]["iou_min"])
    code, stdout, err = run_captured(["report", str(box_grid_run), "--out", str(tmp_path),
                                      "--plot-instances", "worst", "1"])
    assert code == cli.EXIT_OK, err
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"boxgrid_toy_{worst}.png", f"corners_toy_{worst}.png"]
    maps = grid.load_heatmaps(box_grid_run, ok[worst]["payload"])
    figure = grid.box_grid_figure(ok[worst], maps)
    heat = figure.axes[0].images[-1]
    assert (heat.norm.vmin, heat.norm.vmax) == pytest.approx((np.nanmin(maps["iou"]), np.nanmax(maps["iou"])))
    _close(figure)


# ---- item 3: the GT outline --------------------------------------------------------------------------

def test_gt_is_recorded_as_rle_and_outlined_where_the_mask_is(box_grid_run, folder):
    ok, _, _ = records_by_status(box_grid_run)
    record = ok[GOOD[1]]
    gt = load_source_gt(record["payload"])
    np.testing.assert_array_equal(gt, _gt_of(folder, GOOD[1]))
    figure = figures.prompts_figure(load_source_image(record["payload"]), gt=gt)
    (outline,) = _drawn_gt(figure.axes[0])
    vertices = np.concatenate([path.vertices for path in outline.get_paths()])
    rows, cols = np.nonzero(gt)
    assert vertices[:, 0].min() >= cols.min() - 1 and vertices[:, 0].max() <= cols.max() + 1
    assert vertices[:, 1].min() >= rows.min() - 1 and vertices[:, 1].max() <= rows.max() + 1
    assert "GT outline" in [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    _close(figure)
    maps = grid.load_heatmaps(box_grid_run, record["payload"])
    figure = grid.corner_figure(record, maps, load_source_image(record["payload"]), gt)
    assert len(_drawn_gt(figure.axes[0])) == 1
    _close(figure)


def test_mask_panels_outline_the_gt_in_every_panel():
    from jaxseg_robust.reports.mask_plots import MaskPanel, mask_panels_figure

    image = np.full((30, 40, 3), 90, np.uint8)
    gt = np.zeros((30, 40), bool)
    gt[8:20, 10:28] = True
    figure = mask_panels_figure(image, [MaskPanel("min", gt[::-1].copy(), "min"), MaskPanel("max", gt, "max")], gt=gt)
    assert [len(_drawn_gt(axes)) for axes in figure.axes] == [1, 1]
    assert "GT outline" in figure._suptitle.get_text()
    _close(figure)


# ---- item 5: which instances are drawn ---------------------------------------------------------------

def _tetris_record(name: str, min_curve, status: str = "ok") -> dict:
    part = lambda curve: {"iou": curve, "biou": curve, "clicks": [[1.0, 2.0]] * len(curve),  # noqa: E731
                          "is_positive": [True] * len(curve)}
    payload = {"min": part(min_curve), "baseline": part([0.9] * len(min_curve))} if status == "ok" else None
    return {"dataset": "d", "id": name, "status": status, "payload": payload, "error": None}


def test_worst_and_first_selection_per_protocol():
    from jaxseg_robust.reports.rclicks import rclicks_hardness
    from jaxseg_robust.reports.tetris import tetris_hardness

    records = [_tetris_record("a", [0.5, 0.9]), _tetris_record("b", [0.2, 0.3]), _tetris_record("gone", [], "failed"),
               _tetris_record("c", [None, None]), _tetris_record("d", [0.4, 0.6])]
    assert tetris_hardness(records[1], 2) == pytest.approx(0.25)
    worst = instances_to_plot(records, PlotInstances("worst", 2), lambda r: tetris_hardness(r, 2))
    assert [r["id"] for r in worst] == ["b", "d", "a", "c"]  # NaN last, the failed one never
    first = instances_to_plot(records, PlotInstances("first", 2), lambda r: tetris_hardness(r, 2))
    assert [r["id"] for r in first] == ["a", "b", "c", "d"]
    breps = {"status": "ok", "payload": {"tight_iou": 0.7, "min": {"iou": 0.3}, "max": {"iou": 0.8}}}
    assert run_report.breps_hardness(breps, "minmax") == 0.3
    assert run_report.breps_hardness({"status": "ok", "payload": {"tight_iou": 0.7, "iou": 0.9}}, "max") == 0.7
    assert run_report.breps_hardness({"status": "ok", "payload": {"tight_iou": 0.7, "iou": 0.2}}, "min") == 0.2
    assert grid.grid_hardness({"payload": {"iou_min": 0.61}}) == 0.61
    rclicks = {"payload": {"base_iou": [0.5, 0.9], "group_iou": [[0.2, 0.4], [0.6, None]]}}
    assert rclicks_hardness(rclicks) == pytest.approx(0.4)
    assert rclicks_hardness({"payload": {"base_iou": [0.5, 0.9], "group_iou": None}}) == pytest.approx(0.7)
    assert math.isnan(rclicks_hardness({"payload": {}}))


def test_plot_instances_parsing_and_errors(tmp_path, capsys):
    assert plot_selection.parse_plot_instances("first", "7") == PlotInstances("first", 7)
    assert str(plot_selection.DEFAULT_PLOT_INSTANCES) == "worst 4"
    for words, message in ((("best", "2"), "mode"), (("worst", "two"), "count"), (("worst", "-1"), "count")):
        with pytest.raises(ValueError, match=message):
            plot_selection.parse_plot_instances(*words)
    for command in ("report", "demo"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, str(tmp_path), "--plot-instances", "best", "2"] if command == "report"
                     else [command, "--out", str(tmp_path), "--plot-instances", "worst", "x"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert ("--plot-instances best 2" in err and "mode" in err) or "--plot-instances worst x" in err


def test_tetris_report_draws_the_hardest_instance_with_its_clicks_and_gt(folder, tmp_path):
    """A TETRIS run in the real record format (the engine, hand-made outputs): worst 1 draws the lowest MIN AuC."""
    from jaxseg_robust.data.instances import make_instance
    from jaxseg_robust.reports.sources import with_image_source
    from jaxseg_robust.attacks.clicks import RECORDS_FORMAT
    from jaxseg_robust.reports.tetris import click_figure
    from jaxseg_robust.runner.engine import run
    from jaxseg_robust.runner.rundir import RECORDS_FORMAT_KEY

    instances = [make_instance(name, np.array(read_image_rgb(folder / "images" / f"{name}.png")),
                               _gt_of(folder, name).astype(np.int8), dataset="toy",
                               source_paths=(str(folder / "images" / f"{name}.png"),
                                             str(folder / "masks" / f"{name}.png")))
                 for name in GOOD]
    min_auc = {"a0": 0.6, "a1": 0.3, "a2": 0.8}
    area_to_id = {int(_gt_of(folder, name).sum()): name for name in GOOD}  # the batch knows its slots by GT area
    assert len(area_to_id) == len(GOOD)

    def batch(padded):
        count = np.asarray(padded.gt).shape[0]
        ids = [area_to_id.get(int(area), "a0") for area in (np.asarray(padded.gt) == 1).sum(axis=(1, 2))]

        def part(level):
            return {"iou": np.array([[level[i], level[i]] for i in ids], np.float32),
                    "biou": np.full((count, 2), 0.5, np.float32),
                    "clicks_xy": np.tile(np.float32([[[30.0, 5.0], [8.0, 20.0]]]), (count, 1, 1)),
                    "is_positive": np.tile(np.array([[True, False]]), (count, 1))}

        return {"min": part(min_auc), "baseline": part({i: 0.9 for i in GOOD}), "max": part({i: 0.95 for i in GOOD})}

    out = tmp_path / "tetris"
    config = {"protocol": "tetris", "mode": "minmax", RECORDS_FORMAT_KEY: RECORDS_FORMAT}
    summary = run(instances, batch, out, 4, config=config, progress="none", finalize=with_image_source())
    assert summary.ok == 3
    paths = run_report.write_run_report(out, tmp_path / "report", plot_instances=PlotInstances("worst", 1))
    assert sorted(name for name in paths if name.startswith("clicks_")) == ["clicks_toy_a1"]
    assert "Instances drawn: worst 1" in paths["report"].read_text()
    record = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    figure = click_figure(record, ("min", "baseline", "max"), load_source_image(record["payload"]),
                          load_source_gt(record["payload"]))
    axes = figure.axes[0]
    offsets = axes.collections[-1].get_offsets()  # the last trajectory's clicks, drawn at (x, y)
    np.testing.assert_array_equal(np.asarray(offsets), [[30.0, 5.0], [8.0, 20.0]])
    assert len(_drawn_gt(axes)) == 1
    _close(figure)


def test_rclicks_report_draws_the_hardest_instance_s_iou_per_round(folder, tmp_path):
    from jaxseg_robust.data.instances import make_instance
    from jaxseg_robust.reports.rclicks import instance_curves
    from jaxseg_robust.runner.engine import run

    instances = [make_instance(name, np.array(read_image_rgb(folder / "images" / f"{name}.png")),
                               _gt_of(folder, name).astype(np.int8), dataset="toy") for name in GOOD]
    level = {int(_gt_of(folder, name).sum()): value for name, value in zip(GOOD, (0.7, 0.9, 0.4))}

    def batch(padded):
        areas = (np.asarray(padded.gt) == 1).sum(axis=(1, 2))
        scale = np.array([level.get(int(area), 0.5) for area in areas], np.float32)
        curve = np.linspace(0.5, 1.0, 4, dtype=np.float32)
        groups = np.stack([curve * 0.8, curve, curve * 0.9])
        return {"base_iou": scale[:, None] * curve, "group_iou": scale[:, None, None] * groups}

    out = tmp_path / "rclicks"
    summary = run(instances, batch, out, 4, config={"protocol": "rclicks", "settings": {"num_rounds": 4}},
                  progress="none")
    assert summary.ok == 3
    paths = run_report.write_run_report(out, tmp_path / "report", plot_instances=PlotInstances("worst", 1))
    assert sorted(name for name in paths if name.startswith("curves_")) == ["curves_toy_a2"]
    assert_png(paths["curves_toy_a2"])
    assert "worst 1 (the lowest mean IoU of the simulated users first)" in paths["report"].read_text()
    record = json.loads((out / "records.jsonl").read_text().splitlines()[2])
    curves = instance_curves(record["payload"])
    groups = np.array(record["payload"]["group_iou"], np.float64)
    np.testing.assert_allclose(curves["worst group"], groups.min(axis=0))
    np.testing.assert_allclose(curves["mean of groups"], groups.mean(axis=0))
    np.testing.assert_allclose(curves["best group"], groups.max(axis=0))
    np.testing.assert_allclose(curves["baseline"], record["payload"]["base_iou"])


def test_report_lines_say_what_each_figure_shows(tmp_path):
    lines = figures.figure_links("a0", {"clicks_toy_a0": tmp_path / "clicks_toy_a0.png",
                                        "masks_toy_a0": tmp_path / "masks_toy_a0.png",
                                        "corners_toy_a0": tmp_path / "corners_toy_a0.png"})
    assert lines == ["![a0](clicks_toy_a0.png)", "", "![a0 predicted masks](masks_toy_a0.png)", "",
                     "![a0 corners](corners_toy_a0.png)", ""]
