"""A profile is one piece of data (fastlab.profiles): no other module holds a table keyed by profile name or tests a
profile's name, adding a profile is one entry, and gpu-dry is the gpu profile's paths at smoke's sizes."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import fastlab
from fastlab import bench, config
from fastlab.config import TrainConfig, active_profile, comparison_repeats, config_for, time_sizing, tta_settings
from fastlab.lessons import all_together, batch_size, compile_export, hygiene, mixed_precision, own_model
from fastlab.profiles import PROFILES, profile, profile_of

PACKAGE = Path(fastlab.__file__).resolve().parent
# Names that are torch device types as well as profiles: a table keyed by device type ({"cpu": ..., "mps": ...}) is
# not a profile table, so a dict needs a key naming a profile only (smoke, gpu, gpu-dry) to count as one.
DEVICE_TYPES = {"cpu", "cuda", "mps"}


def _names(node: ast.AST, profiles: set[str]) -> list[str]:
    """The profile names a constant, or a tuple/list/set of constants, spells."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in profiles]


def _is_profile_table(keys: list[str | None], profiles: set[str]) -> bool:
    """Keys of a dict literal that make it a table keyed by profile name: two or more profile names (or only
    profile names), at least one of which is not also a device type."""
    named = [k.split()[0] for k in keys if k and k.split()[0] in profiles]  # "gpu compact": gpu's, per model
    if not named or not set(named) - DEVICE_TYPES:
        return False
    return len(named) >= 2 or len(named) == len(keys)


def profile_name_uses(root: Path, profiles: set[str]) -> list[str]:
    """'file:line what' for each table keyed by profile name and each comparison of something that mentions
    `profile` with a profile-name literal, in every module under root except profiles.py (the one place)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "profiles.py" and path.parent == root:
            continue
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Dict):
                keys = [k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None
                        for k in node.keys]
                if _is_profile_table(keys, profiles):
                    found.append(f"{where}:{node.lineno} a dict keyed by profile name: {ast.unparse(node)[:60]}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
                keys = [k.arg for k in node.keywords]
                if _is_profile_table(keys, profiles):
                    found.append(f"{where}:{node.lineno} a dict(...) keyed by profile name")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                for i, side in enumerate(sides):
                    named = _names(side, profiles)
                    others = [ast.unparse(s) for j, s in enumerate(sides) if j != i]
                    if named and any("profile" in o for o in others):
                        found.append(f"{where}:{node.lineno} compares a profile with {named}: {ast.unparse(node)}")
                        break
    return found


def test_no_module_but_profiles_holds_a_table_keyed_by_profile_name_or_tests_a_profile_name():
    found = profile_name_uses(PACKAGE, {*PROFILES, "custom"})
    assert not found, ("sizes and facts of a profile belong in its fastlab/profiles.py entry (read them with "
                       "profile_of(cfg).<field>):\n" + "\n".join(found))


@pytest.mark.parametrize("source, caught", [
    ('SEEDS = {"smoke": (0, 1), "cpu": (0, 1), "gpu": (0, 1, 2)}', True),
    ('TTA_MAX_STEPS = {"smoke": 50}', True),
    ('LADDER = {"smoke": (32, 64), "gpu compact": (128, 1024)}', True),
    ('x = dict(smoke=1, gpu=2)', True),
    ('y = 1 if cfg.profile == "smoke" else 2', True),
    ('y = base.profile != "gpu"', True),
    ('y = active_profile() == "smoke"', True),
    ('y = cfg.profile in ("cpu", "gpu")', True),
    ('WHERE = {"mps": "an Apple GPU (mps)", "cpu": "the CPU"}', False),  # keyed by device type
    ('y = device.type == "cpu"', False),
    ('HEADINGS = {"here": 1, "gpu": 2, "rest": 3}', False),
    ('y = config_for("gpu", model="compact")', False),
])
def test_the_scan_catches_profile_tables_and_name_tests(tmp_path, source, caught):
    """The patterns the lessons used before fastlab.profiles (on the main branch before it, the scan names 33
    such places) are caught; tables keyed by device type and calls naming a profile are not."""
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "lesson.py").write_text(source + "\n")
    (root / "profiles.py").write_text('TABLE = {"smoke": 1, "gpu": 2}\n')  # the one place: never scanned
    found = profile_name_uses(root, {*PROFILES, "custom"})
    assert bool(found) == caught, found
    assert all(f.startswith("pkg/lesson.py:1 ") for f in found)


def test_adding_a_profile_is_one_entry(monkeypatch):
    """A new Profile built from an existing one and registered in PROFILES is accepted everywhere a name is, and
    every lesson reads its sizes from it."""
    smoke = PROFILES["smoke"]
    new = dataclasses.replace(smoke, name="tiny-test", settings=dict(smoke.settings, batch_size=16),
                              batch_grid=(8, 16), precision_seeds=(5,), tta_seeds=(7, 8), eval_repeats=1,
                              loop_steps=3, ladder_batch=(4, 16), comparison_repeats=4, largest_factor=2,
                              time_to_accuracy=dict(synthetic=0.3, cifar10=0.2, eval_every=2, max_steps=9))
    monkeypatch.setitem(PROFILES, "tiny-test", new)
    monkeypatch.setenv("FASTLAB_PROFILE", "tiny-test")
    monkeypatch.delenv("FASTLAB_REPEATS", raising=False)
    assert active_profile() == "tiny-test"
    cfg = config_for(device="cpu")
    assert (cfg.profile, cfg.batch_size, cfg.model, cfg.dataset) == ("tiny-test", 16, "tiny", "synthetic")
    assert profile_of(cfg) is new and TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert batch_size.sizes_for(cfg) == [8, 16]
    assert batch_size.large_batch(cfg, 10_000) == 32
    assert mixed_precision.seeds_for(cfg) == (5,)
    assert profile_of(cfg).tta_seeds == (7, 8)  # what notebooks 06 and 09 run time to accuracy over
    assert len(own_model.loop_dataset(cfg)) == 16 * 3
    assert [r.changes["batch_size"] for r in bench.ladder(cfg) if "batch_size" in r.changes][:1] == [4]
    assert comparison_repeats(cfg) == 4 and time_sizing("tiny-test") is None
    assert tta_settings(cfg)["max_steps"] == 9
    assert compile_export.modes_plan(cfg)[0] == ["off", "default"] and "all_on" in all_together.skipped_rungs(cfg)
    assert hygiene.eval_config(cfg).profile == "tiny-test"


def test_an_unknown_profile_is_refused_naming_the_allowed_ones(monkeypatch):
    with pytest.raises(ValueError, match="profile='nope' is not allowed: choose one of smoke, cpu, gpu, mps, gpu-dry"):
        profile("nope")
    with pytest.raises(ValueError, match="choose one of smoke"):
        config_for("nope")
    monkeypatch.setenv("FASTLAB_PROFILE", "nope")
    with pytest.raises(ValueError, match="FASTLAB_PROFILE='nope' is not allowed"):
        active_profile()
    assert profile("custom") is profile_of(TrainConfig())  # a hand-built config's


# TrainConfig fields that size a run: the only ones where gpu-dry may differ from gpu (besides lr: not at all).
SIZE_FIELDS = {"batch_size", "steps", "warmup_steps", "windows", "train_images", "eval_images", "max_seconds",
               "dataset"}


def test_gpu_dry_is_the_gpu_profile_at_smokes_sizes(monkeypatch):
    monkeypatch.setenv("FASTLAB_PROFILE", "gpu-dry")
    monkeypatch.delenv("FASTLAB_DATA", raising=False)
    dry, gpu, smoke = config_for(), config_for("gpu"), config_for("smoke")
    assert dry.profile == "gpu-dry" and dry.device == "auto"  # CUDA if there, else the CPU
    assert set(gpu.diff(dry)) <= SIZE_FIELDS  # gpu's model, loader, log_every, lr and every other knob
    assert (dry.model, dry.loader, dry.log_every) == ("resnet18", "device", 10)
    assert dry.max_seconds == gpu.max_seconds == 0  # no clock: a run cut short would change the outputs
    for name in ("steps", "warmup_steps", "windows", "dataset"):
        assert getattr(dry, name) == getattr(smoke, name), name
    for name in ("train_images", "eval_images"):  # smoke's batches per epoch and per evaluation, at a quarter the batch
        assert getattr(dry, name) / dry.batch_size == getattr(smoke, name) / smoke.batch_size, name
    dry_p, gpu_p, smoke_p = PROFILES["gpu-dry"], PROFILES["gpu"], PROFILES["smoke"]
    assert dry_p.fixed_steps and not dry_p.downloads and not dry_p.thorough  # nbval's outputs: not speed's
    assert dry_p.cuda_sized == gpu_p.cuda_sized and dry_p.ddp_cpu_profile is not None  # gpu's code paths
    assert config.time_sizing("gpu-dry") is None and tta_settings(dry) == tta_settings(smoke)
    for name in ("precision_seeds", "tta_seeds", "eval_repeats", "comparison_repeats", "loading_shortening",
                 "own_model_shortening", "tta_only", "skip_compile", "batch_tta_max_steps"):
        assert getattr(dry_p, name) == getattr(smoke_p, name), name
    grid = batch_size.sizes_for(dry)
    assert len(grid) == len(gpu_p.batch_grid) and max(grid) <= 16  # gpu's shape, a CPU's sizes
    assert dry_p.search_max_batch * smoke.batch_size == smoke_p.search_max_batch * dry.batch_size
    assert any(b % 8 for b in grid) and dry.batch_size in grid  # a non-multiple of 8, as gpu's 250


def test_gpu_dry_takes_gpus_estimate_without_cuda_but_never_refuses_a_run(monkeypatch, capsys):
    """gpu's path on a CPU (estimate a run, say it), without gpu's refusal: a loaded CI machine must not decide
    whether a notebook cell runs."""
    from fastlab import isolation, train

    started: list = []
    monkeypatch.setattr(train, "_STEP_ESTIMATES", {}, raising=False)
    monkeypatch.setattr(train, "_SAID", set(), raising=False)
    monkeypatch.setattr(isolation, "call", lambda fn, *args: 600.0)  # 10 min a step (pretend)
    monkeypatch.setattr(isolation, "execute", lambda training, cold=False: started.append(training.cfg) or
                        training.result)
    monkeypatch.delenv("FASTLAB_CONFIRM_SLOW", raising=False)
    dry = config_for("gpu-dry", device="cpu")
    fastlab.run(dry, progress=False)
    assert started == [dry]
    assert "the gpu-dry profile is sized for a CUDA GPU" in capsys.readouterr().out
