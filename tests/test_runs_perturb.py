"""`jaxseg_robust.runs.PerturbSpec` run from Python through `runs.evaluate`, against the CLI run of the same
settings (a tiny random two-class DeepLabV3 on the CLI tests' generated folder; two attacks, 2-step budgets)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import GOOD, make_folder, run_captured
from jaxseg_robust.commands.perturb import FLAG_NAMES
from jaxseg_robust.models.dense import DeepLabV3Dense
from jaxseg_robust.runner.records import read_run_records
from jaxseg_robust.runs import DataSpec, EngineSpec, ModelSpec, RunError, RunSpec, evaluate
from jaxseg_robust.runs.perturb import PerturbSpec
from test_cli_perturb import BINARY_DEEPLAB, save_model

SETTINGS = {"attacks": ("padam_ce", "dag_0.003"), "epsilon": 8 / 255, "epsilon_text": "8/255", "examples": 1,
            "padam_steps": 2, "dag_iterations": 2}


@pytest.fixture(scope="module")
def folder_and_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs_perturb")
    return make_folder(root, bad=False), save_model(root / "tiny_deeplab", DeepLabV3Dense(BINARY_DEEPLAB), "deeplabv3")


def _spec(folder, model, **protocol) -> RunSpec:
    return RunSpec(model=ModelSpec(str(model)),
                   protocol=PerturbSpec(**{**SETTINGS, **protocol}),
                   data=DataSpec(folders=((str(folder / "images"), str(folder / "masks")),)),
                   engine=EngineSpec(progress="none"))


def _payloads(run_dir) -> dict:
    """(dataset, id) -> (status, payload) of every record (the payloads hold no timings)."""
    return {(r["dataset"], r["id"]): (r["status"], r["payload"]) for r in read_run_records(run_dir)}


def test_evaluate_writes_the_records_and_manifest_of_the_cli_run(folder_and_model, tmp_path):
    folder, model = folder_and_model
    said = []
    result = evaluate(_spec(folder, model), tmp_path / "py", say=said.append)
    assert result.exit_code == 0 and result.summary.exit_code == 0
    assert result.tables.csv is None and result.tables.markdown.startswith("perturb: ")
    assert any(line.startswith("perturb: 3 instances, attacks padam_ce, dag_0.003, ε = 8/255") for line in said)
    code, _, _ = run_captured(["perturb", "--model", str(model), "--folder", str(folder / "images"),
                               str(folder / "masks"), "--attacks", "padam-ce,dag-0.003", "--eps", "8/255",
                               "--padam-steps", "2", "--dag-iterations", "2", "--examples", "1",
                               "--out", str(tmp_path / "cli"), "--progress", "none"])
    assert code == 0
    python, cli = _payloads(tmp_path / "py"), _payloads(tmp_path / "cli")
    assert sorted(key[1] for key in python) == list(GOOD)
    assert python == cli
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("py", "cli")]
    assert manifests[0]["config"] == manifests[1]["config"]
    assert list(manifests[0]["config"]) == list(manifests[1]["config"])  # the same order too
    assert manifests[0]["engine"]["frame_policy"] == manifests[1]["engine"]["frame_policy"]
    assert (tmp_path / "py" / "summary.csv").is_file() and (tmp_path / "py" / "report" / "report.md").is_file()


def test_a_bad_value_is_a_run_error_naming_the_field_before_anything_is_written(folder_and_model, tmp_path):
    folder, model = folder_and_model
    with pytest.raises(RunError) as error:
        evaluate(_spec(folder, model, sea_iterations=3), tmp_path / "run", say=lambda line: None)
    assert error.value.template.startswith("{sea_iterations} must be >= 4 with the progressive schedule")
    assert error.value.render(FLAG_NAMES).startswith("--sea-iterations must be >= 4")
    assert not (tmp_path / "run").exists()


def test_class_counts_that_do_not_fit_are_run_errors(folder_and_model, tmp_path):
    folder, model = folder_and_model
    with pytest.raises(RunError, match="alma-prox needs a model with >= 3 classes") as error:
        evaluate(_spec(folder, model, attacks=("alma_prox",)), tmp_path / "run", say=lambda line: None)
    assert error.value.template.endswith("drop it from {attacks}")
    with pytest.raises(RunError) as error:
        evaluate(_spec(folder, model, dataset="voc"), tmp_path / "run", say=lambda line: None)
    assert error.value.render(FLAG_NAMES) == ("give either --dataset (voc, cityscapes) or --datasets / --folder, "
                                              "not both")


def test_attack_groups_are_refused_where_candidate_names_are_due():
    with pytest.raises(RunError) as error:
        PerturbSpec(attacks=("sea", "dag_0.003")).check()
    assert error.value.template.startswith("{attacks} must be candidate names out of padam_ce, padam_cos")
    PerturbSpec(attacks=("sea_mce", "dag_0.003")).check()
