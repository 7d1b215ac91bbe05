"""Tests of the Instance record, its validation and lazy InstanceRefs."""

from __future__ import annotations

import numpy as np
import pytest

from jaxseg_robust.data.instances import (
    Instance,
    InstanceError,
    InstanceRef,
    make_instance,
    require_object,
    validate_declared_size,
    validate_instance,
    validate_key,
)


def _image(height=5, width=6):
    return np.zeros((height, width, 3), np.uint8)


def test_make_instance_converts_bool_gt_and_ignore():
    gt = np.zeros((5, 6), bool)
    gt[1:3, 2:4] = True
    ignore = np.zeros((5, 6), bool)
    ignore[0] = True
    instance = make_instance("a", _image(), gt, dataset="ds", ignore=ignore, source_paths=["x.png"])
    assert instance.gt.dtype == np.int8
    assert instance.key == ("ds", "a") and instance.name == "ds/a" and instance.size == (5, 6)
    assert (instance.gt[0] == -1).all() and instance.gt[1:3, 2:4].sum() == 4
    assert instance.source_paths == ("x.png",)
    assert instance.load() is instance


@pytest.mark.parametrize(
    "image, gt, message",
    [
        (np.zeros((5, 6, 3), np.float32), np.zeros((5, 6), np.int8), "image must be uint8"),
        (np.zeros((5, 6), np.uint8), np.zeros((5, 6), np.int8), "image must be uint8"),
        (np.zeros((5, 6, 4), np.uint8), np.zeros((5, 6), np.int8), "image must be uint8"),
        (np.zeros((0, 6, 3), np.uint8), np.zeros((0, 6), np.int8), "image is empty"),
        (_image(), np.zeros((5, 7), np.int8), "differs from image size"),
        (_image(), np.full((5, 6), 2, np.int8), "outside"),
        (_image(), np.zeros((5, 6), np.float32), "gt must be int8"),
        (_image(), np.zeros((5, 6, 1), np.int8), "gt must be int8"),
    ],
)
def test_validate_instance_names_the_instance(image, gt, message):
    bad = Instance("bad_one", image, gt, dataset="ds")
    with pytest.raises(InstanceError, match=message) as info:
        validate_instance(bad)
    assert str(info.value).startswith("ds/bad_one")


def test_make_instance_rejects_bad_inputs_by_name():
    with pytest.raises(InstanceError, match="^ds/x: gt holds values \\[3\\]"):
        make_instance("x", _image(), np.full((5, 6), 3), dataset="ds")
    with pytest.raises(InstanceError, match="^x: gt must be bool or integer"):
        make_instance("x", _image(), np.zeros((5, 6), np.float64))
    with pytest.raises(InstanceError, match="ignore must be bool"):
        make_instance("x", _image(), np.zeros((5, 6), bool), ignore=np.zeros((5, 5), bool))
    with pytest.raises(InstanceError, match="image must be uint8"):
        make_instance("x", _image().astype(np.float32), np.zeros((5, 6), bool))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"id": ""}, "non-empty str"),
        ({"id": 3}, "non-empty str"),
        ({"dataset": None}, "dataset must be a str"),
        ({"source_paths": ["a"]}, "source_paths must be a tuple"),
    ],
)
def test_validate_key(kwargs, message):
    fields = {"id": "a", "image": _image(), "gt": np.zeros((5, 6), np.int8), "dataset": "ds"} | kwargs
    with pytest.raises(InstanceError, match=message):
        validate_key(Instance(**fields))
    with pytest.raises(InstanceError, match="expected an Instance"):
        validate_key("not an instance")


def test_require_object():
    empty = make_instance("e", _image(), np.zeros((5, 6), bool), dataset="ds")
    with pytest.raises(InstanceError, match="^ds/e: gt has no object pixel"):
        require_object(empty)
    require_object(make_instance("f", _image(), np.ones((5, 6), bool)))


def test_instance_ref_loads_and_checks_key_and_size():
    target = make_instance("a", _image(5, 6), np.zeros((5, 6), bool), dataset="ds")
    ref = InstanceRef("a", 5, 6, loader=lambda: target, dataset="ds")
    assert ref.load() is target and ref.size == (5, 6) and ref.key == ("ds", "a")
    with pytest.raises(InstanceError, match=r"^ds/a: declared size \(H, W\) = \(5, 7\)"):
        InstanceRef("a", 5, 7, loader=lambda: target, dataset="ds").load()
    with pytest.raises(InstanceError, match="loader returned instance 'ds/a'"):
        InstanceRef("b", 5, 6, loader=lambda: target, dataset="ds").load()
    with pytest.raises(InstanceError, match="loader returned dict"):
        InstanceRef("a", 5, 6, loader=dict, dataset="ds").load()
    with pytest.raises(InstanceError, match="^ds/a: declared height must be a positive int"):
        validate_declared_size(InstanceRef("a", 0, 6, loader=lambda: target, dataset="ds"))
    validate_declared_size(target)
