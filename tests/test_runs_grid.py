"""`GridSpec` run from Python (`jaxseg_robust.runs.evaluate`): the same records and heatmap files as
`jaxseg-robust grid`, and errors naming the spec's fields."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import folder_flags, make_folder, run_captured
from jaxseg_robust import cli
from jaxseg_robust.runner.records import latest_records, read_run_records
from jaxseg_robust.runs import DataSpec, EngineSpec, ModelSpec, RunError, RunSpec, evaluate
from jaxseg_robust.runs.grid import GridSpec

STRIDE, CHUNK = 8, 32


def folder_data(folder) -> DataSpec:
    return DataSpec(folders=((str(folder / "images"), str(folder / "masks")),))


def test_evaluate_writes_the_records_and_heatmaps_of_the_command_line(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    cli_out, python_out = tmp_path / "cli", tmp_path / "python"
    code, _, err = run_captured(["grid", "--kind", "click", "--model", "sam_tiny", *folder_flags(folder),
                                 "--out", str(cli_out), "--stride", str(STRIDE), "--chunk-size", str(CHUNK),
                                 "--progress", "none"])
    assert code == cli.EXIT_OK, err
    said = []
    spec = RunSpec(model=ModelSpec("sam_tiny"), protocol=GridSpec(kind="click", stride=STRIDE, chunk_size=CHUNK),
                   data=folder_data(folder), engine=EngineSpec(progress="none"))
    result = evaluate(spec, python_out, say=said.append)
    assert result.exit_code == cli.EXIT_OK
    assert "loading sam_tiny ..." in said  # start-up lines go to ``say``
    cli_records, python_records = (latest_records(read_run_records(out)) for out in (cli_out, python_out))
    assert len(python_records) == 3 and all(r["status"] == "ok" for r in python_records.values())
    assert python_records == cli_records  # payloads (heatmap paths included); records hold no timings
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (cli_out, python_out)]
    assert manifests[0]["config"] == manifests[1]["config"]
    assert manifests[1]["config"]["multimask_output"] is True  # the click grid's default
    for record in python_records.values():
        relative = record["payload"]["heatmaps"]
        with np.load(python_out / relative) as ours, np.load(cli_out / relative) as theirs:
            assert sorted(ours) == sorted(theirs) and ours["iou"].shape == (5, 6)  # ceil(40/8) x ceil(48/8)
            for name in ours:
                np.testing.assert_array_equal(ours[name], theirs[name])


@pytest.mark.parametrize("protocol, template", [
    (GridSpec(kind="box", region="object"), "{region} applies to {kind} click"),
    (GridSpec(kind="click", corner_heatmap=False), "{corner_heatmap} applies to {kind} box"),
    (GridSpec(kind="click", thresh=1.5), "{thresh} must be in [0, 1); got 1.5"),
    (GridSpec(kind="click", stride=48), "{stride} 48 leaves a single click position in every image (the largest "
                                        "is 40x48): min and max would be that one prompt; use {stride} 47 or less"),
])
def test_a_bad_setting_is_a_run_error_naming_the_field(tmp_path, protocol, template):
    spec = RunSpec(model=ModelSpec("sam_tiny"), protocol=protocol, data=folder_data(make_folder(tmp_path)))
    with pytest.raises(RunError) as caught:
        evaluate(spec, tmp_path / "run", say=lambda line: None)
    assert caught.value.template == template
    assert not (tmp_path / "run").exists()  # refused before the model was loaded or anything written
