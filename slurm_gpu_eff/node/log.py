"""A log for the hooks and the sampler: one appended line per event, never an exception.

Not the logging module: it costs import time in the prolog, and a hook's log must
work when everything else (disk full, bad permissions) does not.
"""

from __future__ import annotations

import os
import sys
import time


class HookLog:
    def __init__(self, path: str, job_id: str, who: str) -> None:
        self.path = path
        self.prefix = f"job={job_id} {who}[{os.getpid()}]"

    def write(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        line = f"{stamp} {self.prefix}: {' '.join(message.split())}\n"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError:
            try:  # the log itself failed (disk full?): stderr reaches slurmd's log
                sys.stderr.write(line)
            except (OSError, ValueError):
                pass
