"""``python -m ports adaptiveclick``: the EasyDict config read through inert stand-ins, and the strict key table.

Checkpoints are written here in the authors' format (``{"state_dict", "config"}``)
from the tiny model's parameters, with the config the authors' ``init_model``
pickles: an ``easydict.EasyDict`` (a dict subclass pickled with its items; a
stand-in class under that module name here, so easydict need not be installed)
holding the yaml's sections, ``pathlib`` paths and a ``torch.device``. Parity
with the authors' model is in test_adaptiveclick_parity.py.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flax import traverse_util  # noqa: E402

from jaxseg_robust.models import zoo  # noqa: E402
from jaxseg_robust.models.adaptiveclick.config import TINY  # noqa: E402
from jaxseg_robust.models.clickmap.segmenter import ADAPTIVECLICK_TRANSPOSED, ClickMapSegmenter  # noqa: E402
from ports.__main__ import main as ports_main  # noqa: E402
from ports.adaptiveclick import config_from_checkpoint, convert_adaptiveclick  # noqa: E402
from ports.isegm_checkpoint import load_isegm_checkpoint  # noqa: E402
from ports.keytable import PortError  # noqa: E402

CLASS = "isegm.model.is_adaptiveclick_model.AdaptiveClickModel"
PORTED_TINY = dataclasses.replace(TINY, variant="vit_32")  # the port names a variant by the ViT's width


class EasyDict(dict):
    """Pickled as ``easydict.EasyDict`` (module patched in for the dump): a dict subclass with attributes."""

    def __init__(self, d=None):
        super().__init__()
        for k, v in (d or {}).items():
            v = EasyDict(v) if isinstance(v, dict) else v
            self[k] = v
            setattr(self, k, v)


def tiny_cfg(**changes) -> EasyDict:
    """The config the authors' ``init_model`` builds for TINY (tests/adaptiveclick_reference.py's overrides)."""
    model = {
        "BACKBONE": {"PATCH_SIZE": [16, 16], "IN_CHANS": 3, "EMBED_DIM": 32, "DEPTH": 4, "NUM_HEADS": 2,
                     "MLP_RATIO": 4, "QKV_BIAS": True},
        "SIMPLE_FEATURE_PYRAMID": {"IN_DIM": 32, "OUT_DIMS": [8, 16, 24, 32]},
        "SEM_SEG_HEAD": {"NUM_CLASSES": 1, "CONVS_DIM": 32, "MASK_DIM": 32, "NORM": "GN",
                         "IN_FEATURES": ["res2", "res3", "res4", "res5"],
                         "DEFORMABLE_TRANSFORMER_ENCODER_IN_FEATURES": ["res3", "res4", "res5"],
                         "COMMON_STRIDE": 4, "TRANSFORMER_ENC_LAYERS": 1},
        "MASK_FORMER": {"HIDDEN_DIM": 32, "NUM_OBJECT_QUERIES": 3, "NHEADS": 4, "DIM_FEEDFORWARD": 64,
                        "DEC_LAYERS": 4, "PRE_NORM": False, "ENFORCE_INPUT_PROJ": False},
    }
    cfg = {"MODEL": model, "crop_size": (224, 224), "device": torch.device("cpu"), "random_split": False,
           "EXPS_PATH": pathlib.PosixPath("/tmp/experiments")}
    cfg.update(changes)
    return EasyDict(cfg)


def torch_state_dict(params) -> dict:
    """Our torch-named params back in torch's layout, with the keys the port drops."""
    out = {}
    for path, value in traverse_util.flatten_dict(params, sep="/").items():
        v = np.asarray(value)
        if v.ndim == 4 and not path.startswith(ADAPTIVECLICK_TRANSPOSED):
            v = v.transpose(3, 2, 0, 1)
        elif v.ndim == 2 and not path.endswith(("query_feat/weight", "query_embed/weight", "level_embed/weight",
                                                  "transformer/level_embed")):
            v = v.T
        out[path.replace("/", ".")] = torch.from_numpy(np.ascontiguousarray(v))
    d = TINY.embed_dim
    out.update({"backbone.cls_token": torch.zeros(1, 1, d), "backbone.fc_norm.weight": torch.ones(d),
                "backbone.fc_norm.bias": torch.zeros(d), "backbone.head.weight": torch.zeros(1000, d),
                "backbone.head.bias": torch.zeros(1000), "criterion.empty_weight": torch.ones(2)})
    for alias, first in (("lateral_convs.0", "adapter_1"), ("output_convs.0", "layer_1")):
        for leaf in ("0.weight", "0.bias", "1.weight", "1.bias"):
            out[f"pixel_decoder.{alias}.{leaf}"] = out[f"pixel_decoder.{first}.{leaf}"].clone()
    return out


def save_checkpoint(path, state_dict, cfg, monkeypatch) -> None:
    module = types.ModuleType("easydict")
    module.EasyDict = EasyDict
    monkeypatch.setitem(sys.modules, "easydict", module)
    monkeypatch.setattr(EasyDict, "__module__", "easydict")
    config = {"class": CLASS, "params": {
        "cfg": {"type": "builtin", "value": cfg, "specified": True},
        "with_prev_mask": {"type": "builtin", "value": True, "specified": True},
        "use_disks": {"type": "builtin", "value": True, "specified": True},
        "norm_radius": {"type": "builtin", "value": 5, "specified": True}}}
    torch.save({"state_dict": state_dict, "config": config}, path)


@pytest.fixture(scope="module")
def tiny_params():
    return ClickMapSegmenter(TINY).init(0)


def test_port_round_trip_reads_the_easydict_config(tiny_params, tmp_path, monkeypatch):
    ckpt = tmp_path / "tiny.pth"
    save_checkpoint(ckpt, torch_state_dict(tiny_params), tiny_cfg(), monkeypatch)
    assert ports_main(["adaptiveclick", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    seg, params, meta = zoo.load_params(tmp_path / "out")
    assert meta["family"] == "adaptiveclick"
    assert seg.config == PORTED_TINY
    flat_a = traverse_util.flatten_dict(params, sep="/")
    flat_b = traverse_util.flatten_dict(tiny_params, sep="/")
    assert set(flat_a) == set(flat_b)
    for key in flat_b:
        np.testing.assert_array_equal(np.asarray(flat_a[key]), np.asarray(flat_b[key]))


def test_the_config_holds_inert_stand_ins(tiny_params, tmp_path, monkeypatch):
    ckpt = tmp_path / "tiny.pth"
    save_checkpoint(ckpt, torch_state_dict(tiny_params), tiny_cfg(), monkeypatch)
    monkeypatch.delitem(sys.modules, "easydict")  # nothing of the authors' libraries is imported to read it
    _, config = load_isegm_checkpoint(ckpt)
    cfg = config["params"]["cfg"]
    assert type(cfg).qualname == "easydict.EasyDict"
    assert type(cfg.mapping["EXPS_PATH"]).qualname.startswith("pathlib.")
    assert cfg.mapping["device"] == torch.device("cpu")  # torch's own allow-listed object
    assert config_from_checkpoint(config, what="tiny.pth") == PORTED_TINY


def test_port_is_strict(tiny_params):
    state = {k: v.numpy() for k, v in torch_state_dict(tiny_params).items()}
    missing = dict(state)
    del missing["click_aware_decoder.query_feat.weight"]
    with pytest.raises(PortError, match="query_feat"):
        convert_adaptiveclick(missing, TINY, what="tiny.pth")
    extra = {**state, "click_aware_decoder.extra.weight": np.zeros(3, np.float32)}
    with pytest.raises(PortError, match="click_aware_decoder.extra.weight"):
        convert_adaptiveclick(extra, TINY, what="tiny.pth")
    moved = {**state, "pixel_decoder.lateral_convs.0.0.bias": state["pixel_decoder.lateral_convs.0.0.bias"] + 1}
    with pytest.raises(PortError, match="lateral_convs.0.0.bias.*adapter_1.0.bias"):
        convert_adaptiveclick(moved, TINY, what="tiny.pth")


@pytest.mark.parametrize("changes, named", [
    ({"random_split": True}, "cfg.random_split"),
    ({"crop_size": None}, "cfg.crop_size"),
])
def test_unsupported_or_missing_settings_are_named(changes, named, tiny_params, tmp_path, monkeypatch, capsys):
    cfg = tiny_cfg(**changes)
    if changes.get("crop_size", 0) is None:
        del cfg["crop_size"]
    ckpt = tmp_path / "bad.pth"
    save_checkpoint(ckpt, torch_state_dict(tiny_params), cfg, monkeypatch)
    assert ports_main(["adaptiveclick", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert named in err and str(ckpt) in err and len(err.strip().splitlines()) == 1


def test_a_simpleclick_checkpoint_is_refused_by_class(tmp_path, monkeypatch):
    with pytest.raises(PortError, match="PlainVitModel.*AdaptiveClick"):
        config_from_checkpoint({"class": "isegm.model.is_plainvit_model.PlainVitModel", "params": {}}, what="x.pth")
