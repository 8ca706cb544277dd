"""bench/gpu_hooks.py (the prolog and epilog timed on a real GPU) over the stand-in
library: it runs the real hooks, and counts an epilog as the shell's fast path only when
the sampler posted the job's final summary itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import standin

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir("/run"),
    reason="the shell epilog finds the sampler under /run, root's (as the hooks run)",
)


def test_gpu_hooks_times_both_hooks_and_sees_the_sampler_post() -> None:
    standin.library_path()  # built (make) before the bench's config names it
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_hooks.py"), "--standin", "--runs", "2",
         "--settle", "0.3", "--gpus", "0,1", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["epilog_posted_by_sampler"] == 2 and len(found["epilog_all_ms"]) == 2
    assert all(0 < found[k] < 10_000 for k in ("bare_ms", "prolog_ms", "epilog_ms"))
    # Its samplers and their deliverers all ended before it removed their folder.
    assert found["still_running"] == []
