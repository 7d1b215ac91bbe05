"""`python -m ports gpcis`'s key table and config checks (ports/gpcis.py) on a synthetic state dict.

The state dict is the official layout of the tiny config (torch key names,
[out, in, kh, kw] convolutions, [out, in] linears, ``omega`` [L, 1], BatchNorm
counters and the training-only ``omega_var``); the full model's conversion is
checked against the authors' code in tests/test_gpcis_parity.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models.gpcis.config import TINY
from jaxseg_robust.models.gpcis.segmenter import GpcisSegmenter
from ports.gpcis import config_from_checkpoint, convert_gpcis
from ports.keytable import PortError

GP_CLASS = "isegm.model.is_gp_resnet50.GpModel"


def official_state_dict(seed: int = 0) -> dict:
    """Random arrays under the official keys of the tiny config (see the module docstring)."""
    rng = np.random.default_rng(seed)
    flat = traverse_util.flatten_dict(GpcisSegmenter(TINY).param_shapes(), sep="/")
    out = {}
    for path, leaf in flat.items():
        shape = tuple(leaf.shape)
        if len(shape) == 4:
            shape = (shape[3], shape[2], shape[0], shape[1])
        elif len(shape) == 2 and path != "omega":
            shape = shape[::-1]
        value = rng.standard_normal(shape)
        out[path.replace("/", ".")] = (np.abs(value) if path.endswith("running_var") else value).astype(np.float32)
        if path.endswith("running_var"):
            out[path.replace("/", ".").replace("running_var", "num_batches_tracked")] = np.asarray(7)
    out["omega_var"] = np.asarray(0.025, np.float32)
    return out


def release_config(**params) -> dict:
    base = {"backbone": "resnet50", "use_leaky_relu": True, "use_disks": True, "binary_prev_mask": False,
            "with_prev_mask": True}
    return {"class": GP_CLASS, "params": {**base, **params}}


def test_every_key_lands_in_its_place():
    state = official_state_dict()
    params = convert_gpcis(state, TINY)
    flat = traverse_util.flatten_dict(params, sep="/")
    np.testing.assert_array_equal(flat["theta/weight"], state["theta.weight"].T)
    np.testing.assert_array_equal(flat["omega"], state["omega"])
    np.testing.assert_array_equal(flat["u_mlp/2/weight"], state["u_mlp.2.weight"].T)
    np.testing.assert_array_equal(flat["maps_transform/0/weight"],
                                  state["maps_transform.0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(flat["model/backbone/layer1/0/conv1/weight"],
                                  state["model.backbone.layer1.0.conv1.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(flat["weights"], state["weights"])
    expected = traverse_util.flatten_dict(GpcisSegmenter(TINY).param_shapes(), sep="/")
    assert set(flat) == set(expected)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("logsigma2"), "logsigma2"),
    (lambda s: s.pop("omega_var"), "omega_var"),
    (lambda s: s.__setitem__("theta.extra", np.zeros(3, np.float32)), "theta.extra"),
    (lambda s: s.__setitem__("omega", np.zeros((1, TINY.num_random_features), np.float32)), "omega"),
])
def test_a_bad_key_is_named(edit, message):
    state = official_state_dict()
    edit(state)
    with pytest.raises(PortError, match=message):
        convert_gpcis(state, TINY, what="ckpt.pth")


def test_the_release_config_is_read():
    config = config_from_checkpoint(release_config(deeplab_ch=256), what="ckpt.pth")
    assert config.backbone == "resnet50" and config.deeplab_ch == 256 and config.feature_dim == 48


@pytest.mark.parametrize("raw, message", [
    ({"class": "isegm.model.is_hrnet_model.HRNetModel", "params": {}}, "model class"),
    (release_config(with_prev_mask=False), "with_prev_mask"),
    ({"class": GP_CLASS, "params": {"backbone": "resnet50"}}, "with_prev_mask"),
    (release_config(binary_prev_mask=True), "binary_prev_mask"),
    (release_config(backbone="resnet7"), "backbone"),
])
def test_unsupported_configs_are_refused_by_name(raw, message):
    with pytest.raises(PortError, match=message):
        config_from_checkpoint(raw, what="ckpt.pth")
