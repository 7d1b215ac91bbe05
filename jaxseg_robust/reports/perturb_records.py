"""What a ``perturb`` run writes per instance: the record payload and the example images of the report.

docs/protocols/perturbation.md (§5 per-image worst case, "Records"). The engine's ``finalize`` of the
battery (`make_finalize`) turns the battery's outputs of one instance (`attacks.perturb.battery_program`)
into its record payload (statistics only) and lets `ExampleSaver` keep the images of the first few
instances for `reports.perturb.plot_examples`.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax.numpy as jnp
import numpy as np

from jaxseg_robust.attacks.perturb import per_image_scores, select_worst

# The battery's outputs an example file keeps (each cropped to the image inside its frame).
EXAMPLE_KEYS = ("image", "adversarial", "labels", "valid", "clean_pred", "adv_pred")


@dataclasses.dataclass
class ExampleSaver:
    """Saves the images of the first ``limit`` finished instances into ``folder`` (for the report).

    Attributes:
      folder: ``RUN_DIR/examples`` (`reports.perturb.EXAMPLES_DIR`).
      limit: most example files (0: none).
      names: the battery's candidate names (a payload's ``worst_miou`` indexes them).
    """

    folder: pathlib.Path
    limit: int
    names: tuple[str, ...]

    def count(self) -> int:
        """Example files already there."""
        return len(list(self.folder.glob("*.npz"))) if self.folder.is_dir() else 0

    def maybe_save(self, instance, outputs, payload) -> None:
        """Writes ``<dataset>__<id>.npz`` while fewer than ``limit`` examples exist."""
        if self.limit <= 0 or self.count() >= self.limit:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{instance.dataset}__{instance.id}")
        height, width = instance.image.shape[:2]  # the image inside a padded frame
        np.savez_compressed(self.folder / f"{safe}.npz", name=instance.name,
                            attack=self.names[payload["worst_miou"]], miou_clean=payload["miou_clean"],
                            miou_adv=payload["miou_worst"],
                            **{k: np.asarray(outputs[k])[:height, :width] for k in EXAMPLE_KEYS})


def make_finalize(saver: ExampleSaver, background_class: int):
    """Host-side payload of one instance (statistics only) + example images for the report.

    The payload: per-candidate ``confusions`` int[K, C, C], ``clean_confusion``
    int[C, C], attack costs, the image size, the clean and worst per-image
    mIoU (with background) and the indices of the per-image worst candidates by
    mIoU and by accuracy (§5; NaN scores never selected).
    """
    def scores(confusions, metric):
        return per_image_scores(jnp.asarray(confusions, jnp.float32), metric=metric, background_class=background_class)

    def finalize(instance, outputs):
        confusions = np.asarray(outputs["confusions"], np.int64)
        clean = np.asarray(outputs["clean_confusion"], np.int64)
        mious = np.asarray(scores(confusions, "miou"), np.float64)
        worst = int(select_worst(mious[:, None])[0][0])
        worst_accuracy = int(select_worst(np.asarray(scores(confusions, "accuracy"))[:, None])[0][0])
        payload = {"confusions": confusions, "clean_confusion": clean,
                   "forwards": np.asarray(outputs["forwards"]), "backwards": np.asarray(outputs["backwards"]),
                   "height": int(instance.image.shape[0]), "width": int(instance.image.shape[1]),
                   "miou_clean": float(np.asarray(scores(clean[None], "miou"))[0]),
                   "miou_worst": float(mious[worst]), "worst_miou": worst, "worst_accuracy": worst_accuracy}
        saver.maybe_save(instance, outputs, payload)
        return payload

    return finalize
