"""`reports.report_files.file_stem` / `safe_name`: report file names are injective and stable."""

from __future__ import annotations

import itertools

from jaxseg_robust.reports.report_files import file_stem, safe_name, sanitize_name


def test_safe_names_are_kept_and_sanitized_names_get_a_stable_hash():
    assert file_stem("grabcut", "124080") == "grabcut_124080" and safe_name("a0") == "a0"
    assert sanitize_name("a b") == sanitize_name("a_b") == "a_b"  # the old, colliding rule
    assert safe_name("a b") != safe_name("a_b") == "a_b"
    assert safe_name("a b").startswith("a_b~") and safe_name("a b") == safe_name("a b")
    assert safe_name("a b") == "a_b~" + __import__("hashlib").sha256(b"a b").hexdigest()[:8]  # no process salt


def test_distinct_keys_give_distinct_stems():
    """Per arity (a file prefix such as ``groups_`` always takes keys of one arity)."""
    texts = ["a", "b", "a b", "a_b", "a__b", "a/b", "a\\b", "", "x", "_", "é", "e", "b_c", "c", "a_b_c", "~"]
    for arity in (1, 2, 3):
        _check_injective(list(itertools.product(texts, repeat=arity)))
    assert file_stem("a_b", "c") != file_stem("a", "b_c")  # the join alone would give a_b_c twice


def _check_injective(keys):
    stems = {}
    for key in keys:
        stem = file_stem(*key)
        assert stem not in stems or stems[stem] == key, (key, stems.get(stem))
        stems[stem] = key
        assert all(ch.isascii() and (ch.isalnum() or ch in "._-~") for ch in stem), stem
