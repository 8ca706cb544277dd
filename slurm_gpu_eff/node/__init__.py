"""What runs on a compute node, as root, in every job: the hooks, the sampler and GPU access.

Standard library and pynvml only (tests/unit/test_layering.py holds that line).
"""
