"""A notebook panel: one control per knob, Run/Stop/Clear, a progress bar, the plot and the code diff.

Runs train in a background thread that sets widget traits only (`with out:` from a thread never reaches the page).
Each Run measures the baseline beside the variant (A/B/A by default), so the ratio compares runs under the same load.
"""

from __future__ import annotations

import html
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from .advisor import advice_html
from .code import code_diff
from .config import (
    CHOICES,
    DEMONSTRATION_SECONDS,
    DEMONSTRATION_STEPS,
    ArmPlan,
    TrainConfig,
    demonstration_config,
    field_names,
    plan_arm,
)
from .isolation import active_run
from .measure import Spread
from .plots import figure_png, plot_comparison
from .results import RunResult, median_step_seconds
from .train import describe_changes, run
from .verdicts import single_pair, verdict

PlotFn = Callable[[list[RunResult]], Any]
# ipywidgets reads a Dropdown value of None as "nothing selected" and shows it blank, so None travels as this.
NONE_CHOICE = "None (torch's default)"
# Run orders: A is the panel's baseline, B the knobs as set. "none" compares with the first result only.
PAIRINGS = {"ABA": "ABA", "AB": "AB", "none": "B"}

# One run per kernel: the panels by key, and those running.
_PANELS: dict[str, Panel] = {}
_RUNNING: list[Panel] = []
_GUARD = threading.Lock()


def _control(name: str, value: Any, options: Sequence[Any] | None) -> W.Widget:
    style = {"description_width": "initial"}
    if isinstance(value, bool) and options is None:
        return W.Checkbox(value=value, description=name, indent=False, style=style)
    opts = list(options) if options is not None else list(CHOICES.get(name, ()))
    if not opts:
        raise ValueError(f"knob {name!r} needs a list of options (it is not a yes/no or a fixed-choice field)")
    if value not in opts:
        opts = [value] + opts
    opts = [NONE_CHOICE if o is None else o for o in opts]
    value = NONE_CHOICE if value is None else value
    return W.Dropdown(options=[(str(o), o) for o in opts], value=value, description=name, style=style)


def busy_elsewhere(panel: Panel | None = None) -> str | None:
    """One line naming the run in progress in this kernel (another panel's, or any fastlab.run), else None."""
    for other in _RUNNING:
        if other is not panel and other._thread is not None and other._thread.is_alive():
            return (f"Cannot run: the panel '{other.key}' is running <i>{other._label}</i> in this kernel "
                    "(one run at a time): wait for it, or press its Stop.")
    active = active_run()
    if active is not None:
        return f"Cannot run: <i>{active}</i> is running in this kernel (one run at a time): wait for it to finish."
    return None


def pair_summary(base_runs: list[RunResult], variant: RunResult) -> dict[str, Any]:
    """The variant against the baselines beside it: each pair's ratio, their median and range, and the comparison."""
    ratios = [verdict(b.throughput, variant.throughput).ratio for b in base_runs
              if b.window_throughput and variant.window_throughput]
    measured = [b for b in base_runs if b.window_throughput]
    base = Spread.of([w for b in measured for w in b.window_throughput], [b.window_throughput for b in measured])
    if not ratios:
        return {"ratios": [], "baseline": base.median, "noise": False, "label": "n/a"}
    ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
    paired = Spread.of(variant.window_throughput, [variant.window_throughput] * len(measured))
    c = verdict(base, paired)
    return {"ratios": ratios, "ratio": ratio, "low": low, "high": high, "noise": c.noise, "comparison": c,
            "single_pair": single_pair(base, paired),
            "baseline": base.median, "baseline_low": base.low, "baseline_high": base.high,
            "label": "noise" if c.noise else f"{ratio:.2f}x"}


def _cost(pairing: str) -> str:
    order = PAIRINGS[pairing]
    return "" if len(order) == 1 else (f"<br>{'/'.join(order)}: the baseline is measured beside the knobs as set, "
                                       f"so a Run takes about {len(order)} runs' time.")


def _trap_note(plan: ArmPlan) -> str:
    return f"<br>A known trap here ({html.escape(plan.reason)}): one short demonstration run." if plan.kind == "trap" else ""


def paired_line(paired: dict[str, Any], n_base: int) -> str:
    """The panel's line on the last run against the baseline measured beside it (A/B pairs)."""
    cost = f"{n_base} baseline run{'s' if n_base > 1 else ''}, {paired['cost_seconds']:.1f} s"
    if not paired["ratios"]:
        return f"Against the baseline measured beside it: no timed window to compare (cost: {cost})."
    pairs = ", ".join(f"{r:.2f}x" for r in paired["ratios"])
    verdict = ("<b>cannot tell</b> drift from an effect in one A/B pair (A/B/A tells)" if paired.get("single_pair")
               else "<b>noise</b>: inside the spread" if paired["noise"] else f"<b>{paired['ratio']:.2f}x</b>")
    return (f"Against the baseline measured beside it ({paired['baseline']:,.0f} images/s): {verdict} "
            f"(pairs: {pairs}; cost: {cost}).")


class Panel:
    """Controls for some TrainConfig fields; each Run adds one result to `results` and redraws the plot.

    knobs: field -> options (None: a yes/no or fixed-choice field). results: shown beside new runs (the first with
    the base config is the page-load baseline). pairing "none" compares with the first result. A new Panel with the
    same key takes over this one's runs; keep: the latest runs the plot shows; describe(result): HTML under it.
    """

    def __init__(self, base: TrainConfig, knobs: dict[str, Sequence[Any] | None], *,
                 results: list[RunResult] | None = None, plot: PlotFn = plot_comparison,
                 runner: Callable[..., RunResult] = run, title: str = "",
                 describe: Callable[[RunResult], str] | None = None, advice: bool = True,
                 pairing: str = "ABA", key: str | None = None, keep: int = 10) -> None:
        unknown = set(knobs) - field_names()
        if unknown:
            raise ValueError(f"TrainConfig has no field {sorted(unknown)[0]!r}; fields are: {', '.join(sorted(field_names()))}")
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing={pairing!r} is not allowed: choose one of {', '.join(PAIRINGS)}")
        self.base, self.plot, self.runner, self.title = base, plot, runner, title
        self.describe, self.show_advice, self.pairing, self.keep = describe, advice, pairing, keep
        self.key = key or title or ",".join(sorted(knobs))
        self.results: list[RunResult] = list(results or [])
        self._n_given = len(self.results)
        self._successor: Panel | None = None
        self._label = ""
        self.controls = {name: _control(name, getattr(base, name), opts) for name, opts in knobs.items()}
        # no button icons: Font Awesome would be fetched, and the dashboard runs offline
        self.run_button = W.Button(description="Run", button_style="primary")
        self.stop_button = W.Button(description="Stop", button_style="warning", disabled=True)
        self.clear_button = W.Button(description="Clear", tooltip="remove this panel's runs from the plot")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = W.HTML(value="Change the knobs, then press Run.")
        self.advice = W.HTML(value="")
        self.image = W.Image(format="png")
        self.code = W.HTML(value="")
        self.code.add_class("fastlab-code")  # what the browser test finds
        self.count = W.Label(value="0 results in the plot")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._take_over(_PANELS.get(self.key))
        _PANELS[self.key] = self
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.request_stop())
        self.clear_button.on_click(lambda _: self.clear())
        for control in self.controls.values():
            control.observe(lambda _: self.show_code(), names="value")
        self.show_code()
        if self.results:
            self.redraw()
        self.widget = W.VBox([
            W.HBox(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.run_button, self.stop_button, self.clear_button, self.progress]),
            self.status, self.count, self.image, self.code, self.advice,
        ])

    def _take_over(self, old: Panel | None) -> None:
        if old is None or old is self:
            return
        self.results.extend(old.results[old._n_given:])
        old._successor = self
        if old.running:
            self._thread, self._stop, self._label = old._thread, old._stop, old._label
            self.run_button.disabled, self.stop_button.disabled = True, False
            self.status.value = (f"The panel this one replaces is running <i>{old._label}</i>: "
                                 "its result will show here.")

    def _view(self) -> Panel:
        panel = self
        while panel._successor is not None:
            panel = panel._successor
        return panel

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def current_config(self) -> TrainConfig:
        return self.base.replace(**{name: None if c.value == NONE_CHOICE else c.value
                                    for name, c in self.controls.items()})

    def show_code(self) -> None:
        """The diff of the knobs as set against the baseline's script, or why there is none (no traceback)."""
        head = "<b>The code</b>"
        try:
            diff = code_diff(self.base, self.current_config())
        except ValueError as e:
            self.code.value = f"{head}: not a valid combination, so no diff: {html.escape(str(e))}"
            return
        except Exception as e:  # the panel keeps working whatever the script writer meets
            self.code.value = f"{head}: could not be written: {type(e).__name__}: {html.escape(str(e))}"
            return
        if not diff.unified:
            self.code.value = f"{head}: no change from the baseline."
            return
        self.code.value = (f'{head} (fastlab.code_diff against the baseline):'
                           f'<div style="max-height:28em;overflow:auto">{diff._repr_html_()}</div>')

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _refuse(self, line: str) -> None:
        self.status.value = line
        self.advice.value = ""  # advice about an earlier run must not read as advice about this one

    def start(self) -> None:
        if self.running:
            return self._refuse("A run is already going: press Stop first.")
        try:
            cfg = self.current_config()
        except ValueError as e:
            return self._refuse(f"<b>Cannot run:</b> {e}")
        plan = plan_arm(self.base, cfg)  # as every comparison: no run that can teach nothing here
        if plan.kind == "no-op":
            return self._refuse(f"<b>Not trained:</b> every change is a no-op here ({html.escape(plan.reason)}).")
        with _GUARD:
            busy = busy_elsewhere(self)
            if busy is not None:
                return self._refuse(busy)
            changes = self.base.diff(cfg)
            n = sum(1 for r in self.results if r.label.startswith("panel")) + 1
            self._label = f"panel {n}: {describe_changes(changes)}"
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._work, args=(cfg, self._label, plan), daemon=True)
            _RUNNING.append(self)
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.progress.value = 0
        self.status.value = f"Running <i>{self._label}</i> ...{_cost(self.pairing)}{_trap_note(plan)}"
        self.advice.value = ""
        self._thread.start()

    def request_stop(self) -> None:
        """The run ends after its current step, keeping its partial result."""
        self._stop.set()
        self.status.value = "Stopping after the current step ..."

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def clear(self) -> None:
        del self.results[self._n_given:]
        self.redraw()
        self.advice.value = ""

    def _work(self, cfg: TrainConfig, label: str, plan: ArmPlan) -> None:
        try:
            self._finish(self._measure(cfg, label, plan))
        except Exception as e:  # a thread's exception would otherwise vanish
            self._view().status.value = f"<b>Run failed:</b> {type(e).__name__}: {e}"
        finally:
            with _GUARD:
                if self in _RUNNING:
                    _RUNNING.remove(self)
            ui = self._view()
            ui.run_button.disabled, ui.stop_button.disabled = False, True

    def _measure(self, cfg: TrainConfig, label: str,
                 plan: ArmPlan) -> tuple[RunResult | None, list[RunResult], float]:
        """The variant and the baselines beside it, in the pairing's order; a trap gets one short run."""
        order = PAIRINGS[self.pairing]
        if plan.kind == "trap":
            cfg = demonstration_config(cfg)
        variant, baselines, base_seconds = None, [], 0.0
        for i, role in enumerate(order):
            ui = self._view()
            what = "the knobs as set" if role == "B" else "the baseline, beside it"
            if len(order) > 1:
                ui.status.value = (f"Running <i>{label}</i>: run {i + 1} of {len(order)}, {what} ..."
                                   f"{_cost(self.pairing)}{_trap_note(plan)}")
            t0 = time.perf_counter()
            result = self.runner(self.base if role == "A" else cfg,
                                 label=f"{label} (paired baseline)" if role == "A" else label, progress=False,
                                 stop=self._stop, on_step=lambda done, total, i=i: self._on_step(i, done, total))
            if role == "A":
                baselines.append(result)
                base_seconds += time.perf_counter() - t0
            else:
                variant = result
                if plan.kind == "trap":
                    result.trap = plan.reason
            if result.status in ("interrupted", "failed"):
                break
        return variant, baselines, base_seconds

    def _on_step(self, index: int, done: int, total: int) -> None:
        ui = self._view()
        ui.progress.max = total * len(PAIRINGS[self.pairing])
        ui.progress.value = index * total + done

    def _finish(self, measured: tuple[RunResult | None, list[RunResult], float]) -> None:
        variant, baselines, base_seconds = measured
        ui = self._view()
        if variant is None:
            ui.status.value = "Stopped while measuring the baseline: nothing was added."
            return
        lines = [variant.summary()]
        if variant.trap:
            beside = (f" against {median_step_seconds(baselines[0]):.2f} s in the baseline beside it" if baselines
                      else "")
            lines.append(f"A known trap here ({html.escape(variant.trap)}), one short run (at most "
                         f"{DEMONSTRATION_STEPS} steps, {DEMONSTRATION_SECONDS:g} s): a median step took "
                         f"{median_step_seconds(variant):.2f} s{beside}; accuracy not compared.")
        if variant.no_ops:
            lines.append("No-ops here: " + "; ".join(f"{k}: {v}" for k, v in variant.no_ops.items()))
        if baselines:
            paired = pair_summary(baselines, variant)
            paired["cost_seconds"] = base_seconds
            variant.extras["paired"] = paired
            lines.append(paired_line(paired, len(baselines)))
            lines.extend(self._machine_line(paired))
        ui.results.append(variant)
        ui.redraw()
        ui.status.value = "<br>".join(lines)
        notes = [self.describe(variant)] if self.describe is not None else []
        if self.show_advice and variant.status != "interrupted":
            notes.append(advice_html(variant))
        ui.advice.value = "<br>".join(n for n in notes if n)

    def _machine_line(self, paired: dict[str, Any]) -> list[str]:
        """A line when the baseline now differs from the page-load one (the first given result with the base
        config) beyond the spread."""
        base = self.base.to_dict()
        first = next((r for r in self.results[:self._n_given] if r.config == base and r.window_throughput), None)
        if first is None or not paired["ratios"]:
            return []
        now = Spread(paired["baseline"], paired["baseline_low"], paired["baseline_high"], 1)
        if verdict(Spread.of(first.window_throughput), now).noise:  # the drift itself: the windows alone
            return []
        word = "busier" if now.median < first.throughput.median else "less busy"
        return [f"The machine is {word} now: the baseline was {first.throughput.median:,.0f} images/s at page load, "
                f"{now.median:,.0f} now (the ratio above uses the baseline measured now)."]

    def shown_results(self) -> list[RunResult]:
        runs = self.results[self._n_given:]
        return self.results[:self._n_given] + runs[-self.keep:]

    def redraw(self) -> None:
        shown = self.shown_results()
        self.image.value = figure_png(self.plot(shown)) if shown else b""
        hidden = len(self.results) - len(shown)
        self.count.value = f"{len(shown)} results in the plot" + (
            f" ({hidden} older runs not shown; Clear removes the runs)" if hidden else "")
