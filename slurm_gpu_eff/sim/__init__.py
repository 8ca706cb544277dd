"""Simulated GPUs: a pynvml-compatible NVML (nvml.py) driven by in-job workloads (workload.py)."""
