"""What the watch notes of the reader's loop besides its clock: what the loader is, the batches each epoch gave, the
images each step trained on, the loader's wall and CPU time, and misuse (one note each, shown by fastlab.advise);
at the end, the description a reader's RunResult carries (its config, dataset and extras["watch"])."""

from __future__ import annotations

import contextlib
import statistics
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from .loop_facts import BatchMaking, FirstStepFacts, LaterSteps, process_group
from .measure import environment
from .results import RunResult

SOURCE = "your loop (fastlab.watch)"
# what the last 20 finished watches ran with and measured, so advice never proposes a setting just left
_EARLIER: deque[dict[str, Any]] = deque(maxlen=20)


def loader_facts(loader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config entries, dataset entries) read from the loader, looking through wrappers (tqdm keeps .iterable)."""
    for _ in range(3):
        inner = next((i for a in ("iterable", "loader") if (i := getattr(loader, a, None)) is not None), None)
        if isinstance(loader, torch.utils.data.DataLoader) or inner is None:
            break
        loader = inner
    dataset = getattr(loader, "dataset", loader)
    data: dict[str, Any] = {"name": type(dataset).__name__, "synthetic": bool(getattr(dataset, "synthetic", False)),
                            "source": SOURCE}
    with contextlib.suppress(TypeError):
        data["train_images"] = len(dataset)
    if not isinstance(loader, torch.utils.data.DataLoader):
        return {"loader": "iterable"}, data
    return {"loader": "dataloader", "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
            "prefetch_factor": loader.prefetch_factor if loader.num_workers else None}, data


def _tensors(batch: Any) -> list[torch.Tensor]:
    """The batch's tensors, one level deep: the batch itself, a tuple's or list's items, a dict's values."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    return [t for t in items if isinstance(t, torch.Tensor)]


class LoopRecord:
    """The reader's loop as the watch saw it, apart from the clock."""

    def __init__(self) -> None:
        self.loader: dict[str, Any] = {}  # what the loader is (loader_facts)
        self.epochs: list[int] = []  # batches fetched in each epoch of w(loader)
        self.batch_sizes: list[int] = []  # images of each step
        self.fetch_wall = self.fetch_cpu = 0.0  # wall and process CPU seconds inside the loader
        self.batch_bytes = 0  # of the first batch
        self.ready = 0  # batch_ready() calls
        self.notes: dict[str, str] = {}  # misuse seen, one line each
        self.facts: dict[str, Any] = {}  # what the first step did (fastlab.loop_facts), when asked for
        self.profiler_on: list[bool] = []  # whether torch.profiler was recording at each step's end (exercise 08)
        self.paused_blocks = 0
        self._later: LaterSteps | None = None  # from the first step's end: what each later step did
        self.batch_facts: dict[str, Any] = {}  # how the first batch through w(...) was made (BatchMaking), when asked
        self._making: BatchMaking | None = None
        self._last_batch: Any = None

    def describe_loader(self, loader: Iterable) -> dict[str, Any]:
        """Note what the loader is; returns the dataset's description."""
        config, data = loader_facts(loader)
        self.loader.update(config)
        return data

    def fetching(self, get: Callable[[Any], Any], wanted: bool) -> contextlib.AbstractContextManager:
        """Around one fetch of w(loader): the first batch's (get is next) making is watched when `wanted` (facts for
        an exercise's check), to tell a batch collated image by image, or made by a worker, from one indexed in
        memory; fetched() reads it with the batch."""
        if not wanted or get is not next or self._making is not None:
            return contextlib.nullcontext()
        self._making = BatchMaking()
        return self._making

    def fetched(self, batch: Any) -> None:
        self.epochs[-1] += 1
        self._last_batch = batch
        if self._making is not None and not self.batch_facts:
            self.batch_facts = self._making.facts(next(iter(_tensors(batch)), None))
        if not self.batch_bytes:
            self.batch_bytes = sum(t.element_size() * t.nelement() for t in _tensors(batch))

    def images(self, n: int) -> int:
        """The images of this step, noted: n, unless n is the key count of the dict batch just fetched (len(batch))."""
        batch = self._last_batch
        if isinstance(batch, Mapping) and n == len(batch):
            first = next(iter(_tensors(batch)), None)
            rows = int(first.shape[0]) if first is not None and first.dim() else n
            if rows != n:
                key = next(k for k, v in batch.items() if v is first)
                self.notes["dict_batch"] = (f"step({n}) was given len(batch) of a dict batch ({n} keys); counted "
                                            f"{rows} images a step, the first dimension of batch[{key!r}]: pass "
                                            f"len(batch[{key!r}])")
                n = rows
        self.batch_sizes.append(n)
        return n

    def epoch_ended(self, loader: Iterable, it: Iterator) -> None:
        """An epoch of w(loader) ended: one that got no batches from an iterator used up before is noted (and warned
        of, once)."""
        if self.epochs[-1] == 0 and len(self.epochs) > 1 and it is loader and "empty_epoch" not in self.notes:
            note = (f"epoch {len(self.epochs)} got no batches: the loader is an iterator (a generator?) that an "
                    "earlier epoch used up; pass a DataLoader or a list, or make a new generator each epoch")
            warnings.warn("fastlab.watch: " + note, UserWarning, stacklevel=3)
            self.notes["empty_epoch"] = note

    def check_use(self, res: RunResult, steps: int, loss_given: bool, loss_set_late: bool) -> None:
        """Misuse only the end can see: no step marked, no batches, the loader not wrapped, no loss given."""
        fetched = sum(self.epochs)
        if steps == 0 and res.status == "ok":
            res.status = "failed"
            if self.epochs and not fetched:
                res.error = (f"the loader gave no batches in {len(self.epochs)} epoch(s) (empty, or drop_last with "
                             "fewer images than one batch): nothing was measured")
            else:
                got = (f"the loader gave {fetched} batches through the watch" if fetched else
                       "no batch came through the watch either")
                res.error = (f"no step was marked ({got}): put each step in `with w.step(len(x)) as s:` or call "
                             "w.step_done(len(x)) after it")
        elif steps and not (fetched or self.ready):
            res.data_wait_seconds = [float("nan")] * len(res.data_wait_seconds)
            self.notes["loader_not_wrapped"] = ("data wait not measured: the loader was not wrapped; iterate "
                                                "`for x, y in w(loader)` (or call w.batch_ready() when a batch "
                                                "arrives)")
        if steps and not loss_given:
            self.notes["no_loss"] = "no loss given: divergence not checked; " + (
                "s.loss was set after its `with w.step(...) as s:` block ended: set it inside the block"
                if loss_set_late else "set s.loss = loss inside `with w.step(...) as s:` (or step_done(n, loss=loss))")
        res.extras.setdefault("watch", {})["notes"] = list(self.notes.values())

    def describe(self, res: RunResult, device: torch.device, known: dict[str, Any], settings: dict[str, Any],
                 untimed: int) -> None:
        """A reader's run: its images a step (the median after the `untimed` steps), environment, config (what the
        reader told, the watch's settings, the loader), dataset and what the watch noted."""
        timed = self.batch_sizes[untimed:] or self.batch_sizes
        res.images_per_step = int(statistics.median_low(timed)) if timed else 0
        res.env = environment(device, "custom")
        res.config = {**known, "watched": True, "device": device.type, "batch_size": res.images_per_step,
                      "grad_accum_steps": 1, **settings, **self.loader}
        res.dataset = res.dataset or {"name": "data not described (w.describe(loader))", "synthetic": False,
                                      "source": SOURCE}
        res.extras["watched"] = True
        res.extras.setdefault("watch", {}).update(
            images=sum(self.batch_sizes), epochs=self.epochs, batch_bytes=self.batch_bytes,
            data_cpu_share=self.fetch_cpu / self.fetch_wall if self.fetch_wall else None)

    def remember(self, res: RunResult) -> None:
        """A loop of the reader's, remembered (this process only) for the advice on the next one: its earlier loops
        on the same data go into its extras."""
        res.extras.setdefault("watch", {})["earlier"] = [e for e in _EARLIER if e["dataset"] == res.dataset.get("name")]
        kept = ("loader", "num_workers", "batch_size", "persistent_workers")
        _EARLIER.append({"label": res.label, "dataset": res.dataset.get("name"), "status": res.status,
                         "window_throughput": list(res.window_throughput), **{k: res.config.get(k) for k in kept}})

    def step_facts(self, step: int, device_type: str) -> contextlib.AbstractContextManager:
        """What to record around the step after `step` steps: the first step's facts, then each later step's
        (LaterSteps) into them."""
        if step == 0 or not self.facts:
            seen = FirstStepFacts(device_type)
            self.facts = seen.facts  # filled in as the step runs
            return self._first_then_later(seen)
        return self._later.step(step) if self._later is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _first_then_later(self, seen: FirstStepFacts) -> Iterator[None]:
        """The first step's facts; after it, LaterSteps on the modules it called outermost, to the loop's end."""
        with seen:
            yield
        if self._later is not None:
            self._later.close()
        self._later = LaterSteps(seen)
        seen.outermost.clear()  # the watch keeps no module alive

    @contextlib.contextmanager
    def pausing(self) -> Iterator[None]:
        """A `with w.paused()` block: counted, and the evaluations inside it read as off the clock (LaterSteps)."""
        self.paused_blocks += 1
        later = self._later
        if later is not None:
            later.paused = True
        try:
            yield
        finally:
            if later is not None:
                later.paused = False

    def facts_seen(self, res: RunResult, device: torch.device) -> dict[str, Any]:
        """What the first step did, with the loader and what the loop around it did (an exercise's check reads it).
        The hooks of the steps after the first come off here."""
        if self._later is not None:
            self._later.close()
        return {**self.facts, **self.loader, "device": device.type, "images_per_step": res.images_per_step,
                "profiled": any(self.profiler_on), "profiler_on": list(self.profiler_on),
                "group_open": process_group() is not None,  # after the loop: never destroyed (exercise 11)
                "paused_blocks": self.paused_blocks, "steps": res.steps_done,
                "batch_from": None, "batch_stacked": None, "batch_images": None, **self.batch_facts}
