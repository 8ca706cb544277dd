"""slurm-gpu-eff: what each Slurm job really did with the GPUs it was given.

Modules, arrows pointing one way (nothing imports the CLI):
  cli -> render, report, slurm, store, deliver
  hooks -> sampler (as a process), spool, jobenv, log
  sampler -> gpu, stats, spool, jobenv
  gpu -> pynvml | sim.nvml (the only NVML seam)
  everything -> model, config
"""

__version__ = "0.1.0"
