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
            directory = os.path.dirname(self.path)
            if directory and not os.path.isdir(directory):
                # The last part only: a process outliving its cluster (or a site's
                # /var/log gone) must not build the whole tree back.
                os.mkdir(directory, 0o700)
            # 0600: the log names users and jobs, which users may not read of each other;
            # O_NOFOLLOW: root appends to no file a planted link names.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as handle:
                handle.write(line)
        except OSError:
            try:  # the log itself failed (disk full?): stderr reaches slurmd's log
                sys.stderr.write(line)
            except (OSError, ValueError):
                pass
