"""README.md's API tour runs as written: every ```python block of the section, in order, in one namespace.

Top-level expression lines whose comment starts with a value (``# 0.970``,
``# [9 9 9 9]``, ``# (3, 240, 320) (3,)``) are also checked against what the
line evaluates to, so the tour's claimed outputs cannot go stale.
"""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## API tour"


def tour_blocks(text: str) -> list[str]:
    """The ```python blocks of the API tour section (up to the next level-2 heading)."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:] if end < 0 else text[start:end]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def claimed_value(comment: str):
    """(kind, value) of a comment that starts with a value, else None."""
    comment = comment.strip()
    number = re.match(r"(-?\d+\.\d+)\b", comment)
    if number:
        return "float", number.group(1)
    if comment.startswith("["):
        return "array", comment[:comment.index("]") + 1]
    if comment.startswith("("):
        groups = re.match(r"((?:\([\d, ]*\)\s*)+)", comment).group(1)
        return "shapes", tuple(ast.literal_eval(g) for g in re.findall(r"\([\d, ]*\)", groups))
    return None


def check_claim(kind: str, claimed, value, line: str) -> None:
    if kind == "float":
        decimals = len(claimed.split(".")[1])
        assert round(float(value), decimals) == pytest.approx(float(claimed)), line
    elif kind == "array":
        assert np.array2string(np.asarray(value)) == claimed, line
    else:
        assert (tuple(value) if len(claimed) > 1 else value) == (claimed if len(claimed) > 1 else claimed[0]), line


def run_blocks(blocks: list[str]) -> tuple[dict, int]:
    """Executes the blocks statement by statement; returns (namespace, claims checked)."""
    namespace: dict = {"__name__": "readme"}
    checked = 0
    for block in blocks:
        lines = block.splitlines()
        for node in ast.parse(block).body:
            code = compile(ast.Module([node], []), "README.md", "exec")
            if not isinstance(node, ast.Expr):
                exec(code, namespace)  # noqa: S102 - the README's own code
                continue
            value = eval(compile(ast.Expression(node.value), "README.md", "eval"), namespace)  # noqa: S307
            last = lines[node.end_lineno - 1]
            comment = last.split("#", 1)[1] if "#" in last else ""
            claim = claimed_value(comment)
            if claim is not None:
                check_claim(*claim, value, last)
                checked += 1
    return namespace, checked


def test_claimed_value_parsing():
    assert claimed_value(" 0.970") == ("float", "0.970")
    assert claimed_value(" 0.829 (official boundary-iou-api)") == ("float", "0.829")
    assert claimed_value(" [9 9 9 9]") == ("array", "[9 9 9 9]")
    assert claimed_value(" (3, 240, 320) (3,) (3, 64, 64): text") == ("shapes", ((3, 240, 320), (3,), (3, 64, 64)))
    assert claimed_value(" sam_demo, sam_vit_b") is None
    with pytest.raises(AssertionError):
        check_claim("float", "0.970", 0.9, "x")


def test_a_broken_block_fails():
    with pytest.raises(NameError):
        run_blocks(["y = undefined_image + 1\n"])
    with pytest.raises(AssertionError):
        run_blocks(["1 + 1   # 3.0\n"])


def test_the_api_tour_runs_as_written():
    blocks = tour_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 2, "the API tour lost its python blocks"
    namespace, checked = run_blocks(blocks)
    assert checked >= 6
    # block 1's `masks` module is not rebound by block 2
    assert getattr(namespace["masks"], "__name__", "") == "jaxseg_robust.metrics.masks"
