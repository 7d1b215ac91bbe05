"""Benchmark: the ViT layers SimpleClick's attack differentiates through, forward and forward + reverse.

Pieces (ViT-B shapes by default: 12 heads of width 64, MLP 3072, embedding 768):
  * ``attention``: `jaxseg_robust.ops.attention.softmax_attention` (heads-first, hand-written
    reverse pass) vs the einsum + ``jax.nn.softmax`` composition in the token-major layout
    the project used before (derivative by autodiff), vs torch ``bmm`` + ``softmax``;
    shapes: one global block (1 x 12 x 784), 4 and 16 windows of 196 tokens, batch 4 x 784;
  * ``gelu``: `jaxseg_robust.models.clickmap.layers.gelu` (torch's ``erf`` form) vs
    ``jax.nn.gelu(approximate=False)`` (``erfc`` form) vs torch ``F.gelu``, 784 x 3072;
  * ``layernorm``: `LayerNorm`'s `standardise_last_axis` (closed-form reverse pass) vs the
    autodiff composition vs torch ``nn.LayerNorm``, 784 x 768.

The reverse pass is the gradient of ``sum(piece(x) * W)`` with respect to the input (the
attack's case: no weight gradients; torch's parameters are frozen). Every piece is first
checked against the composition (values and gradients, float32 tolerances printed).
Each time is the minimum over ``--repeats`` calls, in ms; ratios ``composition / ours``
and ``torch / ours`` (> 1: ours faster), all in one process.

Run (CPU, under the lock, tuned allocator as docs/benchmarking.md):
``python experiments/benchmarks/bench_vit_layers.py [--repeats 15] [--pieces attention,gelu]``.
torch is optional: without it the torch column is left out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
HEADS, WIDTH = 12, 64
ATTENTION_SHAPES = ((1, 784), (4, 196), (16, 196), (4, 784))  # (batch or windows, tokens)


def best_ms(fn, repeats: int) -> float:
    """Minimum wall time of ``fn()`` over ``repeats`` calls after one warm-up, in ms."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def jax_pair(fn, x, w):
    """(forward, forward + reverse) jitted callables of ``fn`` on input ``x``, cotangent weights ``w``."""
    import jax

    forward = jax.jit(fn)
    grad = jax.jit(jax.grad(lambda x: (fn(x) * w).sum()))
    return (lambda: jax.block_until_ready(forward(x))), (lambda: jax.block_until_ready(grad(x))), forward, grad


def torch_pair(fn, x, w):
    """(forward, forward + reverse) torch callables; ``None`` without torch."""
    if fn is None:
        return None
    import torch

    tx, tw = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(w))

    def forward():
        with torch.no_grad():
            fn(tx)

    def both():
        leaf = tx.clone().requires_grad_(True)
        torch.autograd.grad((fn(leaf) * tw).sum(), leaf)

    return forward, both


def compare(name: str, shape_note: str, ours, composition, reference, x, w, repeats: int) -> None:
    """Check ours against the composition, then print one row per pass."""
    o_fwd, o_both, o_f, o_g = jax_pair(ours, x, w)
    c_fwd, c_both, c_f, c_g = jax_pair(composition, x, w)
    value_err = float(np.abs(np.asarray(o_f(x)) - np.asarray(c_f(x))).max())
    grad_ref = np.asarray(c_g(x))
    grad_err = float(np.abs(np.asarray(o_g(x)) - grad_ref).max() / np.abs(grad_ref).max())
    t = torch_pair(reference, x, w)
    for label, ours_fn, comp_fn, torch_fn in (("forward", o_fwd, c_fwd, t and t[0]),
                                              ("fwd+rev", o_both, c_both, t and t[1])):
        ours_ms, comp_ms = best_ms(ours_fn, repeats), best_ms(comp_fn, repeats)
        torch_ms = best_ms(torch_fn, repeats) if torch_fn else float("nan")
        print(f"{name:10s} {shape_note:18s} {label:8s} {comp_ms:9.2f} {ours_ms:9.2f} {torch_ms:9.2f} "
              f"{comp_ms / ours_ms:8.2f} {torch_ms / ours_ms:8.2f}   max|dvalue| {value_err:.1e} "
              f"grad rel {grad_err:.1e}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--pieces", default="attention,gelu,layernorm")
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from jaxseg_robust.models.clickmap.layers import gelu, standardise_last_axis
    from jaxseg_robust.ops.attention import softmax_attention

    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None
    print(f"# bench_vit_layers  jax {jax.__version__}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ", no torch")
          + f"; python {sys.version.split()[0]}; MALLOC env "
          + str({k: os.environ[k] for k in MALLOC_VARIABLES if k in os.environ}))
    print(f"{'piece':10s} {'shape':18s} {'pass':8s} {'compose':>9s} {'ours':>9s} {'torch':>9s} "
          f"{'comp/our':>8s} {'torch/our':>8s}   (ms, min of {args.repeats})")
    rng = np.random.default_rng(0)
    pieces = args.pieces.split(",")
    scale = WIDTH ** -0.5
    if "attention" in pieces:
        def ours(qkv):  # qkv [B, N, 3, h, d] as the qkv projection gives it
            q, k, v = qkv.transpose(2, 0, 3, 1, 4)
            return softmax_attention(q * scale, k, v).transpose(0, 2, 1, 3)

        def composition(qkv):
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            probabilities = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q * scale, k), axis=-1)
            return jnp.einsum("bhqk,bkhd->bqhd", probabilities, v)

        def reference(qkv):
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            return ((q * scale) @ k.transpose(-2, -1)).softmax(-1).matmul(v).transpose(1, 2)

        for batch, tokens in ATTENTION_SHAPES:
            x = rng.standard_normal((batch, tokens, 3, HEADS, WIDTH)).astype(np.float32)
            w = rng.standard_normal((batch, tokens, HEADS, WIDTH)).astype(np.float32)
            compare("attention", f"{batch}x{HEADS}x{tokens}", ours, composition, torch and reference,
                    jnp.asarray(x), jnp.asarray(w), args.repeats)
    if "gelu" in pieces:
        x = (2 * rng.standard_normal((784, 3072))).astype(np.float32)
        w = rng.standard_normal(x.shape).astype(np.float32)
        compare("gelu", "784x3072", gelu, lambda v: jax.nn.gelu(v, approximate=False),
                torch and torch.nn.functional.gelu, jnp.asarray(x), jnp.asarray(w), args.repeats)
    if "layernorm" in pieces:
        x = (rng.standard_normal((784, 768)) + 0.5).astype(np.float32)
        w = rng.standard_normal(x.shape).astype(np.float32)

        def composed(v):
            mean = v.mean(-1, keepdims=True)
            return (v - mean) / jnp.sqrt(jnp.square(v - mean).mean(-1, keepdims=True) + 1e-6)

        reference = None
        if torch:
            def reference(v):
                return torch.nn.functional.layer_norm(v, (768,), eps=1e-6)
        compare("layernorm", "784x768", lambda v: standardise_last_axis(v, 1e-6), composed, reference,
                jnp.asarray(x), jnp.asarray(w), args.repeats)


if __name__ == "__main__":
    main()
