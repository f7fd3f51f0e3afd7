"""The checklist table: each technique, whether it applies here, what it did here and on the reference GPU.

From ladder results (fastlab.bench.run_ladder), against the rung it was built on (the last one below it kept):

    effect = median images/s of the rung that added it / that of the rung it was built on
    outcome effect = median seconds to target of the rung it was built on / that of the rung that added it
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .outcomes import TimeToAccuracy, built_on
from .results import RunResult
from .verdicts import verdict


@dataclass(frozen=True)
class ChecklistLine:
    """One checklist line: the ladder rung that adds it, the knobs it sets, any condition on that rung."""

    name: str  # as in fastlab.environment_report.techniques_here()
    rung: str  # "" when the technique is not a ladder rung (see `elsewhere`)
    knobs: tuple[str, ...]
    when: dict[str, Any] = field(default_factory=dict)  # the rung's config must have these values
    elsewhere: str = ""  # for a technique off the ladder: where the workbook measures it


# In the ladder's order, mapped onto the rungs of fastlab.bench.ladder.
TECHNIQUES: tuple[ChecklistLine, ...] = (
    ChecklistLine("DataLoader workers", "workers", ("num_workers",)),
    ChecklistLine("pin_memory + non_blocking", "workers", ("pin_memory", "non_blocking")),
    ChecklistLine("fp16 autocast + GradScaler", "amp", ("amp",), {"amp": "fp16"}),
    ChecklistLine("bf16 autocast", "amp", ("amp",), {"amp": "bf16"}),
    ChecklistLine("cudnn.benchmark", "cudnn", ("cudnn_benchmark",)),
    ChecklistLine("channels_last", "channels_last", ("channels_last",)),
    ChecklistLine("fused / foreach optimisers", "fused_adamw", ("opt_impl",)),
    ChecklistLine("device-resident loader", "device_loader", ("loader",)),
    ChecklistLine("larger batch", "large_batch", ("batch_size",)),
    ChecklistLine("torch.compile", "all_on", ("compile",)),
    ChecklistLine("TF32", "", ("tf32", "matmul_precision"),
              elsewhere="not a ladder rung: conv TF32 is on in every rung, as in stock PyTorch; notebook 03 "
                        "(03_cudnn_benchmark_and_channels_last:tf32) compares strict fp32, conv TF32 and TF32 matmuls"),
)


@dataclass(frozen=True)
class ChecklistRow:
    technique: str
    applies: str  # "yes" / "no", with the reason
    here: str  # the measured effect on this machine
    reference: dict[str, str]  # device name -> the measured effect there
    outcome: str = ""  # the effect on time to accuracy over seeds, when the time-to-accuracy ladder was run


def _rung_of(rows: Sequence[RunResult], technique: ChecklistLine, skipped: dict[str, str] | None) -> int | str:
    """Where the technique's rung is among the ladder's runs, or why it cannot be read there."""
    rungs = [r.rung for r in rows]
    if technique.rung not in rungs:
        why = (skipped or {}).get(technique.rung)
        return f"not measured: {why}" if why else "not measured (its rung was not run)"
    r = rows[rungs.index(technique.rung)]
    for knob, wanted in technique.when.items():
        if r.config.get(knob) != wanted:
            return f"not on this ladder (its {technique.rung} rung used {knob}={r.config.get(knob)})"
    return rungs.index(technique.rung)


def effect(results: Sequence[RunResult], technique: ChecklistLine, skipped: dict[str, str] | None = None) -> str:
    """What adding `technique` did on the ladder `results`: a ratio, or why there is none."""
    i = _rung_of(results, technique, skipped) if technique.rung else technique.elsewhere
    if isinstance(i, str):
        return i
    r = results[i]
    if all(k in r.no_ops for k in technique.knobs):
        return f"no-op here: {r.no_ops[technique.knobs[0]]}"
    if not r.window_throughput:
        return f"{r.status}: {r.error or 'no timed window finished'}"
    base = built_on(results, i)
    if base is None or not base.window_throughput:
        return "no baseline to compare with"
    c = verdict(base.throughput, r.throughput)
    text = f"{c.ratio:.2f}x"
    if r.status == "diverged":
        step = f" at step {r.diverged_step}" if r.diverged_step is not None else ""
        text = f"DIVERGED{step} ({r.error or 'non-finite loss'}): {c.ratio:.2f}x images/s, not credited"
    elif c.noise:
        text += " (noise)"
    if r.dropped:
        text += ": a trap here, dropped from the rungs above"
    partners = [t.name for t in TECHNIQUES if t.rung == technique.rung and t is not technique and not t.when]
    if partners and not technique.when:
        text += f" (one step with {', '.join(partners)})"
    return text


def outcome_effect(ttas: Sequence[TimeToAccuracy], technique: ChecklistLine, skipped: dict[str, str] | None = None) -> str:
    """What adding `technique` did to seconds to target over seeds, against the rung it was built on."""
    firsts = [t.runs[0] for t in ttas]
    i = _rung_of(firsts, technique, skipped) if technique.rung else "not a ladder rung"
    if isinstance(i, str):
        return i
    t, n = ttas[i], len(ttas[i].runs)
    diverged = sum(r.status == "diverged" for r in t.runs)
    if diverged:
        return f"DIVERGED in {diverged} of {n} seeds: no time to accuracy"
    if t.reached == 0:
        return f"target {t.target:.0%} not reached in any of {n} seeds"
    base = built_on(ttas, i)
    if base is None or base.reached == 0:
        return f"{t.seconds.median:.1f} s to {t.target:.0%} ({t.reached} of {n} seeds); no baseline that reached it"
    c = verdict(base.seconds, t.seconds, "s", higher_is_better=False)
    noise = " (noise)" if c.noise else ""
    return f"{c.gain:.2f}x{noise} ({t.reached} of {n} seeds reached {t.target:.0%}; against {base.label})"


def build_checklist(results: Sequence[RunResult], techniques_here: Sequence[tuple[str, bool, str]],
                    reference: dict[str, list[RunResult]] | None = None, skipped: dict[str, str] | None = None,
                    tta: Sequence[TimeToAccuracy] | None = None, tta_skipped: dict[str, str] | None = None,
                    ) -> list[ChecklistRow]:
    """One row per technique of the ladder. techniques_here: (name, applies?, why) as from
    fastlab.environment_report.techniques_here(); reference: bundled ladder results by device name; skipped: rung
    -> why it was not run; tta: the time-to-accuracy ladder (adds the outcome column); tta_skipped: likewise."""
    if not results:
        raise ValueError("results is empty: build_checklist needs the ladder's results (fastlab.bench.run_ladder)")
    applies = {name: (ok, why) for name, ok, why in techniques_here}
    rows = []
    for t in TECHNIQUES:
        ok, why = applies.get(t.name, (True, "applies on every device"))
        rows.append(ChecklistRow(
            technique=t.name,
            applies=f"{'yes' if ok else 'no'}: {why}",
            here=effect(results, t, skipped),
            reference={device: effect(ref, t) for device, ref in (reference or {}).items()},
            outcome=outcome_effect(tta, t, {**(skipped or {}), **(tta_skipped or {})}) if tta else "",
        ))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def checklist_markdown(rows: Sequence[ChecklistRow], results: Sequence[RunResult]) -> str:
    """The rows as a Markdown table (notebook 09 says what each figure means)."""
    devices = sorted({d for row in rows for d in row.reference})
    first = results[0] if results else None
    here = first.env.get("device_name", "this machine") if first else "this machine"
    data = first.data_name if first else "?"
    outcome = any(row.outcome for row in rows)
    heads = ["technique", "applies here?", f"measured effect here, images/s ({here}, {data})"]
    heads += ["effect here on time to accuracy (over seeds)"] if outcome else []
    heads += [f"effect on {d}" for d in devices] or ["effect on the reference GPU"]
    lines = ["| " + " | ".join(_cell(h) for h in heads) + " |", "|" + " --- |" * len(heads)]
    for row in rows:
        ref = [row.reference.get(d, "not measured") for d in devices] or ["none bundled yet"]
        cells = [row.technique, row.applies, row.here] + ([row.outcome] if outcome else []) + ref
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def show_checklist(rows: Sequence[ChecklistRow], results: Sequence[RunResult]) -> Any:
    """The table as an IPython Markdown object (IPython is imported here only, so fastlab needs no Jupyter)."""
    from IPython.display import Markdown

    return Markdown(checklist_markdown(rows, results))
