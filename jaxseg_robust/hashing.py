"""The project's hashes, one copy each: files, instance keys and safe file names.

* `file_sha256` / `update_with_file`: SHA-256 of a file's bytes, read in chunks
  (checkpoint and dataset fingerprints, converted-model sources, user-box files);
* `key_digest`: SHA-256 of an instance key ``(dataset, id)``; its first 4
  bytes are the instance's seed (`instance_seed`, randomised protocols), its
  first 8 the process that owns it (`jaxseg_robust.runner.sharding.process_owns`);
* `file_stem`: a name that is safe as a file name (itself when it already is,
  else a sanitised form plus 8 hex digits of its SHA-256, so distinct names
  stay distinct).
"""

from __future__ import annotations

import hashlib
import os
import re

_CHUNK = 1 << 20
_PLAIN = re.compile(r"[A-Za-z0-9._-]+")


def update_with_file(hasher, path: str | os.PathLike, chunk_bytes: int = _CHUNK) -> None:
    """Feeds a file's bytes into ``hasher`` in chunks."""
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            hasher.update(chunk)


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of one file's bytes."""
    hasher = hashlib.sha256()
    update_with_file(hasher, path)
    return hasher.hexdigest()


def key_digest(key: tuple[str, str]) -> bytes:
    """SHA-256 digest of an instance key ``(dataset, id)`` (stable across processes, unlike ``hash``)."""
    return hashlib.sha256(f"{key[0]}\x00{key[1]}".encode()).digest()


def instance_seed(key: tuple[str, str]) -> int:
    """A uint32 seed that depends only on the key ``(dataset, id)`` (first 4 bytes of `key_digest`, little-endian)."""
    return int.from_bytes(key_digest(key)[:4], "little")


def file_stem(text: str) -> str:
    """``text`` itself when it is a plain file name (letters, digits, ``._-``), else a safe name + hash.

    Distinct texts give distinct stems (``"a b"`` -> ``a_b-<8 hex>``, ``"a_b"`` -> ``a_b``).
    """
    text = str(text)
    if _PLAIN.fullmatch(text) and text not in (".", ".."):
        return text
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "x"
    return f"{safe}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:8]}"


__all__ = ["update_with_file", "file_sha256", "key_digest", "instance_seed", "file_stem"]
