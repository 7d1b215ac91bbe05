"""Ports of isegm checkpoints (RITM, SimpleClick/CFR-ICL): safe reading and strict key tables.

Checkpoints are written here in the authors' format (``{"state_dict", "config"}``,
isegm's serialised config) from tiny models' parameters; no reference code
is needed. Parity with the authors' models is in test_click_models_parity.py.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flax import traverse_util  # noqa: E402

from jaxseg_robust.models import zoo  # noqa: E402
from jaxseg_robust.models.clickmap.segmenter import ClickMapSegmenter  # noqa: E402
from jaxseg_robust.models.ritm.config import TINY as RITM_TINY  # noqa: E402
from ports.__main__ import main as ports_main  # noqa: E402
from ports.isegm_checkpoint import (  # noqa: E402
    OpaqueObject,
    UnsafeCheckpointError,
    load_isegm_checkpoint,
)
from ports.keytable import PortError  # noqa: E402
from ports.ritm import convert_ritm  # noqa: E402


def _isegm_config(cls: str, **params) -> dict:
    return {"class": cls, "params": {k: {"type": "builtin", "value": v, "specified": True}
                                     for k, v in params.items()}}


RITM_CONFIG = _isegm_config(
    "isegm.model.is_hrnet_model.HRNetModel", width=4, ocr_width=4, small=True,
    with_aux_output=True, use_leaky_relu=True, use_rgb_conv=False, use_disks=True, norm_radius=5,
    with_prev_mask=True, backbone_lr_mult=0.1,
    norm_layer="torch.nn.modules.batchnorm.BatchNorm2d", cpu_dist_maps=False,
    clicks_groups=None, binary_prev_mask=False, conv_extend=False,
    norm_mean_std=([.485, .456, .406], [.229, .224, .225]))


def torch_state_dict(params) -> dict:
    """Our torch-named params back in torch's layout (+ BatchNorm counters)."""
    out = {}
    for path, value in traverse_util.flatten_dict(params, sep=".").items():
        v = np.asarray(value)
        if v.ndim == 4:
            v = v.transpose(3, 2, 0, 1)
        elif v.ndim == 2:
            v = v.T
        out[path] = torch.from_numpy(np.ascontiguousarray(v))
        if path.endswith(".running_var"):
            out[path[:-len("running_var")] + "num_batches_tracked"] = torch.tensor(7)
    return out


@pytest.fixture(scope="module")
def ritm_params():
    return ClickMapSegmenter(RITM_TINY).init(0)


def test_ritm_port_round_trip(ritm_params, tmp_path):
    ckpt = tmp_path / "tiny.pth"
    torch.save({"state_dict": torch_state_dict(ritm_params), "config": RITM_CONFIG}, ckpt)
    assert ports_main(["ritm", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    seg, params, meta = zoo.load_params(tmp_path / "out")
    assert meta["family"] == "ritm" and seg.config.small and seg.config.width == 4
    flat_a = traverse_util.flatten_dict(params, sep="/")
    flat_b = traverse_util.flatten_dict(ritm_params, sep="/")
    assert set(flat_a) == set(flat_b)
    for key in flat_b:
        np.testing.assert_array_equal(np.asarray(flat_a[key]), np.asarray(flat_b[key]))


def test_ritm_baseline_port_and_zoo_name(tmp_path):
    """RITM's non-iterative baseline (``coco_lvis_h18_baseline.pth``: no previous-mask channel) converts to
    a model with two click-map channels, and its zoo name declares the same configuration."""
    import dataclasses  # noqa: PLC0415

    from jaxseg_robust.models.ritm.config import HRNET18_BASELINE  # noqa: PLC0415

    tiny = dataclasses.replace(RITM_TINY, with_prev_mask=False)
    params = ClickMapSegmenter(tiny).init(1)
    config = {**RITM_CONFIG, "params": {**RITM_CONFIG["params"],
                                        "with_prev_mask": {"type": "builtin", "value": False, "specified": True}}}
    ckpt = tmp_path / "baseline.pth"
    torch.save({"state_dict": torch_state_dict(params), "config": config}, ckpt)
    assert ports_main(["ritm", "--checkpoint", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    seg, converted, _ = zoo.load_params(tmp_path / "out")
    assert seg.config.with_prev_mask is False and seg.config.coord_channels == 2
    flat = traverse_util.flatten_dict(converted, sep="/")
    assert np.asarray(flat["maps_transform/0/weight"]).shape[2] == 2  # HWIO: positive and negative disks
    spec = zoo.get("ritm_hrnet18_cocolvis_baseline")
    assert spec.config == HRNET18_BASELINE and spec.checkpoint_hint.endswith("coco_lvis_h18_baseline.pth")


def test_ritm_port_is_strict(ritm_params):
    sd = {k: v.numpy() for k, v in torch_state_dict(ritm_params).items()}
    extra = dict(sd, **{"feature_extractor.bogus.weight": np.zeros((3,), np.float32)})
    with pytest.raises(PortError, match="feature_extractor.bogus.weight"):
        convert_ritm(extra, RITM_TINY)
    missing = dict(sd)
    del missing["feature_extractor.cls_head.bias"]
    with pytest.raises(PortError, match="cls_head/bias"):
        convert_ritm(missing, RITM_TINY)
    shaped = dict(sd, **{"maps_transform.0.bias": np.zeros((17,), np.float32)})
    with pytest.raises(PortError, match="maps_transform.0.bias"):
        convert_ritm(shaped, RITM_TINY)


def test_wrong_family_and_unsupported_options_are_named(ritm_params, tmp_path):
    ckpt = tmp_path / "tiny.pth"
    torch.save({"state_dict": torch_state_dict(ritm_params), "config": RITM_CONFIG}, ckpt)
    assert ports_main(["simpleclick", "--checkpoint", str(ckpt), "--out",
                       str(tmp_path / "o1")]) == 2
    rgb = _isegm_config(RITM_CONFIG["class"], **{
        **{k: v["value"] for k, v in RITM_CONFIG["params"].items()}, "use_rgb_conv": True})
    torch.save({"state_dict": torch_state_dict(ritm_params), "config": rgb}, ckpt)
    with pytest.raises(PortError, match="use_rgb_conv"):
        from ports.ritm import port_checkpoint
        port_checkpoint(ckpt, tmp_path / "o2")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.environ["JAXSEG_TEST_SENTINEL"],))


def test_code_executing_checkpoint_is_refused(tmp_path, monkeypatch):
    sentinel = tmp_path / "executed"
    monkeypatch.setenv("JAXSEG_TEST_SENTINEL", str(sentinel))
    ckpt = tmp_path / "evil.pth"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "config": {"class": "x", "params": {
        "p": {"value": _Evil()}}}}, ckpt)
    with pytest.raises(UnsafeCheckpointError, match="system"):
        load_isegm_checkpoint(ckpt)
    assert not sentinel.exists()


def test_library_objects_in_a_config_become_inert(tmp_path, monkeypatch):
    pkg = types.ModuleType("isegm")
    mod = types.ModuleType("isegm.fake_losses")

    class CrossEntropyLoss:
        def __init__(self):
            self.use_sigmoid = False

    CrossEntropyLoss.__module__ = "isegm.fake_losses"
    CrossEntropyLoss.__qualname__ = "CrossEntropyLoss"
    mod.CrossEntropyLoss = CrossEntropyLoss
    monkeypatch.setitem(sys.modules, "isegm", pkg)
    monkeypatch.setitem(sys.modules, "isegm.fake_losses", mod)
    pkg.fake_losses = mod
    ckpt = tmp_path / "lib.pth"
    torch.save({"state_dict": {"w": torch.ones(2)},
                "config": _isegm_config("isegm.model.x.Y", head_params={
                    "loss_decode": CrossEntropyLoss(), "channels": 8})}, ckpt)
    monkeypatch.delitem(sys.modules, "isegm.fake_losses")
    state, config = load_isegm_checkpoint(ckpt)
    loss = config["params"]["head_params"]["loss_decode"]
    assert isinstance(loss, OpaqueObject) and loss.qualname.endswith("CrossEntropyLoss")
    assert config["params"]["head_params"]["channels"] == 8
    np.testing.assert_array_equal(state["w"], np.ones(2, np.float32))
