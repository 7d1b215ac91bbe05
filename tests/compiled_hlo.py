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


# ---- StableHLO text (``jax.jit(f).trace(*args).lower().as_text()``) ----------------------------------------------

_FUNC = re.compile(r"^\s*func\.func\s+(?:public\s+|private\s+)?@([\w.$-]+)\(")
_CALL = re.compile(r"\bcall @([\w.$-]+)\(")


def stablehlo_functions(text: str) -> dict[str, list[str]]:
    """Every function of a StableHLO module: name -> its lines (``main`` is the entry)."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = _FUNC.match(line)
        if match:
            current = match.group(1)
            bodies[current] = []
        elif current is not None:
            bodies[current].append(line)
    return bodies


def _local_counts(lines: list[str], op: str) -> tuple[dict[int, int], list[tuple[str, int]], int]:
    """In one function: ({while depth: ``op`` count}, [(callee, while depth of the call)], deepest while).

    A ``stablehlo.while`` line opens its regions (``cond {`` ... ``} do {`` ... ``}``); the loop is
    open while the brace depth stays above the depth its line started at.
    """
    depth, open_whiles, counts, calls, deepest = 0, [], {}, [], 0
    for line in lines:
        is_while = "stablehlo.while" in line
        if is_while:
            open_whiles.append(depth)
            deepest = max(deepest, len(open_whiles))
        level = len(open_whiles) - is_while  # the while's own line sits outside its body
        if f"stablehlo.{op} " in line or f"stablehlo.{op}(" in line:
            counts[level] = counts.get(level, 0) + line.count(f"stablehlo.{op}")
        calls.extend((callee, level) for callee in _CALL.findall(line))
        depth += line.count("{") - line.count("}")
        while open_whiles and depth <= open_whiles[-1] and not is_while:
            open_whiles.pop()
    return counts, calls, deepest


def ops_by_while_depth(text: str, op: str) -> dict[int, int]:
    """How many ``stablehlo.<op>`` the module runs at each depth of while-loop nesting (0: outside every
    loop), following ``func.call`` s from ``main`` (a function called from two places counts twice)."""
    local = {name: _local_counts(lines, op) for name, lines in stablehlo_functions(text).items()}

    def counts_of(name: str, stack: tuple[str, ...]) -> dict[int, int]:
        own, calls, _ = local.get(name, ({}, [], 0))
        total = dict(own)
        for callee, level in calls:
            if callee in stack:
                continue
            for depth, count in counts_of(callee, stack + (name,)).items():
                total[level + depth] = total.get(level + depth, 0) + count
        return total

    return dict(sorted(counts_of("main", ()).items()))


def while_depth(text: str) -> int:
    """The deepest nesting of ``stablehlo.while`` in a module, following calls from ``main``."""
    local = {name: _local_counts(lines, "while") for name, lines in stablehlo_functions(text).items()}

    def deepest(name: str, stack: tuple[str, ...]) -> int:
        _, calls, own = local.get(name, ({}, [], 0))
        return max([own] + [level + deepest(callee, stack + (name,)) for callee, level in calls
                            if callee not in stack])

    return deepest("main", ())
