"""A binding that checks itself: are the GPUs the sampler reads the job's own?

Every comparable tool has shipped a wrong-GPU bug (an index taken for a minor, Slurm's
order against NVIDIA's, a UUID list in CUDA_VISIBLE_DEVICES). So the binding is never
simply trusted; it is cross-checked against the job itself:
- the job's processes, as NVML lists them on every GPU of the node (pid -> job through
  /proc/PID/cgroup): one of the job's processes on a GPU it was not bound to is a
  mismatch; one on a bound GPU is evidence for the binding;
- the job cgroup's device list, where cgroup v1 shows one (a whitelist of `c 195:N`
  entries): a bound GPU it does not allow, or an allowed GPU not bound, is a mismatch.
  Slurm usually denies devices from an allow-all list, which the kernel shows as
  `a *:* rwm`: that says nothing, and is not taken as evidence either way.
Status: `mismatch` if anything disagrees, else `verified` if anything agrees, else
`unverified`. Standard library only: the sampler runs it.

An unverified binding also says whether the job used any GPU at all (`gpu_use`): while
nothing settles the binding, every poll lists the processes of every GPU of the node.
`none` means each such look was whole (every GPU listed, every process's job read) and
no process of the job was on any GPU: the job's GPUs were idle whichever GPUs they are,
which a wrong binding cannot make untrue (a process that lives wholly between two polls
is not seen). Anything less is `unknown`.
"""

from __future__ import annotations

import glob
from collections.abc import Callable

from .jobenv import same_job

VERIFIED, UNVERIFIED, MISMATCH = "verified", "unverified", "mismatch"
GPU_USE_NONE, GPU_USE_UNKNOWN = "none", "unknown"  # an unverified binding's `gpu_use`
NVIDIA_MAJOR = 195
NOT_GPUS = (254, 255)  # nvidia-modeset and nvidiactl share the major; every job may have them
MAX_EVIDENCE = 10
# cgroup v1 only, so job_N only: v1 never names a job's directory after its SLUID (see
# jobenv.job_in_cgroup). v2 has no device list (Slurm confines devices with eBPF there).
DEVICES_LISTS = (
    "{root}/devices/slurm_{node}/uid_*/job_{job}/devices.list",  # several slurmd on one host
    "{root}/devices/slurm/uid_*/job_{job}/devices.list",
)


class BindingCheck:
    """Evidence for and against one node's binding, gathered while the job runs."""

    def __init__(self, job_id: str, node: str, bound_minors: list[int], cgroup_root: str = "/sys/fs/cgroup",
                 sluid: str = ""):
        self.job_id = job_id
        self.sluid = sluid  # Slurm 26.05: what job_of_pid() says of the job's processes on v2
        self.node = node
        self.bound_minors = sorted(set(bound_minors))  # whole GPUs (MIG slices: processes only)
        self.cgroup_root = cgroup_root
        self.agree: list[str] = []
        self.disagree: list[str] = []
        self.notes: list[str] = []  # context for the evidence, neither for nor against
        self.cgroup_read = False
        self.scans = 0  # whole looks at every GPU of the node that found none of the job's
        self.scan_gap = ""  # why a look was not whole: no `gpu_use: none` from then on
        self._seen_on: set[int] = set()
        self._last_pids: dict[int, list[int]] = {}
        self._last_listed: dict[int, list[tuple[int, int]]] = {}  # (pid, memory), as given

    def processes(self, minor: int, jobs_of_pids: dict[int, str | None], bound: bool) -> None:
        """The processes NVML lists on GPU `minor`, each with the job it belongs to."""
        for pid, job in sorted(jobs_of_pids.items()):
            if not same_job(job, self.job_id, self.sluid):
                continue
            if not bound:
                self._note(self.disagree, f"process {pid} of job {self.job_id} runs on GPU minor "
                                          f"{minor}, which this sampler was not bound to")
            elif minor not in self._seen_on:
                self._seen_on.add(minor)
                self._note(self.agree, f"process {pid} of job {self.job_id} runs on bound GPU minor {minor}")

    def settled(self) -> bool:
        """Evidence either way: the node's GPUs need no look every poll any more."""
        return bool(self.agree or self.disagree)

    def scanning(self) -> bool:
        """Whether a look at every GPU of the node can still tell anything: not once the
        binding is settled, nor once a look was partial (the caller then lists nothing)."""
        return not (self.scan_gap or self.agree or self.disagree)

    def node_scan(
        self, listing: list[tuple[int, list[int]]] | None, job_of: Callable[[int], str | None],
    ) -> None:
        """One look at every GPU of the node (None: not every GPU could be listed)."""
        if not self.scanning():
            return
        if listing is None:
            self.scan_gap = "not every GPU of the node could be listed"
            return
        for minor, pids in listing:
            owners = {pid: job_of(pid) for pid in pids}
            unread = [pid for pid, job in owners.items() if job is None]
            if unread:  # gone, or another PID namespace: it may have been the job's
                self.scan_gap = f"whose process {unread[0]} on GPU minor {minor} was could not be read"
                return
            # In no job's cgroup: it may still be the job's (a container the docker daemon
            # started, an ssh session without pam_slurm_adopt, a site without cgroup proctrack)
            outside = [pid for pid, job in owners.items() if not job]
            if outside:
                self.scan_gap = f"process {outside[0]} on GPU minor {minor} is in no job's cgroup"
                return
            self.processes(minor, owners, bound=minor in self.bound_minors)
        if not self.settled():
            self.scans += 1

    def wants(self, minor: int, pids: list[tuple[int, int]]) -> bool:
        """Whether a bound GPU's processes (pid, memory) tell anything new: not once one of
        the job's was seen there, nor when the pids are those looked at last time (this runs
        every poll)."""
        if minor in self._seen_on:
            return False
        if self._last_listed.get(minor) == pids:  # the same (pid, memory) list: the same pids
            return False
        self._last_listed[minor] = pids
        seen = [pid for pid, _ in pids]
        if self._last_pids.get(minor) == seen:
            return False
        self._last_pids[minor] = seen
        return True

    def cgroup(self) -> bool:
        """Read the job cgroup's device list once it exists; True once read (or when this
        host cannot have one), so the caller stops asking."""
        if self.cgroup_read:
            return True
        paths = [p for pattern in DEVICES_LISTS for p in glob.glob(pattern.format(
            root=self.cgroup_root, node=glob.escape(self.node), job=self.job_id))]
        if not paths:
            return False
        try:
            with open(paths[0], encoding="ascii", errors="replace") as handle:
                allowed = allowed_gpu_minors(handle.read())
        except OSError:
            return False
        self.cgroup_read = True
        if allowed is None or not self.bound_minors:
            return True  # allow-all with hidden exceptions, or MIG: says nothing
        if allowed == self.bound_minors:
            self._note(self.agree, f"the job's cgroup allows exactly GPU minors {allowed}")
        else:
            self._note(self.disagree, f"the job's cgroup allows GPU minors {allowed}, "
                                      f"the sampler was bound to {self.bound_minors}")
        return True

    def note(self, text: str) -> None:
        """Something the report should see beside the evidence; changes no status."""
        self._note(self.notes, text)

    def result(self) -> dict[str, object]:
        if self.disagree:
            return {"status": MISMATCH, "evidence": self.disagree + self.agree + self.notes}
        if self.agree:
            return {"status": VERIFIED, "evidence": self.agree + self.notes}
        unused = self.scans > 0 and not self.scan_gap
        evidence = ["no process of the job was seen on a GPU yet, and the job's cgroup does not "
                    "list its devices"]
        if unused:
            evidence.append(f"no process of the job on any GPU of the node in {self.scans} looks "
                            "at all of them")
        elif self.scan_gap:
            evidence.append(f"whether the job used any GPU is unknown: {self.scan_gap}")
        return {"status": UNVERIFIED, "gpu_use": GPU_USE_NONE if unused else GPU_USE_UNKNOWN,
                "evidence": evidence + self.notes}

    def _note(self, where: list[str], text: str) -> None:
        if text not in where and len(where) < MAX_EVIDENCE:
            where.append(text)


def allowed_gpu_minors(devices_list: str) -> list[int] | None:
    """The NVIDIA GPU minors a cgroup v1 device whitelist allows; None when the list
    allows everything (`a *:* ...`) and so names nothing."""
    minors = set()
    for line in devices_list.splitlines():
        kind, _, rest = line.strip().partition(" ")
        number = rest.partition(" ")[0]
        if kind == "a":
            return None
        major, _, minor = number.partition(":")
        if kind == "c" and major == str(NVIDIA_MAJOR):
            if minor == "*":
                return None  # every NVIDIA device: names no GPU in particular
            if minor.isdigit() and int(minor) not in NOT_GPUS:
                minors.add(int(minor))
    return sorted(minors)
