"""`jaxseg-robust demo`: the model choice (never a silent fallback), the sub-runs and the combined report."""

from __future__ import annotations

import pathlib

import pytest

from jaxseg_robust import cli
from jaxseg_robust.commands import demo
from jaxseg_robust.models import zoo

from cli_helpers import assert_png, run_cli


def test_missing_demo_model_is_an_error_naming_the_flag(tmp_path, capsys, monkeypatch):
    def not_installed(name):
        raise FileNotFoundError(f"model '{name}' is known but its weights are not in /nowhere")

    monkeypatch.setattr(zoo, "resolve", not_installed)
    code, _, err = run_cli(["demo", "--out", str(tmp_path / "demo")], capsys)
    assert code == cli.EXIT_FAILURE
    assert "--untrained-model" in err and zoo.DEFAULT_MODEL in err
    assert not (tmp_path / "demo").exists()  # nothing ran
    assert demo.demo_model(untrained=True) == demo.UNTRAINED_MODEL


def test_sub_run_argv_parses_and_uses_the_size(tmp_path):
    parser = cli.build_parser()
    size = demo.SIZES["small"]
    data, out = tmp_path / "synthetic", tmp_path / "out"
    for protocol in demo.PROTOCOLS:
        args = parser.parse_args(demo.sub_run_argv(protocol, "sam_tiny", data, out, size, "none"))
        assert args.out == str(out) and args.folder == [[str(data / "images"), str(data / "masks")]]
    tetris = parser.parse_args(demo.sub_run_argv("tetris", "sam_tiny", data, out, size, "none"))
    assert (tetris.n_clicks, tetris.n_opt_steps, tetris.baseline_clicks) == (5, 11, 10)
    assert tetris.lr_mult == demo.DEMO_TETRIS_LR_MULT
    breps = parser.parse_args(demo.sub_run_argv("breps", "sam_tiny", data, out, size, "none"))
    assert (breps.n_opt_steps, breps.lr_mult) == (size.box_steps, demo.DEMO_BREPS_LR_MULT)
    box = parser.parse_args(demo.sub_run_argv("box_grid", "sam_tiny", data, out, size, "none"))
    assert box.kind == "box" and box.stride == size.box_stride
    with pytest.raises(ValueError, match="protocol"):
        demo.sub_run_argv("nonsense", "sam_tiny", data, out, size, "none")


@pytest.mark.slow
def test_tiny_demo_writes_every_sub_run_and_one_report(tmp_path, capsys):
    out = tmp_path / "demo"
    code, stdout, err = run_cli(["demo", "--out", str(out), "--size", "tiny", "--untrained-model",
                                 "--progress", "none"], capsys)
    assert code == cli.EXIT_OK, err
    for protocol in demo.PROTOCOLS:
        assert (out / protocol / "manifest.json").is_file() and (out / protocol / "summary.md").is_file()
    report = out / "report"
    text = (report / "report.md").read_text()
    assert "UNTRAINED" in text and "`sam_tiny`" in text
    for heading in ("## tetris (tetris)", "## breps (breps)", "## click_grid (grid)", "## box_grid (grid)"):
        assert heading in text
    assert text.index("## tetris") < text.index("## breps") < text.index("## click_grid")
    images = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(images) >= 2 * 4  # per protocol at least one plot per instance
    for relative in images:
        assert_png(report / pathlib.Path(relative))
    assert any("boxes_synthetic" in name for name in images)  # the BREPS run recorded its image sources
    assert (report / "tetris" / "tetris.csv").is_file() and (report / "breps" / "breps.csv").is_file()
    # issue 12: NoC@80, seconds per click, the per-click CSV and the predicted masks of both attacks
    assert "NoC@80" in text and "s/click" in text and (report / "tetris" / "ious.csv").is_file()
    assert any(name.startswith("tetris/masks_synthetic") for name in images)
    assert any(name.startswith("breps/masks_synthetic") for name in images)
    assert "loading sam_tiny ..." in err and "compiling the TETRIS program" in err
    # rerunning resumes every sub-run (nothing recomputed)
    code, again, err = run_cli(["demo", "--out", str(out), "--size", "tiny", "--untrained-model",
                                "--progress", "none"], capsys)
    assert code == cli.EXIT_OK, err
    assert again.count("0 ok, 0 failed, 2 skipped") == 4


def test_compile_line_sums_the_sub_runs_compile_events(tmp_path):
    from jaxseg_robust.reports.artifacts import append_compile_events  # noqa: PLC0415
    from jaxseg_robust.runner.program import CompileEvent  # noqa: PLC0415

    for protocol in demo.PROTOCOLS:
        (tmp_path / protocol).mkdir()
    append_compile_events(tmp_path / "tetris", [CompileEvent("TETRIS program", (64, 64), 4, 20.0),
                                                CompileEvent("TETRIS program", (64, 128), 4, 1.25, from_cache=True)])
    append_compile_events(tmp_path / "box_grid", [CompileEvent("box grid program", (64, 64), 1, 3.0)])
    assert demo.compile_line(tmp_path) == ("compile: 24.2 s for 3 bucket program(s), 1 from the cache (tetris "
                                           "21.2 s, breps 0.0 s, click_grid 0.0 s, box_grid 3.0 s)")


def test_help_says_how_to_pick_the_device(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "JAX_PLATFORMS=cpu|cuda|tpu" in capsys.readouterr().out


def test_frame_matched_lr_mult_restores_the_papers_step_fraction():
    # the papers' setting maps to itself; a 4x smaller frame or a 10x smaller image rescale the multiplier
    assert demo.frame_matched_lr_mult(9.0, (480, 640), 1024) == pytest.approx(9.0)
    assert demo.frame_matched_lr_mult(1.0, (480, 640), 256) == pytest.approx(0.25)
    assert demo.frame_matched_lr_mult(1.0, (48, 64), 1024) == pytest.approx(10.0)
    # TETRIS: lr_mult 5 sqrt(H^2 + W^2) / (400 sqrt 2) resized-frame px, as a fraction of the frame
    paper = 1.0 * 5 * 800 / (400 * 2 ** 0.5) / 1024
    ours = demo.DEMO_TETRIS_LR_MULT * 5 * 80 / (400 * 2 ** 0.5) / 256
    assert ours == pytest.approx(paper, rel=0.01)


def _ok_payloads(run_dir: pathlib.Path) -> dict:
    import json  # noqa: PLC0415

    payloads = {}
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["status"] == "ok":
            payloads[record["id"]] = record["payload"]
    return payloads


def test_tiny_demo_with_the_default_model_moves_every_attack(tmp_path, capsys):
    """The README's main job at CI size: the shipped model, every sub-run, a report, attacks that bite."""
    out = tmp_path / "demo"
    code, stdout, err = run_cli(["demo", "--out", str(out), "--size", "tiny", "--progress", "none"], capsys)
    assert code == cli.EXIT_OK, err
    size = demo.SIZES["tiny"]
    text = (out / "report" / "report.md").read_text()
    assert f"`{zoo.DEFAULT_MODEL}`" in text and "UNTRAINED" not in text
    for table in ("IoU-AuC@2 Min", "IoU-Tight@BBox", "Click grid", "Box grid", "NoC@85"):
        assert table in text
    compiled = demo.compile_line(out)  # issue 30: the compile total of the four sub-runs, printed and in the report
    assert compiled.startswith("compile: ") and "for 4 bucket program(s), 0 from the cache (tetris " in compiled
    assert compiled in stdout and f"Total {compiled}" in text
    images = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(images) >= 1 + 3 * size.instances + size.instances  # curves, clicks, boxes, two heatmaps each
    for relative in images:
        assert_png(out / "report" / pathlib.Path(relative))
    # BREPS: MIN <= tight <= MAX per instance (the acceptance rule), and the attack moves the box somewhere
    breps = _ok_payloads(out / "breps")
    assert len(breps) == size.instances
    spread = 0.0
    for payload in breps.values():
        assert payload["min"]["selection_iou"] <= payload["tight_selection_iou"] <= payload["max"]["selection_iou"]
        spread = max(spread, payload["max"]["selection_iou"] - payload["min"]["selection_iou"])
    assert spread > 0.01
    # TETRIS: click 1 brackets the baseline's click 1; some click moved off the baseline
    tetris = _ok_payloads(out / "tetris")
    assert len(tetris) == size.instances
    moved = 0
    for payload in tetris.values():
        assert payload["min"]["selection_iou"][0] <= payload["baseline"]["selection_iou"][0] \
            <= payload["max"]["selection_iou"][0]
        moved += sum(step > 0 for mode in ("min", "max") for step in payload[mode]["best_step"])
    assert moved > 0
