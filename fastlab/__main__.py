"""python -m fastlab bench | env | run | report | advise | download"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from .config import CHOICES, PROFILES, TrainConfig


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One --flag per TrainConfig field; defaults stay None so only what was given overrides the profile."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in ("notes", "profile"):
            continue
        kind: Any = {"bool": _parse_bool, "int": int, "float": float, "int | None": _parse_optional_int}.get(
            str(f.type), str)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=None,
                            choices=CHOICES.get(f.name), help=f"TrainConfig.{f.name} (default: the profile's)")


def _cmd_env(args: argparse.Namespace) -> int:
    from .environment_report import environment_report

    print(environment_report())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import RUNG_NAMES, bench

    def split(text: str | None) -> list[str] | None:
        return [x.strip() for x in text.split(",") if x.strip()] if text else None

    try:
        out = bench(args.out, profile=args.profile, model=args.model, only=split(args.only), skip=split(args.skip))
    except ValueError as e:
        print(f"fastlab bench: {e} (rungs: {', '.join(RUNG_NAMES)})", file=sys.stderr)
        return 2
    print((out / "bench.md").read_text())
    print(f"wrote {out / 'results.json'}, {out / 'bench.png'} and {out / 'bench.md'}")
    print(f"results in {out.resolve()}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .config import config_for
    from .results import save_results
    from .train import run

    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"profile"}  # --profile picks the preset
    changes = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    cfg = config_for(args.profile, **changes)
    result = run(cfg, label="cli run")
    print(result.summary())
    for knob, why in result.no_ops.items():
        print(f"  no-op here: {knob}: {why}")
    if args.out:
        print(f"wrote {save_results(args.out, [result])}")
    return 0 if result.status == "ok" else 1


def _cmd_report(args: argparse.Namespace) -> int:
    from .bench import write_report

    png, md = write_report(args.results)
    print(md.read_text())
    print(f"wrote {png} and {md}")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    from .data import DatasetError, data_dir, download_cifar10

    try:
        download_cifar10(data_dir(), timeout_s=60)
    except DatasetError as e:
        print(f"fastlab download: {e}", file=sys.stderr)
        return 1
    print(f"CIFAR-10 is in {data_dir()}")
    return 0


def _cmd_advise(args: argparse.Namespace) -> int:
    from .advise import advice_text
    from .results import load_results

    try:
        results = load_results(args.results)
    except FileNotFoundError as e:
        print(f"fastlab advise: {e}", file=sys.stderr)
        return 2
    if not results:
        print(f"{args.results} holds no results")
    for r in results:
        print(advice_text(r))
        print()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastlab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="run the technique ladder and write results.json, bench.png, bench.md")
    p.add_argument("--out", help="output folder (default: bench-results/<date-time>)")
    p.add_argument("--profile", choices=PROFILES, help="default: FASTLAB_PROFILE, else gpu with CUDA, else cpu")
    p.add_argument("--model", choices=CHOICES["model"])
    p.add_argument("--only", help="comma-separated rungs to keep (naive always runs)")
    p.add_argument("--skip", help="comma-separated rungs to leave out")
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("env", help="print the environment and which techniques apply here")
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("run", help="one training run; every TrainConfig field is a flag")
    p.add_argument("--profile", choices=PROFILES)
    p.add_argument("--out", help="write the result to this JSON file")
    add_config_flags(p)
    p.set_defaults(func=_cmd_run)
    p = sub.add_parser("report", help="redraw bench.png and bench.md from a results.json")
    p.add_argument("results")
    p.set_defaults(func=_cmd_report)
    p = sub.add_parser("download", help="download CIFAR-10 into FASTLAB_DATA_DIR")
    p.set_defaults(func=_cmd_download)
    p = sub.add_parser("advise", help="name each run's bottleneck and what to try next, from a results.json")
    p.add_argument("results")
    p.set_defaults(func=_cmd_advise)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"fastlab: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
