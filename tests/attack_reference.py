"""The reference attack code for the step-by-step parity tests of the perturbation battery.

Nothing here is copied from the references; they are imported:

* adv-lib 0.2.8 (PyPI ``adv-lib``; ``pip install --no-deps adv-lib==0.2.8``: it is not in the
  ``reference`` extra because its declared dependency visdom does not build from its sdist
  here): ALMA prox, PDPGD, DAG.
  It imports ``visdom`` at module level for an optional live plot, and its package
  ``__init__`` imports its LPIPS distance, which imports ``torchvision.models`` (only used
  when an LPIPS object is built). When either is not installed an empty stand-in module is
  registered for the import (the tests never create a plot or an LPIPS); the torchvision
  stand-in is removed again right after, so ``importorskip("torchvision")`` elsewhere still
  sees the truth.
  Its ALMA prox ternary search is wrapped in ``torch.compile``; the tests run the
  reference in eager mode (`eager_reference`), i.e. exactly the operations written in
  adv-lib's source, without Inductor's fusion (which needs a C compiler and may reorder
  float32 sums).
* ``$JAXSEG_RSE_REPO``: a checkout of szegedai/Robust-Segmentation-Evaluation (the
  ECCV'24 authors' code): ``rse/attacks.py`` (PAdam) and ``rse/_sea.py`` (APGD with the
  SEA losses). Loaded as a namespace package so that its ``__init__`` (the evaluation
  loop, torchmetrics) is not imported.

Every loader calls ``pytest.skip`` with the reason when its reference is missing.

`RecordingModule` and `recording_logits_fn` record every model input on either side, so
a test can compare the two trajectories iterate by iterate without instrumenting either
implementation: each of these attacks evaluates the model exactly once per iteration.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import pathlib
import sys
import types

import numpy as np
import pytest

ENV_RSE = "JAXSEG_RSE_REPO"


def advlib_segmentation():
    """``adv_lib.attacks.segmentation`` (skips without torch or adv-lib)."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("adv_lib") is None:
        pytest.skip("adv-lib is not installed (pip install --no-deps adv-lib==0.2.8)")
    return import_with_stand_ins("adv_lib.attacks.segmentation")


def import_with_stand_ins(name: str):
    """``importlib.import_module(name)`` with empty ``visdom`` / ``torchvision`` modules where those are missing."""
    if "visdom" not in sys.modules and importlib.util.find_spec("visdom") is None:
        sys.modules["visdom"] = types.ModuleType("visdom")
    stand_ins = []
    if "torchvision" not in sys.modules and importlib.util.find_spec("torchvision") is None:
        vision = types.ModuleType("torchvision")
        vision.models = types.ModuleType("torchvision.models")
        sys.modules.update({"torchvision": vision, "torchvision.models": vision.models})
        stand_ins = ["torchvision", "torchvision.models"]
    try:
        return importlib.import_module(name)
    finally:
        for stand_in in stand_ins:
            sys.modules.pop(stand_in, None)


@contextlib.contextmanager
def eager_reference():
    """Runs ``torch.compile``-decorated reference functions eagerly (TorchDynamo disabled) inside the block."""
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


def rse_modules():
    """(``rse.attacks``, ``rse._sea``) from ``$JAXSEG_RSE_REPO`` (skips without it, torch or adv-lib)."""
    pytest.importorskip("torch")
    value = os.environ.get(ENV_RSE)
    if not value:
        pytest.skip(f"${ENV_RSE} is not set (a checkout of szegedai/Robust-Segmentation-Evaluation)")
    root = pathlib.Path(value).expanduser()
    if not (root / "rse" / "_sea.py").is_file():
        pytest.skip(f"${ENV_RSE}={root} has no rse/_sea.py")
    advlib_segmentation()  # rse/attacks.py imports adv-lib's attacks by name
    if "rse" not in sys.modules:
        package = types.ModuleType("rse")
        package.__path__ = [str(root / "rse")]
        sys.modules["rse"] = package
    return import_with_stand_ins("rse.attacks"), import_with_stand_ins("rse._sea")


def recording_module(module):
    """``module`` wrapped so that every input it sees is kept (NHWC numpy) in ``wrapper.inputs``."""
    import torch

    class RecordingModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = module
            self.inputs = []

        def forward(self, x):
            self.inputs.append(x.detach().numpy().transpose(0, 2, 3, 1).copy())
            return self.net(x)

    return RecordingModule().eval()


def recording_logits_fn(logits_fn, inputs: list):
    """``logits_fn`` that appends every input it is evaluated at (host copy, in call order) to ``inputs``.

    Uses an ordered ``jax.debug.callback``, so the records come out in the loop's order
    from inside ``jit`` / ``fori_loop`` / ``value_and_grad`` (the forward pass only).
    """
    import jax

    def record(values):
        inputs.append(np.array(values, copy=True))

    def wrapped(params, images):
        jax.debug.callback(record, images, ordered=True)
        return logits_fn(params, images)

    return wrapped


def to_nchw(array):
    """NHWC numpy/jax array -> contiguous NCHW torch tensor (float32 stays float32)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(np.asarray(array).transpose(0, 3, 1, 2)))


def trajectory_gaps(ours, theirs, images) -> dict:
    """Per-iteration agreement of two iterate sequences ``[T, B, H, W, 3]`` around ``images`` [B, H, W, 3].

    Returns:
      ``max_abs`` f64[T] (largest coordinate difference), ``frac_off`` f64[T] (fraction of
      coordinates differing by more than 1e-6), ``norm_ours`` / ``norm_theirs`` f64[T]
      (‖δ‖∞ of each side's iterate, max over the batch).
    """
    ours = np.asarray(ours, np.float64)
    theirs = np.asarray(theirs, np.float64)
    x = np.asarray(images, np.float64)[None]
    axes = tuple(range(1, ours.ndim))
    gap = np.abs(ours - theirs)
    return {"max_abs": gap.max(axis=axes), "frac_off": (gap > 1e-6).mean(axis=axes),
            "norm_ours": np.abs(ours - x).max(axis=axes), "norm_theirs": np.abs(theirs - x).max(axis=axes)}
