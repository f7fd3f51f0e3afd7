"""Notebook 09's new parts: time to accuracy of the ladder's rungs, the two ladders side by side, C15's verdict,
and the torch.compile + bf16 check (fastlab.lessons.all_together)."""

import dataclasses
import json
from pathlib import Path

import pytest

import fastlab
from fastlab import bench, measure
from fastlab.claims import check_verdict
from fastlab.lessons import all_together as at
from fastlab.outcomes import built_on
from fastlab.profiles import PROFILES, Profile, profile_of
from fastlab.results import TtaRecord


def rung(name, speeds, status="ok", dropped=None, **config):
    r = fastlab.RunResult(config={"amp": "off", "batch_size": 32, **config}, label=f"+{name}", status=status,
                          window_throughput=list(speeds), dataset={"name": "synthetic", "synthetic": True},
                          env={"device_name": "CPU (test)", "torch": "2.x"}, peak_memory_mb=100.0)
    r.rung = name
    if dropped:
        r.dropped = dropped
    return r


def tta(name, seconds, steps=None, status="ok", dropped=None, target=0.5, speed=100.0):
    runs = []
    for i, s in enumerate(seconds):
        r = rung(name, [speed], status=status, dropped=dropped)
        reached = s is not None and status == "ok"
        st = (steps or [10] * len(seconds))[i]
        r.tta_curve = [[(s or 1.0) / 2, st // 2, 0.3], [s or 1.0, st, 0.6]]  # not at the first check
        r.tta = TtaRecord(target, reached, s if reached else None, st if reached else None, 0.6 if reached else 0.2,
                          None if reached else ("diverged" if status == "diverged" else "step budget spent"))
        runs.append(r)
    return fastlab.TimeToAccuracy(f"+{name}", target, runs)


def ladder():
    return [rung("naive", [100, 100, 100]), rung("workers", [150, 150, 150]),
            rung("amp", [300, 300, 300], status="diverged", dropped="diverged: loss nan"),
            rung("fused_adamw", [160, 160, 160]), rung("large_batch", [320, 320, 320])]


def ttas():
    # each rung's seeds step at the ladder's speed for it: the time-to-accuracy gains are per-step speed
    return [tta("naive", [10.0, 11.0, 12.0]), tta("workers", [7.0, 7.5, 8.0], speed=150.0),
            tta("amp", [None] * 3, status="diverged", dropped="diverged: loss nan"),
            tta("fused_adamw", [6.0, 6.5, 7.0], speed=160.0), tta("large_batch", [12.0, 13.0, 14.0], speed=320.0)]


def test_profiles_choose_rungs_and_seeds(smoke, monkeypatch):
    assert at.tta_rung_names(smoke) == ["naive", "fused_adamw", "large_batch"]
    assert len(profile_of(smoke).tta_seeds) >= 2
    cpu = fastlab.config_for("cpu", device="cpu")
    # the cpu profile measures the checklist's stack and the larger batch against naive, over three seeds...
    assert at.tta_rung_names(cpu) == ["naive", "fused_adamw", "large_batch"] and len(profile_of(cpu).tta_seeds) >= 3
    skipped = at.tta_skipped(smoke)
    assert "workers" in skipped and "smoke" in skipped["all_on"] and "fused_adamw" not in skipped
    assert at.EVERY_RUNG in skipped["workers"] and len(profile_of(smoke).tta_seeds) < len(Profile.tta_seeds)
    assert "cpu" in at.tta_skipped(cpu)["workers"] and at.EVERY_RUNG in at.tta_skipped(cpu)["workers"]
    # ...and every rung when asked for the thorough version (smoke stays short)
    monkeypatch.setenv("FASTLAB_THOROUGH", "1")
    assert at.tta_rung_names(cpu) == [r.name for r in at.rungs_for(cpu)] and at.tta_skipped(cpu) == {}
    assert at.tta_rung_names(smoke) == ["naive", "fused_adamw", "large_batch"]


def test_time_to_accuracy_runs_the_rungs_exact_configs(quick, monkeypatch):
    results = [rung("naive", [1.0], **quick.to_dict()), rung("workers", [1.0], **quick.to_dict()),
               rung("fused_adamw", [1.0], dropped="a trap", **quick.replace(optimizer="adamw").to_dict())]
    seen = []

    def fake(cfg, seeds, label, progress, limits):
        seen.append((cfg, seeds, label))
        limited.append(limits)
        return tta(label.lstrip("+"), [1.0] * len(seeds))

    limited = []

    monkeypatch.setattr(bench, "time_to_accuracy", fake)
    monkeypatch.setitem(PROFILES, "smoke", dataclasses.replace(PROFILES["smoke"], tta_only=("fused_adamw",)))
    out = at.run_tta(results, quick, progress=False)
    assert [label for _, _, label in seen] == ["+naive", "+fused_adamw"]  # workers is not in the smoke subset
    assert seen[1][0] == fastlab.TrainConfig.from_dict(results[2].config)
    assert seen[0][1] == profile_of(quick).tta_seeds
    assert limited[0] is None and limited[1] == fastlab.bench.tta_limits(out[0])  # naive has none; above, naive's
    assert all(r.rung == "fused_adamw" and r.dropped == "a trap" for r in out[1].runs)
    assert all(r.comparison == f"{at.NAME}:time_to_accuracy" for t in out for r in t.runs)


def test_a_rung_faster_per_image_but_slower_to_a_result_stands_out():
    found = dict(at.contrasts(ladder(), ttas()))
    # amp: 2x images/s over workers, but diverged; large_batch: 2x images/s over fused_adamw, but 0.5x to the target
    assert list(found) == ["+amp", "+large_batch"]
    assert "but to the target: not faster (+amp diverged in 3 of 3 seeds)" in found["+amp"]
    assert found["+large_batch"].startswith("2.00x images/s over the rung it built on, but to the target: not faster")
    assert built_on(ttas(), 3).label == "+workers"  # fused_adamw is against workers: amp was dropped
    assert built_on(ttas(), 0) is None
    # what notebook 09's side-by-side figure draws: each rung over naive, per image and to the target
    rows = bench.speedups(ladder(), ttas())
    assert [row["speed"].median for row in rows] == pytest.approx([1.0, 1.5, 3.0, 1.6, 3.2])
    assert rows[2]["tta"] == "DIVERGED" and rows[2]["dropped"] and rows[2]["status"] == "diverged"
    gain, reached, seeds, dropped = rows[3]["tta"]
    assert gain.median == pytest.approx(11.0 / 6.5) and (reached, seeds, dropped) == (3, 3, False)


def test_rungs_without_a_time_to_accuracy_are_marked_not_run():
    rows = bench.speedups(ladder(), ttas()[:2])
    assert [row["tta"] is None for row in rows] == [False, False, True, True, True]


def test_c15_verdict_on_both_measures():
    f = at.judge_c15(ladder(), ttas())
    check_verdict(f.verdict)
    assert f.verdict.startswith("holds, ")  # fused_adamw: 1.60x images/s, and 11.0 s -> 6.5 s to target
    assert "'+fused_adamw'" in f.evidence and "counted in time to 50% held-out accuracy over 3 seeds" in f.evidence
    slow = ttas()
    slow[3] = tta("fused_adamw", [20.0, 21.0, 22.0])
    assert at.judge_c15(ladder(), slow).verdict.startswith("holds only when counted in images/s, ")
    only_speed = at.judge_c15(ladder(), [])
    assert only_speed.verdict.startswith("holds") and "images/s only" in only_speed.evidence
    with pytest.raises(ValueError, match="needs the naive rung"):
        at.judge_c15(ladder()[:1], [])


def test_c15_credits_time_to_accuracy_only_when_steps_or_step_speed_show_it():
    # the stack's seeds reach the target in half the seconds, yet step at naive's speed in the same steps: the
    # seconds measured the machine's load changing between runs, not the stack
    load = ttas()
    load[3] = tta("fused_adamw", [6.0, 6.5, 7.0], speed=100.0)
    f = at.judge_c15(ladder(), load)
    check_verdict(f.verdict)
    assert f.verdict.startswith("holds when counted in images/s; could not tell here when counted in time to 50%")
    assert "counted in time to 50% held-out accuracy over 3 seeds: could not tell here (1.69x in seconds" in \
        f.evidence


def test_c15_names_what_was_dropped_and_what_was_added():
    """On a CPU the claim's AMP is dropped as a trap and channels_last (not in the claim) joins the stack."""
    results = [rung("naive", [100] * 3), rung("workers", [150] * 3),
               rung("amp", [20] * 3, dropped="0.13x the rung below it (under 0.5x): a trap on this machine"),
               rung("cudnn", [150] * 3), rung("channels_last", [170] * 3), rung("fused_adamw", [180] * 3)]
    results[3].no_ops["cudnn_benchmark"] = "cuDNN runs only on NVIDIA GPUs"
    results[3].config["cudnn_benchmark"] = True
    v = at.judge_c15(results, []).verdict
    check_verdict(v)
    assert v.startswith("holds, for the stack as run: ") and "'+amp' dropped (0.13x the rung below it" in v
    assert "'+cudnn' a no-op here" in v and "'+channels_last' added (the checklist does not name it)" in v
    assert at.judge_c15([rung("naive", [100] * 3), rung("fused_adamw", [180] * 3)], []).verdict.startswith(
        "holds, for the stack as run: workers not run; amp not run; cudnn not run")


def _check_runs(eager_status, compiled_status):
    eager = rung("eager", [1.0], status=eager_status, model="compact")
    eager.label, eager.losses = "bf16 autocast, eager", [(0, 2.3), (1, 2.2)]
    compiled = rung("compiled", [1.0], status=compiled_status, model="compact")
    compiled.label, compiled.steps_done, compiled.step_seconds = "bf16 autocast + torch.compile", 2, [30.0, 0.1]
    compiled.losses = [(0, 2.3), (1, float("nan"))] if compiled_status == "diverged" else [(0, 2.3), (1, 2.2)]
    if compiled_status == "diverged":
        compiled.diverged_step, compiled.last_finite_loss = 1, 2.3
    return [eager, compiled]


def _compile_cell(runs, smoke, monkeypatch, capsys) -> str:
    """What notebook 09's compile + bf16 cell prints for these runs (the profile's skip lifted)."""
    nb = json.loads((Path(__file__).parents[1] / "notebooks" / "09_all_together.ipynb").read_text())
    code = next(src for c in nb["cells"] if "at.compile_check_outcome" in (src := "".join(c["source"])))
    monkeypatch.setattr(bench, "compile_skip", lambda base: None)
    monkeypatch.setattr(at, "compile_bf16_check", lambda base: runs)
    exec(code, {"bench": bench, "at": at, "base": smoke})
    return capsys.readouterr().out


@pytest.mark.parametrize("eager, compiled, found, words", [
    ("ok", "diverged", "reproduces",
     "-> it reproduces here: torch.compile + bf16 diverged while bf16 in eager mode did not"),
    ("ok", "ok", "finite", "-> it does not reproduce here: both stayed finite"),
    ("diverged", "diverged", "both diverged", "-> both diverged here"),
    ("diverged", "ok", "eager diverged", "-> bf16 eager diverged and the compiled run did not"),
    ("ok", "failed", "compile failed", "-> torch.compile failed here"),
])
def test_compile_check_reads_the_statuses(eager, compiled, found, words, smoke, monkeypatch, capsys):
    assert at.compile_check_outcome(_check_runs(eager, compiled)) == found
    text = _compile_cell(_check_runs(eager, compiled), smoke, monkeypatch, capsys)
    assert words in text and "torch 2.x on CPU (test), model compact" in text
    assert "first step (compilation included) took 30.0 s" in text
    if compiled == "diverged":
        assert "diverged at step 1 (last finite loss 2.300)" in text


def test_compile_check_guards(smoke, monkeypatch):
    assert "smoke profile" in bench.compile_skip(smoke)
    assert bench.compile_skip(fastlab.config_for("cpu")) is None
    with pytest.raises(ValueError, match="steps=0 is not allowed"):
        at.compile_bf16_check(smoke, steps=0)
    monkeypatch.setattr(at, "bf16_supported", lambda device: False)
    assert at.compile_bf16_check(smoke) == []
    assert at.compile_check_outcome([]) == "not checked"


NATIVE_BF16 = measure.cpu_native_bf16()  # avx512_bf16 or amx_bf16 here (FASTLAB_CPU_KIND overrides it)


@pytest.mark.slow
@pytest.mark.skipif(not NATIVE_BF16, reason="needs a CPU with native bf16 (avx512_bf16 or amx_bf16); the other "
                    "branch is test_compile_check_without_native_bf16_runs_nothing")
def test_compile_check_runs_for_real(quick):
    # a torch.compile of the tiny net on a 2-core CPU: over a minute with a cold inductor cache
    runs = at.compile_bf16_check(quick.replace(device="cpu"), steps=2, model="tiny")
    assert [r.label for r in runs] == ["bf16 autocast, eager", "bf16 autocast + torch.compile"]
    assert runs[0].config["amp"] == runs[1].config["amp"] == "bf16"
    assert runs[0].config["compile"] == "off" and runs[1].config["compile"] == "default"
    assert all(r.status in ("ok", "diverged") for r in runs)
    assert at.compile_check_outcome(runs) in ("reproduces", "finite", "both diverged", "eager diverged")


def test_compile_check_without_native_bf16_runs_nothing(quick, native_bf16, monkeypatch):
    """On every CPU: without native bf16 the case does not arise (bf16 is a trap there), nothing runs, and it says so."""
    native_bf16(False)
    monkeypatch.setattr(at, "run", lambda *a, **k: pytest.fail("a run started without native bf16"))
    assert at.compile_bf16_check(quick.replace(device="cpu"), steps=2, model="tiny") == []
    assert at.compile_check_outcome([]) == "not checked"


def test_the_notebook_says_a_device_without_native_bf16_was_not_checked(smoke, monkeypatch, capsys):
    said = _compile_cell([], smoke, monkeypatch, capsys)
    assert said.startswith("not checked: ") and "has no native bf16" in said


def test_a_rung_of_no_ops_is_not_measured_to_the_target_again(quick, monkeypatch):
    cfg = quick.to_dict()
    results = [rung("naive", [1.0], **cfg), rung("cudnn", [1.0], **{**cfg, "cudnn_benchmark": True}),
               rung("channels_last", [1.0], **{**cfg, "cudnn_benchmark": True, "channels_last": True})]
    results[1].no_ops = {"cudnn_benchmark": "cuDNN runs only on NVIDIA GPUs"}
    assert at.noop_rung(results, 1).startswith("every change of this rung is a no-op here (cuDNN runs only")
    assert at.noop_rung(results, 2) is None
    monkeypatch.setattr(bench, "time_to_accuracy",
                        lambda cfg, seeds, label, progress, limits: tta(label.lstrip("+"), [1.0]))
    monkeypatch.setenv("FASTLAB_THOROUGH", "1")  # every rung measured: the cpu profile's thorough version
    out = at.run_tta(results, fastlab.config_for("cpu", device="cpu"), progress=False)
    assert [t.label for t in out] == ["+naive", "+channels_last"]
    assert at.tta_skipped(fastlab.config_for("cpu"), results)["cudnn"].startswith("every change")
    assert [row["tta"] for row in bench.speedups(results, out)][1] == "no-op here"


def test_the_tuned_run_is_the_highest_kept_rung():
    results = ladder()
    for r in results:
        r.forward_seconds = [0.01]
    assert at.anatomy_pair(results)[0][-1].rung == "large_batch"
    results[-1].dropped = "a trap"
    assert at.anatomy_pair(results)[0][-1].rung == "fused_adamw"  # amp diverged and was dropped below it
    assert at.anatomy_pair(results[:1])[0] == results[:1]  # no rung above naive: never naive against itself


def test_the_anatomy_never_draws_naive_against_itself():
    """Every rung above naive time-limited (a slow CPU): naive alone, and why each rung is not usable."""
    results = [rung("naive", [100, 100], status="time_limited")] + [
        rung(name, [], status="time_limited") for name in ("workers", "fused_adamw")]
    results[2].error = "its budget: 60 s"
    for r in results:
        r.forward_seconds = [0.01]
    runs, note = at.anatomy_pair(results)
    assert runs == [results[0]]
    assert note.startswith("No rung above naive finished with a usable measurement ('+workers' time-limited "
                           "(stopped early); '+fused_adamw' time-limited (its budget: 60 s))")
    results[1].status = "ok"
    assert at.anatomy_pair(results) == ([results[0], results[1]], "")


def test_a_ladder_the_budget_did_not_start_has_no_top_and_says_why():
    refused = [rung(n, [], status="time_limited") for n in ("naive", "+amp")]
    for r in refused:
        r.error, r.budget_cut = "not started: the budget was spent", "not started"
    assert at.ladder_unrun(refused) == ("no rung of the ladder finished a timed window ('+naive' finished no timed "
                                        "window (time_limited: not started: the budget was spent))")
    assert at.ladder_unrun([rung("naive", [100.0, 101.0]), *refused]) is None
