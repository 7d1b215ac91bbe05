"""PASCAL VOC 2012 and Cityscapes for the semantic-segmentation attack battery (docs/models/semseg.md).

Multi-class datasets with the ECCV'24 paper's image protocol (docs/protocols/perturbation.md
§1.3): every image is attacked whole, after one resize.

======================= ==================================================== =====================
dataset                 folders under the data root                           protocol (default)
======================= ==================================================== =====================
``voc`` (21 classes)    ``VOCdevkit/VOC2012/`` (or ``VOC2012/``, or the       shorter side -> 512,
                        folder itself): ``ImageSets/Segmentation/<split>.txt``, aspect kept
                        ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png``
                        (palette indices 0..20, void 255)
``cityscapes`` (19)     ``leftImg8bit/<split>/<city>/<stem>_leftImg8bit.png``, 2048x1024 -> 1024x512
                        ``gtFine/<split>/<city>/<stem>_gtFine_labelIds.png``   (W x H)
                        (label ids 0..33, mapped to the 19 train ids, the
                        rest -> void 255)
======================= ==================================================== =====================

Resizing follows the code the paper's protocol comes from (Rony et al.'s
``dataset_ingredient.py``: torchvision ``Resize`` on PIL images): the image is
resized by Pillow's bilinear filter on uint8 (Pillow antialiases when
shrinking), the labels by torch's ``nearest`` rule (output ``o`` reads input
``floor(o * in / out)``, float32). The shorter-side rule is torchvision's:
``short -> size``, ``long -> int(size * long / short)`` (truncated, so a
375 x 500 VOC image becomes 512 x 682). The paper's §5 says the *longer* side
goes to 512 while its supplement and the code say the shorter one; the
default is the shorter side and ``ResizeRule("longer", 512)`` gives the other
reading (``long -> size``, ``short -> int(size * short / long)``).

Subsets: the whole split in the reference order (VOC: the split file's order;
Cityscapes: cities and files sorted by name, where torchvision lists them in
directory order), or its first ``num_images`` (Rony et al.'s ``num_images``).
The paper uses the whole validation sets (`EXPECTED_VAL_COUNTS`).

Samples are lazy (`SemanticRef`): listing reads only file headers and fails
at once, naming the file, for a missing folder, split file, image or label
file and for an image whose label file has another size; decoding a label
file with values outside the dataset's label set fails that sample, naming
the file. Labels are uint8 class indices with void = `VOID` (255).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from jaxseg_robust.data.instances import DatasetKeyed, Instance, InstanceRef
from jaxseg_robust.ops.labels import IGNORE_LABEL

VOID = 255
VOC_CLASSES = 21
CITYSCAPES_CLASSES = 19
# Cityscapes label ids of the 19 evaluation classes, in train-id order (cityscapesScripts' labels.py).
CITYSCAPES_EVAL_IDS = (7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33)
CITYSCAPES_MAX_ID = 33
EXPECTED_VAL_COUNTS = {"voc": 1449, "cityscapes": 500}


class SemanticDatasetError(ValueError):
    """A dataset folder or file does not fit the expected layout; the message names the file."""


@dataclasses.dataclass(frozen=True)
class ResizeRule:
    """How an image is resized before it is attacked.

    Attributes:
      mode: "shorter" (shorter side -> ``size``), "longer" (longer side ->
        ``size``), "fixed" (``size`` = (H, W)) or "none".
      size: an int for "shorter"/"longer", an (H, W) pair for "fixed", None for "none".
    """

    mode: str
    size: int | tuple[int, int] | None = None

    def __post_init__(self):
        if self.mode == "none":
            if self.size is not None:
                raise ValueError("ResizeRule('none') takes no size")
        elif self.mode in ("shorter", "longer"):
            if not isinstance(self.size, int) or self.size <= 0:
                raise ValueError(f"ResizeRule({self.mode!r}) needs a positive int size; got {self.size!r}")
        elif self.mode == "fixed":
            if (not isinstance(self.size, tuple) or len(self.size) != 2
                    or min(int(v) for v in self.size) <= 0):
                raise ValueError(f"ResizeRule('fixed') needs a positive (H, W); got {self.size!r}")
        else:
            raise ValueError(f"ResizeRule mode must be shorter, longer, fixed or none; got {self.mode!r}")

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(H', W') of an ``height x width`` image under this rule."""
        if self.mode == "none":
            return height, width
        if self.mode == "fixed":
            return int(self.size[0]), int(self.size[1])
        short, long = min(height, width), max(height, width)
        if self.mode == "shorter":
            new_short, new_long = self.size, int(self.size * long / short)
        else:
            new_short, new_long = int(self.size * short / long), self.size
        return (new_short, new_long) if height <= width else (new_long, new_short)


VOC_PROTOCOL = ResizeRule("shorter", 512)
CITYSCAPES_PROTOCOL = ResizeRule("fixed", (512, 1024))


@dataclasses.dataclass(frozen=True, eq=False)
class SemanticSample(DatasetKeyed):
    """One image with its class-label map, in memory.

    Attributes:
      id: identifier, unique within ``dataset`` (VOC: the image id;
        Cityscapes: ``"<city>/<stem>"``).
      image: uint8[H, W, 3] RGB, already resized by the protocol.
      labels: uint8[H, W] class indices, `VOID` (255) = not labelled.
      dataset: "voc" or "cityscapes" (or a caller's name).
      source_paths: (image file, label file).
    """

    id: str
    image: np.ndarray
    labels: np.ndarray
    dataset: str = ""
    source_paths: tuple[str, ...] = ()

    @property
    def size(self) -> tuple[int, int]:
        """(H, W)."""
        return int(self.image.shape[0]), int(self.image.shape[1])

    @property
    def valid(self) -> np.ndarray:
        """bool[H, W]: labelled pixels (``labels != VOID``)."""
        return self.labels != VOID

    def load(self) -> "SemanticSample":
        """The sample itself."""
        return self


@dataclasses.dataclass(frozen=True, eq=False)
class SemanticRef(DatasetKeyed):
    """A lazily decoded `SemanticSample`: key, size after resizing, and a loader.

    ``load()`` decodes, resizes and checks the label values; its errors name the file.
    """

    id: str
    height: int
    width: int
    loader: Callable[[], SemanticSample]
    dataset: str = ""
    source_paths: tuple[str, ...] = ()

    @property
    def size(self) -> tuple[int, int]:
        """(H, W) after resizing."""
        return int(self.height), int(self.width)

    def load(self) -> SemanticSample:
        """Decodes the sample; checks that it has this key and size."""
        sample = self.loader()
        if sample.key != self.key or sample.size != self.size:
            raise SemanticDatasetError(f"{self.name}: loaded {sample.name} of size {sample.size}, "
                                       f"declared {self.size}")
        return sample


# ---- resizing ---------------------------------------------------------------------------

def resize_image(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8[H, W, 3] -> uint8[h, w, 3] with Pillow's bilinear filter (torchvision ``Resize`` on PIL)."""
    height, width = size
    if image.shape[:2] == (height, width):
        return image
    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))


def nearest_indices(in_size: int, out_size: int) -> np.ndarray:
    """int64[out_size] source rows of torch's ``interpolate(mode="nearest")`` along one axis.

    ``src = min(floor(o * (in / out)), in - 1)`` with the scale and the
    product in float32, as torch's CPU kernel (identity when sizes agree).
    """
    if in_size == out_size:
        return np.arange(out_size)
    scale = np.float32(in_size) / np.float32(out_size)
    src = np.floor(np.arange(out_size, dtype=np.float32) * scale).astype(np.int64)
    return np.minimum(src, in_size - 1)


def resize_labels(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8[H, W] -> uint8[h, w] by torch's nearest rule (labels are never blended)."""
    rows = nearest_indices(labels.shape[0], size[0])
    cols = nearest_indices(labels.shape[1], size[1])
    return labels[rows[:, None], cols[None, :]]


# ---- decoding ----------------------------------------------------------------------------

def _header_size(path: pathlib.Path) -> tuple[int, int]:
    try:
        with Image.open(path) as im:
            width, height = im.size
    except (OSError, SyntaxError) as err:
        raise SemanticDatasetError(f"{path}: not a readable image ({err})") from None
    return height, width


def read_rgb(path: pathlib.Path) -> np.ndarray:
    """uint8[H, W, 3] of an image file (``Image.open(path).convert("RGB")``, as torchvision)."""
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, SyntaxError) as err:
        raise SemanticDatasetError(f"{path}: not a readable image ({err})") from None


def read_label_indices(path: pathlib.Path) -> np.ndarray:
    """uint8[H, W] of a single-channel label PNG (palette indices or grey values), as stored."""
    try:
        with Image.open(path) as im:
            if im.mode not in ("P", "L"):
                raise SemanticDatasetError(f"{path}: a label file must be a palette or 8-bit grey PNG; "
                                           f"it is mode {im.mode}")
            return np.asarray(im).astype(np.uint8)
    except (OSError, SyntaxError) as err:
        raise SemanticDatasetError(f"{path}: not a readable label file ({err})") from None


def voc_labels(raw: np.ndarray, path: pathlib.Path) -> np.ndarray:
    """Checks VOC palette indices: 0..20 and void 255 only."""
    bad = np.setdiff1d(np.unique(raw), np.r_[np.arange(VOC_CLASSES), VOID])
    if bad.size:
        raise SemanticDatasetError(f"{path}: label values {bad[:8].tolist()} are outside PASCAL VOC's "
                                   f"0..{VOC_CLASSES - 1} and void {VOID}")
    return raw


def cityscapes_train_ids(raw: np.ndarray, path: pathlib.Path) -> np.ndarray:
    """Cityscapes label ids (0..33) -> train ids 0..18, every other id -> `VOID`."""
    bad = np.unique(raw[raw > CITYSCAPES_MAX_ID])
    if bad.size:
        hint = " (a labelTrainIds file? the loader reads *_gtFine_labelIds.png)" if VOID in bad else ""
        raise SemanticDatasetError(f"{path}: values {bad[:8].tolist()} are not Cityscapes label ids "
                                   f"0..{CITYSCAPES_MAX_ID}{hint}")
    table = np.full(256, VOID, np.uint8)
    table[list(CITYSCAPES_EVAL_IDS)] = np.arange(CITYSCAPES_CLASSES, dtype=np.uint8)
    return table[raw]


def _loader(dataset: str, sample_id: str, image_path: pathlib.Path, label_path: pathlib.Path,
            size: tuple[int, int], decode_labels: Callable) -> Callable[[], SemanticSample]:
    def load() -> SemanticSample:
        image = read_rgb(image_path)
        labels = decode_labels(read_label_indices(label_path), label_path)
        if labels.shape != image.shape[:2]:
            raise SemanticDatasetError(f"{label_path}: labels are {labels.shape[1]}x{labels.shape[0]} "
                                       f"but {image_path} is {image.shape[1]}x{image.shape[0]}")
        return SemanticSample(sample_id, resize_image(image, size), resize_labels(labels, size), dataset,
                              (str(image_path), str(label_path)))

    return load


def _ref(dataset: str, sample_id: str, image_path: pathlib.Path, label_path: pathlib.Path,
         resize: ResizeRule, decode_labels: Callable) -> SemanticRef:
    for path in (image_path, label_path):
        if not path.is_file():
            raise SemanticDatasetError(f"{dataset}/{sample_id}: missing file {path}")
    original = _header_size(image_path)
    label_size = _header_size(label_path)
    if label_size != original:
        raise SemanticDatasetError(f"{label_path}: {label_size[1]}x{label_size[0]} labels for the "
                                   f"{original[1]}x{original[0]} image {image_path}")
    size = resize.output_size(*original)
    return SemanticRef(sample_id, size[0], size[1],
                       _loader(dataset, sample_id, image_path, label_path, size, decode_labels),
                       dataset, (str(image_path), str(label_path)))


def _first(refs: list, num_images: int | None, what: str) -> list:
    if num_images is None:
        return refs
    if num_images <= 0 or num_images > len(refs):
        raise SemanticDatasetError(f"num_images={num_images}: {what} has {len(refs)} images")
    return refs[:num_images]


# ---- PASCAL VOC 2012 ---------------------------------------------------------------------

def find_voc_root(root: str | pathlib.Path) -> pathlib.Path:
    """The ``VOC2012`` folder under ``root`` (``root``, ``root/VOC2012`` or ``root/VOCdevkit/VOC2012``)."""
    root = pathlib.Path(root).expanduser()
    for candidate in (root, root / "VOC2012", root / "VOCdevkit" / "VOC2012"):
        if (candidate / "ImageSets" / "Segmentation").is_dir():
            return candidate
    raise SemanticDatasetError(f"{root}: no PASCAL VOC 2012 layout (expected ImageSets/Segmentation, "
                               f"JPEGImages, SegmentationClass in {root}, {root}/VOC2012 or "
                               f"{root}/VOCdevkit/VOC2012)")


def list_voc(root: str | pathlib.Path, *, split: str = "val", resize: ResizeRule = VOC_PROTOCOL,
             num_images: int | None = None, dataset: str = "voc") -> list[SemanticRef]:
    """PASCAL VOC 2012 segmentation samples of ``split`` in the split file's order.

    Args:
      root: the data root (see `find_voc_root`).
      split: "val" (the paper), "train", "trainval".
      resize: the image protocol (default: shorter side -> 512).
      num_images: keep the first N only.
      dataset: the name in sample keys.

    Raises:
      SemanticDatasetError: naming the missing or inconsistent folder or file.
    """
    voc = find_voc_root(root)
    split_file = voc / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not split_file.is_file():
        raise SemanticDatasetError(f"missing split file {split_file}")
    ids = [line.strip() for line in split_file.read_text().splitlines() if line.strip()]
    if not ids:
        raise SemanticDatasetError(f"{split_file} lists no images")
    if len(set(ids)) != len(ids):
        raise SemanticDatasetError(f"{split_file} lists an image twice")
    ids = _first(ids, num_images, str(split_file))
    return [_ref(dataset, i, voc / "JPEGImages" / f"{i}.jpg", voc / "SegmentationClass" / f"{i}.png",
                 resize, voc_labels) for i in ids]


# ---- Cityscapes ------------------------------------------------------------------------------

IMAGE_SUFFIX, LABEL_SUFFIX = "_leftImg8bit.png", "_gtFine_labelIds.png"


def list_cityscapes(root: str | pathlib.Path, *, split: str = "val",
                    resize: ResizeRule = CITYSCAPES_PROTOCOL, num_images: int | None = None,
                    dataset: str = "cityscapes") -> list[SemanticRef]:
    """Cityscapes fine-annotation samples of ``split``, cities and files sorted by name.

    Args:
      root: the folder holding ``leftImg8bit/`` and ``gtFine/``.
      split: "val" (the paper), "train".
      resize: the image protocol (default: 1024 x 512, i.e. (H, W) = (512, 1024)).
      num_images: keep the first N only.
      dataset: the name in sample keys.

    Raises:
      SemanticDatasetError: naming the missing folder or file.
    """
    root = pathlib.Path(root).expanduser()
    images_dir, labels_dir = root / "leftImg8bit" / split, root / "gtFine" / split
    for folder in (images_dir, labels_dir):
        if not folder.is_dir():
            raise SemanticDatasetError(f"missing Cityscapes folder {folder} (expected the official "
                                       f"leftImg8bit/ and gtFine/ layout under {root})")
    pairs = []
    for city in sorted(p for p in images_dir.iterdir() if p.is_dir()):
        for image_path in sorted(city.glob("*" + IMAGE_SUFFIX)):
            stem = image_path.name[: -len(IMAGE_SUFFIX)]
            pairs.append((f"{city.name}/{stem}", image_path, labels_dir / city.name / (stem + LABEL_SUFFIX)))
    if not pairs:
        raise SemanticDatasetError(f"{images_dir}: no <city>/*{IMAGE_SUFFIX} images")
    pairs = _first(pairs, num_images, str(images_dir))
    return [_ref(dataset, i, image, label, resize, cityscapes_train_ids) for i, image, label in pairs]


LISTERS = {"voc": list_voc, "cityscapes": list_cityscapes}
CLASS_COUNTS = {"voc": VOC_CLASSES, "cityscapes": CITYSCAPES_CLASSES}
BACKGROUND_CLASS = {"voc": 0, "cityscapes": None}


def list_semantic_dataset(name: str, root: str | pathlib.Path, **options) -> list[SemanticRef]:
    """`list_voc` or `list_cityscapes` by name ("voc" | "cityscapes")."""
    if name not in LISTERS:
        raise ValueError(f"unknown semantic dataset {name!r}; expected one of {sorted(LISTERS)}")
    return LISTERS[name](root, **options)


def load_all(refs: Sequence[SemanticRef]) -> list[SemanticSample]:
    """Decodes every sample (small subsets, tests)."""
    return [ref.load() for ref in refs]


def parse_resize_rule(text: str) -> ResizeRule:
    """``"shorter:512"``, ``"longer:512"``, ``"fixed:512x1024"`` (H x W) or ``"none"`` -> `ResizeRule`.

    Raises:
      ValueError: naming the text.
    """
    mode, _, size = str(text).strip().lower().partition(":")
    try:
        if mode == "none" and not size:
            return ResizeRule("none")
        if mode in ("shorter", "longer"):
            return ResizeRule(mode, int(size))
        if mode == "fixed":
            height, width = (int(v) for v in size.split("x"))
            return ResizeRule("fixed", (height, width))
    except ValueError as error:
        raise ValueError(f"bad resize rule {text!r}: {error}") from None
    raise ValueError(f"bad resize rule {text!r}; expected shorter:N, longer:N, fixed:HxW or none")


def resize_rule(dataset: str, text: str | None = None) -> ResizeRule:
    """The `ResizeRule` of ``text`` (`parse_resize_rule`), or the paper's protocol of ``dataset`` when None."""
    if text is None:
        return VOC_PROTOCOL if dataset == "voc" else CITYSCAPES_PROTOCOL
    return parse_resize_rule(text)


def rule_text(rule: ResizeRule) -> str:
    """The `parse_resize_rule` spelling of ``rule`` (for manifests)."""
    if rule.mode == "none":
        return "none"
    if rule.mode == "fixed":
        return f"fixed:{rule.size[0]}x{rule.size[1]}"
    return f"{rule.mode}:{rule.size}"


def as_instance(sample: SemanticSample, num_classes: int) -> Instance:
    """A `SemanticSample` as a multi-class `Instance` (void 255 -> -1).

    Labels outside [0, ``num_classes``) other than `VOID` fail, naming the label file.
    """
    labels = np.asarray(sample.labels)
    bad = (labels != VOID) & (labels >= num_classes)
    if bad.any():
        where = sample.source_paths[1] if len(sample.source_paths) > 1 else sample.name
        raise SemanticDatasetError(f"{where}: labels {np.unique(labels[bad])[:5].tolist()} outside the model's "
                                   f"{num_classes} classes")
    gt = np.where(labels == VOID, IGNORE_LABEL, labels).astype(np.int8)
    return Instance(id=sample.id, image=sample.image, gt=gt, dataset=sample.dataset,
                    source_paths=sample.source_paths, num_classes=num_classes)


def instance_refs(refs: Sequence[SemanticRef], num_classes: int) -> list[InstanceRef]:
    """Lazy `InstanceRef`s of semantic samples (what the run engine takes).

    Args:
      refs: from `list_voc` / `list_cityscapes`.
      num_classes: C of the dataset (and model), at most 127 (int8 labels).
    """
    def loader(ref):
        return lambda: as_instance(ref.load(), num_classes)

    return [InstanceRef(id=ref.id, height=ref.height, width=ref.width, loader=loader(ref), dataset=ref.dataset,
                        source_paths=ref.source_paths) for ref in refs]
