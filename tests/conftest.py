"""Test-wide set-up: 8 forced host devices so multi-device code is tested on one CPU."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
