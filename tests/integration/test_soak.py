"""The fault-injection soak (issue 20): hundreds of jobs of mixed shapes on the development
cluster with the idle policy on (alert and cancel at seconds), while faults are injected
at random but reproducibly (one seed): a sampler SIGKILLed, a lying gres map, the store
held locked, the SMTP server away, slurmctld and slurmdbd restarted, NVML failing for a
stretch on a GPU (a profile phase of the stand-in library), a wall-clock step seen by the
samplers (through [sim] clock_offset_file: never the machine's own clock).

It counts and asserts: busy jobs cancelled 0; idle jobs untouched by a fault alerted
exactly once and cancelled; no job alerted twice or mailed twice; summaries lost 0 (every
job has one from each of its nodes); nodes drained 0. Its figures go to
build/soak-SEED.json.

Not part of `make test` (about 15 minutes for 200 jobs): `make soak` (SOAK_JOBS=200,
SOAK_SEED=20261126); without GPUEFF_SOAK_JOBS it is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from slurm_gpu_eff import config as config_module
from slurm_gpu_eff.sim.profile import EVENT_FIELDS
from tests.smtp import Server

from .conftest import REPO, Cluster, with_settings

pytestmark = [pytest.mark.cluster, pytest.mark.serial]
JOBS = int(os.environ.get("GPUEFF_SOAK_JOBS", "0"))
SEED = int(os.environ.get("GPUEFF_SOAK_SEED", "20261126"))
ALERT_S = 12.0
CANCEL_S = 12.0
IDLE_S = 70  # an idle job's idle phase: long enough for an alert, delivery and a cancel past a fault
OPT_OUT = "gpueff:idle-ok"
FAULT_GAP_S = (15, 35)  # seconds between two faults
NODES = ("gpu1", "gpu2")  # the default partition's nodes (mig1 is a partition of its own)
# A phase of NVML errors on a GPU leaves the look at the node's GPUs incomplete, so a job
# beside it that never opened its GPU cannot be told unused (alerting admins, never
# cancelling): the NVML-error jobs keep to one node, the jobs that must be alerted to the other.
NVML_NODE, IDLE_NODE = NODES[1], NODES[0]

# kind -> weight; each kind says whether it works its GPUs (never to be cancelled) or idles
KINDS = {
    "busy": 28, "busy_multi": 10, "busy_array": 5, "busy_two_nodes": 6, "busy_nvml_errors": 6,
    "idle_open": 14, "idle_never": 14, "idle_exempt": 6, "idle_short": 8,
}
ALERTED_KINDS = {"idle_open", "idle_never"}
FAULTS = ["kill_sampler", "kill_sampler", "liar", "store_locked", "smtp_down", "restart_slurmctld",
          "restart_slurmdbd", "clock_step"]
# The two injections the stand-in and the [sim] config give (said in the figures if not)
NVML_ERRORS = "nvml_error" in EVENT_FIELDS
CLOCK_STEP = any(key[:2] == ("sim", "clock_offset_file") for key in config_module._KEYS)
if not NVML_ERRORS:
    KINDS["busy_nvml_errors"] = 0
if not CLOCK_STEP:
    FAULTS.remove("clock_step")

LIAR = """#!/bin/sh
# slurmd -G -N NODE, lying: Slurm's index i named as the device file of minor (i+1) mod 4
d={nodes}/$3
for i in 0 1 2 3; do
  echo "slurmd: Gres Name=gpu Count=1 Index=$i ID=7696487 File=$d/nvidia$(( (i + 1) % 4 ))" >&2
done
"""


@dataclass
class Job:
    kind: str
    submitted: str  # sbatch's id (an array's for its tasks)
    ids: list[str] = field(default_factory=list)  # each run's own id (JobIDRaw)
    names: list[str] = field(default_factory=list)  # the ids its mails name (1234_7 for a task)
    state: str = ""
    started: float = 0.0
    ended: float = 0.0
    nodes: dict[str, list[str]] = field(default_factory=dict)  # each run's nodes
    hit: list[str] = field(default_factory=list)  # faults aimed at this job alone

    @property
    def busy(self) -> bool:
        return self.kind.startswith("busy")


@dataclass
class Fault:
    name: str
    began: float
    ended: float
    detail: str = ""


def phases(*items: tuple[float, float]) -> list[dict[str, Any]]:
    return [{"seconds": s, "gpus": {"*": {"util": u, "power_w": 100 + 4 * u}}} for s, u in items]


class Soak:
    def __init__(self, cluster: Cluster, smtp: Server, rng: random.Random) -> None:
        self.cluster, self.smtp, self.rng = cluster, smtp, rng
        self.jobs: list[Job] = []
        self.faults: list[Fault] = []
        # Every kind once first, in a seeded order, then at random: a run of one seed
        # might otherwise never inject one of them (seen: no lying gres map in a run)
        self.first = rng.sample(sorted(set(FAULTS)), len(set(FAULTS)))
        self.honest = cluster.write("soak-honest.toml", cluster.config_file.read_text())
        self.drained: list[str] = []
        self.liar_windows: list[tuple[float, float]] = []
        self.killed: set[str] = set()  # runs whose sampler was SIGKILLed on a node
        self.stepped: list[str] = []  # runs whose samplers saw the wall clock step
        self.unsampled: list[str] = []  # runs with no sampler at all (their prolog did not run)

    # --- the jobs ------------------------------------------------------------------------

    def submit(self, kind: str) -> Job:
        cluster, rng = self.cluster, self.rng
        user = rng.choice(("alice", "bob"))
        env = f"--export=ALL,GPUEFF_CONFIG={self.honest}"  # the workload reads the true GPU map
        common = ("--mail-type=END", env, f"--job-name=soak-{kind}")
        busy = phases((rng.randint(12, 26), rng.choice((70, 85, 95))))
        if kind == "busy":
            job = cluster.submit_profile(user, cluster.profile(busy), "--gres=gpu:1", *common)
        elif kind == "busy_multi":
            gpus = f"--gres=gpu:{rng.randint(2, 4)}"
            job = cluster.submit_profile(user, cluster.profile(busy), gpus, *common)
        elif kind == "busy_array":
            job = cluster.submit_profile(user, cluster.profile(busy), "--array=0-2", "--gres=gpu:1", *common)
        elif kind == "busy_two_nodes":
            job = cluster.submit_profile(user, cluster.profile(busy), "-N", "2", "--ntasks-per-node=1",
                                         "--gres=gpu:1", *common, runner="srun")
        elif kind == "busy_nvml_errors":  # NVML fails on the GPU for 12 s while it works
            errors = [*phases((4, 90)), {"seconds": 12, "gpus": {"*": {"util": 90, "nvml_error": True}}},
                      *phases((6, 90))]
            job = cluster.submit_profile(user, cluster.profile(errors), "--gres=gpu:1", "-w", NVML_NODE,
                                         *common)
        elif kind == "idle_open":
            job = cluster.submit_profile(user, cluster.profile(phases((3, 90), (IDLE_S, 0))), "--gres=gpu:1",
                                         "-w", IDLE_NODE, *common)
        elif kind == "idle_never":
            job = cluster.submit(user, f"sleep {IDLE_S}", "--gres=gpu:1", "-w", IDLE_NODE, *common)
        elif kind == "idle_exempt":
            exempt = phases((3, 90), (IDLE_S // 2, 0))
            job = cluster.submit_profile(user, cluster.profile(exempt), "--gres=gpu:1",
                                         f"--comment=soak {OPT_OUT}", *common)
        else:  # idle_short: idle for less than the alert's minutes
            job = cluster.submit_profile(user, cluster.profile(phases((3, 90), (ALERT_S / 2, 0), (8, 90))),
                                         "--gres=gpu:1", *common)
        planned = Job(kind, job)
        self.jobs.append(planned)
        return planned

    def running(self) -> list[tuple[str, list[str]]]:
        """(raw job id, its nodes) of every running job."""
        out = self.cluster.run(["squeue", "-h", "-t", "R", "-o", "%A|%N"]).out
        found = []
        for line in out.split():
            raw, nodelist = line.split("|")
            found.append((raw, self.cluster.run(["scontrol", "show", "hostnames", nodelist]).out.split()))
        return found

    def queued(self) -> int:
        return len([line for line in self.cluster.run(["squeue", "-h", "-o", "%A"]).out.split() if line])

    # --- the faults ----------------------------------------------------------------------

    def fault(self) -> None:
        name = self.first.pop(0) if self.first else self.rng.choice(FAULTS)
        began = time.time()
        detail = getattr(self, name)()
        self.faults.append(Fault(name, began, time.time(), detail))

    def kill_sampler(self) -> str:
        victims = sorted(self.running())
        if not victims:
            return "no job running"
        raw, nodes = self.rng.choice(victims)
        node = self.rng.choice(nodes)
        try:  # the prolog's pid file: "PID STARTED"
            pid = int((self.cluster.spool(node) / "jobs" / raw / "sampler.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError) as exc:
            return f"job {raw} on {node}: no sampler to kill ({exc})"
        self.killed.add(raw)
        return f"job {raw} on {node}: sampler {pid}"

    def with_config(self, change: Callable[[str], str], seconds: float) -> None:
        conf = self.cluster.config_file
        original = conf.read_text()
        conf.write_text(change(original))
        try:
            time.sleep(seconds)
        finally:
            conf.write_text(original)

    def liar(self) -> str:
        liar = self.cluster.write("soak-slurmd-liar", LIAR.format(nodes=self.cluster.dir / "nodes"))
        liar.chmod(0o755)
        began = time.time()
        self.with_config(lambda text: with_settings(text, "slurm", {"slurmd": str(liar)})
                         .replace("gpu-map.json", "gpu-map-liar.json"), 25)
        self.liar_windows.append((began - 2, time.time() + 5))  # a prolog reads it as it starts
        return "25 s"

    def store_locked(self) -> str:
        with self.cluster.store_down():
            time.sleep(20)
        return "20 s"

    def smtp_down(self) -> str:
        self.smtp.stop()
        try:
            time.sleep(25)
        finally:
            self.smtp.start()
        return "25 s"

    def restart(self, daemon: str) -> str:
        done = subprocess.run(["bash", str(REPO / "scripts" / "cluster.sh"), "restart", daemon],
                              env=self.cluster.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return daemon

    def restart_slurmctld(self) -> str:
        return self.restart("slurmctld")

    def restart_slurmdbd(self) -> str:
        return self.restart("slurmdbd")

    def clock_step(self) -> str:
        """The samplers' wall clock an hour ahead for 20 s, then back."""
        offset = self.cluster.write("soak-clock-offset", "3600\n")
        self.stepped += [raw for raw, _ in self.running()]
        self.with_config(lambda text: with_settings(text, "sim", {"clock_offset_file": str(offset)}), 20)
        self.stepped += [raw for raw, _ in self.running()]  # and those whose sampler started meanwhile
        return "+3600 s for 20 s"

    def watch_nodes(self) -> None:
        out = self.cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).out
        self.drained += [line for line in out.splitlines() if re.search(r"drain|down|drng|fail", line)]

    # --- after ---------------------------------------------------------------------------

    def settle(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.queued() and time.monotonic() < end:
            self.watch_nodes()
            time.sleep(5)
        assert not self.queued(), f"jobs still queued after {timeout:g} s"

    def account(self) -> None:
        for job in self.jobs:
            rows = self.cluster.run(["sacct", "-j", job.submitted, "-X", "-n", "-P",
                                     "--format=JobIDRaw,JobID,State,Start,End,NodeList"]).out.splitlines()
            for row in rows:
                raw, shown, state, start, ended, nodelist = row.split("|")
                job.ended = time.mktime(time.strptime(ended, "%Y-%m-%dT%H:%M:%S"))
                job.ids.append(raw)
                job.names.append(shown)
                job.state = state.split()[0]
                job.started = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
                job.nodes[raw] = self.cluster.run(["scontrol", "show", "hostnames", nodelist]).out.split()
                if raw in self.killed:
                    job.hit.append(f"sampler of {raw} killed")
                if raw in self.stepped:
                    job.hit.append(f"{raw} saw a clock step")
                stored = self.cluster.summaries(raw).values()
                if stored and all(not s.get("gpus") for s in stored):  # no sampler ever ran
                    why = "; ".join(s.get("reason", "") for s in stored)
                    job.hit.append(f"{raw}: no GPU figures ({why})")
                    self.unsampled.append(raw)
            if any(a <= job.started <= b for a, b in self.liar_windows):
                job.hit.append("lying gres map")
        # NVML failing on a GPU of a job's node: the look at every GPU of the node is not
        # whole, so a job that never opened its GPU can no longer be told unused (never
        # cancelled on doubt; the admins are told)
        failing = [(node, j.started, j.ended) for j in self.jobs if j.kind == "busy_nvml_errors"
                   for nodes in j.nodes.values() for node in nodes]
        for job in self.jobs:
            on = {n for nodes in job.nodes.values() for n in nodes}
            if job.kind != "busy_nvml_errors" and any(
                    n in on and a <= job.ended and job.started <= b for n, a, b in failing):
                job.hit.append("NVML failing on a GPU of its node meanwhile")


@pytest.fixture
def soak_policy(cluster: Cluster) -> Iterator[None]:
    conf = cluster.config_file
    before = conf.read_text()
    conf.write_text(with_settings(before, "mail", {"idle_alert_min": ALERT_S / 60,
                                                   "idle_cancel_min": CANCEL_S / 60,
                                                   "idle_opt_out_word": OPT_OUT}))
    try:
        yield
    finally:
        conf.write_text(before)


def mails(smtp: Server, job: Job) -> tuple[Counter[str], list[str]]:
    """The job's mails by kind (alert, cancel: the policy's notice; end: Slurm's), and
    their subjects."""
    kinds: Counter[str] = Counter()
    subjects = []
    names = {*job.names, *job.ids}
    for _, message in smtp.inbox.messages:
        subject = str(message["Subject"])
        if not any(f"Job_id={n} " in subject or f"Job_id={n}:" in subject or f"({n})" in subject
                   for n in names):
            continue
        subjects.append(subject)
        if " GPUs idle for " in subject:
            kinds["alert"] += 1
        elif " cancelled: GPU idle for " in subject:
            kinds["cancel"] += 1
        else:
            kinds["end"] += 1
    return kinds, subjects


def watch_did(cluster: Cluster) -> Counter[tuple[str, str]]:
    """What the idle watch's log says it did: (job id, "alerted" | "cancelled") -> times."""
    text = (cluster.dir / "log" / "mail.log").read_text(errors="replace")
    return Counter((m[1], m[2]) for m in re.finditer(r" job (\S+): (alerted|cancelled) ", text))


@pytest.mark.skipif(not JOBS, reason="the soak runs with `make soak` (GPUEFF_SOAK_JOBS), not in make test")
def test_the_soak(cluster: Cluster, smtp: Server, soak_policy: None) -> None:
    rng = random.Random(SEED)
    soak = Soak(cluster, smtp, rng)
    kinds, weights = zip(*KINDS.items(), strict=True)
    plan = rng.choices(kinds, weights, k=JOBS)
    runs = 0
    for kind in plan:  # an array counts its three tasks
        if runs >= JOBS:
            break
        soak.submit(kind)
        runs += 3 if kind == "busy_array" else 1
    next_fault = time.monotonic() + rng.uniform(*FAULT_GAP_S)
    end = time.monotonic() + 60 * 60
    while soak.queued() and time.monotonic() < end:
        soak.watch_nodes()
        if time.monotonic() >= next_fault:
            soak.fault()
            next_fault = time.monotonic() + rng.uniform(*FAULT_GAP_S)
        time.sleep(2)
    soak.settle(300)
    time.sleep(30)  # the last mails and deliveries
    soak.account()

    figures: dict[str, Any] = {
               "seed": SEED, "nvml_errors": NVML_ERRORS, "clock_step": CLOCK_STEP, "runs": 0,
               "kinds": Counter(), "faults": Counter(f.name for f in soak.faults),
               "busy_cancelled": [], "busy_alerted": [], "inbox_matched_busy": [],
               "idle_not_alerted_once": [], "alerted_twice": [], "mailed_twice": [],
               "summaries_lost": [], "nodes_drained": sorted(set(soak.drained)), "hit": {},
               "idle_checked_once": 0,
               "unsampled": soak.unsampled}
    did = watch_did(cluster)
    for job in soak.jobs:
        figures["runs"] += len(job.ids)
        figures["kinds"][job.kind] += len(job.ids)
        got, subjects = mails(smtp, job)
        for raw in job.ids:  # the watch's own log: what it did, whatever the inbox matched
            got["watch_alerted"] += did[(raw, "alerted")]
            got["watch_cancelled"] += did[(raw, "cancelled")]
        if job.hit:
            figures["hit"][job.submitted] = job.hit
        cancelled = job.state.startswith("CANCELLED") or got["watch_cancelled"]
        if job.busy and cancelled:
            figures["busy_cancelled"].append((job.submitted, job.kind, job.state, dict(got), subjects))
        if job.busy and got["watch_alerted"]:
            figures["busy_alerted"].append((job.submitted, job.kind, job.state, dict(got), subjects))
        elif job.busy and got["alert"]:  # the inbox's subject matching, not the watch: said, not failed
            figures["inbox_matched_busy"].append((job.submitted, subjects))
        alerted_once = got["alert"] == 1 and job.state.startswith("CANCELLED")
        if job.kind in ALERTED_KINDS and not job.hit:
            figures["idle_checked_once"] += 1
        if job.kind in ALERTED_KINDS and not job.hit and not alerted_once:
            figures["idle_not_alerted_once"].append((job.submitted, job.kind, job.state, dict(got)))
        if job.kind in ("idle_exempt", "idle_short") and got["alert"]:
            figures["idle_not_alerted_once"].append((job.submitted, job.kind, job.state, dict(got)))
        if got["alert"] > 1 or got["cancel"] > 1:
            figures["alerted_twice"].append((job.submitted, dict(got)))
        if got["end"] > len(job.ids):
            figures["mailed_twice"].append((job.submitted, dict(got)))
        for raw in job.ids:
            stored = set(cluster.summaries(raw))
            if not set(job.nodes[raw]) <= stored:
                figures["summaries_lost"].append((raw, job.kind, sorted(stored), job.nodes[raw]))
    figures["faults_injected"] = [asdict(f) for f in soak.faults]
    out = REPO / "build" / f"soak-{SEED}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "faults_injected"}, default=str))
    assert figures["runs"] >= JOBS
    assert set(figures["faults"]) == set(FAULTS), "a kind of fault was never injected"
    assert not figures["busy_cancelled"] and not figures["busy_alerted"]
    assert not figures["idle_not_alerted_once"]
    assert figures["idle_checked_once"] >= JOBS // 20, "too few idle jobs untouched by a fault to check"
    assert not figures["alerted_twice"] and not figures["mailed_twice"]
    assert not figures["summaries_lost"]
    assert not figures["nodes_drained"]
