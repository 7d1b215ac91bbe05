"""Every checkpoint of the three papers' tables has a zoo name, of the right family, converted by `python -m ports`.

The papers' rows are written out below as data (paper, row label as printed,
zoo name, zoo family, official checkpoint file):

* TETRIS Table 1: 23 checkpoints, in the table's order; the file
  names are those of the authors' run.sh (repo image-seg/adv-clicks).
* RClicks: 33 checkpoints, in the row order of every benchmark
  table (the authors' notebook ``map_names_to_print``).
* BREPS: 15 checkpoints of Tables 1-3, in the tables' order; the file names
  are those of the authors' run_models.sh / runbboxparallel.sh (repo emb-ai/BREPS).

A name removed from the zoo, a name moved to another family, a checkpoint
file renamed, or a port command that ``python -m ports`` does not parse fails
here. The README's "Families and protocols" table is checked against the same
names and against the family rules (which families take boxes). No torch.
"""

from __future__ import annotations

import pathlib
import re
import shlex
from typing import NamedTuple

import pytest

from jaxseg_robust.models import zoo
from jaxseg_robust.models.base import takes_boxes
from ports.__main__ import build_parser

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
README_SECTION = "Families and protocols"


class Row(NamedTuple):
    """One checkpoint row of a paper's table."""

    label: str        # the row as the paper prints it (method, backbone, training data)
    name: str         # the zoo name it maps to
    family: str       # the zoo family of that name (`zoo.get(name).family`)
    checkpoint: str   # the official checkpoint file the authors' scripts load


SAM_ROWS = (
    Row("SAM ViT-B SA-1B", "sam_vit_b", "sam", "sam_vit_b_01ec64.pth"),
    Row("SAM ViT-L SA-1B", "sam_vit_l", "sam", "sam_vit_l_0b3195.pth"),
    Row("SAM ViT-H SA-1B", "sam_vit_h", "sam", "sam_vit_h_4b8939.pth"),
)
SAM_HQ_ROWS = (
    Row("SAM-HQ ViT-B", "sam_hq_vit_b", "sam_hq", "sam_hq_vit_b.pth"),
    Row("SAM-HQ ViT-L", "sam_hq_vit_l", "sam_hq", "sam_hq_vit_l.pth"),
    Row("SAM-HQ ViT-H", "sam_hq_vit_h", "sam_hq", "sam_hq_vit_h.pth"),
)
MOBILE_SAM = Row("MobileSAM ViT-Tiny SA-1B", "mobile_sam", "sam", "mobile_sam.pt")
CDNET_ROWS = (
    Row("CDNet RN34 C+L", "cdnet_resnet34_cocolvis", "cdnet", "cclvs_last_checkpoint.pth"),
    Row("CDNet RN34 SBD", "cdnet_resnet34_sbd", "cdnet", "sbd_last_checkpoint.pth"),
)
# The papers print "C+L"; the one released GPCIS checkpoint (the file both authors' scripts load)
# is documented as trained on SBD (docs/models/gpcis.md), hence the zoo name.
GPCIS = Row("GPCIS RN50 C+L", "gpcis_resnet50_sbd", "gpcis", "GPCIS_Resnet50.pth")
RITM_BASELINE = Row("RITM HR18 C+L", "ritm_hrnet18_cocolvis_baseline", "ritm", "coco_lvis_h18_baseline.pth")
RITM_ITERMASK = (
    Row("RITM HR18s-IT C+L", "ritm_hrnet18s_cocolvis", "ritm", "coco_lvis_h18s_itermask.pth"),
    Row("RITM HR18-IT C+L", "ritm_hrnet18_cocolvis", "ritm", "coco_lvis_h18_itermask.pth"),
    Row("RITM HR32-IT C+L", "ritm_hrnet32_cocolvis", "ritm", "coco_lvis_h32_itermask.pth"),
    Row("RITM HR18-IT SBD", "ritm_hrnet18_sbd", "ritm", "sbd_h18_itermask.pth"),
)
SIMPLECLICK_COCOLVIS = (
    Row("SimpleClick ViT-B C+L", "simpleclick_vit_b", "simpleclick", "cocolvis_vit_base.pth"),
    Row("SimpleClick ViT-L C+L", "simpleclick_vit_l", "simpleclick", "cocolvis_vit_large.pth"),
    Row("SimpleClick ViT-H C+L", "simpleclick_vit_h", "simpleclick", "cocolvis_vit_huge.pth"),
)
SIMPLECLICK_SBD = (
    Row("SimpleClick ViT-XT SBD", "simpleclick_vit_xt_sbd", "simpleclick", "sbd_vit_xtiny.pth"),
    Row("SimpleClick ViT-B SBD", "simpleclick_vit_b_sbd", "simpleclick", "sbd_vit_base.pth"),
    Row("SimpleClick ViT-L SBD", "simpleclick_vit_l_sbd", "simpleclick", "sbd_vit_large.pth"),
    Row("SimpleClick ViT-H SBD", "simpleclick_vit_h_sbd", "simpleclick", "sbd_vit_huge.pth"),
)
CFR_ICL = Row("CFR-ICL ViT-H C+L", "cfr_icl_vit_h", "simpleclick", "cocolvis_icl_vit_huge.pth")
ADAPTIVECLICK_ROWS = (
    Row("AdaptClick ViT-B C+L", "adaptiveclick_vit_base_cocolvis", "adaptiveclick",
        "adaptiveclick_base448_cocolvis.pth"),
    Row("AdaptClick ViT-B SBD", "adaptiveclick_vit_base_sbd", "adaptiveclick", "adaptiveclick_base448_sbd.pth"),
)
SAM2_ROWS = tuple(Row(f"SAM 2 Hiera-{size}", f"sam2_hiera_{name}", "sam2", f"sam2_hiera_{name}.pt")
                  for size, name in (("T", "tiny"), ("S", "small"), ("B+", "base_plus"), ("L", "large")))
SAM21_ROWS = tuple(Row(f"SAM 2.1 Hiera-{size}", f"sam2.1_hiera_{name}", "sam2", f"sam2.1_hiera_{name}.pt")
                   for size, name in (("T", "tiny"), ("S", "small"), ("B+", "base_plus"), ("L", "large")))
SAM_HQ2 = Row("SAM-HQ 2 Hiera-L", "sam2.1_hq_hiera_large", "sam2_hq", "sam2.1_hq_hiera_large.pt")
ROBUSTSAM_ROWS = tuple(Row(f"RobustSAM ViT-{size.upper()}", f"robustsam_vit_{size}", "robustsam",
                           f"robustsam_checkpoint_{size}.pth") for size in ("b", "l", "h"))

# TETRIS Table 1, top to bottom (the RITM rows print HR18s-IT first, then HR18 C+L).
TETRIS_TABLE_1 = (MOBILE_SAM, *SAM_ROWS, *SAM_HQ_ROWS, *CDNET_ROWS, GPCIS, RITM_ITERMASK[0], RITM_BASELINE,
                  *RITM_ITERMASK[1:], *SIMPLECLICK_COCOLVIS, *SIMPLECLICK_SBD, CFR_ICL)
# RClicks: the row order of all benchmark tables.
RCLICKS_TABLES = (GPCIS, *CDNET_ROWS, RITM_BASELINE, *RITM_ITERMASK, *ADAPTIVECLICK_ROWS, *SIMPLECLICK_COCOLVIS,
                  *SIMPLECLICK_SBD, CFR_ICL, MOBILE_SAM, *SAM_ROWS, *SAM_HQ_ROWS, *SAM2_ROWS, *SAM21_ROWS)
# BREPS Tables 1-3 (the same 15 rows in each).
BREPS_TABLES = (Row("MobileSAM ViT-T", "mobile_sam", "sam", "mobile_sam.pt"), *SAM_ROWS, *SAM_HQ_ROWS,
                *SAM21_ROWS, SAM_HQ2, *ROBUSTSAM_ROWS)

PAPERS = {"tetris": (TETRIS_TABLE_1, 23), "rclicks": (RCLICKS_TABLES, 33), "breps": (BREPS_TABLES, 15)}
ALL_ROWS = sorted({row for rows, _ in PAPERS.values() for row in rows})


def port_argv(name: str) -> list[str]:
    """The arguments after ``python -m ports`` of the command that converts ``name``'s official checkpoint."""
    spec = zoo.get(name)
    template = spec.port_command or zoo.family(spec.family).port_command
    command = shlex.split(template.format(family=spec.family, checkpoint=spec.checkpoint_hint, out="OUT"))
    assert command[:3] == ["python", "-m", "ports"], f"{name}: {template}"
    return command[3:]


def readme_section(title: str) -> str:
    """The text of README's ``## title`` section (up to the next level-2 heading)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^##+ {re.escape(title)}\n(.*?)(?=^## )", text, flags=re.M | re.S)
    assert match, f"README has no section '{title}'"
    return match.group(1)


def readme_table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the section's Markdown table."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_each_paper_lists_its_number_of_distinct_checkpoints(paper):
    rows, count = PAPERS[paper]
    assert len(rows) == count
    assert len({row.name for row in rows}) == count
    assert len({row.label for row in rows}) == count
    assert len({row.checkpoint for row in rows}) == count


@pytest.mark.parametrize("row", ALL_ROWS, ids=lambda row: row.name)
def test_every_papers_checkpoint_is_a_zoo_name_of_its_family(row):
    assert row.name in zoo.known_names(), f"{row.label}: no zoo name {row.name}"
    spec = zoo.get(row.name)
    assert spec.family == row.family, f"{row.label}: {row.name} is of family {spec.family}"
    assert spec.checkpoint_hint == row.checkpoint, f"{row.label}: {row.name} names {spec.checkpoint_hint}"


@pytest.mark.parametrize("row", ALL_ROWS, ids=lambda row: row.name)
def test_every_papers_checkpoint_has_a_port_command_that_ports_parses(row):
    argv = port_argv(row.name)
    args = build_parser().parse_args(argv)
    assert args.checkpoint == row.checkpoint
    assert args.out == "OUT"
    assert args.func.__module__ == f"ports.{argv[0]}"


def test_cfr_icl_converts_with_the_cfr_icl_switch_and_simpleclick_without():
    assert build_parser().parse_args(port_argv(CFR_ICL.name)).cfr_icl is True
    assert build_parser().parse_args(port_argv(SIMPLECLICK_COCOLVIS[0].name)).cfr_icl is False


def test_breps_rows_take_boxes_and_click_only_families_are_in_the_click_papers_only():
    for row in BREPS_TABLES:
        assert takes_boxes(zoo.segmenter(row.name)), row.label
    click_only = {row.name for row in ALL_ROWS if not takes_boxes(zoo.segmenter(row.name))}
    assert click_only == {row.name for row in TETRIS_TABLE_1 + RCLICKS_TABLES
                          if row.family in {"ritm", "simpleclick", "adaptiveclick", "cdnet", "gpcis"}}


def test_readme_families_table_lists_every_released_zoo_name():
    listed = set(re.findall(r"`([^`]+)`", readme_section(README_SECTION)))
    released = {name for name in zoo.known_names() if not zoo.get(name).checkpoint_hint.startswith("<")}
    assert {row.name for row in ALL_ROWS} <= released
    assert released - listed == set()


def test_readme_families_table_offers_box_protocols_exactly_to_families_that_take_boxes():
    rows = readme_table_rows(readme_section(README_SECTION))
    assert rows, "the section has no table"
    checked = set()
    for cells in rows:
        protocols = cells[2]
        if "tetris" not in protocols:
            continue  # click models and dense models: no prompt protocol of their own
        for name in re.findall(r"`([^`]+)`", cells[1]):
            boxes = takes_boxes(zoo.segmenter(name))
            assert ("breps" in protocols) == boxes, f"README row {cells[0]}: {name}"
            assert ("grid click/box" in protocols) == boxes, f"README row {cells[0]}: {name}"
            assert ("grid click" in protocols), f"README row {cells[0]}: {name}"
            checked.add(name)
    assert {row.name for row in ALL_ROWS} <= checked


def test_readme_families_table_links_resolve():
    section = readme_section(README_SECTION)
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", section)
    assert targets
    missing = [target for target in targets if not (README.parent / target).is_file()]
    assert missing == []
