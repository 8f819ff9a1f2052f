"""What a report records of the machine it ran on (runs compare only within one machine kind)."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform

import jax


# Instruction-set features that change XLA's CPU code (and so, through float rounding, a run's
# numbers: the same seed trains a different Base on another kind of machine).
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def machine_info() -> dict:
    """What a report records of the machine it ran on: CPU model, cores, the ISA features XLA's CPU
    code depends on, the JAX backend and versions (runs compare only within one machine kind)."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "isa": [f for f in _ISA_FLAGS if f in flags],
            "backend": jax.default_backend(), "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib")}
