"""mirror.py and the deliverer's AdminComment mirror (on by default: the users' read path):
readable words that survive Slurm 22.05's lowercasing, then the report's figures, encoded
so that they survive it too; a site's own text before the line is kept."""

from __future__ import annotations

import base64
import random
import re
import string
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu_eff.config import Config, load_config
from slurm_gpu_eff.errors import ConfigError
from slurm_gpu_eff.mirror import (
    MAX_CHARS,
    TIMELINE_POINTS,
    MirrorError,
    admin_comment,
    digest,
    figures,
    parse_admin_comment,
    with_site_text,
)
from slurm_gpu_eff.model import RUNNING, NodeSummary
from slurm_gpu_eff.node.log import HookLog
from slurm_gpu_eff.node.spool import Spool
from slurm_gpu_eff.store.deliver import admin_comments, deliver_until_done
from slurm_gpu_eff.store.sqlite import SqliteStore
from tests.unit.conftest import BOOT

Factory = Callable[..., Any]
GIB = 1024**3
FIELDS = ["util", "sm_active", "power_w", "mem_used_gib"]  # node/stats.py Timeline.FIELDS


def timeline(points: int, seed: int = 0) -> dict[str, Any]:
    """A sampler's timeline of `points` 10-second buckets of made-up (incompressible) values."""
    rng = random.Random(seed)
    return {"start": BOOT, "bucket_s": 10.0, "fields": FIELDS,
            "points": [[round(rng.uniform(0, 100), 1), round(rng.uniform(0, 100), 1),
                        round(rng.uniform(60, 700), 1), round(rng.uniform(0, 80), 2)]
                       for _ in range(points)]}


def dicts(summaries: list[NodeSummary] | None) -> list[dict[str, Any]]:
    assert summaries is not None
    return [s.to_dict() for s in summaries]


# --- the line ------------------------------------------------------------------------------

def test_the_line_says_what_the_report_says_in_words_slurm_keeps(
    make_summary: Factory, make_gpu: Factory,
) -> None:
    busy = make_gpu(node="gpu1", minor=0, util=90.0, mem_used=60 * GIB)
    idle = make_gpu(node="gpu1", minor=1, util=0.5, mem_used=1 * GIB)
    shared = make_gpu(node="gpu2", minor=0, util=80.0, mem_used=8 * GIB)
    shared.shared_s = 100.0  # another job ran on it: this job is charged its own share
    shared.metrics["own_util"] = {"mean": 20.0}
    for g, joules in ((busy, 3.6e6), (idle, 0.0), (shared, 1.8e6)):
        g.sampled_s, g.energy_j = 3600.0, joules
    line = admin_comment([make_summary(node="gpu2", gpus=[shared]),
                          make_summary(node="gpu1", gpus=[busy, idle])], alloc_gpus=4)
    words, blob = line.split(" figures=")
    assert words == ("gpueff1 status=complete nodes=2 gpus=3 util=36.8 gpu_util=90.0,0.5,20.0 "
                     "idle=1 mem_peak=75.0 energy_kwh=1.500 alloc_gpus=4")
    assert set(words) <= set(string.ascii_lowercase + string.digits + " =.,-_")  # lowercase already
    assert set(blob) <= set(string.ascii_uppercase + "234567")  # base32: either case reads back
    assert parse_admin_comment(line.upper()) == parse_admin_comment(line) != None  # noqa: E711
    assert parse_admin_comment("ticket 4711: node rebooted") is None  # a site's own comment


def test_figures_not_measured_are_dashes_not_zeros(make_summary: Factory) -> None:
    line = admin_comment([make_summary(status="missing", reason="no sampler", utils=())])
    assert line.split(" figures=")[0] == ("gpueff1 status=missing nodes=1 gpus=0 util=- gpu_util=- "
                                          "idle=0 mem_peak=- energy_kwh=- alloc_gpus=-")


def test_the_figures_survive_sacctmgr_lowercasing_them(make_summary: Factory) -> None:
    summaries = [make_summary(node="gpu1", utils=(90.0, 10.0)), make_summary(node="gpu2")]
    summaries[0].gpus[0].timeline = timeline(500)
    stored = admin_comment(summaries, alloc_gpus=3).lower()  # what sacct gives back
    assert dicts(figures(stored)) == dicts(digest(summaries))
    assert dicts(figures(f"ticket 4711 {stored}")) == dicts(digest(summaries))  # after a site's text


def test_a_sites_own_text_is_kept_and_our_old_line_replaced() -> None:
    new = "gpueff1 status=complete nodes=1 gpus=1 alloc_gpus=1 figures=NEW"
    old = "gpueff1 status=partial nodes=1 gpus=1 alloc_gpus=1 figures=old"
    site = "ticket 4711: node rebooted"
    assert with_site_text("", new) == new
    assert with_site_text(site, new) == f"{site} {new}"
    assert with_site_text(f"{site} {old}", new) == f"{site} {new}"
    assert with_site_text(old, new) == new
    assert with_site_text(f"{site}  {old.upper()}", new) == f"{site} {new}"
    assert parse_admin_comment(f"{site} {new}") == parse_admin_comment(new)


def test_a_64_gpu_job_stays_under_max_chars_timelines_dropped_first_then_figures(
    make_summary: Factory, make_gpu: Factory,
) -> None:
    summaries = [make_summary(node=f"gpu{n}", gpus=[
        make_gpu(node=f"gpu{n}", minor=m, timeline=timeline(720, seed=8 * n + m)) for m in range(8)])
        for n in range(8)]
    assert len(admin_comment(summaries, 64, max_chars=10**9)) > MAX_CHARS  # timelines and all: too long
    line = admin_comment(summaries, 64)
    assert len(line) <= MAX_CHARS
    read = figures(line.lower())
    assert read is not None and sum(len(s.gpus) for s in read) == 64
    assert all(g.timeline is None and g.metrics for s in read for g in s.gpus)
    words = admin_comment(summaries, 64, max_chars=2000)  # not even the figures fit
    assert "figures=" not in words and figures(words) is None
    assert words.startswith("gpueff1 status=complete nodes=8 gpus=64 ") and words.endswith(" alloc_gpus=64")


def encoded(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def test_a_figures_word_not_in_base32_is_not_ours() -> None:
    assert figures("gpueff1 status=complete nodes=1 gpus=1 figures=not-base32!") is None


@pytest.mark.parametrize("blob", [
    encoded(b"not zlib at all"),
    encoded(zlib.compress(b"{not json")),
    encoded(zlib.compress(b'[{"node": "gpu1"}]')),  # JSON, not node summaries
    encoded(zlib.compress(b'[{"cluster": "c", "job_id": "1", "node": "gpu1"}]' * 9))[:40],  # cut short
    encoded(zlib.compress(b"[" * 100_000 + b"]" * 100_000)),  # nested past the decoder: small
])
def test_figures_of_a_corrupt_blob_is_a_mirror_error(blob: str) -> None:
    with pytest.raises(MirrorError, match="AdminComment are unreadable"):
        figures(f"gpueff1 status=complete nodes=1 gpus=1 figures={blob}")


def test_no_line_or_a_line_without_figures_has_none() -> None:
    assert figures("") is None
    assert figures("ticket 4711: node rebooted") is None
    assert figures("gpueff1 status=complete nodes=8 gpus=64 alloc_gpus=64") is None


def test_digest_keeps_means_and_maxima_and_at_most_timeline_points_buckets(
    make_summary: Factory, make_gpu: Factory,
) -> None:
    points = [[float(i), None if i % 2 else 50.0, 100.0, float(i % 5)] for i in range(250)]
    gpu = make_gpu(timeline={"start": BOOT, "bucket_s": 10.0, "fields": FIELDS, "points": points})
    short = make_gpu(minor=1, timeline=timeline(TIMELINE_POINTS))
    (small,) = digest([make_summary(gpus=[gpu, short])])
    assert small.gpus[0].metrics == {name: {"mean": stats["mean"], "max": stats["max"]}
                                     for name, stats in gpu.metrics.items()}
    assert gpu.metrics["util"]["samples"] == 3600 and len(gpu.timeline["points"]) == 250  # input kept
    merged = small.gpus[0].timeline
    assert merged is not None and merged["fields"] == FIELDS and merged["start"] == BOOT
    assert (merged["bucket_s"], len(merged["points"])) == (30.0, 84)  # 250 in threes: <= 120
    assert merged["points"][0] == [1.0, 50.0, 100.0, 2.0]  # means of 0-2 (None left out), max memory
    assert merged["points"][1] == [4.0, 50.0, 100.0, 4.0]  # buckets 3-5
    assert merged["points"][-1] == [249.0, None, 100.0, 4.0]  # the last bucket alone, unmeasured SM
    assert small.gpus[1].timeline == short.timeline  # 120 buckets already: as they were


# --- the deliverer writes it ----------------------------------------------------------------

TRES = "billing=2,cpu=2,gres/gpu=2,mem=4000M,node=1"


def fake_slurm(tmp_path: Path, scontrol: str = "", sacctmgr: str = "", database: str = "",
               kept: bool = True, live_mirror_s: float = 0.0, owner: str = "alice/physics",
               comment_field: str = "AdminComment") -> Config:
    """scontrol, sacctmgr and sacct that record their arguments (one call a line, in
    calls.log); scontrol and sacctmgr fail with `error:...`. The database (a file) holds
    the comment field: sacctmgr writes it lowercased, as Slurm 22.05's does (not when
    `kept` is false: the job's end record came after it), and sacct reads it, with TRES
    (and the job's user/account, `owner`, when asked). Live copies are not mirrored
    unless live_mirror_s is given."""
    (tmp_path / "database").write_text(database)

    def command(name: str, body: str) -> str:
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls.log\n' + body)
        path.chmod(0o755)
        return str(path)

    def answer(said: str, then: str = "") -> str:
        return f"echo '{said[6:]}' >&2\nexit 1\n" if said.startswith("error:") else then

    store = (f'for a; do case $a in {comment_field}=*) printf %s "${{a#{comment_field}=}}" '
             f"| tr A-Z a-z > {tmp_path}/database;; esac; done\n") if kept else ""
    user, account = owner.split("/")
    read = ('for a; do case $a in --delimiter=*) d=${a#--delimiter=};; --format=*) f=${a#--format=};; '
            'esac; done\n'
            f'o=""; case $f in *,User,Account) o="${{d}}{user}${{d}}{account}";; esac\n'
            f'printf "%s%s%s%s4242%s4242%s\\n" "$(cat {tmp_path}/database)" "$d" "{TRES}" "$d" "$d" "$o"\n')
    return Config(admin_comment=True, live_mirror_s=live_mirror_s, comment_field=comment_field,
                  scontrol=command("scontrol", answer(scontrol)),
                  sacctmgr=command("sacctmgr", answer(sacctmgr, store)), sacct=command("sacct", read))


def calls(tmp_path: Path) -> list[str]:
    """The calls made, with this call's delimiter as D and the encoded figures as F."""
    log = tmp_path / "calls.log"
    text = log.read_text() if log.exists() else ""
    text = re.sub("--delimiter=\x1f[0-9a-f]{16}\x1f", "--delimiter=D", text)
    return re.sub("figures=[A-Za-z2-7]+", "figures=F", text).splitlines()


def written(tmp_path: Path) -> str:
    """The AdminComment of the last write, as it was given."""
    writes = [c for c in (tmp_path / "calls.log").read_text().splitlines() if "AdminComment=" in c]
    return writes[-1].split("AdminComment=", 1)[1]


LINE = ("gpueff1 status=complete nodes=2 gpus=2 util=50.0 gpu_util=90.0,10.0 idle=0 "
        "mem_peak=25.0 energy_kwh=0.500 alloc_gpus=2 alloc_mem=4194304000 figures=F")  # TRES's
READ = "sacct -j 4242 -X -n -P --delimiter=D --format=AdminComment,AllocTRES,JobIDRaw,JobID"
OWNED = f"{READ},User,Account"  # whose job has the id now: the mirror's read before it writes
DATABASE = f"sacctmgr -i modify job where jobid=4242 cluster=gpueffdev set AdminComment={LINE}"


def deliver_two_nodes(tmp_path: Path, config: Config, make_summary: Factory) -> list[NodeSummary]:
    """Job 4242's gpu1 delivered after gpu2; returns the store's summaries of it."""
    spool = Spool(str(tmp_path / "spool"))
    store_path = str(tmp_path / "gpueff.db")
    with SqliteStore(store_path) as store:
        store.put(make_summary(node="gpu2", utils=(10.0,)))  # the other node came first
    spool.post(make_summary(node="gpu1", utils=(90.0,)))
    spool.post(make_summary(job_id="77", status=RUNNING))  # a live copy: not mirrored here
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    result = deliver_until_done(spool, lambda: SqliteStore(store_path), config, log)
    assert result is not None and result.delivered == 2
    with SqliteStore(store_path, readonly=True) as store:
        return store.node_summaries("4242")


def test_while_slurmctld_holds_the_job_the_line_goes_through_it_after_the_sites_text(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked on Slurm 22.05: the job's end record carries slurmctld's AdminComment into
    the database over anything written there before; so slurmctld's copy first. A job of
    several nodes is looked at again (its other nodes write too): where the store holds
    nothing newer than the write was made from, there is nothing to write again."""
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, database="ticket 4711: node rebooted")
    stored = deliver_two_nodes(tmp_path, config, make_summary)
    assert calls(tmp_path) == [
        OWNED, f"scontrol update jobid=4242 AdminComment=ticket 4711: node rebooted {LINE}"]
    assert dicts(figures(written(tmp_path))) == dicts(digest(stored))


@pytest.mark.parametrize("nodes", [1, 2])
def test_through_slurmctld_a_job_is_looked_at_again_only_where_other_nodes_write(
    tmp_path: Path, make_summary: Factory, nodes: int,
) -> None:
    """Our node's summary alone in the store when it writes: Slurm's TRES says whether other
    nodes will write. Another node's final comes during the wait: a job of two nodes writes
    its part again, with both; a job of one node is not looked at (no other node writes)."""
    from slurm_gpu_eff.store import deliver as module

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setitem(globals(), "TRES", TRES.replace("node=1", f"node={nodes}"))
    spool = Spool(str(tmp_path / "spool"))
    spool.post(make_summary(node="gpu1", utils=(90.0,)))
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    store = str(tmp_path / "gpueff.db")

    def sleep(seconds: float) -> None:
        with SqliteStore(store) as opened:
            opened.put(make_summary(node="gpu2", utils=(10.0,)))

    try:
        module._attempt(spool, lambda: SqliteStore(store), log,
                        mirror=admin_comments(fake_slurm(tmp_path), sleep=sleep))
    finally:
        monkeypatch.undo()
    one = LINE.replace("nodes=2 gpus=2", "nodes=1 gpus=1").replace("90.0,10.0", "90.0").replace(
        "util=50.0", "util=90.0").replace("energy_kwh=0.500", "energy_kwh=0.250")
    assert calls(tmp_path)[:2] == [OWNED, f"scontrol update jobid=4242 AdminComment={one}"]
    again = [OWNED, f"scontrol update jobid=4242 AdminComment={LINE}"]  # both nodes' now
    assert calls(tmp_path)[2:] == ([] if nodes == 1 else again)


def test_a_finished_job_gets_it_in_the_database_read_back_and_written_again_if_overtaken(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, scontrol="error:Job has already finished for job 4242",
                        kept=False)  # the end record overtook our write: nothing there
    deliver_two_nodes(tmp_path, config, make_summary)
    # each look finds it gone (the fake's end record overtakes every write), up to the bound
    assert calls(tmp_path) == [
        OWNED, f"scontrol update jobid=4242 AdminComment={LINE}", DATABASE] * (1 + module.MIRROR_RECHECKS)


def test_jobs_ending_together_are_read_back_after_one_wait_with_the_spool_let_go(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """Four jobs of one node delivered together: all four lines written, then one wait
    (not one per job, under the lock: the last job's line came a minute late), then each
    read back; the spool is free during the wait. (The fake's database is one field for all
    four jobs: each read finds another job's line, so the looks go on to their bound.)"""
    from slurm_gpu_eff.store import deliver as module

    config = fake_slurm(tmp_path, scontrol="error:Job has already finished")
    spool = Spool(str(tmp_path / "spool"))
    store = str(tmp_path / "gpueff.db")
    jobs = ["4242", "4243", "4244", "4245"]
    for job in jobs:
        spool.post(make_summary(job_id=job))
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    waits = []

    def sleep(seconds: float) -> None:
        with module.locked(spool):  # would raise Busy if the deliverer still held it
            waits.append(seconds)
        with open(tmp_path / "calls.log", "a") as log_file:
            log_file.write("WAIT\n")

    mirror = admin_comments(config, sleep=sleep)
    result = module._attempt(spool, lambda: SqliteStore(store), log, mirror=mirror)
    assert result is not None and result.delivered == 4
    assert waits == [module.MIRROR_RECHECK_S] * module.MIRROR_RECHECKS  # a wait a look, for all
    made = calls(tmp_path)
    first = made.index("WAIT")
    before, after = made[:first], made[first + 1:made.index("WAIT", first + 1)]
    assert [c.split("jobid=")[1].split()[0] for c in before if c.startswith("sacctmgr")] == jobs
    assert [c.split()[2] for c in after if c.startswith("sacct ")] == jobs  # each read back


def test_a_line_read_back_lowercased_is_not_written_twice(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, scontrol="error:Invalid job id specified")
    stored = deliver_two_nodes(tmp_path, config, make_summary)
    assert calls(tmp_path) == [OWNED, f"scontrol update jobid=4242 AdminComment={LINE}", DATABASE, OWNED]
    database = (tmp_path / "database").read_text()
    assert database == written(tmp_path).lower()  # as sacctmgr keeps it: still readable
    assert dicts(figures(database)) == dicts(digest(stored))


def test_a_running_jobs_live_figures_go_into_the_database_every_live_mirror_s(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """From its first node only, straight into the database (slurmctld's copy reaches sacct
    only at the job's end), and not again before live_mirror_s has passed."""
    from slurm_gpu_eff.store import deliver as module

    spool = Spool(str(tmp_path / "spool"))
    store = str(tmp_path / "gpueff.db")
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    now = [BOOT + 1000]
    mirror = admin_comments(fake_slurm(tmp_path, live_mirror_s=300), clock=lambda: now[0])

    def deliver_live(until: float) -> None:
        for node in ("gpu2", "gpu1"):
            spool.post(make_summary(node=node, job_id="77", status=RUNNING, sampled_until=until))
        module._attempt(spool, lambda: SqliteStore(store), log, mirror=mirror)

    deliver_live(BOOT + 1000)
    live = LINE.replace("status=complete", "status=running").replace("90.0,10.0", "50.0,50.0")
    once = [OWNED.replace("4242", "77"),
            f"sacctmgr -i modify job where jobid=77 cluster=gpueffdev set AdminComment={live}"]
    assert calls(tmp_path) == once
    now[0] += 299
    deliver_live(BOOT + 1299)
    assert calls(tmp_path) == once  # not yet due
    now[0] += 1
    deliver_live(BOOT + 1300)
    assert calls(tmp_path) == once * 2


def test_a_mirror_that_fails_is_logged_and_costs_the_store_nothing(
    tmp_path: Path, make_summary: Factory,
) -> None:
    spool = Spool(str(tmp_path / "spool"))
    store_path = str(tmp_path / "gpueff.db")
    spool.post(make_summary())
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    config = fake_slurm(tmp_path, scontrol="error:Access/permission denied")
    from slurm_gpu_eff.store import deliver as module

    result = module._attempt(spool, lambda: SqliteStore(store_path), log, mirror=admin_comments(config))
    assert result is not None and result.delivered == 1
    assert ("job 4242: its AdminComment was not written: scontrol could not set job 4242's "
            "AdminComment: Access/permission denied") in (tmp_path / "log").read_text()


def test_admin_comment_is_a_true_or_false_setting_on_by_default(tmp_path: Path) -> None:
    assert Config().admin_comment is True  # the users' read path
    conf = tmp_path / "gpueff.toml"
    conf.write_text('[slurm]\nadmin_comment = false\nsacctmgr = "/opt/slurm/bin/sacctmgr"\n')
    config = load_config(str(conf))
    assert config.admin_comment is False and config.sacctmgr == "/opt/slurm/bin/sacctmgr"
    conf.write_text('[slurm]\nadmin_comment = "maybe"\n')
    with pytest.raises(ConfigError,
                       match=r"line 2: \[slurm\] admin_comment = 'maybe': must be true or false"):
        load_config(str(conf))


# --- issue 20: whose figures, beside whose text ----------------------------------------------

def deliver_one(tmp_path: Path, config: Config, summary: NodeSummary,
                stored: tuple[NodeSummary, ...] = ()) -> str:
    """`summary` delivered to a store already holding `stored`; returns the hook log."""
    spool = Spool(str(tmp_path / "spool"))
    store_path = str(tmp_path / "gpueff.db")
    with SqliteStore(store_path) as store:
        for s in stored:
            store.put(s)
    spool.post(summary)
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    deliver_until_done(spool, lambda: SqliteStore(store_path), config, log)
    return (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""


def test_finding_3_a_job_id_given_out_again_carries_no_other_jobs_figures(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """Bob's job 4242 ends while the store still holds alice's job 4242 of last month (Slurm
    gave the id out again): bob's AdminComment, which bob reads under PrivateData=jobs,
    carries bob's run alone, not alice's user, account, node and per-GPU figures."""
    alices = make_summary(node="gpu3", run_started_at=BOOT - 30 * 86400, user="alice",
                          account="physics", started_at=BOOT - 30 * 86400)
    bobs = make_summary(node="gpu1", run_started_at=BOOT, user="bob", account="chem")
    deliver_one(tmp_path, fake_slurm(tmp_path, owner="bob/chem"), bobs, stored=(alices,))
    carried = figures(written(tmp_path))
    assert carried is not None and [(s.user, s.node) for s in carried] == [("bob", "gpu1")]


def test_a_requeued_job_still_carries_its_own_earlier_run(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """A requeue is the same job (its user and account): its earlier run goes with it, for
    the report to name (report/job.py this_run)."""
    earlier = make_summary(node="gpu3", run_started_at=BOOT - 3600, status="partial", reason="requeued")
    deliver_one(tmp_path, fake_slurm(tmp_path), make_summary(node="gpu1", run_started_at=BOOT),
                stored=(earlier,))
    carried = figures(written(tmp_path))
    assert carried is not None and sorted(s.node for s in carried) == ["gpu1", "gpu3"]
    assert written(tmp_path).split(" figures=")[0].startswith("gpueff1 status=complete nodes=1 gpus=1 ")


def test_finding_3_a_late_summary_does_not_go_into_the_next_job_that_got_its_id(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """Alice's summary reaches the store days late (the store was away): job 4242 in Slurm's
    accounting, the one a write would reach, is bob's by now. Nothing is written; the
    store keeps alice's figures."""
    log = deliver_one(tmp_path, fake_slurm(tmp_path, owner="bob/chem"), make_summary())
    assert [c for c in calls(tmp_path) if "AdminComment=" in c] == []
    assert ("job 4242: its AdminComment was not written: job 4242 in Slurm's accounting is another "
            "user's or account's (bob/chem) now: this run's figures stay in the store") in log


def test_finding_7_the_recheck_puts_our_part_into_the_field_as_it_stands_then(
    tmp_path: Path, make_summary: Factory,
) -> None:
    """Princeton's jobstats writes its summary over the whole AdminComment (sacctmgr, from
    slurmctld's epilog, 5 s after the job ends) while our re-check waits. The re-check puts
    our part in beside it: it never writes back the text it wrote 5 s before (the site's
    old note, no jobstats)."""
    from slurm_gpu_eff.store import deliver as module

    config = fake_slurm(tmp_path, scontrol="error:Job has already finished", database="ticket 4711")

    def sleep(seconds: float) -> None:
        if "js1:" not in (tmp_path / "database").read_text().lower():
            (tmp_path / "database").write_text("JS1:H4sIAAAA")  # another tool's newer write

    spool = Spool(str(tmp_path / "spool"))
    spool.post(make_summary(node="gpu1", utils=(90.0, 10.0)))
    store = str(tmp_path / "gpueff.db")
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    module._attempt(spool, lambda: SqliteStore(store), log, mirror=admin_comments(config, sleep=sleep))
    writes = [c.split("AdminComment=", 1)[1] for c in calls(tmp_path) if c.startswith("sacctmgr")]
    ours = writes[0].removeprefix("ticket 4711 ")
    assert writes == [f"ticket 4711 {ours}", f"JS1:H4sIAAAA {ours}"]


@pytest.mark.parametrize(("path", "when"), [
    ("slurmdbd", "wait"), ("slurmdbd", "final"), ("slurmdbd", "recheck"), ("slurmctld", "final"),
])
def test_the_nodes_of_a_job_ending_together_leave_every_nodes_final_part_in_the_field(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch, path: str, when: str,
) -> None:
    """A three-node job's nodes deliver at once, each writing the field from what the store
    held when it read. gpu3 reads first, while gpu1 and gpu2 were running; they deliver
    whole (final and recheck) during gpu3's wait, or between its store read and its write
    (its final's, or its recheck's sacct slow). gpu3 put back the part it had written, with
    two nodes 'running' for good (CI, Slurm 24.11: a user's report stayed partial); its
    looks now make the part again from what the store holds, and look again after a write
    (a helper's probe: a recheck slow between its read and its write left the same)."""
    from slurm_gpu_eff.slurm import access
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setitem(globals(), "TRES", TRES.replace("node=1", "node=3"))
    store = str(tmp_path / "gpueff.db")
    with SqliteStore(store) as opened:
        for node in ("gpu1", "gpu2"):
            opened.put(make_summary(node=node, status=RUNNING, sampled_until=BOOT + 1800))
    log = HookLog(str(tmp_path / "log"), "-", "deliver")
    scontrol = "error:Job has already finished" if path == "slurmdbd" else ""
    reads = [0]
    real_connect = access.connect

    def node_delivers(node: str, sleep: Callable[[float], None], hook: bool = False) -> None:
        spool = Spool(str(tmp_path / f"spool-{node}"))
        spool.post(make_summary(node=node))
        config = fake_slurm(tmp_path, scontrol=scontrol, database=(tmp_path / "database").read_text())

        def connect(*args: Any, **kwargs: Any) -> Any:
            slurm = real_connect(*args, **kwargs)
            read = slurm.comment

            def comment(job_id: str, owner: bool = False) -> Any:  # gpu3's store read is done
                reads[0] += 1
                if reads[0] == {"final": 1, "recheck": 2}.get(when):
                    others_deliver(0.0)
                return read(job_id, owner)

            slurm.comment = comment  # type: ignore[method-assign]
            return slurm

        with monkeypatch.context() as patch:
            if hook:
                patch.setattr(access, "connect", connect)
            mirror = admin_comments(config, sleep=sleep)
        module._attempt(spool, lambda: SqliteStore(store), log, mirror=mirror)

    def others_deliver(seconds: float) -> None:
        for node in ("gpu1", "gpu2"):
            node_delivers(node, lambda s: None)

    (tmp_path / "database").write_text("")
    node_delivers("gpu3", others_deliver if when == "wait" else (lambda s: None), hook=True)
    if path == "slurmdbd":
        field = (tmp_path / "database").read_text()
    else:  # what the job's end record carries: slurmctld's last
        field = written(tmp_path)
    carried = figures(field)
    assert reads[0] >= 2  # a look read the field: the "recheck" case's hook was reached
    assert carried is not None and sorted((s.node, s.status) for s in carried) == [
        ("gpu1", "complete"), ("gpu2", "complete"), ("gpu3", "complete")]


def test_finding_7_a_sites_text_after_our_part_is_kept_and_ours_still_read(make_summary: Factory) -> None:
    """An admin's note after our part: the field still gives our figures, and our next
    write keeps the note (before our new part at the end), as it keeps text before ours."""
    summaries = [make_summary()]
    field = f"ticket 4711 {admin_comment(summaries, 2)} checked by admin"
    assert dicts(figures(field)) == dicts(digest(summaries))
    new = "gpueff1 status=complete nodes=1 gpus=1 alloc_gpus=1"
    assert with_site_text(field, new) == f"ticket 4711 checked by admin {new}"
    assert with_site_text(field.upper(), new) == f"TICKET 4711 CHECKED BY ADMIN {new}"  # 22.05's sacctmgr


def test_finding_9_a_copy_of_our_form_beside_ours_is_not_trusted(make_summary: Factory) -> None:
    """A site tool copies a job's user-chosen comment into the AdminComment, and the user
    wrote a line in our form there: before our part or after it, neither is trusted (which
    is ours cannot be told); our next write removes the copy. Today's reader took the
    copy's figures when it came after ours, and its writer dropped the site's text."""
    real = admin_comment([make_summary(utils=(2.0,))], 1)
    forged = admin_comment([make_summary(utils=(99.0,))], 1)
    for field in (f"{real} {forged}", f"comment: {forged} {real}", f"{real} copied: {forged}"):
        assert parse_admin_comment(field) is None and figures(field) is None, field
        assert figures(field.lower()) is None
    assert with_site_text(f"comment: {forged} ticket {real}", "gpueff1 status=complete") == (
        "comment: ticket gpueff1 status=complete")
    words = admin_comment([make_summary(utils=(2.0,))], 1, max_chars=200)  # no room for figures
    assert figures(f"{forged} {words}") is None  # today: the copy's figures, for a line without


def test_our_form_is_a_marker_word_then_our_words_in_our_order() -> None:
    """What counts as a part of ours (mirror._parts), and where it ends."""
    from slurm_gpu_eff.mirror import our_part

    assert our_part("see gpueff1 docs") is None  # the word alone is no part
    assert our_part("xgpueff1 status=complete") is None  # not a word of its own
    assert our_part("a gpueff1 status=complete idle=0 b c") == "gpueff1 status=complete idle=0"
    assert our_part("gpueff1 status=complete idle=0 nodes=1") == "gpueff1 status=complete idle=0"  # order
    assert our_part("gpueff1 nodes=1 status=complete") is None  # status first
    last = "gpueff1 status=complete figures=ABC2"  # nothing of ours comes after the figures
    assert our_part(f"{last} alloc_gpus=1") == last
    assert our_part("GPUEFF1 STATUS=COMPLETE IDLE=0") == "GPUEFF1 STATUS=COMPLETE IDLE=0"


def test_comment_field_system_comment_is_written_through_sacctmgr_only(
    tmp_path: Path, make_summary: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[slurm] comment_field = "SystemComment" (a site whose jobstats needs the AdminComment
    to itself): read and written there, always into the database (`scontrol update` cannot
    set it), read back once; the AdminComment is never touched."""
    from slurm_gpu_eff.store import deliver as module

    monkeypatch.setattr(module, "MIRROR_RECHECK_S", 0.0)
    config = fake_slurm(tmp_path, comment_field="SystemComment", database="bb: stage-in ok")
    stored = deliver_two_nodes(tmp_path, config, make_summary)
    read = READ.replace("AdminComment", "SystemComment")
    assert calls(tmp_path) == [
        f"{read},User,Account",
        f"sacctmgr -i modify job where jobid=4242 cluster=gpueffdev set SystemComment=bb: stage-in ok {LINE}",
        f"{read},User,Account"]
    assert dicts(figures((tmp_path / "database").read_text())) == dicts(digest(stored))


def test_comment_field_is_admin_comment_or_system_comment(tmp_path: Path) -> None:
    assert Config().comment_field == "AdminComment"
    conf = tmp_path / "gpueff.toml"
    conf.write_text('[slurm]\ncomment_field = "SystemComment"\n')
    assert load_config(str(conf)).comment_field == "SystemComment"
    conf.write_text('[slurm]\ncomment_field = "Comment"\n')  # the user's own: never
    with pytest.raises(ConfigError, match=r"line 2: \[slurm\] comment_field = 'Comment': "
                                          "say AdminComment or SystemComment"):
        load_config(str(conf))
