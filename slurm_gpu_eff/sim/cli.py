"""`gpueff-sim`: drive simulated GPUs from inside a Slurm job."""

from __future__ import annotations

import argparse
import os
import sys

from ..config import load_config
from ..errors import GpuEffError
from . import workload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpueff-sim", description="Simulated GPU workloads for slurm-gpu-eff."
    )
    parser.add_argument("--config", help="config file (default: $GPUEFF_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="play PROFILE.json on this job's GPUs, then exit")
    run.add_argument("profile")
    check = commands.add_parser("check", help="validate PROFILE.json and print its duration")
    check.add_argument("profile")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            profile = workload.load_profile(args.profile)
            print(f"{args.profile}: {len(profile.phases)} phases, {profile.duration_s:g} s")
            return 0
        started, ended = workload.run(args.profile, load_config(args.config), os.environ)
        # The exact times go to the job's output: tests compute the truth from them.
        print(f"gpueff-sim: played {args.profile} for {ended - started:.1f} s "
              f"(from {started:.6f} to {ended:.6f})")
        return 0
    except GpuEffError as exc:
        print(f"gpueff-sim: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
