"""The in-job workload plays on its own node's GPUs: in an srun step on a job's second node
SLURM_JOB_GPUS is the batch node's (inherited), SLURM_STEP_GPUS this node's."""

from __future__ import annotations

from slurm_gpu_eff.sim.workload import job_minors


def test_a_step_on_another_node_plays_on_that_node_s_gpus() -> None:
    assert job_minors({"SLURM_JOB_GPUS": "1", "SLURM_STEP_GPUS": "2"}) == [2]
    assert job_minors({"SLURM_JOB_GPUS": "1"}) == [1]  # the batch script itself
