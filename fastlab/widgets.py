"""A widget panel for a notebook: one control per knob, Run and Stop buttons, a progress bar and a plot.

The run happens in a background thread so that Stop (and the rest of the notebook) stays responsive.
From that thread, only widget traits are updated (Image.value, Label.value, IntProgress.value):
output written with `with out:` from a thread never reaches the page (see shared NOTES).
This is the only fastlab module that imports ipywidgets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from .advise import advice_html
from .config import CHOICES, TrainConfig, field_names
from .plots import figure_png, plot_comparison
from .results import RunResult
from .train import describe_changes, run

PlotFn = Callable[[list[RunResult]], Any]
# ipywidgets reads a Dropdown value of None as "nothing selected" and shows it blank, so None travels as this.
NONE_CHOICE = "None (torch's default)"


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


class Panel:
    """Controls for some TrainConfig fields; each Run adds one result to `results` and redraws the plot.

    knobs maps a field name to its options (None for a yes/no field or a field with fixed choices).
    results starts with any results to show beside new runs (for example the notebook's headless runs).
    describe(result) returns HTML shown under the plot after each run; with advice=True, fastlab.advise's
    findings for that run follow it.
    """

    def __init__(self, base: TrainConfig, knobs: dict[str, Sequence[Any] | None], *,
                 results: list[RunResult] | None = None, plot: PlotFn = plot_comparison,
                 runner: Callable[..., RunResult] = run, title: str = "",
                 describe: Callable[[RunResult], str] | None = None, advice: bool = True) -> None:
        unknown = set(knobs) - field_names()
        if unknown:
            raise ValueError(f"TrainConfig has no field {sorted(unknown)[0]!r}; fields are: {', '.join(sorted(field_names()))}")
        self.base = base
        self.results: list[RunResult] = list(results or [])
        self.plot = plot
        self.runner = runner
        self.title = title
        self.describe = describe
        self.show_advice = advice
        self.controls = {name: _control(name, getattr(base, name), opts) for name, opts in knobs.items()}
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop", disabled=True)
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = W.HTML(value="Change the knobs, then press Run.")
        self.advice = W.HTML(value="")
        self.image = W.Image(format="png")
        self.count = W.Label(value="0 results in the plot")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.request_stop())
        if self.results:
            self.redraw()
        self.widget = W.VBox([
            W.HBox(list(self.controls.values()), layout=W.Layout(flex_flow="row wrap")),
            W.HBox([self.run_button, self.stop_button, self.progress]),
            self.status, self.count, self.image, self.advice,
        ])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def current_config(self) -> TrainConfig:
        return self.base.replace(**{name: None if c.value == NONE_CHOICE else c.value
                                    for name, c in self.controls.items()})

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """What the Run button does: validate the knobs, then train in a background thread."""
        if self.running:
            self.status.value = "A run is already going: press Stop first."
            return
        try:
            cfg = self.current_config()
        except ValueError as e:
            self.status.value = f"<b>Cannot run:</b> {e}"
            return
        changes = self.base.diff(cfg)
        label = f"panel {sum(1 for r in self.results if r.label.startswith('panel')) + 1}: {describe_changes(changes)}"
        self._stop.clear()
        self.run_button.disabled = True
        self.stop_button.disabled = False
        self.progress.value = 0
        self.status.value = f"Running <i>{label}</i> ..."
        self._thread = threading.Thread(target=self._work, args=(cfg, label), daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """What the Stop button does: the run ends after its current step, keeping its partial result."""
        self._stop.set()
        self.status.value = "Stopping after the current step ..."

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _on_step(self, done: int, total: int) -> None:
        self.progress.max = total
        self.progress.value = done

    def _work(self, cfg: TrainConfig, label: str) -> None:
        try:
            result = self.runner(cfg, label=label, progress=False, stop=self._stop, on_step=self._on_step)
            self.results.append(result)
            self.redraw()
            text = result.summary()
            if result.no_ops:
                text += "<br>No-ops here: " + "; ".join(f"{k}: {v}" for k, v in result.no_ops.items())
            self.status.value = text
            notes = [self.describe(result)] if self.describe is not None else []
            if self.show_advice and result.status != "interrupted":
                notes.append(advice_html(result))
            self.advice.value = "<br>".join(n for n in notes if n)
        except Exception as e:  # shown in the panel: a thread's exception would otherwise vanish
            self.status.value = f"<b>Run failed:</b> {type(e).__name__}: {e}"
        finally:
            self.run_button.disabled = False
            self.stop_button.disabled = True

    def redraw(self) -> None:
        self.image.value = figure_png(self.plot(self.results))
        self.count.value = f"{len(self.results)} results in the plot"


def knob_panel(base: TrainConfig, knobs: dict[str, Sequence[Any] | None], **kwargs: Any) -> Panel:
    """Build a Panel (see Panel for the arguments)."""
    return Panel(base, knobs, **kwargs)
