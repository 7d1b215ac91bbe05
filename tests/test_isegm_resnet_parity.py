"""Parity of isegm's ResNetV1b backbone (models/isegm_resnet) with the authors' ``resnetv1b.py``.

The authors' file is read from the ClickSEG checkout named by
``$JAXSEG_CDNET_REPO`` (GPCIS ships the same classes; only their pretrained
loading differs). Both depths the families use are built as isegm's
``ResNetBackbone`` does (``dilated=True``): ResNet-34 (BasicBlockV1b, 7x7 stem)
and ResNet-50 (BottleneckV1b, deep stem of width 64), with seeded random
weights and BatchNorm statistics in every tensor, in eval mode. The
coordinate features enter after the stem as ``ResNetBackbone.forward`` adds
them (zero-padded, or cut by a negative ``F.pad``). c1..c4 agree within 1e-4
of their scale (max |value|).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.parity

torch = pytest.importorskip("torch")

from cdnet_reference import REPO_ENV, load_source_module, randomise_, repo_path  # noqa: E402

if repo_path() is None:
    pytest.skip(f"${REPO_ENV} does not name a ClickSEG checkout", allow_module_level=True)

from jaxseg_robust.models.isegm_resnet.resnetv1b import ResNetV1b, backbone_spec  # noqa: E402
from ports.isegm_checkpoint import PathRule, torch_layout  # noqa: E402
from ports.keytable import convert  # noqa: E402
from ports.torch_checkpoint import drop_batchnorm_counters  # noqa: E402

RTOL = 1e-4
LEAF = r"[A-Za-z0-9_.]+\.(weight|bias|running_mean|running_var)"


def reference_backbone(name: str):
    """isegm's ``ResNetBackbone(name, pretrained_base=False)`` stages, built from resnetv1b.py."""
    ref = load_source_module("isegm/model/modeling/resnetv1b.py")
    builders = {"resnet34": ref.resnet34_v1b, "resnet50": ref.resnet50_v1s}
    return builders[name](pretrained=False, dilated=True).eval()


def reference_forward(net, x, additional):
    """``ResNetBackbone.forward`` (isegm/model/modeling/resnet.py) on the ResNetV1b's modules."""
    x = net.relu(net.bn1(net.conv1(x)))
    if additional is not None:
        x = x + torch.nn.functional.pad(additional, [0, 0, 0, 0, 0, x.size(1) - additional.size(1)],
                                        mode="constant", value=0)
    x = net.maxpool(x)
    c1 = net.layer1(x)
    c2 = net.layer2(c1)
    c3 = net.layer3(c2)
    return c1, c2, c3, net.layer4(c3)


def converted_params(net, model, image, coord):
    """The reference's backbone state dict through the port's path rule (fc dropped)."""
    import jax  # noqa: PLC0415

    state = {k: v.numpy() for k, v in net.state_dict().items() if not k.startswith("fc.")}
    state = drop_batchnorm_counters(state, what="reference")
    expected = jax.eval_shape(model.init, jax.random.PRNGKey(0), image, coord)["params"]
    return convert(state, [PathRule(LEAF, "", torch_layout)], expected, what="reference")


@pytest.mark.parametrize("name,coord_channels", [("resnet34", 64), ("resnet50", 256)])
def test_backbone_matches_isegm(name, coord_channels):
    net = reference_backbone(name)
    randomise_(net, seed=7)
    rng = np.random.default_rng(3)
    image = rng.standard_normal((2, 3, 67, 74)).astype(np.float32)
    coord = (0.5 * rng.standard_normal((2, coord_channels, 34, 37))).astype(np.float32)
    with torch.no_grad():
        want = reference_forward(net, torch.from_numpy(image), torch.from_numpy(coord))
    model = ResNetV1b(backbone_spec(name))
    image_nhwc, coord_nhwc = jnp.asarray(image.transpose(0, 2, 3, 1)), jnp.asarray(coord.transpose(0, 2, 3, 1))
    params = converted_params(net, model, image_nhwc, coord_nhwc)
    got = model.apply({"params": params}, image_nhwc, coord_nhwc)
    for level, (g, w) in enumerate(zip(got, want), start=1):
        w = w.numpy().transpose(0, 2, 3, 1)
        assert g.shape == w.shape, f"c{level}"
        scale = float(np.max(np.abs(w)))
        err = float(np.max(np.abs(np.asarray(g) - w)))
        assert err <= RTOL * scale, f"{name} c{level}: max error {err:.3g} at scale {scale:.3g}"
