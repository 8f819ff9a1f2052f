"""Test-wide set-up: 8 forced host devices so multi-device code is tested on one CPU.

`--xla_backend_optimization_level=0` skips LLVM's optimisation of the generated CPU code: it
halves compile time, which dominates these tests, and changes results only within test tolerances.
"""

import os

import pytest
from beartype import beartype
from jaxtyping import jaxtyped

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Task fixtures carry their own verifier tests (tests/fixtures/**/tests/test_*.py); they run inside
# sandboxes as the tasks' verifiers, never as part of this suite.
collect_ignore_glob = ["fixtures/*"]


@pytest.fixture
def typechecked():
    """``fn -> fn`` checked at run time against its jaxtyping annotations: dtypes, and shapes
    consistent across the arguments of one call (``jaxtyped`` with beartype)."""
    return lambda fn: jaxtyped(typechecker=beartype)(fn)
