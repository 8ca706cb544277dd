"""slurm-gpu-eff: what each Slurm job really did with the GPUs it was given.

Grouped by where the code runs, arrows pointing down only (nothing imports the CLI):
  cli                        the face: parse, call one function, render
  report/  job, hints, shapes, render (jinja2 templates)
  store/   sqlite, deliver (node spool -> store)
  node/    hooks -> sampler (as a process) -> gpu (the only pynvml seam), binding,
           verify, jobenv, spool, stats, log: standard library and pynvml only
  ground   config, errors, model, slurm (sacct), hostlist
  sim/     the in-job workload and the stand-in libnvidia-ml.so.1 (C): never imported
           by the package, which runs over it through the real pynvml
"""

__version__ = "0.1.0"
