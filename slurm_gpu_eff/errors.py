"""The package's errors (standard library only, cheap to import: the prolog needs them).

Each has its own exit status, so scripts can tell "no such job" from "no GPUs".
"""


class GpuEffError(Exception):
    """Base of every error this package raises on purpose; the CLI prints its message."""

    exit_code = 1


class ConfigError(GpuEffError):
    exit_code = 9


class UsageError(GpuEffError):
    exit_code = 2


class JobNotFound(GpuEffError):
    exit_code = 3


class NoGpus(GpuEffError):
    exit_code = 4


class NoSummary(GpuEffError):
    exit_code = 5


class NotPermitted(GpuEffError):
    """Slurm does not let the caller see this job (PrivateData=jobs)."""

    exit_code = 10


class SlurmError(GpuEffError):
    exit_code = 6


class StoreError(GpuEffError):
    exit_code = 7


class StoreRejected(StoreError):
    """The store will never take this summary, however often it is offered (a constraint
    it breaks, a value it cannot hold): set it aside, deliver the others."""


class SpoolError(GpuEffError):
    exit_code = 8


class GpuAccessError(GpuEffError):
    """NVML could not be used at all (no library, no driver, bad backend)."""


class GpuLost(GpuAccessError):
    """A GPU fell off the bus mid-job (NVML_ERROR_GPU_IS_LOST)."""


class BindingError(GpuEffError):
    """SLURM_JOB_GPUS names GPUs that cannot be resolved on this node."""
