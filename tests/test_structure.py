"""The structure the project promises (docs/ARCHITECTURE.md, "Layers"): small units and imports that point down.

* no library module over 700 lines;
* no function over 90 code lines (docstring, blank and comment-only lines not counted);
* every import of ``jaxseg_robust.X`` inside the library points to X's layer or a lower one:
  ops → metrics, prompts → models, data → runner → attacks, clicksim, evaluation → reports → runs → commands
  → cli (the package root re-exports the public API of ``runs`` lazily, so it imports from the top while
  ``import jaxseg_robust`` itself is layer 0);
* the library never imports the converters (``ports``);
* the shell (``commands/``, ``cli.py``) holds no jitted code: it imports neither ``jax.numpy`` nor
  ``jax.lax`` and calls no ``jit`` / ``vmap`` / ``grad`` (its programs live in the library).

Imports are read with ``ast`` (module level and inside functions), so a lazy import counts too, and
so does an import by name: a string that names a library module (``"jaxseg_robust.models.sam.registry"``
in a registration list) or the module name given to ``importlib.import_module`` / ``__import__``
(an f-string's leading ``"jaxseg_robust.X."`` included).
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jaxseg_robust"
MAX_MODULE_LINES = 700
MAX_FUNCTION_CODE_LINES = 90
LAYERS = {
    "__init__": 0, "ops": 0, "exit_codes": 0, "hashing": 0,
    "metrics": 1, "prompts": 1,
    "models": 2, "data": 2,
    "runner": 3,
    "attacks": 4, "clicksim": 4, "evaluation": 4,
    "reports": 5,
    "runs": 6,
    "commands": 7,
    "cli": 8, "__main__": 8,
}
PACKAGE_ROOT = "jaxseg_robust.__init__"  # the public facade: names of ``runs`` imported on first use (PEP 562)


def library_modules() -> list[pathlib.Path]:
    """Every .py file of the package."""
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(module: str) -> int:
    """Layer of a dotted module name ``jaxseg_robust.X...`` (X = the first component)."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    if head not in LAYERS:
        raise AssertionError(f"{module}: package {head!r} has no layer in tests/test_structure.py")
    return LAYERS[head]


def dotted(path: pathlib.Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return ".".join(relative.parts)


def imports_of(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import in the tree, relative imports resolved."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


MODULE_NAME = re.compile(r"jaxseg_robust(\.[A-Za-z_]\w*)+")
IMPORT_CALLS = {"import_module", "__import__"}


def names_a_module(name: str) -> bool:
    """Whether a dotted name ``jaxseg_robust.X...`` is a module or package of this checkout."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _leading_text(node: ast.AST) -> str | None:
    """A string constant's text, or an f-string's leading constant part (else None)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def string_imports_of(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import by name.

    * a string constant that is exactly the dotted name of a library module (a registration list);
    * the first argument of ``import_module(...)`` / ``__import__(...)``: a constant or an f-string
      whose leading text is ``jaxseg_robust.X.`` (the package it imports from, ``X``, is what counts).
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            text = _leading_text(node.args[0]) if callee in IMPORT_CALLS else None
            if text and (match := MODULE_NAME.match(text)):
                found.append((node.lineno, match.group(0)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and MODULE_NAME.fullmatch(node.value) and names_a_module(node.value):
            found.append((node.lineno, node.value))
    return sorted(set(found))


def code_lines(function: ast.AST, lines: list[str]) -> int:
    """Lines of a function that hold code: not blank, not comment-only, not its docstring."""
    skip = set()
    body = getattr(function, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    count = 0
    for number in range(function.lineno, function.end_lineno + 1):
        text = lines[number - 1].strip()
        if number not in skip and text and not text.startswith("#"):
            count += 1
    return count


def test_modules_are_small():
    big = {dotted(p): n for p in library_modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"library modules over {MAX_MODULE_LINES} lines: {big}"


def test_functions_are_small():
    big = {}
    for path in library_modules():
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := code_lines(node, lines)) > MAX_FUNCTION_CODE_LINES:
                    big[f"{dotted(path)}.{node.name}:{node.lineno}"] = n
    assert not big, f"functions over {MAX_FUNCTION_CODE_LINES} code lines: {big}"


def test_imports_point_down_and_never_to_the_converters():
    wrong = []
    for path in library_modules():
        module = dotted(path)
        own = max(LAYERS.values()) if module == PACKAGE_ROOT else layer_of(module)
        tree = ast.parse(path.read_text())
        for line, name in imports_of(tree, module) + string_imports_of(tree):
            if name == "ports" or name.startswith("ports."):
                wrong.append(f"{module}:{line} imports the converters ({name})")
            elif name.startswith("jaxseg_robust.") and layer_of(name) > own:
                wrong.append(f"{module}:{line} imports {name} (layer {layer_of(name)} > {own})")
    assert not wrong, "\n".join(wrong)


SHELL = ("commands", "cli")
JAX_TRANSFORMS = {"jit", "vmap", "pmap", "grad", "value_and_grad", "jacfwd", "jacrev", "checkpoint", "remat"}
JAX_ARRAY_MODULES = ("jax.numpy", "jax.lax", "jax.scipy")


def jitted_code_of(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every piece of jitted code: an import of `JAX_ARRAY_MODULES` (or ``from jax import
    numpy / lax``), a call or decoration with a `JAX_TRANSFORMS` name (``jax.jit(...)``, ``@jax.jit``,
    ``functools.partial(jax.jit, ...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith(JAX_ARRAY_MODULES)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(JAX_ARRAY_MODULES):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.ImportFrom) and node.module == "jax":
            found += [(node.lineno, f"from jax import {a.name}") for a in node.names
                      if a.name in JAX_TRANSFORMS | {"numpy", "lax", "scipy"}]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "jax" \
                and node.attr in JAX_TRANSFORMS | {"lax", "numpy"}:
            found.append((node.lineno, f"jax.{node.attr}"))
    return sorted(set(found))


def test_the_shell_holds_no_jitted_code():
    breaches = []
    for path in library_modules():
        module = dotted(path)
        if module.split(".")[1] in SHELL:
            breaches += [f"{module}:{line} {what}" for line, what in jitted_code_of(ast.parse(path.read_text()))]
    assert not breaches, f"{len(breaches)} breach(es): jitted code in the shell (move it to the library):\n" + \
        "\n".join(breaches)


@pytest.mark.parametrize("source, expected", [
    ("import jax\n\n@jax.jit\ndef f(x):\n    return x\n", [(3, "jax.jit")]),
    ("import functools, jax\nf = functools.partial(jax.vmap, in_axes=0)\n", [(2, "jax.vmap")]),
    ("import jax.numpy as jnp\nfrom jax import lax\n", [(1, "import jax.numpy"), (2, "from jax import lax")]),
    # not jitted code: placing and reading arrays, the process index
    ("import jax\nx = jax.device_get(jax.device_put(1))\ni = jax.process_index()\n", []),
])
def test_the_shell_check_sees_jitted_code(source, expected):
    assert jitted_code_of(ast.parse(source)) == expected


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    '''doc\n    more'''\n    # note\n\n    return 1\n", 2),
    ("def f():\n    x = 1\n    y = 2\n    return x + y\n", 4),
])
def test_code_lines_count_what_they_say(source, expected):
    function = ast.parse(source).body[0]
    assert code_lines(function, source.splitlines()) == expected


def test_the_layer_check_sees_an_upward_import():
    tree = ast.parse("def f():\n    from jaxseg_robust.cli import EXIT_OK\n")
    (line, name), = imports_of(tree, "jaxseg_robust.metrics.masks")
    assert layer_of(name) > layer_of("jaxseg_robust.metrics.masks") and line == 2


@pytest.mark.parametrize("source, expected", [
    ('BUILTINS = ("jaxseg_robust.ops.distance", "jaxseg_robust.clicksim.click_models")\n',
     [(1, "jaxseg_robust.clicksim.click_models"), (1, "jaxseg_robust.ops.distance")]),
    ('import importlib\n\ndef f(kind):\n    return importlib.import_module(f"jaxseg_robust.commands.{kind}")\n',
     [(4, "jaxseg_robust.commands")]),
    ('def f():\n    return __import__("jaxseg_robust.reports.run_report")\n',
     [(2, "jaxseg_robust.reports.run_report")]),
    # not imports: prose, a name of no module, a version tag
    ('"""jaxseg_robust.data."""\nA = "jaxseg_robust.nothing_here"\nB = "jaxseg_robust.run/1"\n', []),
])
def test_string_imports_are_seen(source, expected):
    assert string_imports_of(ast.parse(source)) == expected


def test_the_layer_check_sees_an_upward_string_import():
    tree = ast.parse('REGISTRATIONS = ("jaxseg_robust.clicksim.click_models",)\n')
    (line, name), = string_imports_of(tree)
    assert layer_of(name) > layer_of("jaxseg_robust.models.zoo") and line == 1


SEAM_MODULES = {"jaxseg_robust.models", "jaxseg_robust.models.base", "jaxseg_robust.models.zoo",
                "jaxseg_robust.models.store"}


def family_imports_of(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a model family's own module (anything under models/ but the seam)."""
    return [(line, name) for line, name in imports_of(tree, module)
            if name.startswith("jaxseg_robust.models") and name not in SEAM_MODULES]


def segmenter_probes_of(tree: ast.AST) -> list[int]:
    """Lines of ``getattr`` / ``hasattr`` calls whose first argument names a segmenter or a model."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and node.args and re.search(r"segmenter|model\b", ast.unparse(node.args[0])):
            lines.append(node.lineno)
    return lines


def test_the_shell_reaches_families_only_through_the_seam():
    # Family differences are declared in models/base.py's FamilyRules and SegmenterBase (docs/ARCHITECTURE.md):
    # the shell imports no family module and nothing outside models/base.py probes a segmenter's attributes.
    family_imports, probes = [], []
    for path in library_modules():
        module, tree = dotted(path), ast.parse(path.read_text())
        if module.split(".")[1] in SHELL:
            family_imports += [f"{module}:{line} imports {name}" for line, name in family_imports_of(tree, module)]
        if module != "jaxseg_robust.models.base":
            probes += [f"{module}:{line}" for line in segmenter_probes_of(tree)]
    assert not family_imports, "\n".join(family_imports)
    assert not probes, "getattr/hasattr on a segmenter outside models/base.py:\n" + "\n".join(probes)


def test_the_seam_check_sees_family_imports_and_probes():
    tree = ast.parse("from jaxseg_robust.models.clickmap.isegm import x\nfrom jaxseg_robust.models.base import y\n"
                     "a = getattr(model.segmenter, 'frame_policy', None)\nb = hasattr(self, 'name')\n")
    assert family_imports_of(tree, "jaxseg_robust.commands.x") == [(1, "jaxseg_robust.models.clickmap.isegm")]
    assert segmenter_probes_of(tree) == [3]
