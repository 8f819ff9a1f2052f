"""Ahead-of-time compilation (tr/train/aot.py): topology names, the config interface, per-chip memory
that follows the sharding, and a real compile for a TPU topology through libtpu on this CPU host."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tr.train import aot

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import pod_scale  # noqa: E402  pylint: disable=wrong-import-position


def needs_libtpu():
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("LIBTPU IS NOT INSTALLED: no TPU ahead-of-time compile checked "
                    "(`TR_AOT=1 bash launch/setup.sh` installs requirements-aot.txt)")


def test_topologies_follow_cloud_accelerator_types():
    v5p = aot.parse_topology("v5p-128")
    assert (v5p.shape, v5p.chips, v5p.hbm_bytes) == ((4, 4, 4), 64, 95 * aot.GiB)  # v5p counts cores
    assert aot.parse_topology("v5p-256").shape == (4, 4, 8)
    assert aot.parse_topology("v5e-64").shape == aot.parse_topology("v5litepod-64").shape == (8, 8)
    assert aot.parse_topology("v4-8").shape == (2, 2, 1)
    assert aot.parse_topology("v5p:4x4x4").chips == 64 and aot.parse_topology("v5e:2x2").libtpu_name == "v5e:2x2"
    with pytest.raises(aot.AotError, match="no v5p slice of that size.*v5p-128"):
        aot.parse_topology("v5p-100")
    with pytest.raises(aot.AotError, match="not understood"):
        aot.parse_topology("tpu-big")
    with pytest.raises(aot.AotError, match="v5e slices have 2 axes"):
        aot.parse_topology("v5e:2x2x2")


def test_config_fields_are_checked_by_name():
    config = pod_scale.get_config("small")
    plan = aot.planned_steps(config)
    assert set(plan) == {"sampler_prefill", "sampler_decode", "sft", "critic", "ppo", "grpo"}
    config.shapes.ppo.micro_batches = 3
    with pytest.raises(aot.AotError, match="shapes.ppo: rows=8 is not a multiple of micro_batches=3"):
        aot.planned_steps(config)
    config = pod_scale.get_config("small")
    del config.shapes.sampler["new_tokens"]
    with pytest.raises(aot.AotError, match="config.shapes.sampler lacks 'new_tokens'"):
        aot.planned_steps(config)
    config = pod_scale.get_config("small")
    del config["shapes"]
    with pytest.raises(aot.AotError, match="no 'shapes' field"):
        aot.planned_steps(config)


def _only(config, **shapes):
    config.shapes = shapes
    return config


def test_per_chip_arguments_shrink_with_fsdp_on_host_devices():
    """The same sft step on 8 CPU devices: parameters and optimizer state replicated (data = 8)
    against sharded (fsdp = 8); XLA's per-device argument bytes follow the rules table."""
    shape = {"rows": 8, "length": 64, "micro_batches": 1}
    replicated = _only(pod_scale.get_config("small"), sft=shape)
    replicated.pod.mesh.data, replicated.pod.mesh.fsdp = 8, 1
    sharded = _only(pod_scale.get_config("small"), sft=shape)
    a = aot.compile_report(replicated, "cpu")["steps"]["sft"]
    b = aot.compile_report(sharded, "cpu")["steps"]["sft"]
    assert a["fits"] and b["fits"]
    assert 4 < a["argument_bytes"] / b["argument_bytes"] < 8.5   # small replicated leaves (norms) aside
    alias = b["argument_bytes"] + b["output_bytes"] + b["temp_bytes"] - b["total_bytes"]
    assert 0 < alias <= b["argument_bytes"]   # the donated state is updated in place


def test_cli_compiles_every_step_of_a_small_config_for_a_tpu_topology():
    needs_libtpu()
    result = subprocess.run([sys.executable, "-m", "tr.train.aot", "--config=experiments/pod_scale.py:small",
                             "--topology=v5e:2x2", "--json"], cwd=ROOT, capture_output=True, text=True,
                            timeout=1800, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report) == {"topology", "chips", "hbm_bytes", "steps", "fits", "shapes", "model"}
    assert report["shapes"] == pod_scale.get_config("small").shapes.to_dict()
    assert (report["topology"], report["chips"], report["hbm_bytes"]) == ("v5e:2x2", 4, 16 * aot.GiB)
    assert set(report["steps"]) == {"sampler_prefill", "sampler_decode", "sft", "critic", "ppo", "grpo"}
    for name, step in report["steps"].items():
        assert set(step) == {"argument_bytes", "output_bytes", "temp_bytes", "total_bytes", "fits"}, name
        assert step["argument_bytes"] > 0 and step["fits"] is True, name
    assert report["fits"] is True
    # PPO holds both models and both optimizer states: at least what the critic-only step holds.
    assert report["steps"]["ppo"]["argument_bytes"] >= report["steps"]["critic"]["argument_bytes"]


def test_a_step_too_big_for_the_chip_is_reported_not_raised():
    """A tiny model, but 4 rows of 32k tokens with all queries at once on 4 v5e chips: XLA refuses
    to compile it (its temporaries exceed HBM) and the report says so with XLA's figure."""
    needs_libtpu()
    config = _only(pod_scale.get_config("small"), sft={"rows": 4, "length": 32768, "micro_batches": 1})
    step = aot.compile_report(config, "v5e:2x2")["steps"]["sft"]
    assert step["fits"] is False and step["temp_bytes"] > 16 * aot.GiB
    assert step["total_bytes"] >= step["temp_bytes"]
