"""Model zoo: names -> configs, random initialisation, and loading converted models.

    from jaxseg_robust.models import zoo
    zoo.known_names()                      # ['sam_vit_b', 'sam_vit_h', 'sam_vit_l', ...]
    model = zoo.load("sam_vit_b")          # from $JAXSEG_ROBUST_MODELS/sam_vit_b
    model = zoo.load("/path/to/converted") # or any converted directory
    model = zoo.init("sam_vit_b", jax.random.key(0))   # random weights
    masks, scores, low_res = model.predict(image, point_coords=..., point_labels=...)
    model.segmenter, model.params          # the functional pieces (jit/vmap/grad)

Converted models live in ``$JAXSEG_ROBUST_MODELS/<name>`` (default
``~/.cache/jaxseg_robust/models/<name>``) and are made by ``python -m ports``.
Models shipped with the package (the demonstration model `DEFAULT_MODEL`,
``sam_demo``) live in ``jaxseg_robust/models/weights/<name>`` (package data);
a converted directory of the same name in the models folder takes precedence.

    model = zoo.load(zoo.DEFAULT_MODEL)    # the embedded demo model, no download

Extending: a family registers a `FamilySpec` (how to rebuild a config from
JSON, build the segmenter, wrap it as a predictor) with `register_family`,
and names with `register_model`. Registration modules listed in
`BUILTIN_REGISTRATIONS` are imported on first use (add yours there, e.g.
MobileSAM and SAM-HQ).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
from typing import Any, Callable

import jax

ENV_MODELS_DIR = "JAXSEG_ROBUST_MODELS"
DEFAULT_MODELS_DIR = "~/.cache/jaxseg_robust/models"
# The embedded demonstration model (jaxseg_robust.models.sam.demo): small, CPU-fast,
# trained on synthetic shapes only. Real evaluations use ported official checkpoints.
DEFAULT_MODEL = "sam_demo"
PACKAGE_WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent / "weights"
BUILTIN_REGISTRATIONS = ("jaxseg_robust.models.sam.registry", "jaxseg_robust.models.sam2.registry",
                         "jaxseg_robust.models.clickability.registry", "jaxseg_robust.models.clickmap.registry",
                         "jaxseg_robust.models.dense.registry", "jaxseg_robust.models.saliency.registry",
                         "jaxseg_robust.models.robustsam.registry", "jaxseg_robust.models.sam3.registry",
                         "jaxseg_robust.models.adaptiveclick.registry", "jaxseg_robust.models.cdnet.registry",
                         "jaxseg_robust.models.gpcis.registry")


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    """How the zoo handles one model family.

    Attributes:
      name: family name, as stored in a converted directory's config.json.
      config_from_dict: JSON config dict -> config object.
      with_compute_dtype: (config, "float32" | "bfloat16") -> config.
      segmenter: config -> Segmenter.
      predictor: (segmenter, params, name) -> predictor object (``set_image``/``predict``).
      port_command: command template to convert weights, with ``{out}`` and ``{checkpoint}``.
    """

    name: str
    config_from_dict: Callable[[dict], Any]
    with_compute_dtype: Callable[[Any, str], Any]
    segmenter: Callable[[Any], Any]
    predictor: Callable[[Any, Any, str], Any]
    port_command: str = "python -m ports {family} --checkpoint {checkpoint} --out {out}"


@dataclasses.dataclass(frozen=True)
class DenseFamilySpec:
    """A family of dense models (image -> per-pixel logits, no prompts; the perturbation battery's).

    Attributes:
      name: family name, as stored in a converted directory's config.json.
      model_from_config: JSON config dict -> the `jaxseg_robust.models.dense.DenseModel` (with
        ``variable_shapes()``, checked against the stored variables).
    """

    name: str
    model_from_config: Callable[[dict], Any]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A named model: family, static config and the official checkpoint file name."""

    name: str
    family: str
    config: Any
    checkpoint_hint: str = "<official checkpoint>.pth"
    description: str = ""
    port_command: str = ""  # overrides the family's (e.g. MobileSAM: family "sam", port "mobile_sam")


_FAMILIES: dict[str, FamilySpec] = {}
_MODELS: dict[str, ModelSpec] = {}
_DENSE_FAMILIES: dict[str, DenseFamilySpec] = {}
_loaded_builtins = False


def register_family(spec: FamilySpec) -> None:
    """Registers (or replaces) a model family."""
    _FAMILIES[spec.name] = spec


def register_dense_family(spec: DenseFamilySpec) -> None:
    """Registers (or replaces) a dense model family (`load_dense` loads it, `load_params` refuses it)."""
    _DENSE_FAMILIES[spec.name] = spec


def register_model(name: str, family: str, config: Any, *, checkpoint_hint: str = "",
                   description: str = "", port_command: str = "") -> None:
    """Registers (or replaces) a named model of a registered family.

    ``port_command`` (same placeholders as `FamilySpec.port_command`) is for
    a model whose weights are converted by another port than its family's.
    """
    if family not in _FAMILIES:
        raise ValueError(f"register the family '{family}' before model '{name}'")
    _MODELS[name] = ModelSpec(name, family, config,
                              checkpoint_hint or "<official checkpoint>.pth", description,
                              port_command)


def _ensure_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        _loaded_builtins = True
        for module in BUILTIN_REGISTRATIONS:
            importlib.import_module(module)


def known_names() -> list[str]:
    """Sorted names of every registered model."""
    _ensure_builtins()
    return sorted(_MODELS)


def get(name: str) -> ModelSpec:
    """The `ModelSpec` of a name.

    Raises:
      ValueError: unknown name (the message lists the known names).
    """
    _ensure_builtins()
    if name not in _MODELS:
        raise ValueError(f"unknown model '{name}'; known names: {', '.join(known_names())} "
                         f"(or pass a directory made by `python -m ports`)")
    return _MODELS[name]


def dense_families() -> tuple[str, ...]:
    """Sorted names of the registered dense families."""
    _ensure_builtins()
    return tuple(sorted(_DENSE_FAMILIES))


def family(name: str) -> FamilySpec:
    """The `FamilySpec` of a family name (ValueError if unknown)."""
    _ensure_builtins()
    if name not in _FAMILIES:
        raise ValueError(f"unknown model family '{name}'; known families: {sorted(_FAMILIES)}")
    return _FAMILIES[name]


def models_dir() -> pathlib.Path:
    """Where named converted models live: $JAXSEG_ROBUST_MODELS or ~/.cache/jaxseg_robust/models."""
    return pathlib.Path(os.environ.get(ENV_MODELS_DIR, DEFAULT_MODELS_DIR)).expanduser()


def segmenter(name: str, *, compute_dtype: str | None = None):
    """The Segmenter (static config only) of a named model."""
    spec = get(name)
    fam = family(spec.family)
    config = spec.config if compute_dtype is None else fam.with_compute_dtype(spec.config,
                                                                              compute_dtype)
    return fam.segmenter(config)


def init(name: str, key: jax.Array, *, compute_dtype: str | None = None):
    """A predictor for a named model with random weights (``.segmenter``, ``.params``).

    Args:
      name: a registered model name.
      key: PRNG key for the parameters.
      compute_dtype: optional "float32" / "bfloat16" image-encoder compute dtype.
    """
    spec = get(name)
    seg = segmenter(name, compute_dtype=compute_dtype)
    return family(spec.family).predictor(seg, seg.init(key), name)


def resolve(name_or_dir: str | os.PathLike) -> pathlib.Path:
    """The converted-model directory of a name or a path.

    A name is looked up in `models_dir`, then in the package's own weights
    (`PACKAGE_WEIGHTS_DIR`, e.g. `DEFAULT_MODEL`).

    Raises:
      ValueError: neither an existing directory nor a known name.
      FileNotFoundError: a known name whose weights were not converted yet
        (the message gives the port command).
    """
    path = pathlib.Path(os.fspath(name_or_dir)).expanduser()
    if path.is_dir():
        return path
    name = os.fspath(name_or_dir)
    spec = get(name)  # raises for unknown names
    target = models_dir() / name
    packaged = PACKAGE_WEIGHTS_DIR / name
    if not target.is_dir() and packaged.is_dir():
        return packaged
    if not target.is_dir():
        command = (spec.port_command or family(spec.family).port_command).format(
            family=spec.family, checkpoint=spec.checkpoint_hint, out=target)
        raise FileNotFoundError(
            f"model '{name}' is known but its weights are not in {target}; convert the official "
            f"checkpoint first:\n  {command}\n(or set ${ENV_MODELS_DIR} to the folder holding "
            f"converted models)")
    return target


def refuse_dense(path: os.PathLike, family_name: str) -> None:
    """StoreError when a converted directory holds a dense model (`dense_families`): it maps an
    image to logits and takes no prompts, so no prompt protocol runs it (the perturbation battery does)."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    if family_name in dense_families():
        raise store.StoreError(f"{os.fspath(path)} holds a '{family_name}' model, a dense model (image -> "
                               "per-pixel logits) that takes no prompts; prompt protocols need a promptable "
                               "model (SAM, SAM 2, SAM-HQ, RITM, SimpleClick, CFR-ICL); perturb attacks dense models")


def family_of_directory(path: os.PathLike) -> str:
    """The family a converted directory's config.json names (StoreError when it has none)."""
    from jaxseg_robust.models import store  # noqa: PLC0415

    return store.read_meta(path)["family"]


def holds_dense(path: os.PathLike) -> bool:
    """Whether ``path`` is a converted directory of a dense family (False for a name or another family)."""
    path = pathlib.Path(os.fspath(path)).expanduser()
    return path.is_dir() and family_of_directory(path) in dense_families()


def load_dense(model_dir: str | os.PathLike):
    """Loads a converted dense model directory (``python -m ports dense|semseg|upernet``; no torch needed).

    Returns:
      (model: `jaxseg_robust.models.dense.DenseModel`, variables: nested dict of numpy float32 arrays).

    Raises:
      jaxseg_robust.models.store.StoreError: a missing or damaged directory, a family that is not
        dense, or variables that do not match the stored config (naming the directory).
    """
    from jaxseg_robust.models import store  # noqa: PLC0415

    family_name = family_of_directory(model_dir)
    if family_name not in dense_families():
        raise store.StoreError(f"{os.fspath(model_dir)} holds a '{family_name}' model, which is not a dense "
                               f"model (expected one of {list(dense_families())})")
    variables, meta = store.load(model_dir)
    model = _DENSE_FAMILIES[family_name].model_from_config(meta["config"])
    store.check_tree(variables, model.variable_shapes(), what=os.fspath(model_dir))
    return model, variables


def load_params(name_or_dir: str | os.PathLike, *, compute_dtype: str | None = None):
    """Loads a converted model's pieces.

    Returns:
      (segmenter, params pytree of jax arrays, meta dict from config.json).

    Raises:
      see `resolve`; `jaxseg_robust.models.store.StoreError` for damaged directories or
      parameters that do not match the config.
    """
    from jaxseg_robust.models import store  # noqa: PLC0415

    path = resolve(name_or_dir)
    refuse_dense(path, store.read_meta(path)["family"])
    params, meta = store.load(path)
    fam = family(meta["family"])
    config = fam.config_from_dict(meta["config"])
    if compute_dtype is not None:
        config = fam.with_compute_dtype(config, compute_dtype)
    seg = fam.segmenter(config)
    store.check_tree(params, seg.param_shapes(), what=os.fspath(path))
    return seg, jax.tree.map(jax.numpy.asarray, params), meta


def load(name_or_dir: str | os.PathLike, *, compute_dtype: str | None = None):
    """A predictor (``set_image`` / ``predict``) for a converted model, by name or directory."""
    seg, params, meta = load_params(name_or_dir, compute_dtype=compute_dtype)
    name = os.fspath(name_or_dir)
    return family(meta["family"]).predictor(seg, params, name)
