"""Converters from official PyTorch checkpoints to jaxseg_robust Flax parameters.

``python -m ports <family> --checkpoint <official .pth> --out <dir>``; one
module per model family, each a declarative key table (see `ports.keytable`).
torch is needed only here (``pip install 'jaxseg_robust[port]'``).
"""
