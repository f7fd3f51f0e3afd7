"""fastlab.claims: the claims as data, verdicts computed from measurements, the store, the claim map; and the
notebooks' side of it (every claim quoted, exercises with solutions, timings printed, Next links)."""

import json
import re
from pathlib import Path

import pytest
from notebook_timings import record_timing, timings_table, with_timings_table

from fastlab import claim_map, claims
from fastlab.measure import Spread
from fastlab.results import RunResult, merge_repeats
from fastlab.tools import timings

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# Every notebook but the start and the dashboard: a lesson, with the same scaffolding.
TECHNIQUE = ["01_data_loading", "02_mixed_precision", "03_cudnn_benchmark_and_channels_last", "04_batch_size",
             "05_no_grad_detach_item", "06_adamw_and_schedules", "07_compile_and_export", "08_profiling",
             "09_all_together", "10_your_own_model", "11_multi_gpu_ddp", "12_memory"]


def fake(label: str, windows: list[float], status: str = "ok", no_ops: dict | None = None, **extra) -> RunResult:
    return RunResult(config={"warmup_steps": 0}, label=label, status=status, window_throughput=windows,
                     no_ops=no_ops or {}, env={"device_name": "Test GPU", "profile": "smoke",
                                               "date": "2026-01-02T00:00:00+00:00"}, **extra)


def arm(label: str, windows: list[float], **extra) -> RunResult:
    """An arm measured in two interleaved repeats with these windows each (as fastlab.train.interleave merges)."""
    return merge_repeats([fake(label, windows, **extra), fake(label, windows, **extra)])


def test_a_side_that_timed_no_window_is_judged_by_its_step_time():
    # fp16 autocast on a CPU without fp16 kernels (a slow AVX2 CPU): 35-47 s a step against 4 s in fp32, so the
    # time budget ran out before one timed window; each step's time was recorded, warm-up included
    fp32 = [fake("fp32", [8.0, 8.1], step_seconds=[6.0, 4.0, 4.1, 3.9, 4.0]) for _ in range(2)]
    fp16 = [fake("fp16", [], status="time_limited", error="stopped at its max_seconds=60 budget",
                 step_seconds=[47.0, 45.2, 46.0, 44.0]) for _ in range(2)]
    for r in (*fp32, *fp16):
        r.config["warmup_steps"] = 1
    f = claims.verdict_speedup(fp32, fp16)
    assert f.verdict == ("does not hold here: 11.3x slower a step (45.2 s vs 4.0 s a step, median); no timed "
                         "window finished within the time budget"), f.verdict
    claims.check_verdict(f.verdict)
    for r in fp16:  # every step it finished was a warm-up step: still its step time, and said so
        r.config["warmup_steps"] = 5
    assert "(45.6 s vs 4.0 s a step, median; warm-up steps included for 'fp16' (2 runs), which timed no step past them)" in \
        claims.verdict_speedup(fp32, fp16).verdict
    quick = fake("bf16", [], status="time_limited", step_seconds=[3.0, 3.0])  # a faster step, yet no window
    assert claims.verdict_speedup(fp32, quick).verdict.startswith("could not tell here (1.33x faster a step (3.0 s")
    # only where no step finished at all is there no step time
    none = claims.verdict_speedup(fp32, fake("fp16", [], status="time_limited"))
    assert none.verdict == ("does not hold here (no timed window finished within the time budget; no step time "
                            "recorded for 'fp16': no step time to compare)")


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLAB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results" / claims.STORE_NAME


def test_fifteen_claims_each_with_a_notebook_and_a_quote():
    assert [c.id for c in claims.CLAIMS] == [f"C{i}" for i in range(1, 16)]
    for c in claims.CLAIMS:
        q = claims.quote(c.id)
        assert all(line.startswith("> ") for line in q.splitlines())
        assert q.startswith(f"> **{c.id}**, the common advice:")
        assert (NOTEBOOKS / f"{c.notebook}.ipynb").exists()
    with pytest.raises(ValueError, match="claim_id='C16' is not allowed"):
        claims.quote("C16")


def test_speedup_verdicts():
    base = arm("base", [100, 105, 110])
    assert claims.verdict_speedup(base, arm("x", [250, 260, 270]), 2.0).verdict.startswith("holds (")
    short = claims.verdict_speedup(base, arm("x", [150, 155, 160]), 2.0).verdict
    assert short.startswith("does not hold here as stated") and "claimed 2x" in short
    assert "not told apart from noise" in claims.verdict_speedup(base, arm("x", [104, 106, 108])).verdict
    assert "slower" in claims.verdict_speedup(base, arm("x", [50, 55, 60])).verdict
    noop = claims.verdict_speedup(base, fake("x", [100], no_ops={"pin_memory": "no GPU"}), knob="pin_memory")
    assert noop.verdict == "no-op here (no GPU)"
    diverged = fake("x", [900, 950], status="diverged", error="loss is nan at step 3")
    assert "not credited" in claims.verdict_speedup(base, diverged).verdict
    # several seeds pool their windows
    assert claims.pooled_throughput([fake("a", [1, 2]), fake("b", [3])]) == Spread(2, 1, 3, 3)


def test_less_and_conditions():
    assert claims.verdict_less(1000, 520, 0.5).verdict.startswith("holds (48% less")
    assert claims.verdict_less(1000, 800, 0.5).verdict.startswith("does not hold here as stated")
    assert claims.verdict_less(1000, 990, 0.5).verdict.startswith("does not hold here (no memory saving")
    assert "more memory" in claims.verdict_less(1000, 1200).verdict
    yes, no = claims.Judgement("holds (2x)", ""), claims.Judgement("does not hold here", "")
    assert claims.verdict_conditions({"at batch 256": yes, "at batch 8": no}).verdict == "holds only when at batch 256"
    assert claims.verdict_conditions({"a": yes, "b": yes}).verdict == "holds"
    assert claims.verdict_conditions({"a": no}).verdict == "does not hold here"
    with pytest.raises(ValueError, match="must start with one of"):
        claims.Verdict(claim="C1", verdict="probably fine")


def test_store_appends_atomically_and_keeps_the_latest(store):
    assert claims.load_verdicts() == []
    first = claims.record(claims.Verdict(claim="C1", verdict="holds (1.5x faster)", evidence="a sweep", device="CPU",
                                               profile="smoke", date="2026-01-01T00:00:00+00:00"))
    second = claims.conclude("C1", claims.Judgement("does not hold here (slower: 0.90x)", "another sweep"),
                             [fake("a", [1.0])])
    assert [v.verdict for v in claims.load_verdicts()] == [first.verdict, second.verdict]
    assert claims.latest_verdicts()["C1"].verdict == second.verdict
    assert second.device == "Test GPU" and second.profile == "smoke" and second.date
    doc = json.loads(store.read_text())
    assert doc["schema_version"] == claims.STORE_VERSION and len(doc["verdicts"]) == 2
    assert not list(store.parent.glob("*.tmp"))


def test_claim_map_prefers_the_readers_verdict_then_the_reference(store, monkeypatch):
    mine = {"C3": claims.Verdict(claim="C3", verdict="holds only when at batch 256", device="CPU", profile="cpu",
                                 date="2026-01-03T00:00:00+00:00")}
    ref = {"C3": claims.Verdict(claim="C3", verdict="holds", source="reference", device="H200", date="2026"),
           "C6": claims.Verdict(claim="C6", verdict="holds", source="reference", device="H200", profile="gpu",
                                date="2026-01-01")}
    text = claim_map.claim_map(mine=mine, reference=ref)
    for c in claims.CLAIMS:
        assert re.search(rf"^{c.id}\s", text, re.M), c.id
    c3 = text.split("\nC4")[0].split("C3 ")[1]
    assert "your latest run" in c3 and "holds only when at batch 256" in c3
    assert "bundled reference results: H200" in text.split("\nC7")[0].split("C6 ")[1]
    assert text.count("not measured yet") >= 13


def test_a_cpu_rooms_claim_map_separates_what_only_a_gpu_can_show(store):
    """On a CPU, C2, C6 and C13 read "not testable here", in their own group, beside the GPU reference results."""
    def v(claim, words, **kw):
        return claims.Verdict(claim=claim, verdict=words, device="CPU", profile="cpu", date="2026-01-03", **kw)

    gpu = [c.id for c in claims.CLAIMS if c.needs_gpu]
    assert gpu == ["C2", "C6", "C13"]
    mine = {c: v(c, claims.no_accelerator("why")) for c in gpu} | {"C1": v("C1", "holds (at the peak)")}
    ref = {"C6": claims.Verdict(claim="C6", verdict="holds (1.20x faster)", source="reference", device="H200",
                                profile="gpu", date="2026-01-01")}
    text = claim_map.claim_map(mine=mine, reference=ref)
    here, rest = text.split(claim_map.MAP_HEADINGS["gpu"])
    gpu_part, rest = rest.split(claim_map.MAP_HEADINGS["rest"])
    assert claim_map.MAP_HEADINGS["here"] in here and re.search(r"^C1\s", here, re.M)
    for c in gpu:
        assert re.search(rf"^{c}\s", gpu_part, re.M) and not re.search(rf"^{c}\s", here + rest, re.M)
    assert gpu_part.count("not testable here: no accelerator (why)") == 3 and "does not hold" not in gpu_part
    c6 = gpu_part.split("\nC6 ")[1].split("\nC13")[0]
    assert "bundled reference results: H200" in c6 and "holds (1.20x faster)" in c6
    assert "no bundled GPU reference result" in gpu_part.split("\nC13 ")[1]
    with pytest.raises(ValueError, match="must start with one of"):
        claims.check_verdict("untestable")


def test_judges_apply_to_bundled_reference_results(monkeypatch):
    from fastlab.lessons import data_loading

    def c2(results):
        return claims.verdict_speedup(results[0], results[1])

    def broken(results):
        raise ValueError("these are not the runs it judges")

    ref = {"H200": [arm("a", [100, 101]), arm("b", [300, 310])]}
    monkeypatch.setattr(claim_map, "reference_for", lambda name: ref if name == "01_data_loading:pipeline" else {})
    judges = [claim_map.ClaimJudge("C2", data_loading.compare_pipeline, c2),
              claim_map.ClaimJudge("C3", data_loading.compare_pipeline, broken)]
    got = claim_map.reference_verdicts(judges)
    assert got["C2"].verdict.startswith("holds") and got["C2"].source == "reference" and got["C2"].device == "H200"
    assert "C3" not in got  # a judge that cannot read the reference is skipped, not fatal
    ref["H200"] = [fake("a", [100, 101], repeats=1), fake("b", [300, 310], repeats=1)]
    # one run each, not interleaved: a single pair judges nothing
    assert "C2" not in claim_map.reference_verdicts(judges)


def test_a_single_pair_is_printed_never_recorded(store):
    base = arm("fp32", [100, 105, 110])
    trap = fake("bf16 (trap demonstration, one short run)", [10, 11, 12], repeats=1)
    f = claims.verdict_speedup(base, trap)
    assert f.verdict.startswith("could not tell here (a single pair") and not f.recorded
    claims.check_verdict(f.verdict)
    v = claims.conclude("C3", f, [base, trap])
    assert v.verdict == f.verdict and claims.load_verdicts() == []
    # beside a condition measured in interleaved repeats, it does not vote, and the combination is recorded
    fp16 = claims.verdict_speedup(base, arm("fp16", [300, 310, 320]))
    both = claims.verdict_conditions({"fp16": fp16, "bf16": f})
    assert both.verdict == "holds" and both.recorded and "bf16: could not tell here" in both.evidence
    claims.conclude("C3", both, [base])
    assert [v.verdict for v in claims.load_verdicts()] == ["holds"]


def test_the_explicit_judges_name_real_claims_and_their_comparisons():
    from reference_run import REPEATED_ON_A_GPU

    ids = {c.id for c in claims.CLAIMS}
    assert {j.claim for j in claim_map.JUDGES} <= ids
    for j in claim_map.JUDGES:  # each judge's comparison is one the reference run repeats on a GPU
        assert REPEATED_ON_A_GPU[j.comparison.name] is j.comparison, j


def test_notebook_time_reads_the_timings_file(tmp_path, monkeypatch):
    path = tmp_path / "timings.json"
    monkeypatch.setenv("FASTLAB_TIMINGS", str(path))
    assert "not measured yet on profile smoke" in timings.notebook_time("01_data_loading", "smoke")
    record_timing(path, "01_data_loading.ipynb", "smoke", 47.26, "ok", "CPU (2 cores)", "2026-01-02T00:00")
    assert timings.notebook_time("01_data_loading", "smoke").startswith("01_data_loading took 47 s")
    assert "not measured yet on profile cpu" in timings.notebook_time("01_data_loading", "cpu")
    table = timings_table()
    assert "| `01_data_loading` | 47 s | not measured yet |" in table and "CPU (2 cores) (2026-01-02)" in table
    assert "| the whole workbook | 47 s | not all measured |" in table
    record_timing(path, "dashboard", "smoke", 30.0, "ok", "CPU (2 cores)", "2026-01-02T00:00", first_result=12.4)
    record_timing(path, "dashboard", "cpu", 50.0, "ok", "CPU (2 cores)", "2026-01-02T00:00")
    record_timing(path, "01_data_loading", "cpu", 150.0, "ok", "CPU (2 cores)", "2026-01-02T00:00",
                          core_path=61.0)
    table = timings_table()
    assert "| `dashboard` | 30 s; first result after 12 s | 50 s |" in table
    assert "| `01_data_loading` | 47 s | 2.5 min; core path 61 s |" in table
    assert "| the whole workbook | 77 s | 3.3 min |" in table
    # a notebook's own training keeps the cores busy: only a load above them is called other work
    record_timing(path, "02_mixed_precision", "smoke", 20.0, "ok", "CPU (x, AVX2, 2 cores usable), no GPU",
                          "2026-01-02T00:00", load=2.1)
    assert "busy" not in timings.notebook_time("02_mixed_precision", "smoke")
    record_timing(path, "02_mixed_precision", "smoke", 20.0, "ok", "CPU (x, AVX2, 2 cores usable), no GPU",
                          "2026-01-02T00:00", load=4.0)
    assert "while other work kept it busy (load average 4)" in timings.notebook_time("02_mixed_precision", "smoke")
    # the thorough version is offered where FASTLAB_THOROUGH changes something, never on the dashboard
    assert "FASTLAB_THOROUGH=1" in timings.notebook_time("01_data_loading", "cpu")
    assert "THOROUGH" not in timings.notebook_time("dashboard", "cpu")


def test_the_timing_tool_reads_the_first_result_from_the_tagged_cells_timestamps():
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("notebook_timings", Path(__file__).parent / "notebook_timings.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)

    def cell(start: str, end: str, tags=()):
        c = nbformat.v4.new_code_cell("pass")
        c.metadata["execution"] = {"iopub.execute_input": f"2026-01-02T00:00:{start}Z",
                                   "shell.execute_reply": f"2026-01-02T00:00:{end}Z"}
        if tags:
            c.metadata["tags"] = list(tags)
        return c

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x"), cell("01.5", "03"),
                                         cell("03", "14.0", [tool.FIRST_RESULT_TAG]), cell("14", "50")])
    assert tool.first_result_seconds(nb) == pytest.approx(12.5)
    del nb.cells[2].metadata["tags"]
    assert tool.first_result_seconds(nb) is None
    assert tool.core_path_seconds(nb) is None  # no "## Going further": no core path
    nb.cells.insert(3, nbformat.v4.new_markdown_cell("## Going further\nMore."))
    assert tool.core_path_seconds(nb) == pytest.approx(12.5)  # from the first cell's start to the core's last end
    del nb.cells[2].metadata["execution"]
    assert tool.core_path_seconds(nb) is None  # a core cell that did not run


# ---------------------------------------------------------------- the notebooks


def markdown(name: str) -> str:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def code(name: str) -> str:
    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_every_claim_is_quoted_in_a_notebook_and_00_maps_them():
    texts = {p.stem: markdown(p.stem) for p in NOTEBOOKS.glob("*.ipynb")}
    missing = [c.id for c in claims.CLAIMS if not any(claims.quote(c.id) in t for t in texts.values())]
    assert not missing, f"paste fastlab.claims.quote(id) into a markdown cell of the notebook that tests {missing}"
    assert "claim_map()" in code("00_start_here")


@pytest.mark.parametrize("name", TECHNIQUE)
def test_technique_notebook_scaffolding(name):
    text, src = markdown(name), code(name)
    first = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"][0]
    assert first["cell_type"] == "markdown" and "What you will learn" in "".join(first["source"])
    assert f'begin_notebook("{name}")' in src  # its first line: the budget, the estimate here, the time elsewhere
    assert len(re.findall(r"^### Exercise \d", text, re.M)) >= 2
    assert text.count("<details>") >= 2 and "Predict" in text
    assert re.search(r"\*\*Next:\*\*", text) and "## Guard rails" in text
    for c in [c for c in claims.CLAIMS if c.notebook == name]:
        assert claims.quote(c.id) in text
        assert f'"{c.id}"' in src, f"{name} records no verdict for {c.id}"
        for number in re.findall(r"§(\d+)", c.section):  # the map's section numbers are the notebook's headings
            assert re.search(rf"^## {number}\. ", text, re.M), f"{c.id}: {name} has no section {number}"


def plan_slots(guide: str) -> dict[str, dict[str, float]]:
    """Each '## A ... plan' table of the guide: notebook -> minutes its rows give it (a row lasts until the next
    row's start; the last row is the plan's closing and gets none). Rows saying "read, not run" give no time."""
    plans: dict[str, dict[str, float]] = {}
    for title, body in re.findall(r"^## (A [^\n]*plan)\n(.*?)(?=^## |\Z)", guide, re.M | re.S):
        rows = re.findall(r"^\| (\d+):(\d\d) \| [^|]*\| ([^|]*)\|", body, re.M)
        slots: dict[str, float] = {}
        for (h, m, where), (h2, m2, _) in zip(rows, rows[1:]):
            minutes = (int(h2) * 60 + int(m2)) - (int(h) * 60 + int(m))
            for name in re.findall(r"`(\w+)`", where):
                if "read, not run" not in where:
                    slots[name] = slots.get(name, 0.0) + minutes
        plans[title] = slots
    return plans


def test_the_guides_plans_give_each_notebook_at_least_its_measured_time():
    """Issue 27: a plan's slot for a notebook is at least the notebook's measured time on the cpu profile."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "workshop.md").read_text()
    plans = plan_slots(guide)
    assert len(plans) >= 2 and all(plans.values()), plans
    measured = timings.load_timings(NOTEBOOKS / "timings.json")
    for title, slots in plans.items():
        for name, minutes in slots.items():
            entry = measured.get(name, {}).get("cpu")
            assert entry, f"{title}: {name} has no cpu-profile time in notebooks/timings.json"
            assert entry["seconds"] <= minutes * 60, (f"{title} gives {name} {minutes:g} min; it took "
                                                      f"{entry['seconds'] / 60:.1f} min on the cpu profile")
    assert plan_slots("## A 1-hour plan\n| 0:00 | a | `00_start_here` |\n| 0:20 | b | `01_data_loading` (read, not "
                      "run) |\n| 0:30 | c | `00_start_here` |\n| 0:40 | end | |\n") == {
        "A 1-hour plan": {"00_start_here": 30.0}}


def test_the_workshop_guide_prints_the_timings_file():
    """docs/workshop.md's table is the timings file's (tests/notebook_timings.py rewrites it), never typed."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "workshop.md").read_text()
    assert with_timings_table(guide, timings_table()) == guide
    with pytest.raises(ValueError, match="no timings table block"):
        with_timings_table("no markers", "x")


@pytest.mark.parametrize("unreadable", ["{not json", '{"schema_version": 99, "verdicts": [{"claim": "C1"}]}', "\xff"])
def test_an_unreadable_store_is_kept_aside_and_said_before_a_new_one_is_written(store, capsys, unreadable):
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_bytes(unreadable.encode("latin-1"))
    assert claims.load_verdicts() == []  # a broken store reads as empty
    claims.record(claims.Verdict(claim="C2", verdict="no-op here (no GPU)", evidence="pin_memory on cpu"))
    assert [v.claim for v in claims.load_verdicts()] == ["C2"]
    kept = list(store.parent.glob(f"{store.name}.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == unreadable.encode("latin-1")
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and kept[0].name in said[0] and "started a new one" in said[0]


def test_a_claim_is_judged_only_where_its_test_could_have_seen_it():
    base, other = arm("base", [60, 100, 150]), arm("x", [65, 110, 160])  # each ±50%: under 2.5x is unseen
    wide = claims.verdict_speedup(base, other, 2.0)
    assert wide.verdict.startswith("could not tell here (no difference detected, 1.10x, but on this machine now a "
                                   "change under 2.54x could not have been seen")
    assert "does not hold" not in wide.verdict and wide.recorded and wide.verdict.endswith("or a GPU)")
    assert claims.verdict_speedup(base, other).verdict.startswith("could not tell here")  # MIN_GAIN, no figure
    for r in (base, other):  # measured on a GPU (the bundled H200 reference): "or a GPU" would send it in circles
        r.env["device_type"] = "cuda"
    assert claims.verdict_speedup(base, other, 2.0).verdict.endswith("the thorough version (FASTLAB_THOROUGH=1))")
    # tight windows: a clear gain holds, and no gain where 2x would have been seen does not hold
    tight = arm("base", [100, 101, 102])
    assert claims.verdict_speedup(tight, arm("x", [200, 202, 204]), 2.0).verdict.startswith("holds (2.00x")
    same = claims.verdict_speedup(tight, arm("x", [100, 102, 103]), 2.0).verdict
    assert same.startswith("does not hold here (1.01x, not told apart from noise: on this machine now a change under")
    assert same.endswith("a 2x gain would have shown)")
    # memory: a claimed 50% saving measured by spreads that could not see it
    m = claims.verdict_less(Spread.of([400.0, 1000.0, 1600.0]), Spread.of([380.0, 950.0, 1500.0]), 0.5)
    assert m.verdict.startswith("could not tell here (no memory saving detected")
    # conditions: could-not-tell beside holds is not a "holds only when"; alone it is a could-not-tell
    yes = claims.Judgement("holds (2x)", "")
    assert claims.verdict_conditions({"at batch 256": yes, "at batch 8": wide}).verdict == (
        "holds when at batch 256; could not tell here when at batch 8")
    assert claims.verdict_conditions({"at batch 8": wide}).verdict.startswith("could not tell here (at batch 8: no")


def test_a_run_the_budget_did_not_start_could_not_tell_and_is_not_recorded():
    from fastlab import config, train

    cfg = config.config_for("smoke")
    base = train.not_started(cfg, "base", "not started: the budget was spent")
    other = train.not_started(cfg.replace(channels_last=True), "other", "not started: the budget was spent")
    finding = claims.verdict_speedup(base, other)
    assert finding.verdict == "could not tell here ('other' did not run: not started: the budget was spent)"
    assert not finding.recorded


def test_a_rate_with_nothing_measured_on_one_side_could_not_tell_and_is_not_recorded():
    """05's C9 once said "does not hold here (nothing measured on the base side)" when the notebook's budget had
    started none of the evaluations: nothing measured tells nothing either way."""

    finding = claims.verdict_faster(Spread.of([]), Spread.of([10.0, 11.0]), unit="eval images/s")
    assert finding.verdict.startswith("could not tell here (nothing measured on the base side")
    assert not finding.recorded
    assert claims.verdict_faster(Spread.of([10.0, 10.5]), Spread.of([20.0, 21.0])).verdict.startswith("holds")
