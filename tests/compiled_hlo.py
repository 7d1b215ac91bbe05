"""Helpers that read XLA's compiled HLO text (``jax.jit(f).lower(...).compile().as_text()``)."""

from __future__ import annotations

import re


def largest_relu_chain(text: str) -> int:
    """The most ``maximum`` ops (one per ReLU) in one fused computation of a compiled program."""
    bodies = re.findall(r"^%fused_computation\S* \(.*?\n(.*?)\n}", text, re.MULTILINE | re.DOTALL)
    return max((len(re.findall(r"= \S+ maximum\(", body)) for body in bodies), default=0)


def computations(text: str) -> dict[str, str]:
    """Every computation of a compiled HLO module: name -> its instruction lines (ENTRY under "ENTRY")."""
    found = {}
    for match in re.finditer(r"^(ENTRY )?%(\S+) \(.*?\n(.*?)\n}", text, re.MULTILINE | re.DOTALL):
        found["ENTRY" if match.group(1) else match.group(2)] = match.group(3)
    return found


def _reachable(name: str, comps: dict[str, str], seen: set[str]) -> str:
    """The text of computation ``name`` and of every computation it calls, transitively."""
    if name in seen or name not in comps:
        return ""
    seen.add(name)
    body = comps[name]
    callees = re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", body)
    for group in re.findall(r"branch_computations=\{([^}]*)\}", body):
        callees += re.findall(r"%([\w.\-]+)", group)
    return "\n".join([body] + [_reachable(callee, comps, seen) for callee in callees])


def _loop_bodies(text: str) -> list[str]:
    """Names of the body computations of every ``while`` in a compiled module."""
    return re.findall(r"while\([^\n]*?body=%([\w.\-]+)", text)


def loop_body_text(text: str) -> str:
    """The instructions run on every iteration of the module's ``while`` loops (bodies and their callees)."""
    comps = computations(text)
    seen: set[str] = set()
    return "\n".join(_reachable(body, comps, seen) for body in _loop_bodies(text))


def outside_loop_text(text: str) -> str:
    """The instructions of the entry computation and its callees, loop bodies excluded."""
    return _reachable("ENTRY", computations(text), set(_loop_bodies(text)))
