"""The peers mode of experiments/benchmarks/bench_coco_eval.py: its measurement and its comparison.

The child's peak RSS is the child's, not this process's; the numbers of the
CLI's CSV come back in COCOeval's (panopticapi's) order; the reference is
pycocotools for mask AP and boundary-iou-api, else vernier, for the others.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"))
import bench_coco_eval  # noqa: E402

from jaxseg_robust.metrics.coco_ap import COCO_SUMMARY_NAMES  # noqa: E402
from jaxseg_robust.reports.coco_eval import summary_csv  # noqa: E402

MiB = 1024 ** 2


def test_peak_rss_is_the_childs_not_this_process(tmp_path):
    held = np.ones(300 * MiB // 8)  # this process holds 300 MiB while it launches the children
    small = bench_coco_eval.timed_child([sys.executable, "-c", "pass"], tmp_path / "small.log")
    large = bench_coco_eval.timed_child(
        [sys.executable, "-c", "import numpy as np; a = np.ones(200 * 1024 ** 2 // 8); a += 1"],
        tmp_path / "large.log")
    failed = bench_coco_eval.timed_child([sys.executable, "-c", "import sys; print('why'); sys.exit(3)"],
                                         tmp_path / "failed.log")
    assert held.sum() > 0
    assert small[2] == 0 and small[1] < 100 * MiB
    assert large[2] == 0 and 200 * MiB <= large[1] < 400 * MiB
    assert failed[2] == 3 and bench_coco_eval.last_line(tmp_path / "failed.log") == "why"
    assert all(run[0] > 0 for run in (small, large, failed))


@pytest.mark.parametrize(("task", "names"), [("boundary", COCO_SUMMARY_NAMES),
                                             ("boundary-pq", bench_coco_eval.PANOPTIC_NAMES)])
def test_cli_stats_reads_the_csv_in_the_reference_order(tmp_path, task, names):
    values = {name: index / 100 for index, name in enumerate(reversed(names))}
    path = tmp_path / "summary.csv"
    path.write_text(summary_csv(values))
    np.testing.assert_array_equal(bench_coco_eval.cli_stats(path, task), [values[name] for name in names])


@pytest.mark.parametrize(("task", "available", "expected"), [
    ("segm", {"pycocotools", "vernier-1", "boundary-iou-api"}, "pycocotools"),
    ("segm", {"vernier-1", "boundary-iou-api"}, None),
    ("boundary", {"pycocotools", "vernier-1", "boundary-iou-api"}, "boundary-iou-api"),
    ("boundary", {"pycocotools", "vernier-1"}, "vernier-1"),
    ("boundary", {"hotcoco"}, None),
    ("pq", {"hotcoco", "vernier-1", "boundary-iou-api"}, "boundary-iou-api"),
    ("boundary-pq", {"hotcoco", "vernier-1"}, "vernier-1"),
])
def test_reference(task, available, expected):
    assert bench_coco_eval.reference_key(task, available) == expected


def test_difference_text():
    reference = np.linspace(0, 1, 12)
    assert bench_coco_eval.difference_text(reference.copy(), reference) == "0 (bit-identical)"
    assert bench_coco_eval.difference_text(reference + np.eye(12)[0] * 2.5e-17, reference) == "2.5e-17"
    assert bench_coco_eval.difference_text(None, reference) == "n/a"
    assert bench_coco_eval.difference_text(reference, None) == "n/a"


def test_peers_declare_their_tasks():
    peers = {peer.key: peer for peer in bench_coco_eval.declared_peers(2)}
    assert set(peers) == {"jaxseg-cold", "jaxseg-warm", "vernier-1", "vernier-2", "hotcoco", "faster-coco-eval",
                          "pycocotools", "boundary-iou-api"}
    doing = {task: {key for key, peer in peers.items() if task in peer.tasks} for task in bench_coco_eval.TASK_TITLES}
    every = {"jaxseg-cold", "jaxseg-warm", "vernier-1", "vernier-2", "boundary-iou-api"}
    assert doing == {"segm": set(peers), "boundary": every | {"faster-coco-eval"}, "pq": every | {"hotcoco"},
                     "boundary-pq": every}
    assert all(peer.worker in bench_coco_eval.WORKERS for peer in peers.values() if peer.launch == "worker")
