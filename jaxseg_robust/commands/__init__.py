"""Sub-commands of the `jaxseg-robust` CLI, one module per command.

Each module defines ``register(subparsers)``, which adds its parser and sets
``func`` to a callable ``(args) -> int`` returning one of the exit codes in
`jaxseg_robust.cli`.
"""
