"""Each family's rules in the authors' protocol code come from its segmenter (jaxseg_robust.models.base).

- TETRIS: the step size from the size the authors' attack renders the click
  on (SAM family: the evaluation frame; click-map models: the network input),
  the mask-input reset of the SAM-family wrappers only, and the click-map
  models' clicks rendered differentiably (soft disks) so the attack's gradient
  reaches the network (docs/protocols/tetris.md).
- RClicks: the reset rule of the SAM-family wrappers only; SAM 2 decoded with
  ``multimask_output=False`` (the official dynamic fallback) as the RClicks SAM 2
  wrapper does (docs/protocols/rclicks.md).
- Box protocols refuse click-only families with exit code 2, naming the model.
- The CLI runs ``tetris``, ``grid``, ``rclicks`` on RITM and SAM 2 model directories and
  ``breps`` on SAM 2 (tiny random models, one or two tiny instances, few steps).
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cli_helpers import run_captured
from jaxseg_robust.attacks.clicks import make_click_batch_fn, tetris_learning_rate
from jaxseg_robust.clicksim.evaluation import RClicksConfig, family_settings
from jaxseg_robust.data.buckets import pad_batch
from jaxseg_robust.data.instances import make_instance
from jaxseg_robust.models import store, zoo
from jaxseg_robust.models.clickmap.isegm import CascadeConfig
from jaxseg_robust.models.base import (
    Transform,
    click_step_hw,
    differentiable,
    evaluation_multimask,
    family_rules,
    resets_feedback,
    takes_boxes,
    with_predictor,
)
from jaxseg_robust.models.sam.segmenter import SamSegmenter

HEIGHT, WIDTH = 24, 28


def _transform(original, resized):
    return Transform(original_hw=jnp.asarray(original, jnp.int32), resized_hw=jnp.asarray(resized, jnp.int32),
                     scale_xy=jnp.asarray([resized[1] / original[1], resized[0] / original[0]], jnp.float32),
                     frame_hw=tuple(original))


@pytest.fixture(scope="module")
def ritm():
    return zoo.init("ritm_tiny", jax.random.key(0))


def test_rules_of_each_family(ritm):
    """The contract's optional members and their SAM-family fallbacks."""
    sam, sam2, clickmap = SamSegmenter(zoo.get("sam_tiny").config), zoo.segmenter("sam2_test"), ritm.segmenter
    transform = _transform((480, 640), (400, 400))  # a click-map network input of 400 x 400 (RITM's fixed400)
    np.testing.assert_array_equal(click_step_hw(clickmap, transform), [400, 400])
    np.testing.assert_array_equal(click_step_hw(sam, transform), [480, 640])
    np.testing.assert_array_equal(click_step_hw(sam2, transform), [480, 640])
    step = click_step_hw(clickmap, transform)
    assert float(tetris_learning_rate(step[0], step[1])) == pytest.approx(5.0)  # 5 sqrt(2) 400 / (400 sqrt 2)
    assert float(tetris_learning_rate(480, 640)) == pytest.approx(5 * 800 / (400 * math.sqrt(2)), rel=1e-6)
    assert (resets_feedback(sam), resets_feedback(sam2), resets_feedback(clickmap)) == (True, True, False)
    assert (evaluation_multimask(sam), evaluation_multimask(sam2), evaluation_multimask(clickmap)) == (
        True, False, True)
    assert (takes_boxes(sam), takes_boxes(sam2), takes_boxes(clickmap)) == (True, True, False)
    assert differentiable(sam) is sam and differentiable(sam2) is sam2
    assert clickmap.click_encoding == "hard" and differentiable(clickmap).click_encoding == "soft"
    assert differentiable(differentiable(clickmap)) == differentiable(clickmap)
    assert clickmap.probability_threshold == 0.49 and sam2.probability_threshold == 0.5
    # RClicks: "reference" is the SAM-family reset; click-map models always feed their previous map back
    assert family_settings(RClicksConfig(), clickmap) == ("always", True)
    assert family_settings(RClicksConfig(), sam2) == ("reference", False)
    assert family_settings(RClicksConfig(), sam) == ("reference", True)
    assert family_settings(RClicksConfig(multimask_output=True, mask_feedback="never"), sam2) == ("never", True)


def _instance(index, seed, height=HEIGHT, width=WIDTH):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    gt = (((yy - 0.5 * height) / (0.3 * height)) ** 2 + ((xx - 0.45 * width) / (0.3 * width)) ** 2) <= 1
    image[gt] = (image[gt] // 2 + 100).astype(np.uint8)
    return make_instance(f"im{index}", image, gt.astype(np.int8), dataset="toy")


@pytest.mark.slow  # 111 s on the loaded 2-core test machine (a RITM grad scan compiles)
@pytest.mark.parametrize("predictor", ["off", "authors"])
def test_tetris_on_a_click_map_model_moves_the_click_through_the_network(ritm, predictor):
    """With the exact (hard) disks the attack's gradient would be zero inside the error region, so
    Adam would never move the click; the protocol runs the family's soft rendering, the click moves,
    the step is the network input's diagonal rule (the frame itself with the predictor off, the
    zoom-in's fixed crop size through the authors' predictor) and the previous map is fed at every
    later click."""
    batch = pad_batch([_instance(0, 0)], (HEIGHT, WIDTH), 1)
    program = make_click_batch_fn(ritm.segmenter, ritm.params, mode="min", n_clicks=2, n_opt_steps=3,
                                  record_trajectory=True, predictor=predictor)
    out = jax.device_get(program(batch))
    points = np.asarray(out["iterates"]["point_resized"])[0]  # [K, S, 2]
    moved = np.abs(points[:, 1:] - points[:, :1]).max()
    assert moved > 1e-3, f"the attacked click never moved (max shift {moved})"
    if predictor == "off":
        network_hw = (HEIGHT, WIDTH)
    else:
        network_hw = tuple(with_predictor(ritm.segmenter, True).evaluation.zoom_in.target_hw)
        assert network_hw != (HEIGHT, WIDTH)
    assert float(out["learning_rate"][0]) == pytest.approx(5 * math.hypot(*network_hw) / (400 * math.sqrt(2)),
                                                           rel=1e-6)
    np.testing.assert_array_equal(out["has_mask_input"][0], [False, True])  # no SAM-style reset


# ---- the command line on model directories -------------------------------------------------------

@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Model directories of ritm_tiny and sam2_test (random weights) and a folder of two tiny instances."""
    root = tmp_path_factory.mktemp("family_cli")
    models = {}
    for name in ("ritm_tiny", "sam2_test"):
        spec = zoo.get(name)
        params = zoo.init(name, jax.random.key(1)).params
        models[name] = store.save(root / name, params, family=spec.family, variant=name,
                                  config=spec.config.to_dict())
    images, masks = root / "toy" / "images", root / "toy" / "masks"
    images.mkdir(parents=True)
    masks.mkdir(parents=True)
    for index, (height, width) in enumerate(((HEIGHT, WIDTH), (20, 26))):
        instance = _instance(index, index, height, width)
        Image.fromarray(np.asarray(instance.image)).save(images / f"a{index}.png")
        Image.fromarray((np.asarray(instance.gt) == 1).astype(np.uint8) * 255).save(masks / f"a{index}.png")
    return root, models, ["--folder", str(images), str(masks), "--progress", "none"]


def _ok_records(out):
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "ok" for r in records), records
    return records


def _settings(out):
    return json.loads((out / "manifest.json").read_text())["config"]


COMMANDS = {
    "tetris": ["tetris", "--n-clicks", "2", "--n_opt_steps", "2", "--baseline-clicks", "2"],
    "grid": ["grid", "--kind", "click", "--stride", "6"],
    "rclicks": ["rclicks", "--clickability", "dt", "--n-clicks", "2", "--groups", "2"],
}


@pytest.mark.slow  # 55-335 s each on the loaded 2-core test machine (exact frames: one compile per size)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_click_protocols_on_a_ritm_directory(workspace, command):
    root, models, data = workspace
    out = root / f"ritm_{command}"
    code, _, stderr = run_captured([*COMMANDS[command], "--model", models["ritm_tiny"], *data,
                                         "--out", str(out)])
    assert code == 0, stderr
    records = _ok_records(out)
    assert len(records) == 2
    # the network on the whole frame (grid) is not padded into buckets; through the authors' predictor
    # (tetris, rclicks) the zoom-in resizes a crop to a fixed size, which works in any frame
    frame_note = "runs every image in its own frame" in stderr
    assert frame_note == (command == "grid"), stderr
    if command == "tetris":
        payload = records[0]["payload"]
        assert _settings(out)["attack"]["thr"] == 0.49
        for mode in ("min", "max"):
            assert payload[mode]["has_mask_input"] == [False, True]
    if command == "rclicks":
        settings = _settings(out)["settings"]
        assert settings["threshold"] == 0.49 and settings["multimask_output"] is True


@pytest.mark.slow  # SAM 2's encoder and the protocols' programs compile per command
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_click_protocols_on_a_sam2_directory(workspace, command):
    root, models, data = workspace
    out = root / f"sam2_{command}"
    code, _, stderr = run_captured([*COMMANDS[command], "--model", models["sam2_test"], *data, "--out", str(out),
                                    "--batch-size", "2"])
    assert code == 0, stderr
    assert len(_ok_records(out)) == 2
    if command == "rclicks":
        settings = _settings(out)["settings"]
        assert settings["threshold"] == 0.5 and settings["multimask_output"] is False


@pytest.mark.slow  # 40 s on the loaded 2-core test machine
def test_breps_on_a_sam2_directory(workspace):
    root, models, data = workspace
    out = root / "sam2_breps"
    code, _, stderr = run_captured(["breps", "--model", models["sam2_test"], *data, "--n_opt_steps", "3",
                                         "--limit", "1", "--out", str(out)])
    assert code == 0, stderr
    (record,) = _ok_records(out)
    assert set(record["payload"]) >= {"min", "max"}


@pytest.mark.parametrize("argv, what", [
    (["breps"], "breps --mode minmax"),
    (["breps", "--mode", "tight"], "breps --mode tight"),
    (["grid", "--kind", "box"], "grid --kind box"),
])
def test_box_protocols_refuse_a_click_only_family(workspace, argv, what):
    root, models, data = workspace
    out = root / ("refused_" + "_".join(argv))
    code, _, stderr = run_captured([*argv, "--model", models["ritm_tiny"], *data, "--out", str(out)])
    assert code == 2
    assert models["ritm_tiny"] in stderr and what in stderr and "clicks only" in stderr


def test_decoding_a_click_map_model_is_unchanged_by_the_rules(ritm):
    """The family rules change what the protocols ask of the model, never its plain decode."""
    soft = differentiable(ritm.segmenter)
    assert dataclasses.replace(soft, click_encoding="hard") == ritm.segmenter


# ---- CFR-ICL: the variant is the converted model's, whatever the file names ------------------------

@pytest.fixture(scope="module")
def cfr_icl_workspace(workspace):
    """A CFR-ICL model directory under a neutral name (tiny SimpleClick weights, ``cfr_icl`` in its
    config.json) beside the workspace's folder of two instances."""
    root, _, data = workspace
    config = dataclasses.replace(zoo.get("simpleclick_tiny").config, cfr_icl=True)
    params = zoo.init("simpleclick_tiny", jax.random.key(2)).params
    directory = store.save(root / "converted_model", params, family="simpleclick", variant="vit_h",
                           config=config.to_dict())
    return root, directory, data


def _folder_instances(root):
    images = sorted((root / "toy" / "images").glob("*.png"))
    return [make_instance(path.stem, np.asarray(Image.open(path).convert("RGB")),
                          (np.asarray(Image.open(root / "toy" / "masks" / path.name)) > 128).astype(np.int8),
                          dataset="toy") for path in images]


def test_a_converted_cfr_icl_model_declares_its_family_whatever_its_name(cfr_icl_workspace):
    _, directory, _ = cfr_icl_workspace
    segmenter, _, meta = zoo.load_params(directory)
    assert meta["config"]["cfr_icl"] is True and segmenter.predictor_family == "cfr_icl"
    assert segmenter.rules.family == "cfr_icl" and not segmenter.rules.accepts_boxes
    authors = with_predictor(segmenter, True)
    assert authors.evaluation.cascade is not None and authors.rules.click_step_hw == (448, 448)
    assert with_predictor(segmenter, True, protocol="rclicks").evaluation.cascade.steps == 2
    plain = dataclasses.replace(segmenter, config=dataclasses.replace(segmenter.config, cfr_icl=False))
    assert plain.rules.family == "simpleclick" and with_predictor(plain, True).evaluation.cascade is None


def test_a_simpleclick_config_json_without_the_cfr_icl_key_is_refused_in_one_line(workspace, capsys):
    """A conversion older than the key cannot say whether its weights are CFR-ICL's: the CLI refuses it
    (exit code 2) with one line naming the directory and how to convert it again."""
    root, _, data = workspace
    config = zoo.get("simpleclick_tiny").config.to_dict()
    del config["cfr_icl"]
    old = store.save(root / "old_conversion", zoo.init("simpleclick_tiny", jax.random.key(3)).params,
                     family="simpleclick", variant="tiny", config=config)
    code, _, stderr = run_captured(["tetris", "--mode", "baseline", "--n-clicks", "2", "--model", str(old), *data,
                                    "--out", str(root / "old_run")])
    assert code == 2
    (line,) = [line for line in stderr.splitlines() if "error" in line]
    assert str(old) in line and "'cfr_icl'" in line and "python -m ports simpleclick" in line


@pytest.mark.slow  # the SimpleClick predictor program (zoom-in 448, flip, cascade) compiles once, ~1 min
def test_cfr_icl_through_the_library_builder_and_the_tetris_cli_gives_the_same_records(cfr_icl_workspace):
    root, directory, data = cfr_icl_workspace
    out = root / "cfr_icl_tetris"
    code, _, stderr = run_captured(["tetris", "--mode", "baseline", "--n-clicks", "2", "--batch-size", "1",
                                    "--model", str(directory), *data, "--out", str(out)])
    assert code == 0, stderr
    isegm = _settings(out)["isegm"]
    assert isegm["family"] == "cfr_icl" and (isegm["cascade"]["steps"], isegm["cascade"]["adaptive"]) == (5, True)
    cli_records = {record["id"]: record["payload"]["baseline"] for record in _ok_records(out)}

    segmenter, params, _ = zoo.load_params(directory)
    program = make_click_batch_fn(segmenter, params, mode="baseline", n_clicks=2)
    assert program.segmenter.evaluation.cascade == CascadeConfig()  # the library builder runs the cascade too
    for instance in _folder_instances(root):
        batch = pad_batch([instance], tuple(np.shape(instance.gt)), 1)
        outputs = jax.device_get(program(batch))
        record = cli_records[instance.id]
        for field in ("iou", "biou", "is_positive"):
            np.testing.assert_array_equal(np.asarray(outputs[field])[0], record[field], err_msg=field)
        np.testing.assert_array_equal(np.asarray(outputs["clicks_xy"])[0], record["clicks_xy"])


@pytest.mark.parametrize("flags, family", [(["--cfr-icl"], "cfr_icl"), ([], "simpleclick")])
def test_the_simpleclick_port_records_cfr_icl_under_any_file_name(tmp_path, monkeypatch, flags, family):
    """``python -m ports simpleclick --cfr-icl`` writes ``cfr_icl`` into the converted config.json: a
    checkpoint named neutrally gets the cascade, and without the flag SimpleClick's predictor. Reading
    and converting the torch checkpoint are stubbed with the tiny model's parameters (their key tables
    are tested with the authors' code in test_click_models_parity.py)."""
    import ports.simpleclick as port  # noqa: PLC0415
    from ports.__main__ import main as ports_main  # noqa: PLC0415

    tiny = zoo.get("simpleclick_tiny").config
    params = zoo.init("simpleclick_tiny", jax.random.key(4)).params
    monkeypatch.setattr(port, "load_isegm_checkpoint", lambda path: ({"state": path}, {"config": path}))
    monkeypatch.setattr(port, "config_from_checkpoint", lambda raw, *, what: tiny)
    monkeypatch.setattr(port, "convert_simpleclick", lambda state, config, *, what: params)
    checkpoint, out = tmp_path / "weights.pth", tmp_path / "model"
    checkpoint.write_bytes(b"stands for the torch file")
    assert ports_main(["simpleclick", *flags, "--checkpoint", str(checkpoint), "--out", str(out)]) == 0
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["cfr_icl"] is (family == "cfr_icl")
    segmenter, _, _ = zoo.load_params(out)
    assert family_rules(segmenter).family == family
    assert (with_predictor(segmenter, True).evaluation.cascade is not None) is (family == "cfr_icl")


def test_the_batch_program_runs_an_exact_frame_family_in_exact_frames(ritm):
    """``FamilyRules.frame_policy``: a click-map network on the whole frame sees the padding, so the batch
    program keeps every image in its own frame; through the zoom-in (or for SAM) the requested policy holds."""
    from jaxseg_robust.data.buckets import ExactFrame, RoundUpFrame  # noqa: PLC0415
    from jaxseg_robust.runner.program import family_frame_policy  # noqa: PLC0415

    requested = RoundUpFrame(16)
    sam = SamSegmenter(zoo.get("sam_tiny").config)
    assert family_rules(ritm.segmenter).frame_policy == "exact"
    assert isinstance(family_frame_policy(ritm.segmenter, requested), ExactFrame)
    assert family_frame_policy(with_predictor(ritm.segmenter, True), requested) is requested
    assert family_frame_policy(sam, requested) is requested
    program = make_click_batch_fn(ritm.segmenter, ritm.params, mode="baseline", n_clicks=2, predictor="off")
    assert isinstance(program.frame_policy(requested), ExactFrame)
