"""`BrepsSpec` run from Python (`jaxseg_robust.runs.evaluate`): the same records as `jaxseg-robust breps`,
user mode's plan of the instances with boxes, and errors naming the spec's fields."""

from __future__ import annotations

import json

import pytest

from cli_helpers import folder_flags, make_folder, run_captured
from jaxseg_robust import cli
from jaxseg_robust.runner.records import latest_records, read_run_records
from jaxseg_robust.runs import DataSpec, EngineSpec, ModelSpec, RunError, RunSpec, evaluate, load_model
from jaxseg_robust.runs.breps import BrepsSpec

STEPS, LR_MULT = 3, 60.0  # tiny images: move the box by a few pixels per step


def folder_data(folder) -> DataSpec:
    return DataSpec(folders=((str(folder / "images"), str(folder / "masks")),))


def test_evaluate_writes_the_records_of_the_command_line(tmp_path):
    folder = make_folder(tmp_path, bad=True)  # 3 good pairs, 2 failing ones
    cli_out, python_out = tmp_path / "cli", tmp_path / "python"
    code, _, err = run_captured(["breps", "--model", "sam_tiny", *folder_flags(folder), "--out", str(cli_out),
                                 "--n_opt_steps", str(STEPS), "--lr_mult", str(LR_MULT), "--batch-size", "2",
                                 "--progress", "none"])
    assert code == cli.EXIT_PARTIAL, err
    said = []
    spec = RunSpec(model=ModelSpec("sam_tiny"), protocol=BrepsSpec(n_opt_steps=STEPS, lr_mult=LR_MULT),
                   data=folder_data(folder), engine=EngineSpec(batch_size=2, progress="none"))
    result = evaluate(spec, python_out, say=said.append)
    assert result.exit_code == cli.EXIT_PARTIAL
    assert "loading sam_tiny ..." in said
    cli_records, python_records = (latest_records(read_run_records(out)) for out in (cli_out, python_out))
    assert len(python_records) == 5 and sum(r["status"] == "ok" for r in python_records.values()) == 3
    assert python_records == cli_records  # payloads, statuses and errors (records hold no timings)
    manifests = [json.loads((out / "manifest.json").read_text()) for out in (cli_out, python_out)]
    assert manifests[0]["config"] == manifests[1]["config"]
    assert manifests[1]["config"]["thresh"] == 0.5  # the SAM family's threshold, resolved
    masks = sorted(path.relative_to(python_out) for path in (python_out / "masks").rglob("*.png"))
    assert masks == sorted(path.relative_to(cli_out) for path in (cli_out / "masks").rglob("*.png"))
    assert len(masks) == 6  # the MIN and the MAX mask of each good instance
    assert (python_out / "summary.md").read_text().startswith("| dataset |")


def test_user_mode_plans_only_the_instances_with_boxes(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("image_id,x1,y1,x2,y2,user\na0,10,8,38,32,u1\na0,12,6,36,30,u2\nzz,1,1,5,5,u1\n")
    spec = BrepsSpec(mode="user", user_boxes=str(boxes))
    spec.check()
    said = []
    instances = spec.load_instances(folder_data(folder), said.append)
    plan = spec.plan(load_model(ModelSpec("sam_tiny")), instances, tmp_path / "run", said.append)
    assert [instance.id for instance in instances] == ["a0", "a1", "a2"]
    assert [instance.id for instance in plan.instances] == ["a0"]
    assert said == ["warning: 1 user box(es) of 1 image id(s) that are not instances were ignored: zz",
                    "note: 2 instance(s) have no user box and are not evaluated"]
    assert plan.config["mode"] == "user" and plan.config["user_boxes"].startswith("sha256:")
    assert "n_opt_steps" not in plan.config  # only the mode's settings are recorded


@pytest.mark.parametrize("protocol, template", [
    (BrepsSpec(mode="user"), "{mode} user needs exactly one of {user_boxes} CSV or {user_box_masks} DIR"),
    (BrepsSpec(user_boxes="boxes.csv"), "{user_boxes} needs {mode} user (got {mode} minmax)"),
    (BrepsSpec(lambda_mult=-1.0), "{lr_mult} and {lambda_mult} must be >= 0; got 9.0, -1.0"),
    (BrepsSpec(jitter_pow=0.0), "{jitter_pow} must be > 0; got 0.0"),
    (BrepsSpec(mode="median"), "{mode} must be one of minmax, min, max, tight, jitter, user; got 'median'"),
])
def test_a_bad_setting_is_a_run_error_naming_the_field(tmp_path, protocol, template):
    spec = RunSpec(model=ModelSpec("sam_tiny"), protocol=protocol, data=folder_data(make_folder(tmp_path)))
    with pytest.raises(RunError) as caught:
        evaluate(spec, tmp_path / "run", say=lambda line: None)
    assert caught.value.template == template
    assert not (tmp_path / "run").exists()  # refused before anything was loaded or written
