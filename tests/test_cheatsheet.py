"""The cheat sheet: docs/cheatsheet.md is what fastlab.cheatsheet generates, and each claim's row is its own.
Notebook 00 shows it from the module, and shows the plain loop (fastlab.code.loop_code) with its measuring touches.
"""

import inspect
import json
import re
from pathlib import Path

import pytest

from fastlab import cheatsheet, claim_map, claims, config_for, verdicts
from fastlab.code import code, loop_code

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cheatsheet.md"
START_HERE = ROOT / "notebooks" / "00_start_here.ipynb"
# Each claim's own PyTorch call, which its code block must show (the technique, not a neighbour's).
CALLS = {"C1": ["num_workers="], "C2": ["pin_memory=", "non_blocking=True"], "C3": ["torch.autocast", "float16"],
         "C4": ["torch.autocast", "bfloat16"], "C5": ["GradScaler", "scaler.scale(loss).backward()", "scaler.step"],
         "C6": ["torch.backends.cudnn.benchmark = True"], "C7": ["+    loader = DataLoader(train_set, batch_size="],
         "C8": ["+    loader = DataLoader(train_set, batch_size="], "C9": ["+    grad_mode = torch.no_grad()"],
         "C10": ["loss.detach()"], "C11": ['+        logged = {"step": step, "loss": loss.item()}'],
         "C12": ["torch.optim.AdamW", "CosineAnnealingLR", "scheduler.step()"],
         "C13": ["num_workers="], "C14": ["torch.export.export", "torch.onnx.export"],
         "C15": ["num_workers=", "pin_memory=", "torch.autocast", "GradScaler", "cudnn.benchmark", "AdamW"]}
TYPED_FIGURE = re.compile(r"\b\d+(\.\d+)?\s*(x faster|x slower|×|x speed|img/s|images/s|% faster|% less|k images)")


@pytest.fixture(scope="module")
def page() -> str:
    return cheatsheet.generate()


def sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## (C\d+)\b", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_docs_cheatsheet_is_what_the_module_generates(page):
    assert DOC.exists(), f"docs/cheatsheet.md is missing: run `{cheatsheet.REGENERATE}`"
    assert DOC.read_text() == page, f"docs/cheatsheet.md is out of date: run `{cheatsheet.REGENERATE}`"


def test_every_claim_once_in_order_with_its_own_code(page):
    found = sections(page)
    assert list(found) == [c.id for c in claims.CLAIMS] == [e.claim for e in cheatsheet.ENTRIES]
    for claim_id, text in found.items():
        assert claims.quote(claim_id) in text  # quoted as under test, from fastlab.claims
        code = text.split("**The verdict**")[0]
        for call in CALLS[claim_id]:
            assert call in code, f"{claim_id}'s code does not show {call!r}"


def test_each_verdict_names_the_function_that_decides_it(page):
    found = sections(page)
    for entry in cheatsheet.ENTRIES:
        fn = entry.decides
        assert entry.claim in inspect.getdoc(fn), f"{fn.__qualname__} does not say it decides {entry.claim}"
        text = found[entry.claim]
        assert f"`{fn.__module__}.{fn.__qualname__}`" in text and "Weighed: " in text
        for registered in [j for j in claim_map.JUDGES if j.claim == entry.claim]:  # the reference verdict
            assert registered.judge is fn or f"{fn.__name__}(" in inspect.getsource(registered.judge)  # runs it too
            assert f"`{registered.comparison.name}`" in text
    assert "**The noise rule**" in page and " ".join(inspect.getdoc(verdicts.is_noise).split()) in page


def test_the_rules_listed_are_the_ones_the_function_calls():
    assert cheatsheet._rules_used(claims.verdict_conditions) == []
    assert "verdict_speedup" in cheatsheet._rules_used(cheatsheet.ENTRIES[2].decides)  # C3: a speed verdict
    assert cheatsheet._rules_used(cheatsheet.ENTRIES[11].decides)[0] == "tta_finding"  # C12: time to accuracy


def test_own_lines_come_from_fastlab_source_and_a_missing_marker_is_an_error():
    fn, markers = cheatsheet.ENTRIES[4].own
    lines = cheatsheet.own_lines(fn, markers)
    assert all(line.strip() in inspect.getsource(fn) for line in lines.splitlines())
    with pytest.raises(ValueError, match="no line of scaler_history"):
        cheatsheet.own_lines(fn, ("torch.no_such_call",))


def test_no_figure_typed_by_hand_outside_quotes_and_code(page):
    """Outside the quoted claims, the code and the docstrings the page quotes, no figure is typed."""
    for fn in [e.decides for e in cheatsheet.ENTRIES] + list(cheatsheet.RULES.values()):
        for paragraph in (inspect.getdoc(fn) or "").split("\n\n"):
            page = page.replace(" ".join(paragraph.split()), "")
    prose, in_code = [], False
    for line in page.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and not line.startswith(">"):
            prose.append(line)
    assert not TYPED_FIGURE.search("\n".join(prose))


def start_here() -> tuple[str, str]:
    """(markdown, code) of notebook 00."""
    cells = json.loads(START_HERE.read_text())["cells"]
    return tuple("\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == kind)
                 for kind in ("markdown", "code"))


def test_the_plain_loop_is_the_train_function_of_the_script_that_runs():
    for cfg, step in ((config_for("smoke"), "optimizer.step()"),
                      (config_for("smoke", amp="fp16", log_every=5), "scaler.step(optimizer)")):
        loop = loop_code(cfg)
        assert loop.startswith("def train(") and loop.rstrip() in code(cfg)
        for line in ("for x, y in batches:", ".backward()", step, "loss.item()", "evaluate("):
            assert line in loop, f"the loop shown lacks {line!r}"
    assert "% 5 == 0" in loop  # a knob's lines are in it too


def test_notebook_00_shows_the_loop_its_touches_and_the_cheat_sheet_from_the_modules():
    text, source = start_here()
    assert "loop_code(cfg)" in source and "cheatsheet.show()" in source
    timer = text.split("## 5. What is inside the timer")[1].split("\n## ")[0]
    for touch in ("synchronise", "`next(batches)`", "copy", "timed apart", "`log_every`"):
        assert touch in timer, f"notebook 00 does not say where fastlab touches the loop: {touch!r}"
    words = len(text.split())
    assert words <= 1100, f"notebook 00's prose is {words} words: keep it near 900"
