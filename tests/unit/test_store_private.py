"""store/sqlite.py keep_private(): the SQLite store is root's and [store] admin_group's
alone (0640; 0600 without a group), made so before SQLite opens it, and put right when an
older version left it readable. The tests run as root (they chown)."""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import StoreError
from slurm_gpu_eff.store.sqlite import SqliteStore, keep_private

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another group: root only")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def group() -> grp.struct_group:
    """A group that is not root's own, so that giving the file to it shows."""
    return next(g for g in grp.getgrall() if g.gr_gid != os.getegid())


def test_a_new_file_is_root_s_alone_without_a_group(tmp_path: Path) -> None:
    path = tmp_path / "gpueff.db"
    keep_private(str(path))
    assert mode(path) == 0o600


def test_a_new_file_is_0640_for_the_admin_group(tmp_path: Path, group: grp.struct_group) -> None:
    path = tmp_path / "gpueff.db"
    keep_private(str(path), group.gr_name)
    assert (mode(path), path.stat().st_gid) == (0o640, group.gr_gid)


def test_an_older_readable_file_is_put_right(tmp_path: Path) -> None:
    path = tmp_path / "gpueff.db"
    path.write_bytes(b"figures")
    path.chmod(0o644)
    keep_private(str(path))
    assert mode(path) == 0o600 and path.read_bytes() == b"figures"


def test_an_unknown_group_is_a_store_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="admin_group 'no-such-gpueff-group' is not a group"):
        keep_private(str(tmp_path / "gpueff.db"), "no-such-gpueff-group")
    assert not (tmp_path / "gpueff.db").exists()


def test_a_writer_leaves_the_store_private_after_a_put(
    tmp_path: Path, group: grp.struct_group, make_summary: Callable[..., Any],
) -> None:
    path = tmp_path / "store" / "gpueff.db"
    with SqliteStore(str(path), admin_group=group.gr_name) as store:
        store.put(make_summary())
    assert (mode(path), path.stat().st_gid) == (0o640, group.gr_gid)
    lock = path.parent / "gpueff.db.lock"  # the writers' queue: no journal left behind
    assert sorted(path.parent.iterdir()) == [path, lock] and mode(lock) == 0o600
    with SqliteStore(str(path), readonly=True) as store:
        assert len(store.node_summaries("4242")) == 1
