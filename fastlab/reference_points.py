"""Reference points from one NVIDIA H200, measured with a plain PyTorch script (points/h200-plain-pytorch.json):
a notebook prints `beside(claim, ...)` next to its own result, so a CPU room sees what a technique did on a large GPU.
Not fastlab's reference results (results.load_reference), and no verdict reads them."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

PATH = Path(__file__).parent / "points" / "h200-plain-pytorch.json"

# claim -> the rows shown, as chains of row names: each chain prints how its rows' knobs and figures change.
CHAINS: dict[str, tuple[tuple[str, ...], ...]] = {
    "C1": (("baseline: fp32, workers=0, Adam, bs128", "+ workers=8"),),
    "C2": (("+ workers=8", "+ workers=8 + pin_memory"),),
    "C3": (("gpu-resident data (no DataLoader)", "gpu data + AMP fp16 + GradScaler", "gpu data + AMP bf16"),
           ("sweep r18 bs512 fp32 (tf32 convs)", "sweep r18 bs512 fp16+scaler", "sweep r18 bs512")),
    "C6": (("gpu-resident data (no DataLoader)", "gpu data + cudnn.benchmark"),
           ("gpu data + bf16 + channels_last", "gpu data + bf16 + cl + bench")),
    "C7": (),
    "C8": (("sweep r18 bs256", "sweep r18 bs512", "sweep r18 bs1024", "sweep r18 bs2048"),),
    "C13": (("baseline: fp32, workers=0, Adam, bs128", "+ workers=8", "gpu-resident data (no DataLoader)"),),
    "C15": (("baseline: fp32, workers=0, Adam, bs128", "seed checklist (w16+pin, fp16 AMP, bench, AdamW, bs512)"),),
}
CHAINS["C4"] = CHAINS["C3"]
FIGURES = {"C4": ("peak_memory_mib",), "C8": ("images_per_s", "peak_memory_mib")}  # else images/s
NOTES = {"C7": "no point tests it: the batch sweep (C8) has powers of two only, no neighbouring size",
         "C13": "no utilisation was recorded"}
UNITS = {"images_per_s": "images/s", "peak_memory_mib": "MiB peak memory"}


def load(path: Path = PATH) -> dict:
    """The table as measured: provenance fields and rows by name."""
    return json.loads(Path(path).read_text())


def provenance(table: dict) -> str:
    """Where the points come from, in the file's own words and figures."""
    cuda = re.search(r"\+cu(\d+)(\d)$", table["torch"])
    return textwrap.fill(
        f"Reference points, not fastlab's results and never part of a verdict: one {table['gpu']}, torch "
        f"{table['torch'].split('+')[0]}" + (f" (CUDA {cuda[1]}.{cuda[2]})" if cuda else "")
        + f", {table['host_cpus']} host CPUs, {table['date']}; a plain PyTorch script, not fastlab's harness; "
        f"short windows, about ±{_spread(table)}% run to run.", 116)


def _spread(table: dict) -> str:
    found = re.search(r"about \+-(\d+)%", table["method"])
    return found[1] if found else "?"


def _figure(value: float, key: str) -> str:
    if key == "peak_memory_mib":
        return f"{value:,.0f}"
    return f"{value / 1000:.1f}k" if value < 100_000 else f"{value / 1000:.0f}k"


def _chain_line(claim: str, rows: list[dict], key: str, baseline: dict, spread: str) -> str:
    """'C1 on an H200 (plain script, one run, ±15%): num_workers 0 -> 8, 4.4k -> 11.2k images/s (resnet18, ...)'."""
    varies = [k for k in rows[0]["knobs"] if len({str(r["knobs"][k]) for r in rows}) > 1]
    changed = ", ".join(f"{k} " + " -> ".join(str(r["knobs"][k]) for r in rows) for k in varies)
    same = rows[0]["knobs"]
    context = [same["model"]] + [f"batch {same['batch_size']}"] * ("batch_size" not in varies) + [
        f"{k} {v}" for k, v in same.items() if k not in varies and k not in ("model", "batch_size") and v != baseline[k]]
    runs = {r["repeats"] for r in rows}
    how = "one run" if runs == {1} else "median of " + "/".join(str(r["repeats"]) for r in rows) + " runs"
    return (f"  {claim} on an H200 (plain script, {how}, ±{spread}%): {changed}, "
            + " -> ".join(_figure(r[key], key) for r in rows) + f" {UNITS[key]} ({', '.join(context)})")


def beside(*claims: str, path: Path = PATH) -> str:
    """The H200's points for these claims, after their provenance: one line per chain of rows."""
    unknown = [c for c in claims if c not in CHAINS]
    if unknown or not claims:
        raise ValueError(f"claims={claims!r}: choose from {', '.join(CHAINS)}")
    table = load(path)
    by_name = {r["name"]: r for r in table["rows"]}
    lines = [provenance(table)]
    for claim in claims:
        for chain in CHAINS[claim]:
            for key in FIGURES.get(claim, ("images_per_s",)):
                lines.append(_chain_line(claim, [by_name[name] for name in chain], key, table["rows"][0]["knobs"],
                                         _spread(table)))
        if claim in NOTES:
            lines.append(f"  {claim}: {NOTES[claim]}")
    return "\n".join(lines)
