"""fastlab.reference_points: one H200's figures from a plain script, shown beside the reader's own, never judged.

The points are printed with their provenance wherever they show, every figure comes from the bundled file, each
GPU claim's notebook shows them, and no verdict reads them (the verdicts agree with the file readable or not).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fastlab import claim_map, claims, reference_points
from fastlab.results import REFERENCE_DIR, RunResult
from fastlab.verdicts import verdict

ROOT = Path(__file__).resolve().parents[1]
GPU_CLAIMS = ("C1", "C2", "C3", "C4", "C6", "C7", "C8", "C13", "C15")
PROVENANCE = ("NVIDIA H200", "torch 2.11", "CUDA 13", "16 host CPUs", "a plain PyTorch script",
              "not fastlab's harness", "short windows", "±15%", "never part of a verdict")


def test_the_bundled_file_is_the_measured_table_kept_apart_from_fastlabs_reference_results():
    table = reference_points.load()
    assert "not fastlab's reference results" in table["caveat"] and len(table["rows"]) > 20
    assert reference_points.PATH.parent != REFERENCE_DIR  # results.load_reference never sees it
    assert set(reference_points.CHAINS) == set(GPU_CLAIMS)


@pytest.mark.parametrize("claim", GPU_CLAIMS)
def test_every_claims_points_print_with_their_provenance_and_one_run_each(claim):
    text = reference_points.beside(claim)
    assert all(p in " ".join(text.split()) for p in PROVENANCE), text
    shown = [line for line in text.splitlines() if line.startswith(f"  {claim} on an H200")]
    assert all("one run" in line and " -> " in line for line in shown)
    assert shown or claim in reference_points.NOTES, "a claim shows points or says why it has none"


def test_every_figure_and_provenance_word_is_read_from_the_file(tmp_path):
    table = reference_points.load()
    for row in table["rows"]:
        row["images_per_s"] *= 2
        row["peak_memory_mib"] = row.get("peak_memory_mib", 0) + 1
    table["gpu"], table["host_cpus"], table["torch"] = "Some GPU", 3, "9.9.0+cu140"
    table["method"] = table["method"].replace("about +-15%", "about +-40%")
    path = tmp_path / "points.json"
    path.write_text(json.dumps(table))
    text = " ".join(reference_points.beside("C1", "C4", path=path).split())
    assert "num_workers 0 -> 8, 8.8k -> 22.3k images/s" in text and "976 -> 707 -> 707 MiB" in text
    assert "one Some GPU, torch 9.9.0 (CUDA 14.0), 3 host CPUs" in text and "±40%" in text and "±15%" not in text
    with pytest.raises(ValueError, match="choose from"):
        reference_points.beside("C5")


def test_each_gpu_claims_notebook_shows_its_points_and_only_through_beside():
    shown: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "reference_points" not in src:
                continue
            assert "from fastlab.reference_points import beside" in src and "PATH" not in src and "load(" not in src
            for call in re.findall(r"beside\(([^)]*)\)", src):
                shown.setdefault(path.stem, set()).update(re.findall(r'"(C\d+)"', call))
    for claim in claims.CLAIMS:
        if claim.id in GPU_CLAIMS:
            assert claim.id in shown.get(claim.notebook, set()), f"{claim.notebook} does not show {claim.id}'s points"


def _fake(label: str, windows: list[float]) -> RunResult:
    return RunResult(config={"warmup_steps": 0}, label=label, status="ok", window_throughput=windows,
                     env={"device_name": "Test GPU", "profile": "smoke", "date": "2026-01-02T00:00:00+00:00"})


def test_no_verdict_reads_the_points(monkeypatch):
    """The verdicts give the same answer with the file readable and with every way to read it failing."""
    def answers() -> list[str]:
        base, fast = _fake("base", [100, 102, 104]), _fake("fast", [300, 305, 310])
        return [str(verdict(base.throughput, fast.throughput)), claims.verdict_speedup(base, fast, 2.0).verdict,
                repr(claim_map.reference_verdicts())]

    readable = answers()

    def refuse(*args, **kwargs):
        raise AssertionError("a verdict read the H200 reference points")

    monkeypatch.setattr(reference_points, "PATH", Path("/nonexistent/h200-plain-pytorch.json"))
    monkeypatch.setattr(reference_points, "load", refuse)
    monkeypatch.setattr(reference_points, "beside", refuse)
    assert answers() == readable
    users = [p.relative_to(ROOT).as_posix() for p in (ROOT / "fastlab").rglob("*.py")
             if p.name != "reference_points.py" and re.search(r"reference_points|h200-plain-pytorch", p.read_text())]
    assert users == [], "only notebooks display the points; no fastlab module reads them"
