"""The advice's claims C1-C15 (claims.json), the verdicts computed from this machine's measurements, and their store.

A verdict starts with one of VERDICT_HEADS: "holds" (or "holds only when ..."), "does not hold here" (no gain where
the claimed one would have been seen, the opposite, or short of the claimed figure), "could not tell here (...)"
(the test could not have seen the claimed effect, or MIN_GAIN: what would tell), "no-op here (why)", "not testable
here: ..." (a device this machine does not have). A finding on a single pair is printed, never recorded.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from .config import active_profile
from .files import keep_aside, write_json
from .measure import Spread, device_name, resolve_device
from .results import RunResult
from .verdicts import CREDITED, Comparison, as_runs, runs_verdict, step_slowdown, verdict
from .verdicts import pooled_throughput as pooled_throughput  # the lessons pool seeds' windows with it

try:
    import fcntl
except ImportError:  # not POSIX: the store's writes stay atomic, only a race between two kernels could lose one
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Claim:
    id: str  # "C1" .. "C15"
    text: str  # the claim, as the advice states it (CLAIMS.md's restatement)
    figures: str  # its figures ("-" when it gives none)
    fair_test: str  # what a fair test of it needs
    notebook: str  # the notebook that tests it, e.g. "01_data_loading"
    section: str  # the section of that notebook, as its heading reads
    needs_gpu: bool = False  # the advice is about a GPU (its copies, cuDNN, its utilisation): a CPU cannot test it


CLAIMS: tuple[Claim, ...] = tuple(Claim(**row) for row in json.loads(
    (Path(__file__).with_name("claims.json")).read_text(encoding="utf-8"))["claims"])  # the table is data
BY_ID: dict[str, Claim] = {c.id: c for c in CLAIMS}


def get(claim_id: str) -> Claim:
    if claim_id not in BY_ID:
        raise ValueError(f"claim_id={claim_id!r} is not allowed: choose one of {', '.join(BY_ID)}")
    return BY_ID[claim_id]


def quote(claim_id: str, width: int = 112) -> str:
    """The claim as a markdown `>` blockquote, id first, attributed to the common advice."""
    c = get(claim_id)
    figures = "" if c.figures == "-" else f" (its figure: {c.figures})"
    body = f"**{c.id}**, the common advice: \"{c.text}\"{figures}"
    return "\n".join("> " + line for line in textwrap.wrap(body, width - 2, break_on_hyphens=False))


# ---------------------------------------------------------------- verdicts, computed from measurements

# The gain that matters where a claim gives no figure: a test that could not see it says "could not tell here".
MIN_GAIN = 1.2
TO_TELL = "to tell: a quieter machine, the thorough version (FASTLAB_THOROUGH=1) or a GPU"
TO_TELL_ON_A_GPU = "to tell: a quieter machine or the thorough version (FASTLAB_THOROUGH=1)"

COULD_NOT_TELL = "could not tell here"
NOT_TESTABLE = "not testable here"
VERDICT_HEADS = ("holds", "does not hold here", COULD_NOT_TELL, "no-op here", NOT_TESTABLE)


class Judgement(NamedTuple):
    """A verdict, the measurement it rests on, and whether it may be recorded (False: a single pair)."""

    verdict: str
    evidence: str
    recorded: bool = True


def check_verdict(words: str) -> str:
    if not isinstance(words, str) or not words.startswith(VERDICT_HEADS):
        raise ValueError(f"verdict={words!r} is not allowed: it must start with one of "
                         f"{', '.join(repr(h) for h in VERDICT_HEADS)}")
    return words


def no_accelerator(why: str) -> str:
    """The verdict of a claim about a GPU on a machine without one."""
    return f"{NOT_TESTABLE}: no accelerator ({why})"


def unseen(c: Comparison, what: str = "no difference detected", on_gpu: bool = False) -> str:
    """The words inside "could not tell here (...)": what it saw, what it could not have seen, what would tell."""
    return f"{what}, {c.gain:.2f}x, but {c.unseen}; {TO_TELL_ON_A_GPU if on_gpu else TO_TELL}"


def verdict_speedup(base_runs: RunResult | Sequence[RunResult], other_runs: RunResult | Sequence[RunResult],
                    claimed_ratio: float | None = None, *, knob: str | None = None,
                    unit: str = "images/s") -> Judgement:
    """Is `other` faster than `base` (by the claimed ratio, when the claim gives one)? From pooled windows.

    A run that diverged or stopped early is not credited; one the notebook's budget did not start makes it "could not
    tell" (not recorded). knob: when every `other` run recorded it as a no-op, the verdict is "no-op here (why)"."""
    base, other = as_runs(base_runs), as_runs(other_runs)
    if not base or not other:
        raise ValueError("verdict_speedup needs at least one run on each side")
    if knob and all(knob in r.no_ops for r in other):
        return Judgement(f"no-op here ({other[0].no_ops[knob]})",
                       f"{knob} did nothing on {other[0].env.get('device_name', 'this device')}")
    c = runs_verdict(base, other, unit=unit)
    if c.comparable:
        return _faster(c, claimed_ratio, "windows", on_gpu=other[0].env.get("device_type") == "cuda")
    summaries = "; ".join(r.summary() for r in (other if c.side == "other" else base))
    refused = next((r for r in (other if c.side == "other" else base) if r.not_started), None)
    if refused is not None:  # the notebook's budget did not start it: nothing was measured, so nothing to keep
        return Judgement(f"{COULD_NOT_TELL} ('{refused.label}' did not run: {refused.error})", summaries, recorded=False)
    if c.side == "base":
        return Judgement(f"{NOT_TESTABLE} (no baseline to compare with: {c.reason})", summaries)
    if c.status in CREDITED:
        return _no_window(base, other, c.status, summaries)
    return Judgement(f"does not hold here ({c.reason})", summaries)


def _no_window(base: list[RunResult], other: list[RunResult], status: str, summaries: str) -> Judgement:
    """The changed side finished no timed window: its step time, against the baseline's, is the speed it has."""
    x, steps = step_slowdown(base, other)
    none = "no timed window finished" + (" within the time budget" if status == "time_limited" else "")
    if x > 1:
        return Judgement(f"does not hold here: {steps}; {none}", summaries)
    if x <= 1:
        return Judgement(f"{COULD_NOT_TELL} ({steps}, but {none}; to tell: a longer time budget)", summaries)
    return Judgement(f"does not hold here ({none}; {steps}: no step time to compare)", summaries)


def verdict_faster(b: Spread, o: Spread, claimed_ratio: float | None = None, *, unit: str = "images/s",
                   what: str = "measurements", on_gpu: bool = False) -> Judgement:
    """verdict_speedup's rule on two spreads of a rate (higher is better). A side with nothing measured could not
    tell (two spreads carry no run's status: a run the notebook's budget did not start leaves one empty)."""
    c = verdict(b, o, unit)
    if not c.comparable:
        return Judgement(f"could not tell here ({c.reason})", c.words, recorded=False)
    return _faster(c, claimed_ratio, what, on_gpu)


def _faster(c: Comparison, claimed_ratio: float | None, what: str, on_gpu: bool) -> Judgement:
    if not c.comparable:
        return Judgement(f"does not hold here ({c.reason})", c.words)
    b, o, ratio, matters = c.base, c.other, c.ratio, claimed_ratio or MIN_GAIN
    evidence = (f"{ratio:.2f}x: {o.median:,.0f} ({o.low:,.0f}-{o.high:,.0f}) vs {b.median:,.0f} ({b.low:,.0f}-"
                f"{b.high:,.0f}) {c.unit}, median (min-max) over {o.n} and {b.n} {what}; {c.power}")
    untold = _untold(c, matters, evidence, on_gpu=on_gpu)
    if untold:
        return untold
    if c.noise:
        return Judgement(f"does not hold here ({ratio:.2f}x, not told apart from noise: {c.unseen}; a {matters:g}x "
                       f"gain would have shown)", evidence)
    if c.direction == "worse":
        return Judgement(f"does not hold here (slower: {ratio:.2f}x)", evidence)
    if claimed_ratio is not None and ratio < claimed_ratio:
        return Judgement(f"does not hold here as stated ({ratio:.2f}x faster, short of the claimed {claimed_ratio:g}x)",
                       evidence)
    return Judgement(f"holds ({ratio:.2f}x faster)", evidence)


def verdict_less(base: Spread | float, other: Spread | float, claimed_saving: float | None = None, *,
                 what: str = "memory", unit: str = "MiB", tolerance: float = 0.05, about: float = 0.1) -> Judgement:
    """Does `other` use less (memory, latency) than `base`, by about the claimed share (0.5 = 50% less)?

    Lower is better (fastlab.verdicts.verdict with higher_is_better=False). A difference inside the spread, or
    under `tolerance` of the base, is none. "About" a claimed share means within `about` of it.
    """
    b = base if isinstance(base, Spread) else Spread.of([float(base)])
    o = other if isinstance(other, Spread) else Spread.of([float(other)])
    c = verdict(b, o, unit, higher_is_better=False, quantity=what, fmt=",.1f")
    if not c.comparable or not b.median > 0:
        raise ValueError(f"verdict_less needs a positive base and a measured other: got {b.median} and {o.median}")
    saving = 1 - c.ratio
    change = f"{saving:.0%} less" if saving >= 0 else f"{-saving:.0%} more"
    evidence = f"{what} {o.median:,.1f} vs {b.median:,.1f} {unit}: {change}; {c.power}"
    matters = 1 / (1 - claimed_saving) if claimed_saving is not None and claimed_saving < 1 else MIN_GAIN
    untold = _untold(c, matters, evidence, f"no {what} saving detected")
    if untold:
        return untold
    if c.noise or abs(saving) < tolerance:
        return Judgement(f"does not hold here (no {what} saving outside the noise: {saving:+.0%})", evidence)
    if c.direction == "worse":
        return Judgement(f"does not hold here ({-saving:.0%} more {what})", evidence)
    if claimed_saving is not None and saving < claimed_saving - about:
        return Judgement(f"does not hold here as stated ({saving:.0%} less {what}, not about {claimed_saving:.0%})",
                       evidence)
    return Judgement(f"holds ({saving:.0%} less {what})", evidence)


def _untold(c: Comparison, matters: float, evidence: str, what: str = "no difference detected",
            on_gpu: bool = False) -> Judgement | None:
    """"could not tell here" when the comparison could not have seen a gain of `matters`; a single pair is never
    recorded. None when it could have seen it."""
    if c.single_pair:
        return Judgement(f"{COULD_NOT_TELL} (a single pair, {c.ratio:.2f}x: {c.unseen}; not recorded)", evidence,
                       recorded=False)
    if c.noise and c.detectable > matters:
        return Judgement(f"{COULD_NOT_TELL} ({unseen(c, what, on_gpu)})", evidence)
    return None


def verdict_conditions(findings: dict[str, Judgement]) -> Judgement:
    """Combine one finding per condition ("at batch 8", "at batch 32"): holds, holds only when ..., or not. A
    condition that may not be recorded (a single pair) is shown in the evidence and does not vote; with no other
    condition, the combination is not recorded either."""
    if not findings:
        raise ValueError("verdict_conditions needs at least one condition")
    evidence = "; ".join(f"{c}: {f.verdict}" + (f" [{f.evidence}]" if f.evidence else "") for c, f in findings.items())
    voting = {c: f for c, f in findings.items() if f.recorded}
    if not voting:
        return Judgement(next(iter(findings.values())).verdict, evidence, recorded=False)
    findings = voting
    holding = [c for c, f in findings.items() if f.verdict.startswith("holds")]
    untold = [c for c, f in findings.items() if f.verdict.startswith(COULD_NOT_TELL)]
    if untold and len(holding) + len(untold) == len(findings):  # nothing measured against it
        if not holding:
            return Judgement(f"{COULD_NOT_TELL} (" + "; ".join(f"{c}: {findings[c].verdict[len(COULD_NOT_TELL):].strip(' ()')}"
                                                      for c in untold) + ")", evidence)
        return Judgement(f"holds when {' and '.join(holding)}; {COULD_NOT_TELL} when {' and '.join(untold)}", evidence)
    if all(f.verdict.startswith("no-op here") for f in findings.values()):
        return Judgement(next(iter(findings.values())).verdict, evidence)
    if len(holding) == len(findings):
        return Judgement("holds", evidence)
    if holding:
        return Judgement("holds only when " + " and ".join(holding), evidence)
    return Judgement("does not hold here", evidence)


# ---------------------------------------------------------------- a verdict, and the store it is kept in


@dataclass
class Verdict:
    claim: str
    verdict: str
    evidence: str = ""
    result_summary: str = ""
    device: str = ""
    profile: str = ""
    date: str = ""
    notebook: str = ""
    source: str = "this machine"  # or "reference" (judged from bundled results)

    def __post_init__(self) -> None:
        get(self.claim)
        check_verdict(self.verdict)

    def __str__(self) -> str:
        text = f"{self.claim} verdict: {self.verdict}"
        if self.evidence:
            text += f"\n    measured: {self.evidence}"
        return text


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _context(results: Sequence[RunResult]) -> tuple[str, str]:
    """(device, profile) from results' environment, else from this process."""
    for r in results:
        if r.env:
            return r.env.get("device_name", "?"), r.env.get("profile", "?")
    return device_name(resolve_device()), active_profile()


def verdict_for(claim_id: str, finding: Judgement, results: Sequence[RunResult] = (), *,
                result_summary: str | None = None) -> Verdict:
    """A dated Verdict from a finding, with the device and profile of its results."""
    device, profile = _context(results)
    summary = result_summary if result_summary is not None else "; ".join(r.summary() for r in results[:6])
    return Verdict(claim=claim_id, verdict=finding.verdict, evidence=finding.evidence, result_summary=summary,
                   device=device, profile=profile, date=_now(), notebook=get(claim_id).notebook)


STORE_VERSION = 1
STORE_NAME = "verdicts.json"
MAX_KEPT = 500  # the store keeps the newest verdicts only, so it never grows without bound


def store_path() -> Path:
    """Where the reader's own verdicts are kept: in FASTLAB_RESULTS_DIR, else ~/.cache/fastlab."""
    env = os.environ.get("FASTLAB_RESULTS_DIR", "").strip()
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "fastlab") / STORE_NAME


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the store (released when its file closes): two kernels appending both keep theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _entries(path: Path) -> list | None:
    """The store's verdict entries: [] when there is none, None when this version cannot read the file."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except ValueError:  # not JSON, or not text
        return None
    if not isinstance(doc, dict) or doc.get("schema_version") != STORE_VERSION:
        return None
    entries = doc.get("verdicts", [])
    return entries if isinstance(entries, list) else None


def load_verdicts(path: str | os.PathLike | None = None) -> list[Verdict]:
    """Every verdict in the store, oldest first; [] when there is none (or the file is not a verdict store)."""
    out = []
    for item in _entries(Path(path) if path is not None else store_path()) or []:
        try:
            out.append(Verdict(**item))
        except (TypeError, ValueError):  # a verdict written by another version: skipped, not fatal
            continue
    return out


def record(verdict: Verdict) -> Verdict:
    """Append a verdict to the store (atomically: a reader never sees half a file). Returns it."""
    path = store_path()
    with _locked(path):
        entries, readable = _entries(path), load_verdicts(path)
        if entries is None or len(readable) < len(entries):  # never dropped: the file kept beside the new store
            why = ("is not a verdict store this version reads (corrupt, or another version's)" if entries is None
                   else f"holds {len(entries) - len(readable)} verdict(s) this version cannot read")
            keep_aside(path, why, f"started a new one with the {len(readable)} readable")
        kept = readable + [verdict]
        write_json(path, {"schema_version": STORE_VERSION, "verdicts": [asdict(v) for v in kept[-MAX_KEPT:]]})
    return verdict


def latest_verdicts(verdicts: list[Verdict] | None = None) -> dict[str, Verdict]:
    """The newest verdict of each claim (from the store unless given)."""
    out: dict[str, Verdict] = {}
    for v in load_verdicts() if verdicts is None else verdicts:
        if v.claim not in out or v.date >= out[v.claim].date:
            out[v.claim] = v
    return out


def conclude(claim_id: str, finding: Judgement, results: Sequence[RunResult] = (), *, save: bool = True,
             result_summary: str | None = None) -> Verdict:
    """The notebook's one call per claim: the verdict from the finding, recorded unless it may not be, returned."""
    v = verdict_for(claim_id, finding, results, result_summary=result_summary)
    if save and finding.recorded:
        record(v)
    return v
