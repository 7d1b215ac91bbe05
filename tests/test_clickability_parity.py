"""Clickability parity against mmseg's MSCAN / LightHamHead (random weights, real images).

The reference is the RClicks ``SegNeXtSaliency`` (arch 'b') as spec rclicks.md
§3 describes it, assembled here from mmsegmentation 1.2.2's ``MSCAN``,
``StemConv`` and ``LightHamHead`` classes plus a mask encoder and scale layer
written in this file: the mask features are added after the stem, all four
stages feed the head, ``num_classes = 1``, eval mode. Its state dict has the
official key layout (§3.8: ``encoder_decoder.backbone.*``,
``encoder_decoder.decode_head.0.*``, ``maps_transform.*``); it is saved with
``torch.save``, converted with ``ports.clickability.port_clickability`` and
loaded with ``load_converted``.

mmcv-lite has no compiled ops, so the ``mmseg.models`` package cannot be
imported; the needed source files are loaded under stub parent packages (only
while the reference is built), which also skips mmseg's mmcv version check.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import importlib.util
import pathlib
import re
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mmengine")
pytest.importorskip("mmcv")
if importlib.util.find_spec("mmseg") is None:
    pytest.skip("mmsegmentation is not installed", allow_module_level=True)

import cv2  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torchvision.transforms import v2 as tv_transforms  # noqa: E402

from jaxseg_robust.models.clickability import (  # noqa: E402
    SEGNEXT_B, ClickabilityNet, letterbox_geometry, load_converted, minmax_per_sample,
    prepare_inputs, unletterbox)
from jaxseg_robust.models.clickability import train as T  # noqa: E402
from ports import clickability as clickability_port  # noqa: E402
from ports.clickability import convert_clickability, port_clickability  # noqa: E402
from ports.keytable import PortError  # noqa: E402
from jaxseg_robust.models.store import StoreError  # noqa: E402
from ports.torch_checkpoint import load_state_dict  # noqa: E402

pytestmark = pytest.mark.parity

STUB_PACKAGES = ("mmseg", "mmseg.models", "mmseg.models.backbones", "mmseg.models.decode_heads",
                 "mmseg.models.utils", "mmseg.models.losses", "mmseg.utils")


_LOADED: dict[str, types.ModuleType] = {}


@contextlib.contextmanager
def mmseg_modules():
    """Yields (mscan module, ham_head module) loaded from mmseg's source files.

    The modules are loaded once per process (mmseg's registries cannot be created
    twice); each use re-installs them in ``sys.modules`` and restores it afterwards.
    """
    saved = {k: v for k, v in sys.modules.items() if k == "mmseg" or k.startswith("mmseg.")}
    try:
        if _LOADED:
            sys.modules.update(_LOADED)
        else:
            _load_mmseg_sources()
            _LOADED.update({k: v for k, v in sys.modules.items()
                            if k == "mmseg" or k.startswith("mmseg.")})
        yield (sys.modules["mmseg.models.backbones.mscan"],
               sys.modules["mmseg.models.decode_heads.ham_head"])
    finally:
        for k in [k for k in sys.modules if k == "mmseg" or k.startswith("mmseg.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _load_mmseg_sources() -> None:
    root = pathlib.Path(importlib.util.find_spec("mmseg").submodule_search_locations[0])
    for name in STUB_PACKAGES:
        stub = types.ModuleType(name)
        stub.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = stub
    typing_utils = importlib.import_module("mmseg.utils.typing_utils")
    for attr in ("ConfigType", "OptConfigType", "MultiConfig", "OptMultiConfig",
                 "SampleList", "OptSampleList"):
        setattr(sys.modules["mmseg.utils"], attr, getattr(typing_utils, attr))
    wrappers = importlib.import_module("mmseg.models.utils.wrappers")
    sys.modules["mmseg.models.utils"].resize = wrappers.resize
    accuracy = importlib.import_module("mmseg.models.losses.accuracy")
    sys.modules["mmseg.models.losses"].accuracy = accuracy.accuracy
    importlib.import_module("mmseg.models.losses.cross_entropy_loss")  # the head's loss
    importlib.import_module("mmseg.models.backbones.mscan")
    importlib.import_module("mmseg.models.decode_heads.ham_head")


class ScaleLayer(torch.nn.Module):
    """``maps_transform.5``: output ``x · |scale|``."""

    def __init__(self, init_value: float):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((1,), init_value))

    def forward(self, x):
        return x * torch.abs(self.scale)


def build_reference():
    """The spec's patched SegNeXtSaliency from mmseg classes (torch, train mode)."""
    with mmseg_modules() as (mscan, ham_head):

        class StemWithFeatures(mscan.StemConv):
            def forward(self, x, extra):
                x = self.proj(x) + extra
                _, _, h, w = x.shape
                return x.flatten(2).transpose(1, 2), h, w

        class MSCANWithFeatures(mscan.MSCAN):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.patch_embed1 = StemWithFeatures(3, kwargs["embed_dims"][0],
                                                     norm_cfg=kwargs["norm_cfg"])

            def forward(self, x, extra):
                b, outs = x.shape[0], []
                for i in range(self.num_stages):
                    embed = getattr(self, f"patch_embed{i + 1}")
                    x, h, w = embed(x, extra) if i == 0 else embed(x)
                    for blk in getattr(self, f"block{i + 1}"):
                        x = blk(x, h, w)
                    x = getattr(self, f"norm{i + 1}")(x)
                    x = x.reshape(b, h, w, -1).permute(0, 3, 1, 2).contiguous()
                    outs.append(x)
                return outs

        backbone = MSCANWithFeatures(
            embed_dims=[64, 128, 320, 512], depths=[3, 3, 12, 3], mlp_ratios=[8, 8, 4, 4],
            drop_rate=0.0, drop_path_rate=0.1,
            attention_kernel_sizes=[5, [1, 7], [1, 11], [1, 21]],
            attention_kernel_paddings=[2, [0, 3], [0, 5], [0, 10]],
            act_cfg=dict(type="GELU"), norm_cfg=dict(type="BN", requires_grad=True))
        head = ham_head.LightHamHead(
            in_channels=[64, 128, 320, 512], in_index=[0, 1, 2, 3], channels=512,
            ham_channels=512, dropout_ratio=0.1, num_classes=1,
            norm_cfg=dict(type="GN", num_groups=32, requires_grad=True), align_corners=False,
            ham_kwargs=dict(MD_S=1, MD_R=16, train_steps=6, eval_steps=7, inv_t=100,
                            rand_init=False))

    class EncoderDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = backbone
            self.decode_head = torch.nn.ModuleList([head])

    class Saliency(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder_decoder = EncoderDecoder()
            self.maps_transform = torch.nn.Sequential(
                torch.nn.Conv2d(2, 16, 1), torch.nn.ReLU(inplace=True),
                torch.nn.Conv2d(16, 16, 3, stride=2, padding=1), torch.nn.ReLU(inplace=True),
                torch.nn.Conv2d(16, 64, 3, stride=2, padding=1), ScaleLayer(0.05))

        def forward(self, image, aux):
            """-> (raw head output y [B,1,h,w], min-max map [B,1,H,W])."""
            feats = self.maps_transform(aux)
            y = self.encoder_decoder.decode_head[0](self.encoder_decoder.backbone(image, feats))
            up = F.interpolate(y, size=image.shape[2:], mode="bilinear", align_corners=True)
            flat = up.view(up.shape[0], -1)
            low, high = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
            return y, ((flat - low) / (high - low + 1e-9)).view(up.shape)

    return Saliency()


def randomise_(model, seed: int) -> None:
    """Random weights, BatchNorm statistics, counters and NMF bases (in place)."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(t, lo, hi):
        return torch.rand(t.shape, generator=gen) * (hi - lo) + lo

    with torch.no_grad():
        model(torch.zeros(1, 3, 64, 64), torch.zeros(1, 2, 64, 64))  # creates `bases`
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "layer_scale" in name:
                p.copy_(uniform(p, 0.05, 0.3))
            elif name == "maps_transform.5.scale":
                p.copy_(torch.tensor([-0.8]))           # the forward uses |scale|
            elif p.ndim == 1 and leaf == "weight":     # BN / LN / GN scales
                p.copy_(uniform(p, 0.5, 1.5))
            elif leaf == "bias":
                p.copy_(uniform(p, -0.2, 0.2))
            else:                                        # conv kernels: keep torch's init law
                bound = float(p.abs().max())
                p.copy_(uniform(p, -bound, bound))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(uniform(b, -0.3, 0.3))
            elif name.endswith("running_var"):
                b.copy_(uniform(b, 0.5, 2.0))
            elif name.endswith("num_batches_tracked"):
                b.fill_(1234)
            elif name.endswith("bases"):
                fresh = torch.rand(b.shape, generator=gen)
                b.copy_(F.normalize(fresh, dim=1))


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = build_reference()
    randomise_(model, seed=1)
    return model.eval()


def real_samples(data_dir: pathlib.Path):
    """Two real images (portrait Berkeley, landscape DAVIS) with G and an error mask E."""
    out = []
    for folder, stem, rule in (("berkeley", "101087", lambda m: m[..., 0] > 128),
                               ("davis", "001", lambda m: m.max(axis=2) > 0)):
        image_path = next((data_dir / folder / "images").glob(stem + ".*"), None)
        mask_path = data_dir / folder / "masks" / f"{stem}.png"
        if image_path is None or not mask_path.is_file():
            pytest.skip(f"{folder}/{stem} not in the real data folder")
        image = cv2.cvtColor(cv2.imread(str(image_path)), cv2.COLOR_BGR2RGB)
        gt = rule(cv2.imread(str(mask_path))).astype(np.float32)
        error = gt * (np.arange(gt.shape[1])[None, :] < gt.shape[1] // 2)   # an FN-like region
        out.append((image, gt, error))
    return out


def max_err(got, want) -> tuple[float, float]:
    """(max abs error, max abs reference value)."""
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max()), float(np.abs(want).max())


def test_reference_state_dict_has_the_official_layout(reference):
    sd = reference.state_dict()
    assert len(sd) == 862
    learnable = sum(p.numel() for p in reference.parameters())
    assert learnable == 27_604_290
    assert tuple(sd["encoder_decoder.decode_head.0.hamburger.ham.bases"].shape) == (1, 512, 16)


def test_eval_parity_on_real_images_at_416(reference, real_data_dir, tmp_path):
    samples = real_samples(real_data_dir)
    checkpoint = tmp_path / "clickability_model.pth"
    torch.save(reference.state_dict(), checkpoint)
    port_clickability(checkpoint, tmp_path / "converted")
    config, variables = load_converted(tmp_path / "converted")
    assert config == SEGNEXT_B

    prepared = [prepare_inputs(*s) for s in samples]
    image = np.stack([p[0] for p in prepared])
    aux = np.stack([p[1] for p in prepared])
    with torch.no_grad():
        y_ref, map_ref = reference(torch.from_numpy(image).permute(0, 3, 1, 2).contiguous(),
                                   torch.from_numpy(aux).permute(0, 3, 1, 2).contiguous())
    net = ClickabilityNet(config)
    out = jax.jit(lambda v, x, a: net.apply(v, x, a))(variables, image, aux)

    raw_err, raw_scale = max_err(out.raw, y_ref[:, 0].numpy())
    map_err, _ = max_err(out.normalized, map_ref[:, 0].numpy())
    print(f"\n416x416 eval parity: raw y max|err| {raw_err:.3e} (max|y| {raw_scale:.3e}, "
          f"rel {raw_err / raw_scale:.3e}); min-max map max|err| {map_err:.3e}")
    assert raw_err <= 1e-4 * raw_scale
    assert map_err <= 1e-4
    ref = map_ref[:, 0].numpy()
    assert ref.std(axis=(1, 2)).min() > 0.05 and np.abs(ref[0] - ref[1]).max() > 0.5

    # Un-letterboxing: torchvision Resize (bilinear, no antialias) of the pasted crop.
    for b, (img, _, _) in enumerate(samples):
        h, w = img.shape[:2]
        g = letterbox_geometry(h, w)
        crop = map_ref[b:b + 1, :, g.top:g.top + g.resized_h, g.left:g.left + g.resized_w]
        want = tv_transforms.Resize((h, w), antialias=False)(crop)[0, 0].numpy()
        got = np.asarray(unletterbox(out.normalized[b:b + 1], (h, w))[0])
        err, _ = max_err(got, want)
        print(f"un-letterboxed {h}x{w}: max|err| {err:.3e}")
        assert err <= 1e-4
        # Metric wrapper: second min-max over the crop (no eps).
        second = np.asarray(minmax_per_sample(jnp.asarray(got)[None], 0.0)[0])
        np.testing.assert_allclose(second, (want - want.min()) / (want.max() - want.min()),
                                   atol=1e-4)


def test_train_mode_parity_forward_loss_gradients_and_statistics(reference):
    """Train mode with stochastic depth and dropout off: batch statistics, 6 NMF steps,
    KLD loss, all gradients and the BatchNorm running-statistics update."""
    size = 128
    model = copy.deepcopy(reference).train()
    for module in model.modules():
        if hasattr(module, "drop_prob"):
            module.drop_prob = 0.0
    model.encoder_decoder.decode_head[0].dropout.p = 0.0

    rng = np.random.default_rng(5)
    image = rng.normal(size=(2, size, size, 3)).astype(np.float32)
    aux = (rng.uniform(size=(2, size, size, 2)) > 0.5).astype(np.float32)
    target = (rng.uniform(size=(2, size, size)) ** 4).astype(np.float32)

    variables = convert_clickability(load_state_dict_from(reference), SEGNEXT_B)
    config = dataclasses.replace(SEGNEXT_B, input_size=size, drop_path_rate=0.0,
                                 dropout_ratio=0.0)
    net = ClickabilityNet(config)

    x_t = torch.from_numpy(image).permute(0, 3, 1, 2).contiguous()
    a_t = torch.from_numpy(aux).permute(0, 3, 1, 2).contiguous()
    _, map_t = model(x_t, a_t)
    loss_t = kld_torch(map_t, torch.from_numpy(target)[:, None])
    loss_t.backward()

    def loss_fn(params):
        out, mutated = net.apply({**variables, "params": params}, image, aux, train=True,
                                 mutable=["batch_stats"])
        return T.kld_loss(out.normalized, target), (out, mutated["batch_stats"])

    (loss_j, (out_j, stats_j)), grads_j = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
        variables["params"])
    map_err, _ = max_err(out_j.normalized, map_t[:, 0].detach().numpy())
    print(f"\ntrain-mode {size}x{size}: map max|err| {map_err:.3e}, loss {float(loss_j):.6f} "
          f"vs {loss_t.item():.6f}")
    assert map_err <= 1e-4
    np.testing.assert_allclose(float(loss_j), loss_t.item(), rtol=1e-4)

    # Gradients and updated running statistics through the same key table.
    grads_t = {k: p.grad.numpy() for k, p in model.named_parameters()}
    stats_t = {k: b.numpy() for k, b in model.named_buffers()}
    ported = convert_clickability({**grads_t, **stats_t}, SEGNEXT_B)
    flat_j = jax.tree_util.tree_flatten_with_path(grads_j)[0]
    flat_t = dict(jax.tree_util.tree_flatten_with_path(ported["params"])[0])
    rows: list[tuple[float, float, float, str]] = []
    for path, g in flat_j:
        want = flat_t[path]
        err = float(np.abs(np.asarray(g, np.float64) - want).max())
        rows.append((err / max(float(np.abs(want).max()), 1e-30), err,
                     float(np.abs(want).max()), jax.tree_util.keystr(path)))
    # Biases in front of a train-mode BatchNorm, and conv_seg's bias (the min-max output
    # ignores constant shifts), have an analytic gradient of 0: both sides hold rounding
    # noise there, so only its size is checked.
    analytic_zero = re.compile(r"patch_embed\d'\]\['proj(_[03])?'\]\['bias|conv_seg'\]\['bias")
    # Tolerance: max|err| <= 1e-3 x the tensor's own max|grad|, or, for tensors whose
    # gradient is a near-cancelling sum (ham_in's bias: 2.4e-3 against 0.35 for the
    # largest tensor; it sums ReLU-masked terms of both signs over every pixel and
    # passes through 6 multiplicative NMF updates), <= 1e-4 x the largest gradient of
    # the model: float32 summation order alone moves it by ~4e-6 absolute.
    largest = max(r[2] for r in rows)
    for rel, err, scale, name in rows:
        if analytic_zero.search(name):
            assert scale < 1e-6 and err < 1e-6, name
        else:
            assert rel <= 1e-3 or err <= 1e-4 * largest, (
                f"gradient of {name}: max|err| {err:.3e}, max|grad| {scale:.3e} (rel {rel:.3e}), "
                f"largest max|grad| {largest:.3e}")
    worst = max(r for r in rows if not analytic_zero.search(r[3]))
    print("worst gradient (max|err| / max|grad| per tensor): %.3e (%s)" % (worst[0], worst[3]))
    stats_err = max(max_err(a, b)[0] for a, b in zip(jax.tree.leaves(stats_j),
                                                     jax.tree.leaves(ported["batch_stats"])))
    print(f"running statistics max|err| {stats_err:.3e}")
    assert stats_err <= 1e-4


def load_state_dict_from(model) -> dict[str, np.ndarray]:
    """A torch module's state dict as numpy arrays (as `load_state_dict` returns them)."""
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def kld_torch(pred, target, eps=1e-9):
    """The reference training loss (spec §3.7)."""
    q = target / (eps + target.sum(dim=(1, 2, 3), keepdim=True))
    p = pred / (eps + pred.sum(dim=(1, 2, 3), keepdim=True))
    return torch.mean(torch.sum(q * torch.log(eps + q / (eps + p)), dim=(1, 2, 3)))


def test_port_command_hook(reference, tmp_path, capsys):
    """``python -m ports clickability`` entry points (add_arguments / run) and a
    checkpoint saved before the first forward (no NMF bases)."""
    checkpoint = tmp_path / "sd.pth"
    torch.save(reference.state_dict(), checkpoint)
    assert load_state_dict(checkpoint).keys() == reference.state_dict().keys()
    parser = argparse.ArgumentParser()
    clickability_port.add_arguments(parser)
    args = parser.parse_args(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "m")])
    assert clickability_port.run(args) == 0
    assert "converted" in capsys.readouterr().out
    with pytest.raises(StoreError, match="overwrite"):
        clickability_port.run(args)
    no_bases = {k: v for k, v in reference.state_dict().items() if not k.endswith(".bases")}
    torch.save(no_bases, tmp_path / "fresh.pth")
    with pytest.raises(PortError, match="hamburger.ham.bases"):
        port_clickability(tmp_path / "fresh.pth", tmp_path / "m2")
