"""The paths that ask Slurm, on the running dev cluster, through each backend (issue 21):
`gpueff JOBID` against Slurm's own seff on the same finished GPU jobs of several shapes,
and the usage report's sync over 30 days of 10,000 finished GPU jobs.

Each command is timed from inside the cluster (its release's root where it has one), as
the job's owner, by `bench/timed.py`: the way in (`scripts/cluster.sh as`) costs the
same for every command and is left out of the figures. The 10,000 jobs are copies of a
finished GPU job of the cluster written straight into its accounting database (in a
month of 2025 no other job is in, with ids above any Slurm gives out), and removed again.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.demo import cluster_env, in_cluster  # noqa: E402

BACKENDS = ("commands", "pyslurm")
SYNTHETIC_BASE = 90_000_000  # above Slurm's highest job id (MaxJobId is at most 67,043,328)
MONTH = (1748736000, 1751328000)  # 2025-06-01 to 2025-07-01 (UTC): no job of the tests is in it
Row = tuple[str, str, str, str, bool]


def run_in(env: dict[str, str], user: str, *command: str,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(in_cluster(user, *command), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def backend_configs(env: dict[str, str]) -> dict[str, str]:
    """A copy of the cluster's config per backend, beside it (every user reads it)."""
    from tests.integration.conftest import with_settings

    config = Path(env["GPUEFF_CONFIG"])
    folder = Path(env["GPUEFF_CLUSTER_DIR"]) / "tests"  # a fresh cluster has none yet:
    folder.mkdir(exist_ok=True)  # made as the integration tests' Cluster makes it
    folder.chmod(0o1777)
    made = {}
    for name in BACKENDS:
        path = folder / f"bench-{name}.toml"
        path.write_text(with_settings(config.read_text(), "slurm", {"backend": name}))
        path.chmod(0o644)
        made[name] = str(path)
    return made


def usable(env: dict[str, str]) -> tuple[bool, str]:
    python = str(Path(env["GPUEFF_VENV"]) / "bin" / "python")
    done = run_in(env, "alice", python, "-c", "from slurm_gpu_eff.slurm.inproc import usable; "
                                              "ok, why = usable(); print(int(ok), why)")
    ok, _, why = done.stdout.strip().partition(" ")
    return ok == "1", why or done.stderr.strip()[-80:]


def gpu_jobs(env: dict[str, str]) -> list[tuple[str, str, str]]:
    """Finished GPU jobs of the cluster, one of each shape: (job id, owner, shape)."""
    listed = run_in(env, "root", "sacct", "-a", "-n", "-P", "-S", "now-7days",
                    "--format=JobID,User,State,AllocTRES,NNodes,NTasks").stdout.splitlines()
    allocations = {line.split("|")[0]: line.split("|") for line in listed if "." not in line.split("|")[0]}
    steps: dict[str, int] = {}
    for line in listed:
        job_id = line.split("|")[0]
        if "." in job_id and job_id.split(".")[1].isdigit():
            steps[job_id.split(".")[0]] = steps.get(job_id.split(".")[0], 0) + 1
    chosen: dict[str, tuple[str, str, str]] = {}
    for job_id, (_, user, state, tres, nodes, _) in reversed(list(allocations.items())):
        if state != "COMPLETED" or "gres/gpu" not in tres or not user:
            continue
        shape = ("array task" if "_" in job_id else "heterogeneous" if "+" in job_id
                 else f"{nodes} nodes" if nodes != "1" else f"{min(steps.get(job_id, 0), 2)} steps")
        chosen.setdefault(shape, (job_id, user, shape))
    return list(chosen.values())


def timed(env: dict[str, str], user: str, commands: list[list[str]], runs: int) -> list[float]:
    """Each command's median wall time (s), run in turns inside the cluster as `user`."""
    python = str(Path(env["GPUEFF_VENV"]) / "bin" / "python")
    done = run_in(env, user, python, str(REPO / "bench" / "timed.py"), str(runs), json.dumps(commands))
    if done.returncode != 0:
        raise RuntimeError(f"bench/timed.py: {done.stderr.strip()[-200:]}")
    return json.loads(done.stdout)


def report_vs_seff(env: dict[str, str], configs: dict[str, str], runs: int = 9) -> list[Row]:
    gpueff = str(Path(env["GPUEFF_VENV"]) / "bin" / "gpueff")
    seff = str(Path(env["GPUEFF_CLUSTER_DIR"]) / "bin" / "seff")
    jobs = gpu_jobs(env)
    if not jobs:
        return [("gpueff JOBID vs seff", "skipped", "no finished GPU job: make demo", "-", True)]
    ratios: dict[str, list[float]] = {name: [] for name in configs}
    walls: dict[str, list[float]] = {name: [] for name in (*configs, "seff")}
    default = default_backend(env)
    for job, user, _ in jobs:
        names = [*configs, "seff"]
        # The default backend with the cluster's own config, as users run it (a file that
        # names a backend leaves the query to Python: bin/gpueff starts none itself)
        commands = [[gpueff, job] if n == default else [gpueff, job, "--config", configs[n]]
                    for n in configs] + [["perl", seff, job]]
        medians = dict(zip(names, timed(env, user, commands, runs), strict=True))
        for name in configs:
            ratios[name].append(medians[name] / medians["seff"])
        for name, wall in medians.items():
            walls[name].append(wall)
    shapes = ", ".join(shape for _, _, shape in jobs)
    rows: list[Row] = []
    for name, found in ratios.items():
        ratio = statistics.median(found)
        said = " (default)" if name == default else ""
        rows.append((f"gpueff JOBID vs seff, {name}{said}",
                     f"{statistics.median(walls[name]) * 1000:.0f} ms",
                     f"{ratio:.2f}x seff ({statistics.median(walls['seff']) * 1000:.0f} ms), "
                     f"median of {len(found)} jobs",
                     # the bar is the default configuration's; the other backend is shown
                     *(("<= 0.9x", ratio <= 0.9) if name == default else ("-", True))))
    rows.append(("  shapes", str(len(jobs)), shapes[:45], "-", True))
    return rows


def default_backend(env: dict[str, str]) -> str:
    python = str(Path(env["GPUEFF_VENV"]) / "bin" / "python")
    code = ("from slurm_gpu_eff.config import load_config\nfrom slurm_gpu_eff.slurm.access import connect\n"
            "print(connect(load_config(), use='report').name)")
    return run_in(env, "alice", python, "-c", code).stdout.strip()


# -- the usage report's sync over a month of 10,000 jobs -------------------------------------

def mysql(env: dict[str, str], sql: str) -> str:
    socket = Path(env["GPUEFF_CLUSTER_DIR"]) / "mysql" / "mysqld.sock"
    command = ["mariadb", "--no-defaults", f"--socket={socket}", "-u", "root", "-N", "-B", "slurm_acct_db"]
    done = subprocess.run([*command, "-e", sql], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mariadb: {done.stderr.strip()[-200:]}")
    return done.stdout


def fill_month(env: dict[str, str], jobs: int) -> str | None:
    """`jobs` copies of the newest finished GPU job (its steps too), 30 days / jobs apart;
    returns the cluster's table prefix (None: no such job to copy)."""
    cluster = mysql(env, "SELECT name FROM cluster_table WHERE deleted = 0 LIMIT 1").strip()
    table, steps = f"{cluster}_job_table", f"{cluster}_step_table"
    proto = mysql(env, f"SELECT job_db_inx FROM {table} WHERE state = 3 AND tres_alloc LIKE '%1001=%' "
                       "AND het_job_id = 0 AND id_array_job = 0 ORDER BY job_db_inx DESC LIMIT 1").strip()
    if not proto:
        return None
    spread = (MONTH[1] - MONTH[0]) // jobs
    inx = mysql(env, f"SELECT MAX(job_db_inx) FROM {table}").strip()
    base_inx = max(int(inx), SYNTHETIC_BASE)
    mysql(env, f"""
CREATE TEMPORARY TABLE many AS SELECT j.*, s.seq AS n FROM {table} j JOIN seq_1_to_{jobs} s
  WHERE j.job_db_inx = {proto};
UPDATE many SET job_db_inx = {base_inx} + n, id_job = {SYNTHETIC_BASE} + n,
  time_submit = {MONTH[0]} + n * {spread}, time_eligible = {MONTH[0]} + n * {spread},
  time_end = {MONTH[0]} + n * {spread} + (time_end - time_start), time_start = {MONTH[0]} + n * {spread};
CREATE TEMPORARY TABLE many_steps AS SELECT st.*, m.n AS n FROM {steps} st JOIN many m
  WHERE st.job_db_inx = {proto};
UPDATE many_steps SET job_db_inx = {base_inx} + n,
  time_end = {MONTH[0]} + n * {spread} + (time_end - time_start), time_start = {MONTH[0]} + n * {spread};
ALTER TABLE many DROP COLUMN n;
ALTER TABLE many_steps DROP COLUMN n;
INSERT INTO {table} SELECT * FROM many;
INSERT INTO {steps} SELECT * FROM many_steps;
""")
    return cluster


def empty_month(env: dict[str, str], cluster: str) -> None:
    mysql(env, f"DELETE st FROM {cluster}_step_table st JOIN {cluster}_job_table j USING (job_db_inx) "
               f"WHERE j.id_job > {SYNTHETIC_BASE}; "
               f"DELETE FROM {cluster}_job_table WHERE id_job > {SYNTHETIC_BASE}")


SYNC = ("import sys, time\nfrom slurm_gpu_eff.config import load_config\n"
        "from slurm_gpu_eff.slurm.access import connect\n"
        "s = connect(load_config(sys.argv[1]))\nstarted = time.perf_counter()\n"
        "jobs = s.period_jobs(float(sys.argv[2]), float(sys.argv[3]))\n"
        "print(time.perf_counter() - started, len(jobs))\n")


def sync_month(env: dict[str, str], configs: dict[str, str], jobs: int = 10_000, runs: int = 3) -> list[Row]:
    python = str(Path(env["GPUEFF_VENV"]) / "bin" / "python")
    cluster = fill_month(env, jobs)
    if cluster is None:
        return [("report sync", "skipped", "no finished GPU job to copy: make demo", "-", True)]
    rows: list[Row] = []
    try:
        took: dict[str, float] = {}
        for name, config in configs.items():
            found = []
            for _ in range(runs):
                done = run_in(env, "root", python, "-c", SYNC, config, str(MONTH[0]), str(MONTH[1]))
                if done.returncode != 0:
                    raise RuntimeError(f"{name}: {done.stderr.strip()[-200:]}")
                seconds, count = done.stdout.split()
                if int(count) != jobs:
                    raise RuntimeError(f"{name}: {count} jobs of the month, not {jobs}")
                found.append(float(seconds))
            took[name] = statistics.median(found)
        for name, seconds in took.items():
            versus = f"{seconds / took['commands']:.2f}x the commands" if name != "commands" else "-"
            rows.append((f"report sync, {jobs:,} jobs, {name}", f"{seconds:.2f} s", versus, "-", True))
    finally:
        empty_month(env, cluster)
    return rows


def rows() -> list[Row]:
    try:
        env = cluster_env()
        up = run_in(env, "root", "scontrol", "ping")
    except (subprocess.SubprocessError, OSError) as exc:
        return [("Slurm paths", "skipped", f"no dev cluster ({type(exc).__name__}): make cluster", "-", True)]
    if up.returncode != 0:
        return [("Slurm paths", "skipped", "no dev cluster: make cluster", "-", True)]
    configs = backend_configs(env)
    ok, why = usable(env)
    if not ok:
        configs.pop("pyslurm")
        note: list[Row] = [("pyslurm", "skipped", why[:45], "-", True)]
    else:
        note = []
    return note + report_vs_seff(env, configs) + sync_month(env, configs)


def main() -> int:
    from bench.run import print_rows

    print_rows(rows())
    return 0


if __name__ == "__main__":
    sys.exit(main())
