"""Binding Slurm's GPU indexes to devices: what `slurmd -G` says each index's device file is.

It runs on the node (the sampler and the in-job workload use it), so it lives here, not
with the accounting code.

`slurmd -G` is asked once per node and its answer kept in the node's GPU map ([gpu]
map_file): on Slurm 24.11+ every run of it sends a reconfigure request to every running
step of the node, and each of those jobs logs `slurmstepd: error: Unrecognized request`.
The map is renewed (by root only) when what the answer depends on changes: the slurmd
binary, slurm.conf and gres.conf, the node name, the boot.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable

from ..config import Config, find_command, load_config
from ..errors import BindingError, GpuEffError
from ..hostlist import expand_hostlist

MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SLURM_CONF = "/etc/slurm/slurm.conf"  # slurmd's own default when SLURM_CONF is unset
MAP_VERSION = 1
NO_FILE = ("slurmd -G lists GPUs without device files (AutoDetect?): cannot map Slurm's GPU "
           "indexes to devices; make gres.conf name them (File=/dev/nvidia...)")

Files = list[list[str]]  # per Slurm GPU position: its device file(s); [] when slurmd named none
Minors = dict[int, int | tuple[int, int]]
Warn = Callable[[str], None]


def gpu_minors(node: str, config: Config, wait_s: float = 0.0, warn: Warn | None = None) -> Minors:
    """Slurm's GPU indexes on `node` -> device minors, through the node's GPU map (see
    gpu_files). {} when slurmd cannot answer; BindingError when it lists GPUs it names no
    device file for."""
    files = gpu_files(node, config.slurmd, config.gpu_map_for(node), wait_s, warn)
    return files_minors(files or [], config.mig_minors_for(node))


def gres_gpu_minors(node: str, slurmd: str = "slurmd", mig_minors: str = MIG_MINORS) -> Minors:
    """As gpu_minors, but asking slurmd itself, every call: for a one-off look only."""
    return files_minors(gres_gpu_files(node, slurmd) or [], mig_minors)


def files_minors(positions: Files, mig_minors: str = MIG_MINORS) -> Minors:
    """Slurm's GPU positions (their device files) -> device minor numbers, read from the
    files themselves. Slurm's order need not be the minors' (with AutoDetect it can follow
    PCI order): binding by this map is right either way. A position whose files hold a MIG
    capability (/dev/nvidia-caps/nvidia-capN) maps to (GPU minor, GPU instance id) through
    the driver's `mig_minors` table. A position it cannot map is left out (and the binding
    refuses it, rather than guess)."""
    _checked(positions)
    minors: Minors = {}
    table: dict[int, tuple[int, int]] | None = None
    for position, files in enumerate(positions):
        caps = [path for path in files if "nvidia-caps" in path]
        if caps:  # one MIG slice: its parent's file and its capabilities, one position
            table = mig_table(mig_minors) if table is None else table
            slot = next((table[m] for m in map(char_minor, caps) if m in table), None)
            if slot is not None:
                minors[position] = slot
            continue
        minor = char_minor(files[0])
        if minor is not None:
            minors[position] = minor
    return minors


# -- the node's GPU map ------------------------------------------------------------------------

def gpu_files(
    node: str, slurmd: str = "slurmd", map_file: str = "", wait_s: float = 0.0,
    warn: Warn | None = None,
) -> Files | None:
    """Each of the node's GPU positions' device files, from the GPU map at `map_file`
    while it is current. Root renews a missing or stale map (asks slurmd once and writes
    it); anyone else waits up to `wait_s` for root to, and only then asks slurmd itself,
    saying so through `warn`, writing nothing. No map_file: slurmd is asked. None when
    slurmd cannot answer; BindingError when it lists GPUs without device files."""
    if not map_file:
        return gres_gpu_files(node, slurmd)
    if os.geteuid() == 0:
        files = read_map(map_file, node, watched_paths(slurmd))
        files = files if files is not None else refresh_map(node, slurmd, map_file, warn)
    else:
        files = _wait_for_map(map_file, node, wait_s)
        if files is None:
            _say(warn, f"no current GPU map in {map_file} (root's sampler makes it as a job starts): "
                       f"asking '{slurmd} -G' instead, which on Slurm 24.11+ disturbs the node's other jobs")
            return gres_gpu_files(node, slurmd)
    return None if files is None else _checked(files)


def refresh_map(node: str, slurmd: str, map_file: str, warn: Warn | None = None) -> Files | None:
    """Ask slurmd now and write its answer to the map (root): the positions, unchecked
    (a list slurmd names no files in is kept too, so that each job is refused without
    asking again). None, and nothing written, when slurmd cannot answer."""
    # The key before asking: a file changed while slurmd reads it makes the next look renew.
    key = map_key(node, watched_paths(slurmd))
    files = _ask_slurmd(node, slurmd)
    if files is not None:
        try:
            write_map(map_file, key, files)
        except OSError as exc:
            _say(warn, f"cannot write the GPU map {map_file}: {exc.strerror or exc}: "
                       "every GPU job asks slurmd again")
    return files


def watched_paths(slurmd: str) -> list[str]:
    """What slurmd's answer depends on, as files: its binary, slurm.conf (SLURM_CONF, as
    slurmd gives the prolog) and the gres.conf beside it."""
    conf = os.environ.get("SLURM_CONF") or SLURM_CONF
    gres = os.path.join(os.path.dirname(conf), "gres.conf")
    return [os.path.realpath(find_command(slurmd)), conf, gres]


def map_key(node: str, paths: list[str]) -> dict[str, object]:
    """What a map was made from: the node, the boot, and each file's [path, mtime_ns,
    size] ([path, None, None] while missing: its appearing renews the map too)."""
    return {"node": node, "boot_id": _boot_id(), "files": [[p, *_stamp(p)] for p in paths]}


def read_map(map_file: str, node: str, paths: list[str] | None = None) -> Files | None:
    """The map's positions while it is current for `paths` (None: the paths the map
    itself names, for a reader whose environment need not be the prolog's); None when it
    is missing, stale, unreadable, or not root's (anyone may be able to put a file there)."""
    loaded = _load(map_file)
    if loaded is None:
        return None
    key, files = loaded
    if paths is None:
        paths = _recorded_paths(key)
    if paths is None or key != map_key(node, paths):
        return None
    return files


def write_map(map_file: str, key: dict[str, object], files: Files) -> None:
    """Atomically (a private temporary file renamed over it: a reader sees the old map or
    the new, never half of one, and two samplers writing at once are both right), mode
    0644 so that every job's user may read it."""
    import json
    import tempfile

    directory = os.path.dirname(map_file) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gpu-map.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"version": MAP_VERSION, "key": key, "gpus": files, "made_at": time.time()}, handle)
        os.replace(tmp, map_file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _wait_for_map(map_file: str, node: str, wait_s: float) -> Files | None:
    """The job starts as the prolog starts the sampler: its map may be a moment away."""
    deadline = time.monotonic() + wait_s
    while True:
        files = read_map(map_file, node)
        if files is not None or time.monotonic() >= deadline:
            return files
        time.sleep(0.1)


def _load(map_file: str) -> tuple[object, Files] | None:
    """(key, positions) of the map at map_file; None where it is not one."""
    import json

    try:
        with open(map_file, encoding="utf-8") as handle:
            info = os.fstat(handle.fileno())
            if info.st_uid not in (0, os.getuid()) or info.st_mode & 0o022:
                return None  # not root's (or our own) map, or one others could rewrite
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("version") != MAP_VERSION:
        return None
    gpus = record.get("gpus")
    if not (isinstance(gpus, list) and all(
            isinstance(p, list) and all(isinstance(f, str) for f in p) for p in gpus)):
        return None
    return record.get("key"), gpus


def _recorded_paths(key: object) -> list[str] | None:
    if not isinstance(key, dict) or not isinstance(key.get("files"), list):
        return None
    paths = [f[0] for f in key["files"] if isinstance(f, list) and f and isinstance(f[0], str)]
    return paths if len(paths) == len(key["files"]) else None


def _stamp(path: str) -> list[int | None]:
    try:
        info = os.stat(path)
    except OSError:
        return [None, None]
    return [info.st_mtime_ns, info.st_size]


def _boot_id() -> str:
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _say(warn: Warn | None, message: str) -> None:
    if warn is not None:
        warn(message)


# -- slurmd -G ---------------------------------------------------------------------------------

def gres_gpu_files(node: str, slurmd: str = "slurmd") -> Files | None:
    """The device files of each of the node's GPU positions (one file, or a MIG slice's
    files), in Slurm's order, asking `slurmd -G` now (see gpu_files for the map that
    spares the node's other jobs); None when slurmd cannot answer; BindingError when it
    lists GPUs without device files."""
    files = _ask_slurmd(node, slurmd)
    return None if files is None else _checked(files)


def _ask_slurmd(node: str, slurmd: str) -> Files | None:
    slurmd = find_command(slurmd)  # a prolog's PATH often lacks the sbin directories
    try:
        done = subprocess.run([slurmd, "-G", "-N", node], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    files = parse_gres_gpus((done.stdout + done.stderr).decode("utf-8", "replace"))
    # Failed with no GPU listed: no answer (not kept in the map; the next job asks again),
    # rather than "this node has no GPUs".
    return None if done.returncode != 0 and not files else files


def parse_gres_gpus(text: str) -> Files:
    """`slurmd -G`'s output -> each GPU position's device files, in Slurm's own order (a
    job's SLURM_JOB_GPUS counts positions in it). slurmd prints the list through its logger,
    behind a prefix that differs by release (`slurmd-NODE: `, `slurmd: `, a timestamp),
    among its other messages; 23.02+ end each line with `Links=... Flags=...`. A GPU line
    without File= gives one empty position per GPU it counts (refused by _checked). Its
    "Index=" is the device file's number, not the position: nvidia-cap21 prints Index=21,
    yet the job on it gets SLURM_JOB_GPUS=1."""
    positions: Files = []
    for line in text.splitlines():
        start = line.find("Gres Name=")
        if start < 0:
            continue
        fields = dict(f.split("=", 1) for f in line[start:].split() if "=" in f)
        if fields.get("Name") != "gpu":
            continue
        if "File" not in fields:
            count = fields.get("Count", "1")
            positions += [[] for _ in range(int(count) if count.isdigit() else 1)]
            continue
        files = expand_hostlist(fields["File"])
        if any("nvidia-caps" in path for path in files):
            positions.append(files)
        else:
            positions += [[path] for path in files]
    return positions


def _checked(files: Files) -> Files:
    """Never index = minor by default where slurmd knows GPUs but not their devices: on a
    node whose order is not the minors' that would measure other jobs' GPUs."""
    if any(not position for position in files):
        raise BindingError(NO_FILE)
    return files


def char_minor(path: str) -> int | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return os.minor(info.st_rdev) if stat.S_ISCHR(info.st_mode) else None


def mig_table(path: str = MIG_MINORS) -> dict[int, tuple[int, int]]:
    """The driver's MIG capability minors: `gpu0/gi3/access 30` (and its compute
    instances' `gpu0/gi3/ci0/access 31`) -> {30: (0, 3), 31: (0, 3)}: which GPU (by minor)
    and GPU instance a capability file opens. {} when the driver has no such table."""
    table: dict[int, tuple[int, int]] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return table
    for line in lines:
        name, _, number = line.partition(" ")
        parts = name.split("/")
        if (len(parts) >= 3 and parts[0].startswith("gpu") and parts[1].startswith("gi")
                and parts[-1] == "access" and number.strip().isdigit()
                and parts[0][3:].isdigit() and parts[1][2:].isdigit()):
            table[int(number)] = (int(parts[0][3:]), int(parts[1][2:]))
    return table


# -- making the map ahead of time ---------------------------------------------------------------

def main(argv: list[str]) -> int:
    """`python -m slurm_gpu_eff.node.binding --refresh NODE [--force]`, as root, with the
    environment slurmd gives the prolog (SLURM_CONF; GPUEFF_CONFIG where the config is not
    in its usual place): makes the node's GPU map unless it is current (--force: anyway,
    asking slurmd, which on 24.11+ disturbs the node's running jobs)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m slurm_gpu_eff.node.binding",
                                     description="Make a node's GPU map ([gpu] map_file) as root.")
    parser.add_argument("--refresh", metavar="NODE", required=True, help="the Slurm node name")
    parser.add_argument("--force", action="store_true", help="ask slurmd even if the map is current")
    args = parser.parse_args(argv)
    try:
        return _refresh(args.refresh, load_config(), args.force)
    except GpuEffError as exc:
        print(f"gpu map: {exc}", file=sys.stderr)
        return 1


def _refresh(node: str, config: Config, force: bool) -> int:
    if os.geteuid() != 0:
        raise GpuEffError("only root makes the GPU map (the sampler trusts no one else's)")
    map_file = config.gpu_map_for(node)
    files = None if force else read_map(map_file, node, watched_paths(config.slurmd))
    said = "current" if files is not None else "made"

    def warn(message: str) -> None:
        print(f"gpu map: {message}", file=sys.stderr)

    files = files if files is not None else refresh_map(node, config.slurmd, map_file, warn)
    if files is None:
        raise GpuEffError(f"'{config.slurmd} -G -N {node}' gave no answer: no map written")
    print(f"{map_file}: {said}, {len(files)} GPU position(s)")
    for position, paths in enumerate(_checked(files)):
        print(f"  {position}: {','.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
