"""gpupool: pool private NVIDIA GPUs into isolated slices leased by VRAM MiB x compute.

The public, dependency-free API lives in :mod:`gpupool.core` (allocator, leases, outcomes) and
:mod:`gpupool.hardware` (slices, inventory, GPU facts). Everything under :mod:`gpupool.adapters`
imports its third-party library lazily.
"""

__version__ = "0.1.0"
