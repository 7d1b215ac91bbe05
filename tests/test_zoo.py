"""Tests of the model zoo (names, random init, loading converted directories)."""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import numpy as np
import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.sam.registry import SAM_CONFIGS, TINY_CONFIG
from jaxseg_robust.models import store


def test_known_names_and_lookup():
    names = zoo.known_names()
    assert {"sam_vit_b", "sam_vit_l", "sam_vit_h", "sam_tiny"} <= set(names)
    assert zoo.get("sam_vit_h").config == SAM_CONFIGS["vit_h"]
    assert zoo.get("sam_vit_b").checkpoint_hint == "sam_vit_b_01ec64.pth"
    with pytest.raises(ValueError, match="sam_vit_b"):  # the message lists known names
        zoo.get("sam_vit_x")
    with pytest.raises(ValueError, match="unknown model family"):
        zoo.family("no_family")
    with pytest.raises(ValueError, match="register the family"):
        zoo.register_model("x", "no_family", TINY_CONFIG)


def test_models_dir_env(monkeypatch, tmp_path):
    monkeypatch.delenv(zoo.ENV_MODELS_DIR, raising=False)
    assert zoo.models_dir() == pathlib.Path("~/.cache/jaxseg_robust/models").expanduser()
    monkeypatch.setenv(zoo.ENV_MODELS_DIR, str(tmp_path))
    assert zoo.models_dir() == tmp_path


def test_load_errors_name_the_problem(monkeypatch, tmp_path):
    monkeypatch.setenv(zoo.ENV_MODELS_DIR, str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        zoo.load("sam_vit_b")
    message = str(err.value)
    assert "python -m ports sam --checkpoint sam_vit_b_01ec64.pth" in message
    assert str(tmp_path / "sam_vit_b") in message
    with pytest.raises(ValueError, match="known names: .*sam_vit_b"):
        zoo.load("definitely_not_a_model")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(store.StoreError, match="config.json"):
        zoo.load(empty)


def test_init_save_load_round_trip(monkeypatch, tmp_path):
    model = zoo.init("sam_tiny", jax.random.key(3))
    assert model.config == TINY_CONFIG
    again = zoo.init("sam_tiny", jax.random.key(3))
    jax.tree.map(np.testing.assert_array_equal, model.params, again.params)
    out = tmp_path / "sam_tiny"
    store.save(out, model.params, family="sam", variant="tiny", config=TINY_CONFIG.to_dict())
    monkeypatch.setenv(zoo.ENV_MODELS_DIR, str(tmp_path))
    for loaded in (zoo.load(out), zoo.load("sam_tiny")):
        assert loaded.config == TINY_CONFIG
        jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)
    bf16 = zoo.load(out, compute_dtype="bfloat16")
    assert bf16.config.compute_dtype == "bfloat16"
    assert zoo.segmenter("sam_tiny", compute_dtype="bfloat16").config.compute_dtype == "bfloat16"


def test_load_rejects_params_that_do_not_match_the_config(tmp_path):
    model = zoo.init("sam_tiny", 0)
    wider = dataclasses.replace(TINY_CONFIG, mask_in_chans=16)
    out = tmp_path / "mismatch"
    store.save(out, model.params, family="sam", variant="tiny", config=wider.to_dict())
    with pytest.raises(store.StoreError, match="prompt_encoder/mask_downscaling"):
        zoo.load(out)


def test_dense_families_are_those_of_the_dense_modules_and_are_refused_by_name(tmp_path):
    from jaxseg_robust.models.dense import deeplabv3, semseg, u2net, upernet

    assert set(zoo.dense_families()) == {m.FAMILY for m in (u2net, deeplabv3, semseg, upernet)}
    out = tmp_path / "u2netp"
    store.save(out, {"w": np.zeros(2)}, family="u2netp", variant="u2netp", config={})
    with pytest.raises(store.StoreError) as caught:
        zoo.load_params(out)
    assert str(caught.value).startswith(f"{out} holds a 'u2netp' model, a dense model (image -> per-pixel logits) "
                                        "that takes no prompts")


def test_load_dense_is_the_one_loader_of_the_dense_families(tmp_path):
    """A converted dense directory comes back as its registered family's model with its variables; variables
    that do not fit the stored config are refused naming the directory."""
    from dense_configs import TINY_DEEPLAB
    from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Dense

    model = DeepLabV3Dense(TINY_DEEPLAB)
    variables = jax.tree.map(np.asarray, model.init(jax.random.key(0)))
    out = tmp_path / "deeplab"
    store.save(out, variables, family="deeplabv3", variant="tiny", config=TINY_DEEPLAB.to_dict())
    loaded, loaded_variables = zoo.load_dense(out)
    assert loaded == model and zoo.holds_dense(out) and not zoo.holds_dense(tmp_path / "absent")
    jax.tree.map(np.testing.assert_array_equal, loaded_variables, variables)
    wider = tmp_path / "wider"
    store.save(wider, variables, family="deeplabv3", variant="tiny",
               config=dataclasses.replace(TINY_DEEPLAB, width=8).to_dict())
    with pytest.raises(store.StoreError, match=str(wider)):
        zoo.load_dense(wider)


def _damage(path: pathlib.Path, how: str) -> None:
    for file in sorted(path.iterdir()) if path.is_dir() else [path]:
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 2] if how == "truncate" else b"garbled" * 5)


@pytest.mark.parametrize("part, how, named", [
    ("params/_METADATA", "truncate", "params"),
    ("params/manifest.ocdbt", "garble", "params/manifest.ocdbt"),
    ("params/d", "garble", "params/d/"),
    ("params/d", "truncate", "params/d/"),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, part, how, named):
    out = tmp_path / "model"
    store.save(out, {"a": {"w": np.ones((64, 64))}, "b": np.zeros(3)}, family="sam", variant="x", config={})
    _damage(out / part, how)
    before = sys.unraisablehook
    with pytest.raises(store.StoreError) as caught:
        store.load(out)
    assert sys.unraisablehook is before  # the quiet hook is load's only
    message = str(caught.value)
    assert message.startswith(str(out / named)) and "\n" not in message and len(message) < 300
    assert "the parameter checkpoint is damaged or incomplete" in message and "python -m ports" in message


def test_the_quiet_hook_drops_only_the_closed_event_loop():
    import types

    seen = []
    hook = store.quiet_closed_loop_hook(seen.append)
    for error in (RuntimeError("Event loop is closed"), RuntimeError("other"), ValueError("Event loop is closed")):
        hook(types.SimpleNamespace(exc_value=error))
    assert [str(u.exc_value) for u in seen] == ["other", "Event loop is closed"]
