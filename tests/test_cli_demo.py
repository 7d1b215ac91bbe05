"""`jaxseg-robust demo`: the model choice (never a silent fallback), the sub-runs and the combined report."""

from __future__ import annotations

import pathlib

import pytest

from jaxseg_robust import cli
from jaxseg_robust.commands import demo
from jaxseg_robust.models import zoo

from test_cli_tetris import assert_png, run_cli


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
    assert (tetris.n_clicks, tetris.n_opt_steps, tetris.baseline_clicks) == (5, 5, 10)
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
    # rerunning resumes every sub-run (nothing recomputed)
    code, again, err = run_cli(["demo", "--out", str(out), "--size", "tiny", "--untrained-model",
                                "--progress", "none"], capsys)
    assert code == cli.EXIT_OK, err
    assert again.count("0 ok, 0 failed, 2 skipped") == 4
