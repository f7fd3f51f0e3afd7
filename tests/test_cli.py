import json
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
    # how long the command ran is measured and printed, never typed beside a table
    wall = json.loads((tmp_path / "b" / "results.json").read_text())["meta"]["wall_seconds"]
    assert f"ran for {wall / 60:.1f} minutes of wall time" in (tmp_path / "b" / "bench.md").read_text()


def test_bench_profile_and_model_reach_the_results(tmp_path):
    out = cli("bench", "--profile", "smoke", "--model", "compact", "--only", "device_loader", "--skip", "all_on",
              "--out", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    results = fastlab.load_results(tmp_path / "b" / "results.json")
    assert [r.rung for r in results] == ["naive", "device_loader"]
    assert {(r.config["profile"], r.config["model"]) for r in results} == {("smoke", "compact")}


def test_bench_rejects_unknown_rungs(tmp_path):
    out = cli("bench", "--skip", "turbo", "--out", str(tmp_path))
    assert out.returncode == 2 and "unknown rung 'turbo'" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_reference_run_refuses_without_a_gpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "reference_run.py"), "--out", "/tmp/none"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr


# ---------------------------------------------------------------- errors are one line, exit status 2


def assert_one_line_error(out, *fragments):
    """exit 2, no traceback, and stderr is the single line `fastlab: <what> — <fix>` naming the fragments."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and len(lines) == 1, out.stderr
    assert lines[0].startswith("fastlab: ") and " — " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def offline_env(**extra):
    """No network for the download attempt: urllib (and so torchvision) go through a proxy that refuses."""
    return {"https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "FASTLAB_PROFILE": "", **extra}


def cli_env(*args, env=None, cwd=ROOT, timeout=300):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "fastlab", *args], capture_output=True, text=True, cwd=cwd,
                          env=full, timeout=timeout)


def test_report_on_a_missing_file_is_one_line(tmp_path):
    assert_one_line_error(cli("report", str(tmp_path / "nope" / "results.json")), "no results file at", "bench")
    (tmp_path / "results.json").write_text("{")
    assert_one_line_error(cli("advise", str(tmp_path)), "is not a fastlab results file")


def test_cifar10_asked_for_offline_with_no_data_is_one_line(tmp_path):
    out = cli_env("run", "--profile", "cpu", "--steps", "2", "--windows", "1",
                  env=offline_env(FASTLAB_DATA="cifar10", FASTLAB_DATA_DIR=str(tmp_path)))
    assert_one_line_error(out, "could not download CIFAR-10", "FASTLAB_DATA=synthetic")


def test_a_corrupt_cifar10_folder_is_one_line(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(b"not a pickle")
    out = cli_env("run", "--profile", "cpu", "--steps", "2", "--windows", "1",
                  env=offline_env(FASTLAB_DATA="cifar10", FASTLAB_DATA_DIR=str(tmp_path)))
    assert_one_line_error(out, "is corrupt", f"delete {folder}")


def test_bench_out_that_cannot_be_created_fails_before_any_run(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = cli("bench", "--only", "device_loader", "--out", str(tmp_path / "a-file" / "bench"))
    assert_one_line_error(out, "cannot create or write the output folder", "--out")
    out = cli("run", "--steps", "2", "--windows", "1", "--out", str(tmp_path / "a-file" / "r" / "r.json"))
    assert_one_line_error(out, "cannot create or write the output folder")
    assert "images/s" not in out.stdout  # refused before training
    assert_one_line_error(cli("run", "--out", str(tmp_path)), "is a folder", "result.json")


@pytest.mark.parametrize("args, fragment", [
    (["run", "--batch-size", "0"], "TrainConfig.batch_size=0 is not allowed — an integer >= 1"),
    (["run", "--amp", "fp8"], "invalid choice: 'fp8'"),
    (["run", "--steps", "many"], "invalid int value: 'many'"),
    (["run", "--pin-memory", "maybe"], "expected true or false"),
    (["run", "--device", "cuda:x"], "TrainConfig.device='cuda:x' is not allowed"),
    (["bench", "--skip", "turbo"], "unknown rung 'turbo' — rungs are: naive"),
    (["bench", "--skip", "naive"], "cannot be skipped"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
])
def test_bad_values_and_usage_are_one_line(args, fragment, capsys, monkeypatch):
    from fastlab.__main__ import main

    monkeypatch.setenv("FASTLAB_PROFILE", "smoke")
    try:
        status = main(args)
    except SystemExit as e:  # argparse's usage errors exit from inside parse_args
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and err.startswith("fastlab: ") and fragment in err, err


def test_a_bad_profile_variable_is_one_line(capsys, monkeypatch):
    from fastlab.__main__ import main

    monkeypatch.setenv("FASTLAB_PROFILE", "huge")
    assert main(["run"]) == 2
    assert capsys.readouterr().err == "fastlab: FASTLAB_PROFILE='huge' is not allowed — choose one of smoke, cpu, gpu, mps, gpu-dry\n"


def test_an_unexpected_error_is_one_line_and_the_traceback_is_there_on_request(capsys, monkeypatch):
    from fastlab import __main__ as cli_module

    def boom(args):
        raise RuntimeError("something odd\non two lines")

    monkeypatch.setattr(cli_module, "_cmd_env", boom)
    assert cli_module.main(["env"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected RuntimeError: something odd on two lines" in err
    monkeypatch.setenv("FASTLAB_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli_module.main(["env"])


def test_the_python_api_keeps_its_exceptions(tmp_path):
    with pytest.raises(FileNotFoundError):
        fastlab.load_results(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="TrainConfig.batch_size=0"):
        fastlab.config_for("smoke", batch_size=0)


def test_torchrun_entry_point_has_a_default_out_folder():
    from fastlab.distributed import _parse_args

    assert _parse_args(["--profile", "smoke"]).out == "ddp-results"
    assert _parse_args(["--out", "x"]).out == "x"


# ---------------------------------------------------------------- python -m fastlab notebooks


def test_notebooks_command_copies_skips_unchanged_and_keeps_edited_ones(tmp_path, capsys):
    from fastlab.__main__ import main

    names = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    dest = tmp_path / "work"
    assert main(["notebooks", str(dest)]) == 0
    assert sorted(p.name for p in dest.glob("*.ipynb")) == names and not (dest / "checked_outputs.json").exists()
    assert f"{len(names)} notebooks written" in capsys.readouterr().out
    assert main(["notebooks", str(dest)]) == 0  # again: every file unchanged, skipped quietly
    out = capsys.readouterr().out
    assert "wrote" not in out and f"0 notebooks written to {dest.resolve()}; {len(names)} already up to date" in out
    edited = dest / names[0]
    edited.write_text(edited.read_text().replace('"cells": [', '"cells": [{"cell_type": "markdown", "id": "mine", '
                                                                  '"metadata": {}, "source": ["my notes"]}, ', 1))
    assert main(["notebooks", str(dest)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and f"kept 1 notebook(s) you edited in {dest}: {names[0]}" in captured.err
    assert "--force" in captured.err and "my notes" in edited.read_text()
    assert main(["notebooks", str(dest), "--force"]) == 0
    assert "overwrote your edited" in capsys.readouterr().out and "my notes" not in edited.read_text()
