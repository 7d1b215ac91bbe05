"""Index-addressable synthetic datasets: samples, `Instance`s, lazy refs, and image/mask folders.

Sample ``i`` of a configuration (seed, sizes, difficulties, families) is
  * family ``families[i % F]``, difficulty ``difficulties[(i // F) % D]``
    (so any ``F * D`` consecutive indices hold every pair once);
  * size ``sizes[k]``, with ``k`` drawn from sample ``(seed, i)``'s own stream;
  * rendered by `scenes.render_sample(seed, i, family, difficulty, size)`.
A training loop can therefore draw sample ``i`` directly, and gets the same
sample whatever else is in its batch. Changing the configuration lists
changes which family/difficulty/size an index gets, not how a given
``(seed, i, family, difficulty, size)`` looks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

from jaxseg_robust.data.instances import Instance, InstanceRef
from jaxseg_robust.data.synthetic.families import FAMILIES
from jaxseg_robust.data.synthetic.scenes import (
    DIFFICULTIES,
    STREAM_TAG,
    SyntheticSample,
    check_size,
    render_sample,
)

# Bumped whenever the same arguments would give different pixels.
GENERATOR_VERSION = 1
DEFAULT_SEED = 0
DATASET_NAME = "synthetic"
# Training sizes (H, W): squares and SAM-like 3:4 / 4:3 frames.
TRAIN_SIZES = ((64, 64), (128, 128), (256, 256), (96, 128), (128, 96), (192, 256))
# Small sizes for the CPU demo and tests.
DEMO_SIZES = ((64, 64), (48, 64))
IMAGES_FOLDER = "images"
MASKS_FOLDER = "masks"
MANIFEST_NAME = "synthetic.json"
_SIZE_STREAM = 4  # spawn key of the size choice (0-3 are `scenes.sample_streams`)


def _check_choices(name: str, values, known: Sequence[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} must not be empty")
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"{name}: unknown {unknown}; known: {', '.join(known)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} lists an entry twice: {values}")
    return values


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """What a synthetic dataset draws from.

    Attributes:
      seed: non-negative int.
      sizes: sequence of image sizes in pixels, each an (H, W) pair or an int
        (a square): ``(64, 128)`` is two squares, ``[(96, 128)]`` one frame.
      difficulties: tuple of `DIFFICULTIES` entries, cycled over indices.
      families: tuple of `FAMILIES` entries, cycled over indices.
    """

    seed: int = DEFAULT_SEED
    sizes: tuple = TRAIN_SIZES
    difficulties: tuple = DIFFICULTIES
    families: tuple = FAMILIES

    def __post_init__(self):
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed!r}")
        sizes = (self.sizes,) if isinstance(self.sizes, (int, np.integer)) else self.sizes
        try:
            sizes = tuple(check_size(size) for size in sizes)
        except TypeError as error:
            raise ValueError(f"sizes must be a sequence of ints or (H, W) pairs, got {self.sizes!r}") from error
        if not sizes:
            raise ValueError("sizes must not be empty")
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "difficulties", _check_choices("difficulties", self.difficulties, DIFFICULTIES))
        object.__setattr__(self, "families", _check_choices("families", self.families, FAMILIES))

    def plan(self, index: int) -> tuple[str, str, tuple[int, int]]:
        """``(family, difficulty, (H, W))`` of sample ``index`` (cheap: nothing is rendered)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"index must be a non-negative int, got {index!r}")
        index = int(index)
        family = self.families[index % len(self.families)]
        difficulty = self.difficulties[(index // len(self.families)) % len(self.difficulties)]
        if len(self.sizes) == 1:
            return family, difficulty, self.sizes[0]
        stream = np.random.SeedSequence([STREAM_TAG, self.seed, index], spawn_key=(_SIZE_STREAM,))
        choice = int(np.random.Generator(np.random.PCG64(stream)).integers(len(self.sizes)))
        return family, difficulty, self.sizes[choice]

    def sample(self, index: int) -> SyntheticSample:
        """Sample ``index`` (see the module docstring)."""
        family, difficulty, size = self.plan(index)
        return render_sample(self.seed, int(index), family, difficulty, size)

    def fingerprint(self, index: int) -> str:
        """Token that changes whenever sample ``index`` could change (generator version and plan)."""
        family, difficulty, (height, width) = self.plan(index)
        return (f"jaxseg_robust.synthetic/v{GENERATOR_VERSION}/seed={self.seed}/index={int(index)}/"
                f"{family}/{difficulty}/{height}x{width}")


def _indices(num: int, start: int) -> range:
    for name, value in (("num", num), ("start", start)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return range(int(start), int(start) + int(num))


def synthetic_sample(index: int, *, seed: int = DEFAULT_SEED, sizes=TRAIN_SIZES, difficulties=DIFFICULTIES,
                     families=FAMILIES) -> SyntheticSample:
    """Sample ``index`` of the configuration (see the module docstring).

    Returns:
      `SyntheticSample` with ``image`` uint8[H, W, 3], ``mask`` bool[H, W].
    """
    return SyntheticConfig(seed, sizes, difficulties, families).sample(index)


def synthetic_samples(num: int, *, seed: int = DEFAULT_SEED, sizes=TRAIN_SIZES, difficulties=DIFFICULTIES,
                      families=FAMILIES, start: int = 0) -> list[SyntheticSample]:
    """Samples ``start .. start + num - 1`` of the configuration."""
    config = SyntheticConfig(seed, sizes, difficulties, families)
    return [config.sample(i) for i in _indices(num, start)]


def synthetic_instances(num: int, *, seed: int = DEFAULT_SEED, sizes=TRAIN_SIZES, difficulties=DIFFICULTIES,
                        families=FAMILIES, start: int = 0, dataset: str = DATASET_NAME) -> list[Instance]:
    """Samples ``start .. start + num - 1`` as in-memory `Instance`s.

    Args:
      num: number of instances (>= 0).
      seed: non-negative int.
      sizes: (H, W) pairs or ints (squares), sides in [32, 1024] px.
      difficulties: `DIFFICULTIES` entries to cycle over.
      families: `FAMILIES` entries to cycle over.
      start: first index.
      dataset: dataset name of the instances.

    Returns:
      `Instance`s with id ``"<index:06d>_<family>_<difficulty>"``, ``image``
      uint8[H, W, 3] and ``gt`` int8[H, W] in {0, 1}.
    """
    config = SyntheticConfig(seed, sizes, difficulties, families)
    return [config.sample(i).to_instance(dataset) for i in _indices(num, start)]


def _load_instance(config: SyntheticConfig, index: int, dataset: str) -> Instance:
    return config.sample(index).to_instance(dataset)


def synthetic_instance_refs(num: int, *, seed: int = DEFAULT_SEED, sizes=TRAIN_SIZES, difficulties=DIFFICULTIES,
                            families=FAMILIES, start: int = 0, dataset: str = DATASET_NAME) -> list[InstanceRef]:
    """Like `synthetic_instances`, as lazy `InstanceRef`s (rendered on ``load()``).

    Declared sizes come from the plan without rendering; each ref's
    ``fingerprint`` is `SyntheticConfig.fingerprint`.
    """
    config = SyntheticConfig(seed, sizes, difficulties, families)
    refs = []
    for index in _indices(num, start):
        family, difficulty, (height, width) = config.plan(index)
        refs.append(InstanceRef(id=f"{index:06d}_{family}_{difficulty}", height=height, width=width,
                                loader=functools.partial(_load_instance, config, index, dataset),
                                dataset=dataset, fingerprint=config.fingerprint(index)))
    return refs


def sample_record(sample: SyntheticSample) -> dict:
    """JSON-ready description of a sample (everything but the pixels)."""
    return {
        "id": sample.id, "index": sample.index, "family": sample.family, "kind": sample.kind,
        "difficulty": sample.difficulty, "height": sample.size[0], "width": sample.size[1],
        "num_parts": sample.num_parts, "num_distractors": sample.num_distractors,
        "contrast": round(sample.contrast, 6), "background": sample.background, "appearance": sample.appearance,
        "stroke_width": None if sample.stroke_width is None else round(sample.stroke_width, 6),
        "box_xyxy": [int(v) for v in sample.box],
    }


def write_synthetic_folder(root, num: int, *, seed: int = DEFAULT_SEED, sizes=DEMO_SIZES,
                           difficulties=DIFFICULTIES, families=FAMILIES, start: int = 0) -> pathlib.Path:
    """Writes samples as an image/mask folder that the datasets ``folder`` kind reads.

    Layout: ``root/images/<id>.png`` (RGB), ``root/masks/<id>.png`` (8-bit
    grey, 0 background, 255 object: the default ``>128`` rule), and
    ``root/synthetic.json`` (generator version, configuration, one record per
    sample from `sample_record`). Writing the same arguments again rewrites
    identical files.

    Args:
      root: output folder (created).
      num, seed, sizes, difficulties, families, start: as `synthetic_instances`
        (default sizes: `DEMO_SIZES`).

    Returns:
      ``root`` as a `pathlib.Path`.

    Raises:
      ValueError: bad arguments, or ``images/`` / ``masks/`` already hold
        files this call would not write (they would be paired with these).
    """
    config = SyntheticConfig(seed, sizes, difficulties, families)
    indices = _indices(num, start)
    root = pathlib.Path(root)
    images_dir, masks_dir = root / IMAGES_FOLDER, root / MASKS_FOLDER
    ids = [f"{i:06d}_{family}_{difficulty}" for i in indices for family, difficulty, _ in [config.plan(i)]]
    expected = {f"{name}.png" for name in ids}
    for folder in (images_dir, masks_dir):
        if folder.is_dir():
            stale = sorted(p.name for p in folder.iterdir() if p.name not in expected)
            if stale:
                raise ValueError(f"root: {folder} already holds {len(stale)} other file(s) "
                                 f"(e.g. {', '.join(stale[:3])}); use an empty folder")
    images_dir.mkdir(parents=True, exist_ok=True)
    masks_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for index in indices:
        sample = config.sample(index)
        Image.fromarray(sample.image).save(images_dir / f"{sample.id}.png")
        Image.fromarray(sample.mask.astype(np.uint8) * 255).save(masks_dir / f"{sample.id}.png")
        records.append(sample_record(sample))
    manifest = {
        "generator": "jaxseg_robust.data.synthetic", "version": GENERATOR_VERSION, "seed": config.seed,
        "sizes": [list(s) for s in config.sizes], "difficulties": list(config.difficulties),
        "families": list(config.families), "start": indices.start, "num": len(indices),
        "mask_rule": ">128", "samples": records,
    }
    (root / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    return root
