"""The locally built images: the base image from host packages, task images from Dockerfiles."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tr.envs.images import base as images
from tr.envs.sandbox import SandboxConfig, make_sandbox

from test_sandbox import docker_problem  # noqa: F401 - shared fixture


def test_package_closure_is_installed_and_closed_under_depends():
    closure = dict(images.package_closure())
    for must in ("bash", "coreutils", "python3.11", "libc6"):
        assert must in closure
    # independent check: every Depends alternative of every member has one member in the set
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Depends}\n", *closure],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        pkg, _, deps = line.partition("\t")
        for clause in filter(None, (c.strip() for c in deps.split(","))):
            names = [alt.strip().split()[0].split(":")[0] for alt in clause.split("|")]
            installed = [n for n in names if subprocess.run(
                ["dpkg-query", "-W", n], capture_output=True).returncode == 0]
            if installed:
                assert any(n in closure for n in names), f"{pkg}: {clause} missing"
    assert images.base_image_tag(list(closure.items())) == images.base_image_tag()


def test_task_image_from_a_dockerfile_whose_base_cannot_be_pulled(docker_problem, tmp_path):
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    (tmp_path / "hello.txt").write_text("from context\n")
    (tmp_path / "Dockerfile").write_text(textwrap.dedent("""\
        FROM ubuntu:22.04
        WORKDIR /app
        COPY hello.txt /app/hello.txt
        RUN echo built > /app/built && mkdir -p /opt/tool && echo t > /opt/tool/t
        ENV TASK_VAR=1
        """))
    tag = images.build_task_image(tmp_path / "Dockerfile", tmp_path)
    assert tag.startswith("tr-task:")
    assert images.build_task_image(tmp_path / "Dockerfile", tmp_path) == tag   # cached
    with make_sandbox("docker", SandboxConfig(image=tag, disk_mb=64)) as box:
        r = box.run("cat /app/hello.txt /app/built /opt/tool/t; echo $TASK_VAR; python3 -V")
        assert r.output.startswith("from context\nbuilt\nt\n1\nPython 3.11"), r.output


def test_missing_dockerfile_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="Dockerfile"):
        images.build_task_image(tmp_path / "Dockerfile", tmp_path)
