"""The locally built images: the base image from host packages, task images from Dockerfiles."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from tr.envs.images import base as images
from tr.envs.backends import make_sandbox
from tr.envs.sandbox import SandboxConfig

from test_sandbox import docker_problem  # noqa: F401 - shared fixture


def test_package_closure_is_installed_and_closed_under_depends():
    closure = dict(images.package_closure())
    for must in ("bash", "coreutils", "python3.11", "libc6"):
        assert must in closure
    # independent check: every Depends alternative of every member that the host satisfies (an
    # installed package of that name, or one that Provides it) has a satisfying member in the set
    table = subprocess.run(["dpkg-query", "-W", "-f",
                            "${Package}\t${db:Status-Abbrev}\t${Provides}\t${Depends}\n"],
                           capture_output=True, text=True, check=True).stdout
    satisfies: dict[str, set] = {}
    depends = {}
    for line in table.splitlines():
        pkg, status, provides, deps = line.split("\t")
        if status.startswith("ii"):
            satisfies.setdefault(pkg, set()).add(pkg)
            for v in filter(None, (x.strip().split()[0] for x in provides.split(",") if x.strip())):
                satisfies.setdefault(v, set()).add(pkg)
            depends[pkg] = deps
    for pkg in closure:
        for clause in filter(None, (c.strip() for c in depends[pkg].split(","))):
            names = [alt.strip().split()[0].split(":")[0] for alt in clause.split("|")]
            options = set().union(*(satisfies.get(n, set()) for n in names))
            if options:
                assert options & set(closure), f"{pkg}: {clause} missing"
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
    real = tmp_path / "real"                    # a task folder reached through a symlink: its
    real.mkdir()                                # whole content is the build context
    (real / "hello.txt").write_text("through a link\n")
    (real / "Dockerfile").write_text("FROM ubuntu:22.04\nCOPY hello.txt /app/hello.txt\n")
    linked = tmp_path / "linked"
    linked.symlink_to(real, target_is_directory=True)
    via_link = images.build_task_image(linked / "Dockerfile", linked)
    try:
        with make_sandbox("docker", SandboxConfig(image=via_link, disk_mb=64)) as box:
            assert box.read_file("/app/hello.txt") == b"through a link\n"
    finally:
        from tr.envs.docker_sandbox import remove_image
        remove_image(via_link)
    with make_sandbox("docker", SandboxConfig(image=tag, disk_mb=64)) as box:
        r = box.run("cat /app/hello.txt /app/built /opt/tool/t; echo $TASK_VAR; python3 -V")
        assert r.output.startswith("from context\nbuilt\nt\n1\nPython 3.11"), r.output


def test_missing_dockerfile_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="Dockerfile"):
        images.build_task_image(tmp_path / "Dockerfile", tmp_path)


def test_base_image_has_what_the_suite_uses(docker_problem):
    """The built-in suite's tools work in the base image (tr/envs/suite/README.md): a C program
    compiled, archived into a static library and linked with make; a git commit; a venv; patch,
    flock, setsid, ps, file."""
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    script = textwrap.dedent("""\
        set -e
        for t in %s; do command -v "$t" >/dev/null || { echo "missing $t"; exit 1; }; done
        cd /tmp && echo 'int twice(int x) { return 2 * x; }' > lib.c
        cat > m.c <<'C'
        #include <stdio.h>
        int twice(int);
        int main(void) { printf("%%d\\n", twice(21)); return 0; }
        C
        printf 'm: m.o libt.a\\n\\tcc -o m m.o -L. -lt\\nlibt.a: lib.o\\n\\tar rcs $@ $^\\n' > Makefile
        make -s && ./m
        git init -q r && cd r && git config user.email a@b && git config user.name a
        echo x > f && git add f && git commit -qm one && git log --format=%%s
        cd /tmp && python3 -m venv --without-pip v && v/bin/python -c 'import sys; print(sys.prefix)'
        echo a > p && echo b > q && ! diff -u p q > d && patch -s p d && cat p
        flock /tmp/lk true && setsid true && ps -o comm= -p $$ && file -b /tmp/m | cut -d, -f1
        """) % " ".join(images.SUITE_TOOLS)
    with make_sandbox("docker", SandboxConfig(disk_mb=128)) as box:
        r = box.run(script, timeout_s=120)
    assert r.exit_code == 0, r.output
    assert r.output.split("\n")[:6] == ["42", "one", "/tmp/v", "b", "bash",
                                         "ELF 64-bit LSB pie executable"], r.output


def test_build_errors_name_the_hosts_that_could_not_be_reached():
    lines = ["Step 3/5 : RUN pip install torch==2.7.0 --index-url https://download.pytorch.org/whl/cpu",
             "WARNING: Retrying after connection broken by 'NewConnectionError(Failed to establish "
             "a new connection: [Errno -2] Name or service not known)': /whl/cpu/torch/",
             "Get:1 http://deb.debian.org/debian bookworm InRelease",
             "curl: (6) Could not resolve host: github.com"]
    assert images.unreachable_hosts(lines) == ["download.pytorch.org", "github.com"]
    assert images.unreachable_hosts(lines[2:3]) == []


def test_multi_source_copy_gets_a_folder_destination():
    assert images._multi_source_copy("COPY a.py b.py /app") == "COPY a.py b.py /app/"
    assert images._multi_source_copy("COPY --chown=1:1 a b c /x") == "COPY --chown=1:1 a b c /x/"
    assert images._multi_source_copy("COPY task-deps/* /app") == "COPY task-deps/* /app/"
    for same in ("COPY a.py /app", "COPY a b /app/", 'COPY ["a", "b", "/app"]', "RUN cp a b c"):
        assert images._multi_source_copy(same) == same
