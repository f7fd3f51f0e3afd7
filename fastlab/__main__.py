"""python -m fastlab bench | env | run | code | report | advise | download | notebooks

fastlab.bench is imported by the two commands that use it: it brings matplotlib, which the others do not need."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .advisor import results_advice_text
from .code import code, code_diff
from .config import CHOICES, PROFILES, TrainConfig, add_config_flags, config_for
from .data import DatasetError, data_dir, download_cifar10
from .environment_report import environment_report
from .files import NotWritten
from .results import load_document, load_results, save_results
from .tools.install import copy_notebooks
from .train import run


class CliError(Exception):
    """A command-line error: what went wrong and how to fix it, printed as one line (exit status 2)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what} — {fix}")
        self.what, self.fix = what, fix


class _Parser(argparse.ArgumentParser):
    """argparse whose usage error is one line, like every other CLI error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _fail(message, f"see `{self.prog} --help`")
        sys.exit(2)


def _fail(what: str, fix: str, status: int = 2) -> int:
    """Print `fastlab: <what> — <fix>` on one line to stderr; returns the exit status."""
    one_line = " ".join(f"{what.rstrip('. ')} — {fix.rstrip('. ')}".split())
    print(f"fastlab: {one_line}", file=sys.stderr)
    return status


def _what_and_fix(e: BaseException) -> tuple[str, str]:
    """What went wrong and its fix, from an exception the package raised (its messages say both)."""
    text = " ".join(str(e).split())
    if isinstance(e, CliError):
        return e.what, e.fix
    what, mark, fix = text.partition(" Fix: ")  # "<what>. Fix: <fix>": _fail drops the full stop
    if mark:
        return what, fix
    if isinstance(e, DatasetError):
        return text, "set FASTLAB_DATA=synthetic to use the offline synthetic set"
    if isinstance(e, ValueError):
        what, mark, fix = text.partition(" is not allowed: ")
        if mark:
            return f"{what} is not allowed", fix
        what, mark, fix = text.partition("; ")  # "unknown rung 'x'; rungs are: ..." and the like
        return (what, fix) if mark else (text, "see `python -m fastlab --help`")
    if isinstance(e, NotWritten):  # says the path, why and what was kept
        return str(e), e.fix
    if isinstance(e, OSError):
        where = f" ({e.filename})" if e.filename and str(e.filename) not in text else ""
        return f"{text}{where}", "check the path and its permissions"
    return (f"unexpected {type(e).__name__}: {text}",
            "if this looks like a bug, rerun with FASTLAB_TRACEBACK=1 and report the traceback")


def _writable_folder(folder: Path, flag: str = "--out") -> Path:
    """Create `folder` before any training, so a bad path fails at once, not after a run."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".fastlab-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise CliError(f"cannot create or write the output folder {folder} ({e.strerror or e})",
                       f"choose a folder you can write to with {flag}") from None
    return folder


def _results_file(path_text: str) -> Path:
    """A results.json named directly or by its folder."""
    path = Path(path_text)
    if path.is_dir():
        path = path / "results.json"
    fix = "give the path of a results.json written by `python -m fastlab bench` (or `run --out`)"
    if not path.is_file():
        raise CliError(f"no results file at {path}", fix)
    try:
        load_document(path)
    except ValueError as e:  # not JSON, or another schema version (the fix follows ". ")
        what, _, said = str(e).partition(". ")
        raise CliError(what, said or fix) from None
    return path


def _flags_config(args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"profile"}
    return config_for(args.profile, **{k: v for k, v in vars(args).items() if k in fields and v is not None})


def _cmd_env(args: argparse.Namespace) -> int:
    print(environment_report())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import bench, default_out_dir, ladder, select_rungs

    def split(text: str | None) -> list[str] | None:
        return [x.strip() for x in text.split(",") if x.strip()] if text else None

    only, skip = split(args.only), split(args.skip)
    select_rungs(ladder(TrainConfig(device="cpu", profile="smoke")), only, skip)  # bad rung names fail before the folder
    out = _writable_folder(Path(args.out) if args.out else default_out_dir())
    out = bench(out, profile=args.profile, model=args.model, only=only, skip=skip, metric=args.metric,
                seeds=args.seeds)
    print((out / "bench.md").read_text())
    print(f"wrote {out / 'results.json'}, {out / 'bench.png'} and {out / 'bench.md'}")
    print(f"results in {out.resolve()}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = _flags_config(args)
    if args.out and Path(args.out).is_dir():
        raise CliError(f"--out {args.out} is a folder", f"give a file name, such as {Path(args.out) / 'result.json'}")
    if args.out:
        _writable_folder(Path(args.out).parent)
    result = run(cfg, label="cli run")
    print(result.summary())
    for knob, why in result.no_ops.items():
        print(f"  no-op here: {knob}: {why}")
    if args.out:
        print(f"wrote {save_results(args.out, [result])}")
    return 0 if result.status == "ok" else 1


def _cmd_code(args: argparse.Namespace) -> int:
    cfg = _flags_config(args)
    if args.diff is None:
        print(code(cfg), end="")
    else:  # against the profile's preset (the flags undone), or another profile's
        print(code_diff(config_for(args.profile if args.diff == "preset" else args.diff), cfg))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .bench import write_report

    png, md = write_report(_results_file(args.results))
    print(md.read_text())
    print(f"wrote {png} and {md}")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    download_cifar10(data_dir(), timeout_s=60)  # a DatasetError says what failed and the fix: main prints it
    print(f"CIFAR-10 is in {data_dir()}")
    return 0


def _cmd_advise(args: argparse.Namespace) -> int:
    results = load_results(_results_file(args.results))
    print(results_advice_text(results) if results else f"{args.results} holds no results")
    return 0


def _cmd_notebooks(args: argparse.Namespace) -> int:
    report = copy_notebooks(_writable_folder(Path(args.dir), "the DIR argument"), force=args.force)
    written = {"wrote": report.copied, "updated": report.updated, "overwrote your edited": report.overwritten}
    for how, names in written.items():
        for name in names:
            print(f"{how} {report.folder / name}")
    print(f"{sum(map(len, written.values()))} notebooks written to {report.folder.resolve()}"
          + (f"; {len(report.unchanged)} already up to date" if report.unchanged else "")
          + f". Open it with: jupyter lab {report.folder}")
    if report.kept:
        raise CliError(f"kept {len(report.kept)} notebook(s) you edited in {report.folder}: {', '.join(report.kept)}",
                       "rerun with --force to overwrite them with this version's, or copy into another folder")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m fastlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.set_defaults(func=func)
        return p

    p = command("bench", _cmd_bench, "run the technique ladder and write results.json, bench.png, bench.md")
    p.add_argument("--out", help="output folder (default: bench-results/<date-time>)")
    p.add_argument("--profile", choices=PROFILES, help="default: FASTLAB_PROFILE, else gpu with CUDA, mps on an Apple GPU, else cpu")
    p.add_argument("--model", choices=CHOICES["model"])
    p.add_argument("--only", help="comma-separated rungs to keep (naive always runs)")
    p.add_argument("--skip", help="comma-separated rungs to leave out")
    p.add_argument("--metric", choices=("throughput", "time-to-accuracy"), default="throughput",
                   help="images/s per rung, or training seconds to the profile's target accuracy over seeds")
    p.add_argument("--seeds", type=int, default=3, help="seeds per rung for --metric time-to-accuracy (default 3)")
    command("env", _cmd_env, "print the environment and which techniques apply here")
    p = command("run", _cmd_run, "one training run; every TrainConfig field is a flag")
    p.add_argument("--profile", choices=PROFILES)
    p.add_argument("--out", help="write the result to this JSON file")
    add_config_flags(p)
    p = command("code", _cmd_code, "print the run as a standalone PyTorch script; every TrainConfig field is a flag")
    p.add_argument("--profile", choices=PROFILES)
    p.add_argument("--diff", nargs="?", const="preset", choices=("preset", *PROFILES),
                   help="print only what the flags change: a diff against the profile's preset (or another profile)")
    add_config_flags(p)
    command("report", _cmd_report, "redraw bench.png and bench.md from a results.json").add_argument("results")
    command("download", _cmd_download, "download CIFAR-10 into FASTLAB_DATA_DIR")
    p = command("advise", _cmd_advise, "name each run's bottleneck and what to try next, from a results.json")
    p.add_argument("results")
    p = command("notebooks", _cmd_notebooks, "copy the workbook's notebooks into DIR (edited ones are kept)")
    p.add_argument("dir", nargs="?", default="fastlab-notebooks", metavar="DIR",
                   help="where to write them (default: ./fastlab-notebooks)")
    p.add_argument("--force", action="store_true", help="overwrite notebooks you edited there")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return _fail("interrupted", "run the command again to start over", status=130)
    except Exception as e:  # every CLI error is one line; FASTLAB_TRACEBACK=1 shows the traceback instead
        if os.environ.get("FASTLAB_TRACEBACK"):
            raise
        return _fail(*_what_and_fix(e))


if __name__ == "__main__":
    sys.exit(main())
