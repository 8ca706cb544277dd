"""What Slurm tells a prolog, epilog or job through its environment (standard library only)."""

from __future__ import annotations

from ..errors import BindingError

TYPE_CHECKING = False  # not typing's: importing typing costs the prolog milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..model import NodeSummary

_HEX = set("0123456789abcdefABCDEF-")
MAX_GPUS_PER_NODE = 1024  # a range wider than this is garbage, not a node


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


class JobContext:
    """The job as the prolog saw it; stored in the spool for the sampler and epilog.

    Plain class (no dataclass): the prolog builds it and must start fast.
    """

    FIELDS = ("job_id", "node", "cluster", "user", "uid", "account", "partition", "job_gpus")

    def __init__(
        self, job_id: str, node: str, cluster: str = "", user: str = "", uid: str = "",
        account: str = "", partition: str = "", job_gpus: str = "",
    ) -> None:
        self.job_id = job_id
        self.node = node
        self.cluster = cluster
        self.user = user
        self.uid = uid
        self.account = account
        self.partition = partition
        self.job_gpus = job_gpus

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
    """The Slurm job a process belongs to, from its cgroup path (Slurm's cgroup plugins
    put every job's processes under .../job_N/...): a job id, NO_JOB for a process
    outside any job, None when it cannot be read (gone, or another PID namespace)."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    for part in text.replace(":", "/").replace("\n", "/").split("/"):
        if part.startswith("job_") and _digits(part[4:]):
            return part[4:]
    return NO_JOB


CGROUP_PATTERNS = (
    "{root}/*/slurm_{node}/uid_*/job_{job}",  # cgroup v1, several slurmd on one host
    "{root}/*/slurm/uid_*/job_{job}",  # cgroup v1
    "{root}/system.slice/slurmstepd.scope/job_{job}",  # cgroup v2
)


def job_cgroup_exists(job_id: str, node: str, root: str = "/sys/fs/cgroup") -> bool:
    """Whether Slurm's cgroup of the job exists on this node (it goes when the job ends)."""
    import glob  # here, not at the top: the prolog imports this module and never needs it

    return any(
        glob.glob(pattern.format(root=root, node=glob.escape(node), job=job_id))
        for pattern in CGROUP_PATTERNS
    )
