"""The declared dependencies equal the imported ones (pyproject.toml against every import of the package).

Every third-party name the library (``jaxseg_robust``) and the converters (``ports``) import is read
with ``ast``, at module level and inside functions, and checked against ``pyproject.toml``:

* an import at module level needs a core dependency (a plain ``pip install .`` imports that module),
  unless the whole module is an optional one listed in `OPTIONAL_MODULES` with its extra;
* an import inside a function (lazy: only the feature that needs it pays for it) needs a core
  dependency or a user-facing extra (`USER_EXTRAS`: not ``test`` or ``reference``, which a user who
  runs the tool does not install);
* every core dependency and every package of a user-facing extra is imported somewhere (a declared
  dependency is one the code uses), except the few in `DECLARED_FOR_OTHERS` with their reason.

Import names map to distributions through the installed metadata
(``importlib.metadata.packages_distributions``) and, for packages of extras that are not installed
here, through `KNOWN_DISTRIBUTIONS`; an unknown name fails with a line saying where to add it.
"""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
from collections.abc import Iterable, Mapping

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("jaxseg_robust", "ports")
FIRST_PARTY = {"jaxseg_robust", "ports"}
USER_EXTRAS = ("coco", "rclicks", "tfds", "port", "progress")
# Modules a plain install never imports: their module-level imports need the named extra.
OPTIONAL_MODULES = {"jaxseg_robust/data/tfds_builders.py": "tfds"}
# Import name -> distribution, for optional packages that may not be installed where the test runs.
KNOWN_DISTRIBUTIONS = {
    "torch": "torch", "onnx": "onnx", "ot": "pot", "tensorflow_datasets": "tensorflow-datasets",
    "pycocotools": "pycocotools", "scipy": "scipy", "tqdm": "tqdm", "chex": "chex",
}
# Declared for a package that uses it without declaring it; nothing of ours imports it.
DECLARED_FOR_OTHERS = {
    "importlib-resources": "tensorflow-datasets resolves its builders' code paths with it undeclared",
}


def normalised(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a requirement string names (``"jax>=0.6"`` -> ``"jax"``)."""
    return normalised(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def declared(pyproject: Mapping) -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, {extra: distributions}) of a parsed pyproject.toml."""
    project = pyproject["project"]
    core = {requirement_name(r) for r in project["dependencies"]}
    extras = {extra: {requirement_name(r) for r in requirements}
              for extra, requirements in project.get("optional-dependencies", {}).items()}
    return core, extras


def third_party_imports(source: str, path: str) -> list[tuple[str, int, bool]]:
    """(top-level import name, line, lazy) of every absolute import that is not stdlib or first party.

    ``lazy`` is True for an import inside a function body (at any depth).
    """
    found = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name.split(".")[0], child.lineno, inside) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                found.append((child.module.split(".")[0], child.lineno, inside))
            visit(child, inside)

    visit(ast.parse(source, filename=path), False)
    return [(name, line, lazy) for name, line, lazy in found
            if name not in sys.stdlib_module_names and name not in FIRST_PARTY and name != "__future__"]


def distribution_of(import_name: str, installed: Mapping[str, list[str]]) -> str | None:
    """The distribution that provides a top-level import name, or None when unknown."""
    if import_name in installed:
        return normalised(installed[import_name][0])
    known = KNOWN_DISTRIBUTIONS.get(import_name)
    return normalised(known) if known else None


def dependency_problems(files: Mapping[str, str], core: set[str], extras: Mapping[str, set[str]],
                        installed: Mapping[str, list[str]]) -> list[str]:
    """One line per import that the declared dependencies do not cover, and per unused declaration.

    Args:
      files: {path relative to the repository: source text}.
      core, extras: the declared distributions (`declared`).
      installed: import name -> distributions (``packages_distributions()``).
    """
    user_extras = {extra: extras.get(extra, set()) for extra in USER_EXTRAS}
    optional = set().union(*user_extras.values())
    problems, used = [], set()
    for path, source in sorted(files.items()):
        module_extra = OPTIONAL_MODULES.get(path)
        for name, line, lazy in third_party_imports(source, path):
            dist = distribution_of(name, installed)
            where = f"{path}:{line}: import {name}"
            if dist is None:
                problems.append(f"{where}: unknown distribution (add it to KNOWN_DISTRIBUTIONS and pyproject.toml)")
                continue
            used.add(dist)
            if dist in core:
                continue
            if module_extra is not None:
                if dist not in extras.get(module_extra, set()):
                    problems.append(f"{where}: {dist} is not in the extra {module_extra!r} that guards this module")
            elif not lazy:
                problems.append(f"{where}: {dist} is imported at module level but is not a core dependency")
            elif dist not in optional:
                problems.append(f"{where}: {dist} is in no user-facing extra {USER_EXTRAS}")
    for dist in sorted((core | optional) - used - set(DECLARED_FOR_OTHERS)):
        problems.append(f"pyproject.toml: {dist} is declared but nothing in {SOURCES} imports it")
    return problems


def source_files() -> dict[str, str]:
    """{relative path: text} of every .py file of the library and the converters."""
    return {path.relative_to(ROOT).as_posix(): path.read_text()
            for source in SOURCES for path in sorted((ROOT / source).rglob("*.py"))}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _installed() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def test_every_import_is_declared_and_every_declaration_is_imported():
    core, extras = declared(_pyproject())
    problems = dependency_problems(source_files(), core, extras, _installed())
    assert not problems, "\n".join(problems)


def test_the_core_is_the_design_cards_packages():
    """A plain install gets the numeric core the library is built on (chex included: shape checks)."""
    core, _ = declared(_pyproject())
    assert {"jax", "flax", "optax", "orbax-checkpoint", "chex", "numpy"} <= core
    assert not core & {"torch", "torchvision", "tensorflow", "tensorflow-datasets", "onnx"}


def _moved(core: set[str], extras: Mapping[str, set[str]], dist: str, extra: str):
    moved = {name: set(members) for name, members in extras.items()}
    moved.setdefault(extra, set()).add(dist)
    return core - {dist}, moved


@pytest.mark.parametrize("dist, extra", [("chex", "test"), ("optax", "port"), ("pillow", "coco")])
def test_a_core_import_moved_to_an_extra_is_named(dist, extra):
    core, extras = declared(_pyproject())
    problems = dependency_problems(source_files(), *_moved(core, extras, dist, extra), _installed())
    assert problems and all("not a core dependency" in line for line in problems), problems
    assert any(line.startswith("jaxseg_robust/") for line in problems)


def test_a_lazy_import_needs_a_user_facing_extra():
    core, extras = declared(_pyproject())
    without_onnx = {name: members - {"onnx"} for name, members in extras.items()}
    without_onnx["reference"] = without_onnx.get("reference", set()) | {"onnx"}
    problems = dependency_problems(source_files(), core, without_onnx, _installed())
    assert any(line.startswith("ports/dense.py") and "onnx is in no user-facing extra" in line for line in problems)


def test_unknown_and_unused_distributions_are_named():
    files = {"jaxseg_robust/x.py": "import numpy\n\ndef f():\n    import notapackage_xyz\n"}
    problems = dependency_problems(files, {"numpy", "jax"}, {}, {"numpy": ["numpy"]})
    assert "jaxseg_robust/x.py:4: import notapackage_xyz: unknown distribution" in problems[0]
    assert problems[1] == "pyproject.toml: jax is declared but nothing in ('jaxseg_robust', 'ports') imports it"


def test_imports_are_read_at_module_level_and_inside_functions():
    source = ("import os\nimport numpy as np\nfrom jax import numpy\nfrom . import sibling\n"
              "try:\n    import scipy\nexcept ImportError:\n    scipy = None\n"
              "class A:\n    def f(self):\n        from torch import nn\n")
    assert third_party_imports(source, "m.py") == [("numpy", 2, False), ("jax", 3, False),
                                                    ("scipy", 6, False), ("torch", 11, True)]


def _names(requirements: Iterable[str]) -> list[str]:
    return [requirement_name(r) for r in requirements]


def test_requirement_names_are_normalised():
    assert _names(["jax>=0.6", "orbax_checkpoint>=0.11", "Pillow", "segment-anything==1.0"]) == [
        "jax", "orbax-checkpoint", "pillow", "segment-anything"]
