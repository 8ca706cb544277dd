"""What Slurm tells a prolog, epilog or job through its environment (standard library only)."""

from __future__ import annotations

from ..errors import BindingError

TYPE_CHECKING = False  # not typing's: importing typing costs the prolog milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..model import NodeSummary

_HEX = set("0123456789abcdefABCDEF-")
MAX_GPUS_PER_NODE = 1024  # a range wider than this is garbage, not a node
# A SLUID (Slurm 26.05's job identifier, e.g. s51SM8AT3HNP00): "s" and 13 characters of
# Crockford's base32, which leaves out I, L, O and U. A set, not a regex: no `re` import.
_CROCKFORD = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def parse_job_gpus(raw: str | None) -> list[int | str]:
    """Parse SLURM_JOB_GPUS: node-level indexes ("0,1", "0-3", "0-1,3") or GPU/MIG UUIDs.

    Returns [] when the job has no GPUs; raises BindingError on anything else, so a
    typo in a site's gres setup is reported, never silently sampled as another GPU.
    """
    text = (raw or "").strip()
    if text in ("", "(null)", "N/A", "none"):
        return []
    found: list[int | str] = []
    for part in text.split(","):
        part = part.strip()
        if _digits(part):
            found.append(int(part))
        elif _is_range(part):
            low, high = (int(x) for x in part.split("-"))
            if high < low or high - low >= MAX_GPUS_PER_NODE:
                raise BindingError(f"SLURM_JOB_GPUS={text!r}: bad range {part!r}")
            found.extend(range(low, high + 1))
        elif part[:4] in ("GPU-", "MIG-") and len(part) > 4 and set(part[4:]) <= _HEX:
            found.append(part)
        else:
            raise BindingError(f"SLURM_JOB_GPUS={text!r}: cannot read {part!r}")
    if len(set(found)) != len(found):
        raise BindingError(f"SLURM_JOB_GPUS={text!r}: a GPU is named twice")
    return found


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²' and Arabic-Indic digits."""
    return text.isascii() and text.isdigit()


def _is_range(part: str) -> bool:
    low, sep, high = part.partition("-")
    return bool(sep) and _digits(low) and _digits(high)


def is_sluid(text: str) -> bool:
    return len(text) == 14 and text[0] == "s" and _CROCKFORD.issuperset(text[1:])


def valid_sluid(raw: str | None) -> str:
    """SLURM_JOB_SLUID as given, or "" when it is absent or malformed: a SLUID only helps
    to recognise the job's processes, so a bad one is ignored, never a reason to stop."""
    text = (raw or "").strip()
    return text if is_sluid(text) else ""


def same_job(key: str | None, job_id: str, sluid: str = "") -> bool:
    """Whether `key`, what job_of_pid() says of a process, names this job: its id (a
    job_N cgroup) or its SLUID (Slurm 26.05's default cgroup name on v2)."""
    return bool(key) and (key == job_id or key == sluid)


class JobContext:
    """The job as the prolog saw it; stored in the spool for the sampler and epilog.

    Plain class (no dataclass): the prolog builds it and must start fast.
    """

    FIELDS = ("job_id", "node", "cluster", "user", "uid", "account", "partition", "job_gpus", "sluid")

    def __init__(
        self, job_id: str, node: str, cluster: str = "", user: str = "", uid: str = "",
        account: str = "", partition: str = "", job_gpus: str = "", sluid: str = "",
    ) -> None:
        self.job_id = job_id
        self.node = node
        self.cluster = cluster
        self.user = user
        self.uid = uid
        self.account = account
        self.partition = partition
        self.job_gpus = job_gpus
        self.sluid = valid_sluid(sluid)  # "" before Slurm 26.05, or when malformed

    def owns(self, key: str | None) -> bool:
        """Whether a process job_of_pid() traced to `key` is this job's."""
        return same_job(key, self.job_id, self.sluid)

    def ids(self) -> tuple[str, ...]:
        """The names this job's cgroup directory may have: job_ID, or its SLUID (26.05)."""
        return (self.job_id, self.sluid) if self.sluid else (self.job_id,)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobContext) and self.to_dict() == other.to_dict()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobContext:
        job_id = env.get("SLURM_JOB_ID", "").strip()
        if not _digits(job_id):
            raise BindingError(f"SLURM_JOB_ID={job_id!r} is not a job id")
        return cls(
            job_id=job_id,
            node=env.get("SLURMD_NODENAME", "") or env.get("HOSTNAME", "") or "unknown",
            cluster=env.get("SLURM_CLUSTER_NAME", ""),
            user=env.get("SLURM_JOB_USER", ""),
            uid=env.get("SLURM_JOB_UID", ""),
            account=env.get("SLURM_JOB_ACCOUNT", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            job_gpus=env.get("SLURM_JOB_GPUS", ""),
            sluid=env.get("SLURM_JOB_SLUID", ""),  # Slurm 26.05+; checked by __init__
        )

    def to_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.FIELDS}

    def summary(self, status: str, reason: str = "", **figures: object) -> NodeSummary:
        """This job's node summary, with what the sampler measured (if anything)."""
        from ..model import NodeSummary  # here: the prolog imports this module, not dataclasses

        return NodeSummary(
            cluster=self.cluster, job_id=self.job_id, node=self.node, status=status,
            reason=reason, user=self.user, account=self.account, partition=self.partition,
            job_gpus=self.job_gpus, **figures,  # type: ignore[arg-type]
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> JobContext:
        return cls(**{k: str(data.get(k, "")) for k in cls.FIELDS})


NO_JOB = ""  # a process that runs outside every Slurm job


def job_of_pid(pid: int, proc: str = "/proc") -> str | None:
    """The Slurm job a process belongs to, from its cgroup path: the job id for a job_N
    directory, the SLUID for a Slurm 26.05 one (compare with JobContext.owns()), NO_JOB
    for a process outside any job, None when it cannot be read (gone, another PID
    namespace)."""
    try:
        # errors="replace": a cgroup name is bytes; one odd name must not raise here
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    return job_in_cgroup(text)


# Slurm's job directory is job_N in every release and layout (v1: .../uid_U/job_N/, v2:
# .../slurmstepd.scope/job_N/). Slurm 26.05 on cgroup v2 names it after the job's SLUID
# unless cgroup.conf sets CgroupJobIdPaths=yes, right under the stepd scope (named
# NODE_slurmstepd.scope with several slurmd on a host). cgroup/v1 never does: in SchedMD/slurm
# src/plugins/cgroup/v1/xcgroup.c, xcgroup_create_hierarchy() names it "%s/job_%u" (the
# numeric id) under "%s/uid_%u"; 26.05's build (Debian's cgroup_v1.so, 26.05.5) holds no
# other job path, and its cgroup.conf(5) says CgroupJobIdPaths "Only applies to cgroup/v2".
def job_in_cgroup(text: str) -> str:
    """The job named in a /proc/PID/cgroup text (all of it: v1 has a line per controller).
    A SLUID-shaped name counts only right under a stepd scope, where Slurm puts it."""
    parent = ""
    for part in text.replace(":", "/").replace("\n", "/").split("/"):
        if part.startswith("job_") and _digits(part[4:]):
            return part[4:]
        if parent.endswith("slurmstepd.scope") and is_sluid(part):
            return part
        parent = part
    return NO_JOB


# The job's cgroup directory ({name}: job_N, or the SLUID) in each layout Slurm makes.
CGROUP_PATTERNS_V1 = (
    "{root}/*/slurm_{node}/uid_*/{name}",  # several slurmd on one host
    "{root}/*/slurm/uid_*/{name}",
)
CGROUP_PATTERNS_V2 = (  # src/plugins/cgroup/v2/cgroup_v2.c, _set_int_cg_ns()
    "{root}/system.slice/slurmstepd.scope/{name}",
    "{root}/system.slice/{node}_slurmstepd.scope/{name}",  # several slurmd on one host
)


def job_cgroup_exists(job: str, node: str, root: str = "/sys/fs/cgroup") -> bool:
    """Whether Slurm's cgroup of the job exists on this node (it goes when the job ends).
    `job` is the job id (a job_N directory, v1 or v2) or its SLUID (Slurm 26.05 on v2
    only: v1 never names a directory after it); ask with each of JobContext.ids()."""
    import glob  # here, not at the top: the prolog imports this module and never needs it

    patterns: tuple[str, ...]
    if _digits(job):
        name, patterns = f"job_{job}", CGROUP_PATTERNS_V1 + CGROUP_PATTERNS_V2
    elif is_sluid(job):
        name, patterns = job, CGROUP_PATTERNS_V2
    else:
        return False
    node = glob.escape(node)
    return any(glob.glob(pattern.format(root=root, node=node, name=name)) for pattern in patterns)
