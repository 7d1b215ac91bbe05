"""`RClicksSpec` through `jaxseg_robust.runs.evaluate` from Python: the same records and manifest config as the
`jaxseg-robust rclicks` command of the same settings; errors name the spec's fields; a failed figure is a
warning beside the table."""

from __future__ import annotations

import json

import pytest

from jaxseg_robust import runs
from jaxseg_robust.runs.rclicks import RClicksPlan, RClicksSpec

from cli_helpers import folder_flags, make_folder, run_captured

CLICKS_CSV = ("dataset,image_stem,object_stem,model_type,click_type,full_stem,device,x,y,w,h\n"
              "toy,a0,,,first,a0,pc,15,12,48,40\n"
              "toy,a0,,,first,a0,mobile,20,14,48,40\n")
SETTINGS = {"n_clicks": 3, "groups": 2, "seed": 7}


def _records(run_dir) -> dict:
    """(dataset, id) -> the record's status, payload and error (not its traceback, which names source paths)."""
    by_key = {}
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_key[(record["dataset"], record["id"])] = {key: record.get(key) for key in ("status", "payload", "error")}
    return by_key


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    """The CLI run and the `evaluate` run of the same settings on the same folder (3 good, 2 bad pairs)."""
    root = tmp_path_factory.mktemp("rclicks_spec")
    folder = make_folder(root)
    clicks_csv = root / "clicks.csv"
    clicks_csv.write_text(CLICKS_CSV)
    cli_dir, spec_dir = root / "cli", root / "spec"
    code, _, err = run_captured(["rclicks", "--model", "sam_tiny", "--clickability", "dt", *folder_flags(folder),
                                 "--n-clicks", "3", "--groups", "2", "--seed", "7", "--clicks-csv", str(clicks_csv),
                                 "--out", str(cli_dir), "--progress", "none"])
    assert code == 1, err  # the two bad pairs are recorded as failed
    lines = []
    spec = runs.RunSpec(model=runs.ModelSpec("sam_tiny"),
                        data=runs.DataSpec(folders=((str(folder / "images"), str(folder / "masks")),)),
                        engine=runs.EngineSpec(progress="none"),
                        protocol=RClicksSpec(clickability="dt", clicks_csv=str(clicks_csv), **SETTINGS))
    result = runs.evaluate(spec, spec_dir, say=lines.append)
    return cli_dir, spec_dir, result, lines


def test_evaluate_writes_the_records_and_config_of_the_cli(both_runs):
    cli_dir, spec_dir, result, lines = both_runs
    assert result.exit_code == 1 and "loading sam_tiny ..." in lines
    cli_records, spec_records = _records(cli_dir), _records(spec_dir)
    assert len(spec_records) == 5 and sum(r["status"] == "ok" for r in spec_records.values()) == 3
    assert spec_records == cli_records
    assert spec_records[("toy", "a0")]["payload"]["n_user_clicks"] == 2
    cli_config = json.loads((cli_dir / "manifest.json").read_text())["config"]
    spec_config = json.loads((spec_dir / "manifest.json").read_text())["config"]
    assert spec_config == cli_config
    assert spec_config["model_source"] == "random:0" and spec_config["settings"]["seed"] == 7
    assert spec_config["clickability_source"] == "dt" and spec_config["settings"]["user_slots"] == 8


def test_evaluate_writes_the_table_and_the_groups_figure(both_runs):
    cli_dir, spec_dir, result, _ = both_runs
    header = result.tables.csv.splitlines()[0].split(",")
    assert header[:3] == ["dataset", "instances", "noc_sample"] and "nsr_at_3" in header
    row = dict(zip(header, result.tables.csv.splitlines()[1].split(",")))
    assert row["dataset"] == "toy" and row["instances"] == "3" and row["n_clicks"] == "3"
    assert "NoC3@90 Sample" in result.tables.markdown
    assert spec_dir / "groups_toy_a0.png" in result.files and (spec_dir / "groups_toy_a0.png").is_file()
    assert (spec_dir / "groups_toy_a0.png").read_bytes() == (cli_dir / "groups_toy_a0.png").read_bytes()


def test_a_failed_figure_is_a_warning_beside_the_table(both_runs):
    from jaxseg_robust.clicksim.evaluation import RClicksConfig  # noqa: PLC0415

    _, spec_dir, result, _ = both_runs
    spec = RClicksSpec(clickability="dt", **SETTINGS)
    instances = runs.load_instances(runs.DataSpec(datasets=(str(spec_dir.parent / "toy"),), limit=1))
    plan = RClicksPlan(instances, None, {}, "sha256:0", click_model=None, settings=RClicksConfig(num_groups=2))
    said = []
    tables = spec.summarize(spec_dir, plan, said.append)
    assert tables.files == () and tables.markdown == result.tables.markdown.split("\n\n| dataset | timed")[0]
    assert said == ["warning: clicking-groups figure failed: AttributeError: 'NoneType' object has no "
                    "attribute 'model'"]


@pytest.mark.parametrize("settings, field, message", [
    ({"groups": 3}, "groups", "groups must be even"),
    ({"thresh": 1.0}, "thresh", "thresh must be in (0, 1); got 1.0"),
    ({"run_base": False, "groups": 0}, "run_base", "leaves nothing to evaluate"),
])
def test_bad_settings_name_the_field_before_anything_is_read(tmp_path, settings, field, message):
    spec = runs.RunSpec(model=runs.ModelSpec("no_such_model"), data=runs.DataSpec(datasets=(str(tmp_path / "none"),)),
                        protocol=RClicksSpec(clickability="dt", **settings))
    with pytest.raises(runs.RunError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        runs.evaluate(spec, tmp_path / "run", say=lambda line: None)
    assert f"{{{field}}}" in error.value.template
    assert not (tmp_path / "run").exists()


def test_user_clicks_are_checked_before_the_model_is_loaded(tmp_path):
    folder = make_folder(tmp_path, bad=False)
    clicks_csv = tmp_path / "clicks.csv"
    clicks_csv.write_text(CLICKS_CSV.replace("toy,a0,,,first,a0", "GrabCut,other,,,first,other"))
    spec = runs.RunSpec(model=runs.ModelSpec("no_such_model"),
                        data=runs.DataSpec(folders=((str(folder / "images"), str(folder / "masks")),)),
                        protocol=RClicksSpec(clickability="no_such_click_model", clicks_csv=str(clicks_csv)))
    said = []
    with pytest.raises(runs.RunError, match="no first-round clicks match the instances") as error:
        runs.evaluate(spec, tmp_path / "run", say=said.append)
    assert error.value.template.startswith("{clicks_csv} ") and not any(line.startswith("loading") for line in said)
