"""The profiles: each one piece of data holding every size a notebook or lesson uses on it.

A profile (smoke, cpu, gpu, mps, gpu-dry) is one `Profile` entry in PROFILES: its TrainConfig overrides, its
time-to-accuracy settings, how its runs are sized, and each lesson's sizes (seeds, batch grids, sweep limits, ladder
batches, search limits) as named fields. Lessons read `profile_of(cfg).<field>`; none holds a table keyed by profile
name and none tests a profile's name (tests/test_profiles.py checks both), so adding a profile is one entry here.
Facts a lesson acts on (never touching the network, skipping a slow compile) are fields too, not name tests.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

# A run's (steps, warmup_steps, windows) cut to a few steps: a lesson with many runs, each starting workers or a
# slower net, stays short in CI.
Shortening = dict[str, int]


@dataclass(frozen=True)
class Profile:
    """Every size and fact a notebook or lesson reads for one profile; a field's comment says what it is for."""

    name: str
    # The TrainConfig fields this profile sets (overrides on TrainConfig's defaults).
    settings: dict[str, Any] = field(default_factory=dict)
    # Whether runs may use real CIFAR-10 (FASTLAB_DATA, the data folder, or a download). False: always the synthetic
    # set and never the network (CI; nbval's outputs must not depend on what is on disk).
    downloads: bool = True
    # Time to accuracy: targets its naive configuration reaches within max_steps (synthetic / cifar10), how often to
    # evaluate, and optionally on how many held-out images (cpu: 256, since every evaluation costs training time).
    time_to_accuracy: dict[str, Any] = field(default_factory=dict)
    # Runs sized by time (fastlab.calibration): seconds of timed steps for one run and a whole comparison, turned into
    # steps within min_steps..max_steps; notebook_seconds: a notebook's budget (fastlab.budget). None: fixed `steps`.
    time_sizing: dict[str, float] | None = None
    # How many times each arm of a speed comparison runs, interleaved: two or more let the noise rule tell an effect
    # from the machine drifting between runs; one is a single pair and judges nothing (verdicts.single_pair).
    comparison_repeats: int = 2
    # Whether FASTLAB_THOROUGH=1 lengthens this profile (more seeds, every rung to the target).
    thorough: bool = True
    # Sized for a CUDA GPU: without one, a run's time is estimated first and said (train.py), and one estimated
    # over slow_run_minutes is refused unless FASTLAB_CONFIRM_SLOW=1 (None: never refused).
    cuda_sized: bool = False
    slow_run_minutes: float | None = None
    # 01 data loading: the shortening of its many worker runs ({}: the profile's own steps).
    loading_shortening: Shortening = field(default_factory=dict)
    # 02 mixed precision: the seeds each precision trains over (three precisions x seeds must fit a lesson).
    precision_seeds: tuple[int, ...] = (0, 1, 2)
    # 04 batch size: the sizes sweep (powers of two beside neighbours; None: the profile's batch and its neighbours).
    batch_grid: tuple[int, ...] | None = None
    # 04: the largest-batch search's ceiling and, on a CPU, its memory budget over the process's memory now (MB).
    search_max_batch: int = 1024
    search_headroom_mb: int = 512
    # 04: "the largest batch that fits" is capped at this x the profile's batch for time to accuracy.
    largest_factor: int = 8
    # 04: time to accuracy's step limit by batch size (None: the profile's own time_to_accuracy max_steps).
    batch_tta_max_steps: int | None = None
    # 04, 06, 09: the seeds time to accuracy runs over.
    tta_seeds: tuple[int, ...] = (0, 1, 2)
    # 05 hygiene: how many times each eval_mode runs, in turns.
    eval_repeats: int = 3
    # 07 compile: whether every compile mode runs (False: eager and default only; max-autotune takes minutes on a CPU).
    all_compile_modes: bool = True
    # 09 all together: the ladder's (naive, large) batch, and per model where a model needs another (None: the
    # profile's batch and twice it).
    ladder_batch: tuple[int, int] | None = None
    ladder_batch_by_model: dict[str, tuple[int, int]] = field(default_factory=dict)
    # 09: skip torch.compile's rung and the compile + bf16 check (a first compile on a CPU outlasts the notebook).
    skip_compile: bool = False
    # 09: the rungs measured to the target besides naive (empty: every rung).
    tta_only: tuple[str, ...] = ()
    # 10 your own model: the notebook's shortening ({}: the profile's own sizes), and its hand-written loop's steps.
    own_model_shortening: Shortening = field(default_factory=dict)
    loop_steps: int = 40
    # 11 DDP on a machine with one GPU: the profile whose sizes its CPU processes take (None: this profile's own).
    ddp_cpu_profile: str | None = None
    # Exercises: batches of training images, steps a timed window, warm-up steps.
    exercise_batches: int = 20
    exercise_window_steps: int = 5
    exercise_warmup_steps: int = 3

    @property
    def fixed_steps(self) -> bool:
        """Whether runs take the profile's `steps` as they are (no sizing by time: nbval's outputs stay fixed)."""
        return self.time_sizing is None

    def ladder_batches(self, model: str, batch_size: int) -> tuple[int, int]:
        """The ladder's (naive, large) batch for `model` at this profile's `batch_size`."""
        return self.ladder_batch_by_model.get(model) or self.ladder_batch or (batch_size, batch_size * 2)


SMOKE = Profile(
    "smoke",
    # CI and shared rooms: a tiny net on a few hundred synthetic images, a few seconds a run.
    settings=dict(model="tiny", dataset="synthetic", batch_size=32, steps=10, warmup_steps=3, windows=2,
                  train_images=640, eval_images=256, lr=3e-3, max_seconds=60.0),
    downloads=False, time_to_accuracy=dict(synthetic=0.50, cifar10=0.40, eval_every=5, max_steps=120),
    time_sizing=None, comparison_repeats=2, thorough=False,
    loading_shortening=dict(steps=6, warmup_steps=1, windows=3), precision_seeds=(0, 1), batch_grid=(24, 32, 40),
    search_max_batch=256, search_headroom_mb=64, largest_factor=4, batch_tta_max_steps=50, tta_seeds=(0, 1),
    eval_repeats=2, all_compile_modes=False, ladder_batch=(32, 64), skip_compile=True,
    tta_only=("fused_adamw", "large_batch"), own_model_shortening=dict(steps=12, warmup_steps=2, windows=3),
    loop_steps=28, exercise_batches=8, exercise_window_steps=2, exercise_warmup_steps=1,
)

CPU = Profile(
    "cpu",
    # A laptop: the compact net, a comparison of two runs in about a minute.
    settings=dict(model="compact", batch_size=64, steps=25, warmup_steps=3, windows=5,
                  train_images=10_000, eval_images=1_000, lr=2e-3, max_seconds=45.0),
    time_to_accuracy=dict(synthetic=0.50, cifar10=0.50, eval_every=5, max_steps=150, eval_images=256),
    time_sizing=dict(run_seconds=6.0, comparison_seconds=40.0, min_steps=10, max_steps=60, notebook_seconds=240.0),
    comparison_repeats=2, precision_seeds=(0, 1), batch_grid=(48, 64, 80), search_max_batch=1024,
    search_headroom_mb=512, largest_factor=4, ladder_batch=(64, 128), tta_only=("fused_adamw", "large_batch"),
    loop_steps=40,
)

GPU = Profile(
    "gpu",
    # A real GPU, sized for 15 GB: the device loader (time the GPU, not PIL), the loss read (a sync) every 10 steps.
    settings=dict(model="resnet18", loader="device", log_every=10, batch_size=512, steps=200, warmup_steps=30,
                  windows=5, train_images=50_000, eval_images=10_000, lr=2e-3),
    time_to_accuracy=dict(synthetic=0.90, cifar10=0.90, eval_every=50, max_steps=5_000),
    # sweep_seconds: notebook 01's worker sweep past the cores only while it fits (lessons.data_loading.sweep_counts);
    # max_autotune_in_fast 0: 07 compiles with max-autotune only in the thorough version (minutes of autotuning);
    # notebook_seconds 100: the workbook's fast version within 25 minutes on an H200 (tests/gpu_estimate.py)
    time_sizing=dict(run_seconds=4.0, comparison_seconds=30.0, min_steps=50, max_steps=400, notebook_seconds=100.0,
                     sweep_seconds=60.0, max_autotune_in_fast=0),
    comparison_repeats=3, cuda_sized=True, slow_run_minutes=10.0, precision_seeds=(0, 1, 2), batch_grid=(96, 128, 160, 250, 256),
    search_max_batch=16_384, search_headroom_mb=0, largest_factor=8, ladder_batch=(128, 512),
    ladder_batch_by_model={"compact": (128, 1024)}, loop_steps=100, ddp_cpu_profile="cpu",
)

MPS = Profile(
    "mps",
    # An Apple GPU (mps): the DataLoader (the device loader is untested on mps), a budget (laptop GPUs vary).
    settings=dict(model="compact", batch_size=128, steps=60, warmup_steps=5, windows=5,
                  train_images=20_000, eval_images=2_000, lr=2e-3, max_seconds=90.0),
    time_to_accuracy=dict(synthetic=0.80, cifar10=0.80, eval_every=25, max_steps=2_000),
    time_sizing=dict(run_seconds=6.0, comparison_seconds=40.0, min_steps=20, max_steps=200, notebook_seconds=240.0),
    comparison_repeats=2, loop_steps=60,
)

# The gpu profile's shapes and code paths at smoke's step counts, on whatever device is here (CUDA if there, else the
# CPU): CI runs every notebook through the gpu profile's paths (ResNet-18, the device loader, the loss read every 10
# steps, the one-GPU DDP fallback, the estimate of a CUDA-sized run without CUDA) in minutes. Fixed steps (nbval's
# outputs must not depend on speed), synthetic data and never the network, smoke's seeds, repeats, shortenings and
# batches per epoch; the lr stays gpu's (not a size). Its batches are a quarter of smoke's (8, not 32): ResNet-18 with
# the CIFAR stem is 0.12 s a step at 8 and 0.44 s at 32 on a quiet 2-core Xeon, and every notebook under gpu-dry must
# fit in make test beside the smoke pass. No time limit (gpu's max_seconds=0, not smoke's 60 s): a run cut short by
# the clock on a loaded CI CPU would leave the notebook without its accuracy, an output that depends on speed.
GPU_DRY_BATCH = 8
GPU_DRY = dataclasses.replace(
    GPU,
    name="gpu-dry",
    settings=dict(GPU.settings, dataset="synthetic", batch_size=GPU_DRY_BATCH, steps=SMOKE.settings["steps"],
                  warmup_steps=SMOKE.settings["warmup_steps"], windows=SMOKE.settings["windows"],
                  train_images=SMOKE.settings["train_images"] * GPU_DRY_BATCH // SMOKE.settings["batch_size"],
                  eval_images=SMOKE.settings["eval_images"] * GPU_DRY_BATCH // SMOKE.settings["batch_size"]),
    downloads=False, time_to_accuracy=SMOKE.time_to_accuracy, time_sizing=None,
    comparison_repeats=SMOKE.comparison_repeats, thorough=False, loading_shortening=SMOKE.loading_shortening,
    precision_seeds=SMOKE.precision_seeds,
    # gpu's grid shape (a power of two with a neighbour each side, then the non-multiple-of-8 250 beside 256) at its
    # sixty-fourth: 15 beside 16 as 250 beside 256.
    batch_grid=(6, 8, 10, 15, 16),
    # On a CPU the search's budget is the process's memory plus headroom_mb; its largest batch a quarter of smoke's,
    # as the batch is.
    search_max_batch=SMOKE.search_max_batch * GPU_DRY_BATCH // SMOKE.settings["batch_size"],
    search_headroom_mb=SMOKE.search_headroom_mb,
    largest_factor=SMOKE.largest_factor,  # 4 x 8 = 32
    batch_tta_max_steps=SMOKE.batch_tta_max_steps, tta_seeds=SMOKE.tta_seeds, eval_repeats=SMOKE.eval_repeats,
    all_compile_modes=False,  # max-autotune benchmarks kernels for minutes on a CPU
    # gpu's ladder shape: naive a quarter of the profile's batch, large the batch (compact: 8 x naive, as gpu's
    # 128 -> 1024).
    ladder_batch=(GPU_DRY_BATCH // 4, GPU_DRY_BATCH), ladder_batch_by_model={"compact": (2, 16)},
    skip_compile=True, tta_only=SMOKE.tta_only, own_model_shortening=SMOKE.own_model_shortening,
    loop_steps=SMOKE.loop_steps,
    ddp_cpu_profile="smoke",  # gpu's fallback to another profile's sizes, landing on smoke's
    # gpu's estimate of a run without CUDA, said but never refused: on a loaded CI CPU the estimate of even 13 steps
    # of ResNet-18 can pass gpu's 10 minutes, and whether a cell ran must not depend on speed.
    slow_run_minutes=None,
    exercise_batches=SMOKE.exercise_batches, exercise_window_steps=SMOKE.exercise_window_steps,
    exercise_warmup_steps=SMOKE.exercise_warmup_steps,
)

# The profiles FASTLAB_PROFILE, --profile and config_for accept: adding one is one entry here.
PROFILES: dict[str, Profile] = {p.name: p for p in (SMOKE, CPU, GPU, MPS, GPU_DRY)}

# A TrainConfig built by hand (not from a profile): the defaults above, fixed steps, its own time-to-accuracy budget.
CUSTOM = Profile("custom", time_to_accuracy=dict(synthetic=0.60, cifar10=0.60, eval_every=10, max_steps=200))


class _Configured(Protocol):
    profile: str


def profile(name: str) -> Profile:
    """The profile called `name` ("custom": a hand-built config's); a ValueError names the allowed ones."""
    if name == CUSTOM.name:
        return CUSTOM
    if name not in PROFILES:
        raise ValueError(f"profile={name!r} is not allowed: choose one of {', '.join(PROFILES)}")
    return PROFILES[name]


def profile_of(config: _Configured) -> Profile:
    """The Profile a TrainConfig came from (its `profile` field)."""
    return profile(config.profile)
