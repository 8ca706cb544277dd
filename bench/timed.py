"""Run commands in turns and print each one's median wall time (s) as JSON: bench/slurm_paths.py
runs this inside the dev cluster as a job's owner, so that only the commands are timed.
Standard library only (it runs on the cluster release's own Python).

    timed.py RUNS '[["gpueff", "12"], ["perl", "seff", "12"]]'
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def main() -> int:
    runs, commands = int(sys.argv[1]), json.loads(sys.argv[2])
    walls: list[list[float]] = [[] for _ in commands]
    for command in commands:  # once each first: caches warm for all alike
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for _ in range(runs):
        for command, found in zip(commands, walls, strict=True):
            started = time.perf_counter()
            done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
            found.append(time.perf_counter() - started)
            if done.returncode != 0:
                said = done.stderr.decode("utf-8", "replace")[-200:]
                print(f"{command}: exit status {done.returncode}: {said}", file=sys.stderr)
                return 1
    print(json.dumps([statistics.median(found) for found in walls]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
