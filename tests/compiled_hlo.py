"""Helpers that read XLA's compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``)."""

from __future__ import annotations

import re


def largest_relu_chain(text: str) -> int:
    """The most ``maximum`` ops (one per ReLU) in one fused computation of a compiled program."""
    bodies = re.findall(r"^%fused_computation\S* \(.*?\n(.*?)\n}", text, re.MULTILINE | re.DOTALL)
    return max((len(re.findall(r"= \S+ maximum\(", body)) for body in bodies), default=0)
