"""Strict ports of the dense models on synthetic inputs (no onnx, no torch needed).

* U²-Net-p: a synthetic `OnnxGraph` laid out like the PyTorch ONNX export
  (folded BatchNorm, numeric initializer names, named side/fusion convs), then
  one mutation per check of `ports.dense.name_u2net_initializers`.
* DeepLabV3: a synthetic torchvision state dict whose keys are written here
  from torchvision's module structure (independently of the key table).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import numpy as np
import pytest
from flax import traverse_util

from jaxseg_robust.models import dense
from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Config
from jaxseg_robust.models.dense.u2net import U2NETP, U2NetConfig
from jaxseg_robust.models import store
from ports.dense import (GRAPH_INPUT, OnnxGraph, OnnxNode, add_arguments, convert_deeplabv3,
                         convert_u2netp, deeplabv3_config_from_state_dict,
                         drop_batchnorm_counters, name_u2net_initializers, run, u2net_conv_plan,
                         u2net_op_counts)
from ports.keytable import PortError

from dense_configs import TINY_DEEPLAB, TINY_U2NET

# Two blocks in layer1 and layer4: blocks without a downsample branch are mapped too.
TINY_DEEPLAB = dataclasses.replace(TINY_DEEPLAB, blocks=(2, 1, 1, 2))


# ---- a synthetic U²-Net ONNX export -------------------------------------------------

def synthetic_u2net_graph(config: U2NetConfig, seed: int = 0) -> OnnxGraph:
    """An `OnnxGraph` with the export's conv order, producers, op counts and outputs."""
    rng = np.random.default_rng(seed)
    plan = u2net_conv_plan(config)
    counts = u2net_op_counts(config)
    nodes: list[OnnxNode] = []
    inits: dict[str, np.ndarray] = {}
    extra_resizes = counts["Resize"] - 5  # the other 5 upsample side2..side6
    last_relu, stage_out, conv_out = None, {}, {}
    serial = iter(range(1000, 10 ** 6))

    def node(op, inputs, attrs=None):
        out = f"t{next(serial)}"
        nodes.append(OnnxNode(op, f"{op}_{len(nodes)}", tuple(inputs), (out,), dict(attrs or {})))
        return out

    for conv in plan:
        if conv.producer == GRAPH_INPUT:
            source = "input.1"
        elif conv.producer == "Relu":
            source = last_relu
        elif conv.producer == "MaxPool":
            source = node("MaxPool", [last_relu], {"kernel_shape": (2, 2), "strides": (2, 2),
                                                   "ceil_mode": 1, "pads": (0, 0, 0, 0)})
        elif conv.producer == "Concat":
            first = last_relu
            if extra_resizes > 0:
                first = node("Resize", [last_relu], {"mode": "linear",
                                                     "coordinate_transformation_mode":
                                                     "pytorch_half_pixel"})
                extra_resizes -= 1
            source = node("Concat", [first, last_relu], {"axis": 1})
        else:  # Add: a side conv reads the output of the stage it watches
            side_of = {1: "stage1d", 2: "stage2d", 3: "stage3d", 4: "stage4d", 5: "stage5d",
                       6: "stage6"}
            source = stage_out[side_of[int(conv.name[4:])]]
        if conv.name.startswith(("side", "outconv")):
            w_name, b_name = f"{conv.name}.weight", f"{conv.name}.bias"
        else:
            w_name, b_name = str(next(serial)), str(next(serial))
        inits[w_name] = rng.standard_normal(
            (conv.out_channels, conv.in_channels, conv.kernel, conv.kernel)).astype(np.float32)
        inits[b_name] = rng.standard_normal(conv.out_channels).astype(np.float32)
        pad = conv.dilation * (conv.kernel - 1) // 2
        out = node("Conv", [source, w_name, b_name],
                   {"kernel_shape": (conv.kernel,) * 2, "dilations": (conv.dilation,) * 2,
                    "pads": (pad,) * 4, "strides": (1, 1), "group": 1})
        conv_out[conv.name] = out
        if conv.name.startswith("stage"):
            last_relu = node("Relu", [out])
            stage, module = conv.name.split(".")
            if module == "rebnconv1d":
                stage_out[stage] = node("Add", [last_relu, last_relu])
                last_relu = stage_out[stage]
    outputs = [node("Sigmoid", [conv_out["outconv"]]), node("Sigmoid", [conv_out["side1"]])]
    for k in range(2, 7):
        up = node("Resize", [conv_out[f"side{k}"]], {"mode": "linear",
                                                    "coordinate_transformation_mode":
                                                    "pytorch_half_pixel"})
        outputs.append(node("Sigmoid", [up]))
    nodes.append(OnnxNode("Shape", "Shape_plumbing", ("input.1",), ("shape0",), {}))
    return OnnxGraph(tuple(nodes), inits, ("input.1",), tuple(outputs))


def _replace_node(graph: OnnxGraph, index: int, **changes) -> OnnxGraph:
    nodes = list(graph.nodes)
    nodes[index] = dataclasses.replace(nodes[index], **changes)
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _conv_index(graph: OnnxGraph, k: int) -> int:
    return [i for i, n in enumerate(graph.nodes) if n.op_type == "Conv"][k]


@pytest.fixture(scope="module")
def graph():
    return synthetic_u2net_graph(U2NETP)


def test_u2netp_synthetic_export_converts_and_lands_in_the_right_places(graph):
    variables = convert_u2netp(graph)
    flat = traverse_util.flatten_dict(variables, sep="/")
    assert len(flat) == len(graph.initializers) == 238
    plan = u2net_conv_plan(U2NETP)
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    for conv, node in zip(plan, convs):
        path = "params/" + conv.name.replace(".", "/")
        np.testing.assert_array_equal(flat[path + "/kernel"],
                                      graph.initializers[node.inputs[1]].transpose(2, 3, 1, 0))
        np.testing.assert_array_equal(flat[path + "/bias"], graph.initializers[node.inputs[2]])


def test_tiny_u2net_config_converts_too():
    variables = convert_u2netp(synthetic_u2net_graph(TINY_U2NET, seed=1), TINY_U2NET)
    store.check_tree(variables, dense.U2NetDense(TINY_U2NET).variable_shapes(), what="tiny")


def _mutations(graph: OnnxGraph):
    c7 = _conv_index(graph, 7)  # stage1.rebnconv7 (dilation 2)
    conv7 = graph.nodes[c7]
    resize = next(i for i, n in enumerate(graph.nodes) if n.op_type == "Resize")
    pool = next(i for i, n in enumerate(graph.nodes) if n.op_type == "MaxPool")
    c2 = _conv_index(graph, 2)  # stage1.rebnconv2 reads a MaxPool
    relu = next(n for n in graph.nodes if n.op_type == "Relu")
    side1 = graph.nodes[_conv_index(graph, 112)]
    yield "dilations", _replace_node(graph, c7, attrs={**conv7.attrs, "dilations": (1, 1),
                                                       "pads": (1, 1, 1, 1)})
    yield "pytorch_half_pixel", _replace_node(
        graph, resize, attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners"})
    yield "ceil_mode", _replace_node(graph, pool, attrs={**graph.nodes[pool].attrs,
                                                         "ceil_mode": 0})
    yield "Softmax", dataclasses.replace(
        graph, nodes=graph.nodes + (OnnxNode("Softmax", "Softmax_x", ("a",), ("b",), {}),))
    yield "not used", dataclasses.replace(
        graph, initializers={**graph.initializers, "9999999": np.zeros(3, np.float32)})
    inits = dict(graph.initializers)
    inits["side2.weight"] = inits.pop("side1.weight")
    yield "sits where", _replace_node(
        dataclasses.replace(graph, initializers=inits), _conv_index(graph, 112),
        inputs=(side1.inputs[0], "side2.weight", side1.inputs[2]))
    yield "not the sigmoid", dataclasses.replace(
        graph, outputs=(graph.outputs[0], graph.outputs[2], graph.outputs[1], *graph.outputs[3:]))
    yield "expected MaxPool", _replace_node(graph, c2, inputs=(relu.outputs[0],
                                                                *graph.nodes[c2].inputs[1:]))
    yield "Conv node", dataclasses.replace(
        graph, nodes=tuple(n for i, n in enumerate(graph.nodes) if i != _conv_index(graph, 50)))
    inits = dict(graph.initializers)
    inits[conv7.inputs[1]] = inits[conv7.inputs[1]][:, :8]
    yield "shape", dataclasses.replace(graph, initializers=inits)
    c8 = graph.nodes[_conv_index(graph, 8)]  # stage1.rebnconv6d: 32 -> 16, like rebnconv5d
    c9 = _conv_index(graph, 9)
    yield "used by both", _replace_node(graph, c9, inputs=(graph.nodes[c9].inputs[0],
                                                           *c8.inputs[1:]))
    yield "graph input", dataclasses.replace(graph, inputs=("input.1", "other"))


@pytest.mark.parametrize("index", range(12))
def test_u2netp_port_rejects_each_kind_of_mismatch(graph, index):
    message, bad = list(_mutations(graph))[index]
    with pytest.raises(PortError, match=message):
        name_u2net_initializers(bad, what="synthetic.onnx")


def test_u2netp_named_arrays_go_through_the_strict_key_table(graph):
    from ports.dense import u2netp_rules
    from ports.keytable import convert

    named = name_u2net_initializers(graph)
    expected = dense.U2NetDense(U2NETP).variable_shapes()
    with pytest.raises(PortError, match="stage1.bogus.weight"):
        convert({**named, "stage1.bogus.weight": np.zeros(1, np.float32)}, u2netp_rules(),
                expected)
    named.pop("side3.bias")
    with pytest.raises(PortError, match="side3/bias"):
        convert(named, u2netp_rules(), expected)


# ---- a synthetic torchvision DeepLabV3 state dict -------------------------------------

def torchvision_deeplabv3_state_dict(cfg: DeepLabV3Config, seed: int = 0) -> dict:
    """Keys and torch-layout shapes of torchvision's DeepLabV3-ResNet for ``cfg``."""
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}

    def conv(name, out, inp, k, bias=False):
        sd[f"{name}.weight"] = rng.standard_normal((out, inp, k, k)).astype(np.float32)
        if bias:
            sd[f"{name}.bias"] = rng.standard_normal(out).astype(np.float32)

    def bn(name, c):
        sd[f"{name}.weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[f"{name}.bias"] = rng.standard_normal(c).astype(np.float32)
        sd[f"{name}.running_mean"] = rng.standard_normal(c).astype(np.float32)
        sd[f"{name}.running_var"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[f"{name}.num_batches_tracked"] = np.array(123, np.int64)

    w = cfg.width
    conv("backbone.conv1", w, 3, 7)
    bn("backbone.bn1", w)
    inplanes, layer3_out = w, None
    for i, n in enumerate(cfg.blocks):
        planes = w * 2 ** i
        for j in range(n):
            p = f"backbone.layer{i + 1}.{j}"
            conv(f"{p}.conv1", planes, inplanes if j == 0 else 4 * planes, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", 4 * planes, planes, 1)
            bn(f"{p}.bn3", 4 * planes)
            if j == 0:
                conv(f"{p}.downsample.0", 4 * planes, inplanes, 1)
                bn(f"{p}.downsample.1", 4 * planes)
        inplanes = 4 * planes
        layer3_out = inplanes if i == 2 else layer3_out
    c = cfg.aspp_channels
    conv("classifier.0.convs.0.0", c, inplanes, 1)
    bn("classifier.0.convs.0.1", c)
    for r in (1, 2, 3):
        conv(f"classifier.0.convs.{r}.0", c, inplanes, 3)
        bn(f"classifier.0.convs.{r}.1", c)
    conv("classifier.0.convs.4.1", c, inplanes, 1)
    bn("classifier.0.convs.4.2", c)
    conv("classifier.0.project.0", c, 5 * c, 1)
    bn("classifier.0.project.1", c)
    conv("classifier.1", c, c, 3)
    bn("classifier.2", c)
    conv("classifier.4", cfg.num_classes, c, 1, bias=True)
    if cfg.aux_classifier:
        conv("aux_classifier.0", layer3_out // 4, layer3_out, 3)
        bn("aux_classifier.1", layer3_out // 4)
        conv("aux_classifier.4", cfg.num_classes, layer3_out // 4, 1, bias=True)
    return sd


@pytest.fixture(scope="module")
def deeplab_state_dict():
    return torchvision_deeplabv3_state_dict(TINY_DEEPLAB)


def test_deeplabv3_config_is_read_from_the_state_dict(deeplab_state_dict):
    cfg = deeplabv3_config_from_state_dict(deeplab_state_dict)
    assert cfg.blocks == (2, 1, 1, 2) and cfg.num_classes == 5 and cfg.aux_classifier
    no_aux = {k: v for k, v in deeplab_state_dict.items() if not k.startswith("aux_")}
    assert not deeplabv3_config_from_state_dict(no_aux).aux_classifier
    with pytest.raises(PortError, match="layer"):
        deeplabv3_config_from_state_dict({"classifier.4.weight": np.zeros((5, 8, 1, 1))})
    with pytest.raises(PortError, match="classifier.4.weight"):
        deeplabv3_config_from_state_dict(
            {k: v for k, v in deeplab_state_dict.items() if k != "classifier.4.weight"})


def test_deeplabv3_port_fills_every_variable(deeplab_state_dict):
    variables = convert_deeplabv3(deeplab_state_dict, TINY_DEEPLAB)
    store.check_tree(variables, dense.DeepLabV3Dense(TINY_DEEPLAB).variable_shapes(), what="tiny")
    sd = deeplab_state_dict
    np.testing.assert_array_equal(variables["params"]["backbone"]["conv1"]["kernel"],
                                  sd["backbone.conv1.weight"].transpose(2, 3, 1, 0))
    block = "layer1_1"
    np.testing.assert_array_equal(variables["batch_stats"]["backbone"][block]["bn2"]["var"],
                                  sd["backbone.layer1.1.bn2.running_var"])
    aspp = variables["params"]["classifier"]["aspp"]
    np.testing.assert_array_equal(aspp["pooling_bn"]["scale"], sd["classifier.0.convs.4.2.weight"])
    np.testing.assert_array_equal(variables["params"]["aux_classifier"]["classifier"]["bias"],
                                  sd["aux_classifier.4.bias"])
    assert "downsample_conv" not in variables["params"]["backbone"]["layer1_1"]


def test_deeplabv3_port_is_strict(deeplab_state_dict):
    sd = deeplab_state_dict
    with pytest.raises(PortError, match="backbone.layer9.0.conv1.weight"):
        convert_deeplabv3({**sd, "backbone.layer9.0.conv1.weight": np.zeros((4, 4, 1, 1))},
                          TINY_DEEPLAB)
    missing = {k: v for k, v in sd.items() if k != "classifier.2.running_mean"}
    with pytest.raises(PortError, match="classifier.2"):
        convert_deeplabv3(missing, TINY_DEEPLAB)
    wrong = {**sd, "classifier.1.weight": np.zeros((8, 8, 1, 1), np.float32)}
    with pytest.raises(PortError, match="classifier.1.weight"):
        convert_deeplabv3(wrong, TINY_DEEPLAB)
    # A checkpoint without the auxiliary head does not fill a model that has one.
    no_aux = {k: v for k, v in sd.items() if not k.startswith("aux_")}
    with pytest.raises(PortError, match="aux_classifier"):
        convert_deeplabv3(no_aux, TINY_DEEPLAB)


def test_batchnorm_counters_are_handled_by_name(deeplab_state_dict):
    sd = deeplab_state_dict
    kept = drop_batchnorm_counters(sd)
    assert not any(k.endswith("num_batches_tracked") for k in kept)
    assert len(kept) == len(sd) - sum(k.endswith("num_batches_tracked") for k in sd)
    with pytest.raises(PortError, match="classifier.1.num_batches_tracked"):
        drop_batchnorm_counters({**sd, "classifier.1.num_batches_tracked": np.array(1)})
    no_counter = {k: v for k, v in sd.items() if k != "classifier.2.num_batches_tracked"}
    with pytest.raises(PortError, match="classifier.2"):
        drop_batchnorm_counters(no_counter)
    with pytest.raises(PortError, match="integer scalar"):
        drop_batchnorm_counters({**sd, "classifier.2.num_batches_tracked": np.array(1.5)})
    negative = {**sd, "classifier.2.running_var": -np.ones(8, np.float32)}
    with pytest.raises(PortError, match="negative"):
        drop_batchnorm_counters(negative)


# ---- converted directories and the command line -----------------------------------------

def test_converted_directories_round_trip_without_onnx_or_torch(tmp_path, graph,
                                                                deeplab_state_dict):
    u2 = convert_u2netp(graph)
    store.save(tmp_path / "u2netp", u2, family="u2netp", variant="u2netp",
               config=U2NETP.to_dict())
    model, loaded = dense.load_converted(tmp_path / "u2netp")
    assert model == dense.U2NetDense(U2NETP)
    jax.tree.map(np.testing.assert_array_equal, loaded, u2)

    dl = convert_deeplabv3(deeplab_state_dict, TINY_DEEPLAB)
    store.save(tmp_path / "dl", dl, family="deeplabv3", variant=TINY_DEEPLAB.variant,
               config=TINY_DEEPLAB.to_dict())
    model, loaded = dense.load_converted(tmp_path / "dl")
    assert model == dense.DeepLabV3Dense(TINY_DEEPLAB)
    jax.tree.map(np.testing.assert_array_equal, loaded, dl)

    store.save(tmp_path / "other", {"params": {"w": np.zeros(2)}}, family="sam", variant="x",
               config={})
    with pytest.raises(store.StoreError, match="not a dense"):
        dense.load_converted(tmp_path / "other")


def test_command_line_arguments_and_missing_files(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["u2netp", "--onnx", str(tmp_path / "none.onnx"), "--out",
                              str(tmp_path / "out")])
    assert args.dense_family == "u2netp" and not args.overwrite
    with pytest.raises(FileNotFoundError, match="none.onnx"):
        run(args)
    args = parser.parse_args(["deeplabv3", "--checkpoint", "x.pth", "--out", "o", "--overwrite"])
    assert args.dense_family == "deeplabv3" and args.overwrite
    with pytest.raises(SystemExit):
        parser.parse_args(["deeplabv3", "--out", "o"])  # --checkpoint is required
