"""node/frameworks.py: a job's GPU processes told apart by the libraries they map, on
maps text shaped as the kernel writes it (captured-style, abridged), and the watch's
once-per-PID reads and caps, on a fake /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu_eff.node import frameworks
from slurm_gpu_eff.node.frameworks import FrameworkWatch, classify_maps, read_maps

SITE = "/opt/conda/envs/train/lib/python3.11/site-packages"


def maps(*paths: str, anonymous: int = 3) -> bytes:
    """A /proc/PID/maps text: each path mapped as its four segments (r--p, r-xp, r--p,
    rw-p, as ld.so maps a library), with anonymous regions and the driver's device
    mappings between, as a CUDA process has them."""
    lines, address = [], 0x7F0000000000
    base = ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/locale/locale-archive"]
    for inode, path in enumerate([*base, *paths], 1000):
        for perms in ("r--p", "r-xp", "r--p", "rw-p"):
            lines.append(f"{address:x}-{address + 0x1000:x} {perms} 00000000 fd:01 {inode:<10} "
                         f"               {path}")
            address += 0x1000
        for _ in range(anonymous):
            lines.append(f"{address:x}-{address + 0x200000:x} rw-s 00000000 00:05 27 "
                         f"                        /dev/nvidia0")
            lines.append(f"{address:x}-{address + 0x1000:x} ---p 00000000 00:00 0 ")
            address += 0x201000
    lines.append("7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]")
    lines.append("7ffc001f0000-7ffc001f4000 r--p 00000000 00:00 0                          [vvar]")
    return ("\n".join(lines) + "\n").encode()


CUDA_LIBS = ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.90.07",
             f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12")
PYTORCH = maps(f"{SITE}/torch/lib/libc10.so", f"{SITE}/torch/lib/libtorch_cpu.so",
               f"{SITE}/torch/lib/libtorch_cuda.so", f"{SITE}/torch/lib/libc10_cuda.so",
               f"{SITE}/torch/lib/libtorch_python.so", *CUDA_LIBS,
               f"{SITE}/nvidia/cudnn/lib/libcudnn.so.9")
TENSORFLOW = maps(f"{SITE}/tensorflow/libtensorflow_framework.so.2",
                  f"{SITE}/tensorflow/python/_pywrap_tensorflow_internal.so", *CUDA_LIBS)
JAX = maps(f"{SITE}/jaxlib/xla_extension.so", f"{SITE}/jaxlib/cuda/_versions.so",
           f"{SITE}/jax_plugins/xla_cuda12/xla_cuda_plugin.so", *CUDA_LIBS)
JAX_NEWER = maps(f"{SITE}/jaxlib/_jax.so", *CUDA_LIBS)  # jaxlib without xla_extension.so
PLAIN_CUDA = maps("/opt/apps/gromacs/2024/lib/libgromacs.so.9", *CUDA_LIBS)
UNKNOWN = maps("/opt/apps/vasp/6.4/lib/libopenblas.so.0")  # e.g. OpenACC's own runtime


@pytest.mark.parametrize(("text", "expected"), [
    (PYTORCH, {"pytorch"}),
    (TENSORFLOW, {"tensorflow"}),
    (JAX, {"jax"}),
    (JAX_NEWER, {"jax"}),
    (PLAIN_CUDA, {"cuda"}),
    (UNKNOWN, set()),
    (b"", set()),
], ids=["pytorch", "tensorflow", "jax", "jax-newer", "plain-cuda", "unknown", "empty"])
def test_a_process_is_classified_by_the_libraries_it_maps(text: bytes, expected: set[str]) -> None:
    assert classify_maps(text) == expected


def test_a_process_mapping_two_frameworks_is_both_and_not_plain_cuda() -> None:
    both = maps(f"{SITE}/torch/lib/libtorch_cuda.so", f"{SITE}/jaxlib/xla_extension.so", *CUDA_LIBS)
    assert classify_maps(both) == {"pytorch", "jax"}


def test_only_mapped_files_count_not_names_elsewhere_on_the_line() -> None:
    """A directory that merely looks like a library, a deleted file, a path with spaces."""
    text = maps("/home/alice/libtorch_cuda.so.d/data.bin", "/scratch/my runs/libcudart.so.12 (deleted)")
    assert classify_maps(text) == {"cuda"}  # the deleted runtime is still mapped, hence used


def test_a_cut_maps_file_is_read_to_its_last_whole_line(tmp_path: Path) -> None:
    pid_dir = tmp_path / "4321"
    pid_dir.mkdir()
    (pid_dir / "maps").write_bytes(PYTORCH)
    cut = read_maps(4321, str(tmp_path), limit=1000)
    assert cut is not None and len(cut) <= 1000 and cut.endswith(b"\n")
    assert PYTORCH.startswith(cut)
    assert read_maps(4321, str(tmp_path)) == PYTORCH
    assert read_maps(9999, str(tmp_path)) is None  # gone


def fake_proc(root: Path, texts: dict[int, bytes]) -> str:
    for pid, text in texts.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "maps").write_bytes(text)
    return str(root)


def test_the_watch_reads_each_pid_once_and_unions_the_job(tmp_path: Path) -> None:
    watch = FrameworkWatch(fake_proc(tmp_path, {10: PYTORCH, 11: PLAIN_CUDA}))
    assert watch.result() is None  # nothing looked at yet
    watch.look(10)
    (tmp_path / "10" / "maps").write_bytes(TENSORFLOW)  # were it read again, it would say so
    watch.look(10)
    watch.look(11)
    assert watch.result() == ["cuda", "pytorch"]
    assert (watch.examined, watch.read) == (2, 2)


def test_unreadable_processes_are_no_evidence(tmp_path: Path) -> None:
    watch = FrameworkWatch(str(tmp_path))
    watch.look(77)  # gone before it could be read
    assert watch.result() is None
    watch = FrameworkWatch(fake_proc(tmp_path, {78: UNKNOWN}))
    watch.look(78)
    assert watch.result() == []  # read, nothing recognised


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_maps_file_we_may_not_read_is_skipped_quietly(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {5: PYTORCH})
    (tmp_path / "5" / "maps").chmod(0)
    watch = FrameworkWatch(proc)
    watch.look(5)
    assert watch.result() is None


def test_the_watch_looks_at_no_more_than_max_pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "MAX_PIDS", 3)
    watch = FrameworkWatch(fake_proc(tmp_path, {1: UNKNOWN, 2: UNKNOWN, 3: UNKNOWN, 4: JAX}))
    for pid in (1, 2, 3, 4):
        watch.look(pid)
    assert watch.examined == 3 and watch.result() == []
    assert not watch.wants(4) and not watch.wants(5)


def test_skipped_pids_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "MAX_SEEN", 2)
    watch = FrameworkWatch("/nonexistent")
    watch.skip(1)
    watch.skip(2)
    watch.skip(3)  # full: not remembered, and nothing more is looked at
    assert watch.seen == {1, 2}
    assert not watch.wants(3)


def test_a_real_process_maps_is_read_and_classified() -> None:
    """This test's own interpreter, through the real /proc."""
    text = read_maps(os.getpid())
    assert text is not None and b"libc.so" in text
    watch = FrameworkWatch()
    watch.look(os.getpid())
    assert watch.read == 1 and watch.result() is not None
