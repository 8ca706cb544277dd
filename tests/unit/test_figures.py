"""report/figures.py: a job's figures from its AdminComment (the users' path: for an ended
job no store is opened), a running job's fresher copy from the store where the caller may
read it, else the store; when neither has them, why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.errors import NoSummary
from slurm_gpu_eff.mirror import admin_comment, digest
from slurm_gpu_eff.model import NodeSummary
from slurm_gpu_eff.report.figures import gather
from slurm_gpu_eff.report.job import build_report
from slurm_gpu_eff.store.base import Store
from slurm_gpu_eff.store.sqlite import SqliteStore

Factory = Callable[..., Any]


def dicts(summaries: list[NodeSummary]) -> list[dict[str, Any]]:
    return [s.to_dict() for s in summaries]


def no_store() -> Store:
    raise AssertionError("the store was opened")


def absent_store(tmp_path: Path) -> Callable[[], Store]:
    """What a user's gpueff meets: no store it can read (a StoreError on opening)."""
    return lambda: SqliteStore(str(tmp_path / "absent.db"), readonly=True)


def test_a_finished_job_with_figures_in_its_admin_comment_never_opens_the_store(
    make_job: Factory, make_summary: Factory,
) -> None:
    summaries = [make_summary(utils=(90.0, 10.0))]
    job = make_job(admin_comment=f"ticket 4711 {admin_comment(summaries, 2)}".lower())
    (found,) = gather([job], no_store)
    assert (found.source, found.unavailable) == ("accounting", "")
    assert dicts(found.summaries) == dicts(digest(summaries))


def test_a_running_job_goes_to_the_store_where_the_caller_may_read_it(
    tmp_path: Path, make_job: Factory, make_summary: Factory,
) -> None:
    path = str(tmp_path / "gpueff.db")
    fresher = make_summary(status="running", utils=(70.0,))
    with SqliteStore(path) as store:
        store.put(fresher)
    mirrored = admin_comment([make_summary(status="running", utils=(5.0,))], 2)  # minutes old
    job = make_job(state="RUNNING", end="Unknown", admin_comment=mirrored)
    (found,) = gather([job], lambda: SqliteStore(path, readonly=True))
    assert (found.source, found.unavailable) == ("store", "")
    assert dicts(found.summaries) == dicts(digest([fresher]))
    (found,) = gather([job], absent_store(tmp_path))  # a user: the live figures in the line
    assert (found.source, found.unavailable) == ("accounting", "")
    assert found.summaries[0].gpus[0].metric("util") == 5.0


def test_a_finished_job_without_a_line_or_a_store_says_why_as_no_summary(
    tmp_path: Path, make_job: Factory,
) -> None:
    job = make_job()
    (found,) = gather([job], absent_store(tmp_path))
    assert found.summaries == [] and found.source == ""
    assert found.unavailable.startswith("no GPU figures for job 4242 in Slurm's accounting")
    assert "no GPU data has been stored yet" in found.unavailable  # the store's own words
    with pytest.raises(NoSummary) as raised:
        build_report(job, found.summaries, None, found.unavailable)
    assert str(raised.value) == found.unavailable


def test_a_running_job_without_a_line_or_a_store_says_it_is_running(
    tmp_path: Path, make_job: Factory,
) -> None:
    (found,) = gather([make_job(state="RUNNING", end="Unknown")], absent_store(tmp_path))
    assert found.unavailable.startswith("job 4242 is running: its GPU figures reach Slurm's accounting")


def test_a_line_too_large_for_its_figures_says_so(
    tmp_path: Path, make_job: Factory, make_summary: Factory,
) -> None:
    summaries = [make_summary(utils=(50.0,) * 8)]
    words = admin_comment(summaries, 8, max_chars=200)  # the figures did not fit
    assert "figures=" not in words
    job = make_job(gpus=8, admin_comment=words)
    (found,) = gather([job], absent_store(tmp_path))
    assert found.unavailable == ("job 4242's GPU figures (8 GPUs) are more than Slurm's "
                                 "AdminComment holds: an admin's gpueff reads them from the store")
    with pytest.raises(NoSummary, match="more than Slurm's AdminComment holds"):
        build_report(job, found.summaries, None, found.unavailable)


def test_finding_9_a_copy_of_our_line_beside_ours_gives_no_figures_and_says_why(
    tmp_path: Path, make_job: Factory, make_summary: Factory,
) -> None:
    """A user's copy of our form next to our line (a site tool copied the job's comment
    into the AdminComment): users get no figures, told why; the admin group reads the
    store. Today the copy's figures were the report's."""
    mine = make_summary(utils=(2.0,))
    forged = admin_comment([make_summary(utils=(99.0,))], 1)
    job = make_job(admin_comment=f"{admin_comment([mine], 1)} {forged}".lower())
    (found,) = gather([job], absent_store(tmp_path))
    assert found.summaries == [] and found.unavailable == (
        "job 4242's comment in Slurm's accounting holds more than one line in gpueff's form "
        "(text copied there from elsewhere): none is trusted; an admin's gpueff reads its "
        "figures from the store")
    path = str(tmp_path / "gpueff.db")
    with SqliteStore(path) as store:
        store.put(mine)
    (found,) = gather([job], lambda: SqliteStore(path, readonly=True))
    assert found.source == "store" and found.summaries[0].gpus[0].metric("util") == 2.0
