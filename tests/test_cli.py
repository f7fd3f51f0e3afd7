import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastlab

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=ROOT, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fastlab", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)


def test_env_prints_the_environment_and_what_applies():
    out = cli("env")
    assert out.returncode == 0, out.stderr
    assert "torch" in out.stdout and "cudnn.benchmark" in out.stdout and "techniques on this machine" in out.stdout


def test_bad_knob_is_a_clear_error():
    out = cli("run", "--batch-size", "0")
    assert out.returncode == 2 and "TrainConfig.batch_size=0" in out.stderr


def test_run_takes_a_profile_and_any_knob(tmp_path):
    out = cli("run", "--profile", "smoke", "--steps", "4", "--windows", "2", "--batch-size", "16", "--out",
              str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    (result,) = fastlab.load_results(tmp_path / "r.json")
    assert (result.config["profile"], result.config["steps"], result.config["batch_size"]) == ("smoke", 4, 16)


def test_bench_writes_three_files_and_names_the_folder(tmp_path):
    out = cli("bench", "--only", "device_loader", "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    for name in ("results.json", "bench.png", "bench.md"):
        assert (tmp_path / "b" / name).is_file()
    assert str((tmp_path / "b").resolve()) in out.stdout
    redraw = cli("report", str(tmp_path / "b" / "results.json"))
    assert redraw.returncode == 0 and "+device-resident data" in redraw.stdout


def test_bench_profile_and_model_reach_the_results(tmp_path):
    out = cli("bench", "--profile", "smoke", "--model", "compact", "--only", "device_loader", "--skip", "all_on",
              "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    results = fastlab.load_results(tmp_path / "b" / "results.json")
    assert [r.extras["rung"] for r in results] == ["naive", "device_loader"]
    assert {(r.config["profile"], r.config["model"]) for r in results} == {("smoke", "compact")}


def test_bench_rejects_unknown_rungs(tmp_path):
    out = cli("bench", "--skip", "turbo", "--out", str(tmp_path))
    assert out.returncode == 2 and "unknown rung 'turbo'" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_reference_run_refuses_without_a_gpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "fastlab.reference_run", "--out", "/tmp/none"], capture_output=True,
                         text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr
