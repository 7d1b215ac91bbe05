"""The semseg / DDC-AT and UPerNet-ConvNeXt models and their strict ports, on synthetic data.

No torch and no official code needed (the numeric parity is in
test_semseg_parity.py / test_upernet_parity.py): the synthetic state dicts are
written here from the official modules' structure (semseg ``model/pspnet.py``
+ ``model/resnet.py``; Robust-Segmentation ``uperforseg.py`` +
``convnext_orig.py``), independently of the key tables, at tiny widths.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models import dense, store
from jaxseg_robust.models.dense.base import DenseModel
from jaxseg_robust.models.dense.layers import adaptive_pool_matrix
from jaxseg_robust.models.dense.semseg import SemsegConfig, SemsegDense, head_names, output_size
from jaxseg_robust.models.dense.upernet import UperNetConfig, UperNetDense
from ports.keytable import PortError
from ports.semseg import convert_semseg, parse_background, parse_ints, semseg_config_from_state_dict
from ports.torch_checkpoint import strip_wrapper_prefix
from ports.upernet import convert_upernet, unwrap_normalizer, upernet_config_from_state_dict

TINY = dict(width=4, blocks=(2, 1, 1, 2), head_channels=8, aux_channels=6)


# ---- synthetic official state dicts ----------------------------------------------------

class _Writer:
    def __init__(self, seed: int):
        self.rng, self.sd = np.random.default_rng(seed), {}

    def conv(self, name, out, inp, k, bias=False):
        self.sd[f"{name}.weight"] = self.rng.standard_normal((out, inp, k, k)).astype(np.float32)
        if bias:
            self.sd[f"{name}.bias"] = self.rng.standard_normal(out).astype(np.float32)

    def bn(self, name, c):
        self.sd[f"{name}.weight"] = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        self.sd[f"{name}.bias"] = self.rng.standard_normal(c).astype(np.float32)
        self.sd[f"{name}.running_mean"] = self.rng.standard_normal(c).astype(np.float32)
        self.sd[f"{name}.running_var"] = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        self.sd[f"{name}.num_batches_tracked"] = np.array(7, np.int64)

    def ln(self, name, c):
        self.sd[f"{name}.weight"] = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        self.sd[f"{name}.bias"] = self.rng.standard_normal(c).astype(np.float32)

    def linear(self, name, out, inp):
        self.sd[f"{name}.weight"] = self.rng.standard_normal((out, inp)).astype(np.float32)
        self.sd[f"{name}.bias"] = self.rng.standard_normal(out).astype(np.float32)


def semseg_state_dict(head: str, ddcat: bool, *, classes: int = 5, width: int = 4,
                      blocks=(2, 1, 1, 2), hidden: int = 8, aux_hidden: int = 6, bins: int = 4,
                      prefix: str = "module.", seed: int = 0) -> dict:
    """Keys and torch shapes of semseg's PSPNet / DDC-AT's DeepLabV3 (+ _DDCAT), training mode."""
    w = _Writer(seed)
    w.conv("layer0.0", width, 3, 3), w.bn("layer0.1", width)
    w.conv("layer0.3", width, width, 3), w.bn("layer0.4", width)
    w.conv("layer0.6", 2 * width, width, 3), w.bn("layer0.7", 2 * width)
    inplanes = 2 * width
    for i, n in enumerate(blocks):
        planes = width * 2 ** i
        for j in range(n):
            p = f"layer{i + 1}.{j}"
            w.conv(f"{p}.conv1", planes, inplanes if j == 0 else 4 * planes, 1), w.bn(f"{p}.bn1", planes)
            w.conv(f"{p}.conv2", planes, planes, 3), w.bn(f"{p}.bn2", planes)
            w.conv(f"{p}.conv3", 4 * planes, planes, 1), w.bn(f"{p}.bn3", 4 * planes)
            if j == 0:
                w.conv(f"{p}.downsample.0", 4 * planes, inplanes, 1), w.bn(f"{p}.downsample.1", 4 * planes)
        inplanes = 4 * planes
    top, mid = inplanes, inplanes // 2
    if head == "psp":
        for b in range(bins):
            w.conv(f"ppm.features.{b}.1", top // bins, top, 1), w.bn(f"ppm.features.{b}.2", top // bins)
        context, k = 2 * top, 3
    else:
        for b in range(4):
            w.conv(f"aspp.convs.{b}.0", hidden, top, 1 if b == 0 else 3), w.bn(f"aspp.convs.{b}.1", hidden)
        w.conv("aspp.convs.4.1", hidden, top, 1), w.bn("aspp.convs.4.2", hidden)
        context, k = 5 * hidden, 1
    names = ("cls1", "cls2", "mask1") if ddcat else ("cls",)
    for name in names:
        w.conv(f"{name}.0", hidden, context, k), w.bn(f"{name}.1", hidden)
        w.conv(f"{name}.4", 2 if name == "mask1" else classes, hidden, 1, bias=True)
    aux = "aux_cls1" if ddcat else "aux"
    w.conv(f"{aux}.0", aux_hidden, mid, k), w.bn(f"{aux}.1", aux_hidden)
    w.conv(f"{aux}.4", classes, aux_hidden, 1, bias=True)
    return {prefix + key: v for key, v in w.sd.items()}


def upernet_state_dict(*, classes: int = 5, depths=(1, 1, 2, 1), dims=(8, 16, 24, 32), stem_width=4,
                       channels=16, aux_hidden=8, seed: int = 0) -> dict:
    """Keys and torch shapes of Robust-Segmentation's UperNetForSemanticSegmentation (CvSt)."""
    w = _Writer(seed)
    s = "backbone.downsample_layers.0.stem"
    w.conv(f"{s}.0", stem_width, 3, 3, bias=True), w.ln(f"{s}.1", stem_width)
    w.conv(f"{s}.3", dims[0], stem_width, 3, bias=True), w.ln(f"{s}.4", dims[0])
    for i in range(1, 4):
        w.ln(f"backbone.downsample_layers.{i}.0", dims[i - 1])
        w.conv(f"backbone.downsample_layers.{i}.1", dims[i], dims[i - 1], 2, bias=True)
    for i, (depth, dim) in enumerate(zip(depths, dims)):
        for j in range(depth):
            p = f"backbone.stages.{i}.{j}"
            w.sd[f"{p}.gamma"] = w.rng.uniform(0.5, 1.5, dim).astype(np.float32)
            w.sd[f"{p}.dwconv.weight"] = w.rng.standard_normal((dim, 1, 7, 7)).astype(np.float32)
            w.sd[f"{p}.dwconv.bias"] = w.rng.standard_normal(dim).astype(np.float32)
            w.ln(f"{p}.norm", dim), w.linear(f"{p}.pwconv1", 4 * dim, dim), w.linear(f"{p}.pwconv2", dim, 4 * dim)
        w.ln(f"backbone.norm{i}", dim)

    def module(name, out, inp, k):
        w.conv(f"{name}.conv", out, inp, k), w.bn(f"{name}.batch_norm", out)

    d = "decode_head"
    w.conv(f"{d}.classifier", classes, channels, 1, bias=True)
    for k in range(4):
        module(f"{d}.psp_modules.{k}.1", channels, dims[-1], 1)
    module(f"{d}.bottleneck", channels, dims[-1] + 4 * channels, 3)
    for i in range(3):
        module(f"{d}.lateral_convs.{i}", channels, dims[i], 1)
        module(f"{d}.fpn_convs.{i}", channels, channels, 3)
    module(f"{d}.fpn_bottleneck", channels, 4 * channels, 3)
    module("auxiliary_head.convs.0", aux_hidden, dims[2], 3)
    w.conv("auxiliary_head.classifier", classes, aux_hidden, 1, bias=True)
    return w.sd


# ---- semseg models ---------------------------------------------------------------------

@pytest.mark.parametrize("head,ddcat", [("psp", False), ("psp", True), ("aspp", False), ("aspp", True)])
def test_semseg_config_is_read_from_the_keys_and_every_variable_filled(head, ddcat):
    sd = semseg_state_dict(head, ddcat)
    cfg = semseg_config_from_state_dict(convert_prepared(sd), background_class=None)
    assert cfg == SemsegConfig(head=head, ddcat=ddcat, num_classes=5, aux=True, background_class=None, **TINY)
    variables = convert_semseg(sd, cfg)
    store.check_tree(variables, SemsegDense(cfg).variable_shapes(), what="synthetic")
    flat = traverse_util.flatten_dict(variables, sep="/")
    main = "cls1" if ddcat else "cls"
    np.testing.assert_array_equal(flat[f"params/{main}/classifier/bias"], sd[f"module.{main}.4.bias"])
    np.testing.assert_array_equal(flat["params/backbone/stem_conv3/kernel"],
                                  sd["module.layer0.6.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(flat["batch_stats/backbone/layer4_1/bn2/var"],
                                  sd["module.layer4.1.bn2.running_var"])
    assert "params/backbone/layer4_1/downsample_conv/kernel" not in flat


def convert_prepared(sd):
    from ports.semseg import prepare_state_dict

    return prepare_state_dict(sd)


def test_semseg_port_is_strict_and_names_the_key():
    sd = semseg_state_dict("psp", False)
    cfg = semseg_config_from_state_dict(convert_prepared(sd), background_class=None)
    with pytest.raises(PortError, match="module.layer9.0.conv1.weight|layer9.0.conv1.weight"):
        convert_semseg({**sd, "module.layer9.0.conv1.weight": np.zeros((4, 4, 1, 1), np.float32)}, cfg)
    with pytest.raises(PortError, match="cls/classifier/bias"):
        convert_semseg({k: v for k, v in sd.items() if k != "module.cls.4.bias"}, cfg)
    with pytest.raises(PortError, match="cls.0.weight"):
        convert_semseg({**sd, "module.cls.0.weight": np.zeros((8, 8, 1, 1), np.float32)}, cfg)
    with pytest.raises(PortError, match="wrapper prefix"):
        convert_semseg({**sd, "layer1.0.conv1.weight": sd["module.layer1.0.conv1.weight"]}, cfg)
    # A UPerNet checkpoint is not a semseg one: the first foreign key is named.
    with pytest.raises(PortError, match="ppm|aspp"):
        semseg_config_from_state_dict(upernet_state_dict())


def test_semseg_config_checks_what_the_weights_cannot_say():
    sd = convert_prepared(semseg_state_dict("psp", False, bins=2))
    with pytest.raises(PortError, match="2 PSP pyramid bins"):
        semseg_config_from_state_dict(sd, background_class=None)  # default --bins has 4
    assert semseg_config_from_state_dict(sd, bins=(1, 6), background_class=None).bins == (1, 6)
    voc = convert_prepared(semseg_state_dict("psp", False, classes=21))
    city = convert_prepared(semseg_state_dict("aspp", False, classes=19))
    assert semseg_config_from_state_dict(voc).background_class == 0
    assert semseg_config_from_state_dict(city).background_class is None
    with pytest.raises(PortError, match="5 classes"):
        semseg_config_from_state_dict(convert_prepared(semseg_state_dict("psp", False)))
    assert parse_ints("1,2,3,6", name="--bins") == (1, 2, 3, 6)
    with pytest.raises(ValueError, match="--bins"):
        parse_ints("1,x", name="--bins")
    assert parse_background("none") is None and parse_background("AUTO") == "auto"
    assert parse_background("3") == 3


def test_wrapper_prefix_is_all_or_nothing():
    assert strip_wrapper_prefix({"a.x": 1}) == {"a.x": 1}
    assert strip_wrapper_prefix({"module.a": 1, "module.b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(PortError, match="'b'"):
        strip_wrapper_prefix({"module.a": 1, "b": 2}, what="x.pth")


def test_semseg_dense_model_evaluates_the_normal_branch():
    cfg = SemsegConfig(head="aspp", ddcat=True, num_classes=5, **TINY)
    model = SemsegDense(cfg)
    assert isinstance(model, DenseModel) and model.num_classes == 5
    assert head_names(cfg) == ("cls1", "cls2", "mask1", "aux_cls1")
    variables = model.init(jax.random.key(0))
    images = jax.random.uniform(jax.random.key(1), (2, 19, 26, 3))

    @jax.jit
    def run(v, x):  # one program: every head, and the evaluation output's sum with its input gradient
        total, grad = jax.value_and_grad(lambda y: model.apply(v, y).sum())(x)
        return model.apply_heads(v, x), total, grad

    heads, total, grad = run(variables, images)
    assert heads["cls1"].shape == (2, 19, 26, 5) and heads["mask1"].shape == (2, 19, 26, 2)
    np.testing.assert_allclose(total, heads["cls1"].sum(), rtol=1e-4)  # apply = the cls1 head
    assert not np.allclose(heads["cls1"], heads["cls2"])
    assert grad.shape == images.shape and np.isfinite(np.asarray(grad)).all() and np.abs(grad).max() > 0
    with pytest.raises(ValueError, match="no head"):
        model.apply_heads(variables, images, heads=("cls",))


def test_semseg_size_rule_and_config_checks():
    assert [output_size(s) for s in (473, 512, 682, 1024)] == [473, 512, 682, 1024]
    with pytest.raises(ValueError, match="head"):
        SemsegConfig(head="fcn")
    with pytest.raises(ValueError, match="bins"):
        SemsegConfig(bins=(1, 2, 3))  # 3 does not divide 2048
    assert SemsegConfig().variant == "pspnet50"
    assert SemsegConfig(head="aspp", ddcat=True).variant == "deeplabv3_50_ddcat"
    cfg = SemsegConfig(head="aspp", **TINY)
    assert SemsegConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        SemsegConfig.from_dict({**cfg.to_dict(), "dropout": 0.1})


def test_adaptive_pool_matrix_follows_torch_windows():
    # AdaptiveAvgPool: window i = [floor(i*in/out), ceil((i+1)*in/out)).
    m = adaptive_pool_matrix(5, 3)
    expected = np.array([[.5, .5, 0, 0, 0], [0, 1 / 3, 1 / 3, 1 / 3, 0], [0, 0, 0, .5, .5]], np.float32)
    np.testing.assert_allclose(m, expected, rtol=1e-7)
    np.testing.assert_allclose(adaptive_pool_matrix(4, 1), [[.25] * 4])
    np.testing.assert_allclose(adaptive_pool_matrix(2, 6).sum(1), np.ones(6))  # out > in repeats inputs
    with pytest.raises(ValueError):
        adaptive_pool_matrix(0, 2)


# ---- UPerNet ---------------------------------------------------------------------------

TINY_UPER = dict(depths=(1, 1, 2, 1), dims=(8, 16, 24, 32), stem_width=4, channels=16, aux_channels=8)


def test_upernet_config_is_read_and_every_variable_filled():
    sd = upernet_state_dict()
    from ports.upernet import prepare_state_dict

    prepared, normalizer = prepare_state_dict(sd)
    assert normalizer is None
    cfg = upernet_config_from_state_dict(prepared, background_class=0)
    assert cfg == UperNetConfig(num_classes=5, **TINY_UPER)
    variables = convert_upernet(sd, cfg)
    store.check_tree(variables, UperNetDense(cfg).variable_shapes(), what="synthetic")
    flat = traverse_util.flatten_dict(variables, sep="/")
    np.testing.assert_array_equal(flat["params/backbone/stage2_1/pwconv1/kernel"],
                                  sd["backbone.stages.2.1.pwconv1.weight"].T)
    np.testing.assert_array_equal(flat["params/backbone/stage0_0/dwconv/kernel"],
                                  sd["backbone.stages.0.0.dwconv.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(flat["params/backbone/stage3_0/scale"], sd["backbone.stages.3.0.gamma"])
    np.testing.assert_array_equal(flat["batch_stats/decode_head/psp2/bn/mean"],
                                  sd["decode_head.psp_modules.2.1.batch_norm.running_mean"])


def test_upernet_port_is_strict_and_reads_a_normalising_wrapper():
    sd = upernet_state_dict()
    cfg = UperNetConfig(num_classes=5, **TINY_UPER)
    with pytest.raises(PortError, match="backbone.stages.0.0.extra.weight"):
        convert_upernet({**sd, "backbone.stages.0.0.extra.weight": np.zeros(3, np.float32)}, cfg)
    with pytest.raises(PortError, match="decode_head/fpn1"):
        convert_upernet({k: v for k, v in sd.items() if not k.startswith("decode_head.fpn_convs.1.")}, cfg)
    with pytest.raises(PortError, match="semseg ResNet|backbone.stages"):
        upernet_config_from_state_dict(convert_prepared(semseg_state_dict("psp", False)))
    wrapped = {"normalize.mean": np.array([.4, .5, .6], np.float32).reshape(1, 3, 1, 1),
               "normalize.std": np.array([.2, .2, .2], np.float32).reshape(1, 3, 1, 1),
               **{"model." + k: v for k, v in sd.items()}}
    unwrapped, (mean, std) = unwrap_normalizer(wrapped)
    assert set(unwrapped) == set(sd)
    np.testing.assert_allclose(mean, (.4, .5, .6), rtol=1e-6)
    with pytest.raises(PortError, match="partner"):
        unwrap_normalizer({k: v for k, v in wrapped.items() if k != "normalize.std"})
    with pytest.raises(PortError, match="under 'model.'"):
        unwrap_normalizer({**wrapped, "extra": np.zeros(1)})


def test_upernet_dense_model_runs_on_plain_inputs():
    cfg = UperNetConfig(num_classes=5, **TINY_UPER)
    model = UperNetDense(cfg)
    assert isinstance(model, DenseModel) and cfg.pixel_mean is None
    variables = model.init(jax.random.key(0))
    images = jax.random.uniform(jax.random.key(1), (1, 37, 45, 3))
    logits, (main, aux) = jax.jit(lambda v, x: (model.apply(v, x), model.apply_with_aux(v, x)))(
        variables, images)
    assert logits.shape == aux.shape == (1, 37, 45, 5)
    np.testing.assert_allclose(logits, main, rtol=1e-5, atol=1e-5 * float(np.abs(main).max()))
    assert UperNetConfig().variant == "upernet_convnext_t_cvst"
    assert UperNetConfig(depths=(3, 3, 27, 3)).variant == "upernet_convnext_s_cvst"
    with pytest.raises(ValueError, match="both"):
        UperNetConfig(pixel_mean=(0.5, 0.5, 0.5))


# ---- converted directories and the command line ----------------------------------------------

def test_converted_directories_round_trip(tmp_path):
    cfg = SemsegConfig(head="psp", num_classes=5, **TINY)
    variables = convert_semseg(semseg_state_dict("psp", False), cfg)
    store.save(tmp_path / "psp", variables, family="semseg", variant=cfg.variant, config=cfg.to_dict())
    model, loaded = dense.load_converted(tmp_path / "psp")
    assert model == SemsegDense(cfg)
    jax.tree.map(np.testing.assert_array_equal, loaded, variables)
    ucfg = UperNetConfig(num_classes=5, **TINY_UPER)
    uvars = convert_upernet(upernet_state_dict(), ucfg)
    store.save(tmp_path / "uper", uvars, family="upernet", variant=ucfg.variant, config=ucfg.to_dict())
    model, _ = dense.load_converted(tmp_path / "uper")
    assert model == UperNetDense(ucfg)


class PickledCode:
    """An object whose unpickling would run this module's code: weights_only loading refuses it."""


def test_command_line_end_to_end(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from ports.__main__ import build_parser, main

    sd = semseg_state_dict("aspp", True)
    path = tmp_path / "train_epoch_50.pth"
    torch.save({"epoch": 50, "state_dict": {k: torch.from_numpy(v) for k, v in sd.items()},
                "optimizer": {"state": {}, "param_groups": [{"lr": 0.01, "params": [0, 1]}]}}, path)
    command = ["semseg", "--checkpoint", str(path), "--out", str(tmp_path / "dl")]
    assert main(command) == 2  # 5 classes: neither VOC nor Cityscapes, background must be given
    assert main(command + ["--background-class", "none"]) == 0
    model, _ = dense.load_converted(tmp_path / "dl")
    assert model.config.ddcat and model.config.head == "aspp" and model.background_class is None
    assert main(command + ["--background-class", "none"]) == 2  # the directory holds a model
    torch.save({k: torch.from_numpy(v) for k, v in upernet_state_dict().items()}, tmp_path / "u.pth")
    assert main(["upernet", "--checkpoint", str(tmp_path / "u.pth"), "--out", str(tmp_path / "u"),
                 "--background-class", "0"]) == 0
    assert dense.load_converted(tmp_path / "u")[0].background_class == 0
    torch.save({"state_dict": {"layer0.0.weight": torch.zeros(1)}, "hook": PickledCode()}, tmp_path / "code.pth")
    assert main(["semseg", "--checkpoint", str(tmp_path / "code.pth"), "--out", str(tmp_path / "c")]) == 2
    args = build_parser().parse_args(["semseg", "--checkpoint", "x.pth", "--out", "o", "--bins", "1,2"])
    assert isinstance(args, argparse.Namespace) and args.bins == "1,2"
    assert main(["upernet", "--checkpoint", str(tmp_path / "missing.pth"), "--out", "o"]) == 2
    errors = capsys.readouterr().err
    assert "code.pth: not a readable PyTorch checkpoint" in errors and "missing.pth" in errors
