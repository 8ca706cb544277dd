"""Simulated GPUs: the in-job workload (workload.py, `gpueff-sim run`) publishes what each
GPU does; the stand-in libnvidia-ml.so.1 (standin/, C against NVIDIA's nvml.h) reads that
and answers the real pynvml as a driver would."""
