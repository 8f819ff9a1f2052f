"""The Debian stand-in base image (tr.envs.images.debian) and task builds on it, with a real
Docker engine: apt and pip at build time, `python`, the agent's runtime offline, Ubuntu names
mapped, a missing package named, and a t-bench task end to end with the stand-in recorded.

The stand-in is bootstrapped from deb.debian.org once per machine (about a minute; cached by its
recipe hash); each build here also reaches the Debian registry and PyPI."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tr.envs.images import base as images
from tr.envs.images import debian
from tr.envs.backends import make_sandbox
from tr.envs.sandbox import SandboxConfig
from tr.envs.tasks import load_task, runner

from test_sandbox import docker_problem  # noqa: F401 - shared fixture

TASKS = Path(__file__).parent / "fixtures" / "tasks"


@pytest.fixture(scope="module")
def standin(docker_problem):
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    client = images.docker_client()
    try:
        return debian.ensure_standin_image(client)
    finally:
        client.close()


def test_standin_is_a_debian_with_apt_python_pip_venv(standin):
    assert standin == debian.standin_tag() and standin.startswith("tr-debian:")
    with make_sandbox("docker", SandboxConfig(image=standin, disk_mb=128, workdir="/app")) as box:
        r = box.run("set -e; . /etc/os-release; echo $VERSION_CODENAME; command -v apt-get dpkg; "
                    "python --version; python3 -m pip --version | cut -d' ' -f1; "
                    "python3 -m venv /tmp/v && /tmp/v/bin/python -c 'print(1)'; "
                    # apt's own user writes /tmp (apt-get update at run time): the area keeps 1777
                    "stat -c %a /tmp; su -s /bin/sh _apt -c 'touch /tmp/apt-probe' && echo apt-ok; "
                    # a font with the chess glyphs, where PIL finds it by name (chess-best-move)
                    "find /usr/share/fonts -name DejaVuSans.ttf",
                    timeout_s=300)   # venv + ensurepip: 107 s at load 30
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[:3] == [debian.SUITE, "/usr/bin/apt-get", "/usr/bin/dpkg"]
    assert lines[3].startswith("Python 3.") and lines[4:] == [
        "pip", "1", "1777", "apt-ok", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"], lines


def test_dockerfile_apt_and_pip_run_at_build_time_and_the_runtime_is_offline(standin, tmp_path):
    (tmp_path / "Dockerfile").write_text(textwrap.dedent("""\
        FROM ubuntu:24.04
        WORKDIR /app
        RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tree \\
            && rm -rf /var/lib/apt/lists/*
        RUN pip install --no-cache-dir six==1.16.0
        """))
    notes: list[str] = []
    tag = images.build_task_image(tmp_path / "Dockerfile", tmp_path, notes=notes)
    assert len(notes) == 1 and notes[0].startswith("FROM ubuntu:24.04: not on this machine")
    assert standin in notes[0]
    with make_sandbox("docker", SandboxConfig(image=tag, disk_mb=64)) as box:
        r = box.run("tree --version | cut -c1-4; python -c 'import six; print(six.__version__)'; "
                    "pwd; python3 -c \"import urllib.request as u; u.urlopen('http://deb.debian.org',"
                    " timeout=5)\" 2>/dev/null && echo online || echo offline", timeout_s=60)
    assert r.output.splitlines() == ["tree", "1.16.0", "/app", "offline"], r.output


def test_ubuntu_names_are_mapped_and_unknown_packages_named(standin, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y libtinfo5 tr-no-such-pkg\n")
    text, replaced = images._rewrite(images.docker_client(), tmp_path / "Dockerfile",
                                     lambda m: None, [])
    assert replaced == ["ubuntu:24.04"] and "apt-get install -y libtinfo6 tr-no-such-pkg" in text
    assert "ENV PIP_BREAK_SYSTEM_PACKAGES=1" in text   # apt may bring EXTERNALLY-MANAGED back
    with pytest.raises(RuntimeError) as info:
        images.build_task_image(tmp_path / "Dockerfile", tmp_path)
    message = str(info.value)
    assert "apt package(s) tr-no-such-pkg do not exist in Debian bookworm, the stand-in for " \
           "ubuntu:24.04" in message and "docker pull ubuntu:24.04" in message, message


def test_ubuntu_ppas_are_skipped_with_a_note(standin, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        "FROM ubuntu:22.04\nRUN add-apt-repository -y ppa:deadsnakes/ppa && apt-get update -qq "
        "&& apt-get install -y -qq python3.11-venv >/dev/null && echo ppa-free > /ppa.txt\n")
    notes: list[str] = []
    tag = images.build_task_image(tmp_path / "Dockerfile", tmp_path, notes=notes)
    try:
        assert any("ppa:deadsnakes/ppa` (an Ubuntu PPA) is skipped" in n for n in notes), notes
        with make_sandbox("docker", SandboxConfig(image=tag, disk_mb=64)) as box:
            assert box.read_file("/ppa.txt") == b"ppa-free\n"
    finally:
        from tr.envs.docker_sandbox import remove_image
        remove_image(tag)


def test_tbench_task_on_the_standin_passes_and_records_it(standin):
    task = load_task(TASKS / "tb1-py-inventory")
    solved, turns = runner.run_task(task, "solution", "docker")
    assert solved.strict_pass and [t.exit_code for t in turns] == [0, 0, 0], solved.log[-2000:]
    assert any("built on the local stand-in" in n for n in solved.notes), solved.notes
    nothing, _ = runner.run_task(task, "none", "docker")
    assert nothing.error is None and not nothing.strict_pass and nothing.matched == 0


def test_steps_aimed_at_the_real_images_python_are_flagged(standin, tmp_path):
    (tmp_path / "Dockerfile").write_text(
        "FROM python:3.13-slim\nRUN rm -rf /usr/local/lib/python3.13/site-packages/pip\n")
    notes: list[str] = []
    images._rewrite(images.docker_client(), tmp_path / "Dockerfile", lambda m: None, notes)
    assert notes[0].startswith("FROM python:3.13-slim: not on this machine")
    assert notes[1] == ("Dockerfile: `/usr/local/lib/python3.13` belongs to the real base image; "
                        "the stand-in's Python is 3.11 under /usr, so this step may not do what "
                        "the task expects (other Python)")
