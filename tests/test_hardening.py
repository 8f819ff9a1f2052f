"""Adversarial tests of the sandboxes and the protected verifier (issue 18's red-team classes).

Each test plays the agent: commands through the sandbox's persistent shell, then the real
protected verifier of a real task (``tr.envs.tasks.runner.verify``) or the real episode loop
(``tr.agent.harness.run_episode``), on both backends where the class applies.  The fixture task
wants ``42`` in ``/app/answer.txt``; the agent leaves ``41`` and tries to turn that into a pass.
Its test also starts ``python3`` and ``git`` (tests often do), so their configuration hooks are
attack surface too.  Every payload does the same thing if it ever runs inside the verifier:
write ``42`` to the answer file.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tr.envs.backends import make_sandbox
from tr.envs.sandbox import SandboxConfig, SandboxError
from tr.envs.tasks import load_task
from tr.envs.tasks.runner import prepare, sandbox_config, verify
from tr.envs.workspace import ROOT_PREFIX, reap_stale

from test_sandbox import backend, docker_problem, host_pids_with, unique_sleep  # noqa: F401

SMALL = dict(memory_mb=768, pids=256, disk_mb=64, file_size_mb=256, cpu_time_s=120)

TEST_OUTPUTS = textwrap.dedent("""\
    import subprocess

    def test_answer():
        subprocess.run(["python3", "-c", "pass"], capture_output=True, timeout=60)
        subprocess.run(["git", "-c", "safe.directory=*", "-C", "/app/repo", "status"],
                       capture_output=True, timeout=60)
        assert open("/app/answer.txt").read().strip() == "42"
    """)


def make_task(root: Path, name: str, test_text: str = TEST_OUTPUTS, timeout_s: int = 60):
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "environment").mkdir()
    (d / "task.toml").write_text(textwrap.dedent(f"""\
        [metadata]
        family = "hardening"
        tier = "easy"
        [agent]
        timeout_sec = 300
        max_turns = 10
        [verifier]
        timeout_sec = {timeout_s}
        """))
    (d / "instruction.md").write_text("Write 42 to /app/answer.txt.\n")
    (d / "solution" / "solve.sh").write_text("echo 42 > /app/answer.txt\n")
    (d / "environment" / "setup.sh").write_text(
        "echo 41 > /app/answer.txt && git init -q /app/repo\n")
    (d / "tests" / "test_outputs.py").write_text(test_text)
    return load_task(d)


@pytest.fixture(scope="session")
def task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("hardening-tasks"), "answer")


@pytest.fixture
def box(backend, task):
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as sb:
        prepare(task, sb, backend)
        yield sb


def agent(box, command: str, timeout_s: float = 60):
    """One command of the agent, as the harness runs it (the persistent shell)."""
    return box.run(textwrap.dedent(command), timeout_s=timeout_s)


# A shared library whose constructor writes 42 -- but only inside the verifier (its environment
# has TR_PYTHON), so the agent's own later commands are not affected.
PAYLOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void forge(void) {
    if (!getenv("TR_PYTHON")) return;
    FILE *f = fopen("/app/answer.txt", "w");
    if (f) { fputs("42\n", f); fclose(f); }
}
"""
PY_PAYLOAD = "open('/app/answer.txt', 'w').write('42\\n')\n"     # as /tmp/forge.py


def build_payload(box) -> None:
    box.write_file("/tmp/forge.py", PY_PAYLOAD)
    box.write_file("/tmp/forge.c", PAYLOAD_C)
    r = agent(box, "gcc -shared -fPIC -o /tmp/forge.so /tmp/forge.c && echo built", 120)
    assert "built" in r.output, r.output


def verdict(box, task):
    result = verify(task, box)
    return result


# ----------------------------------------------------------------------------- who the agent is

def test_local_agent_is_not_host_root_and_cannot_write_host_sysctls(task):
    """The core_pattern escape, reproduced safely: writing a *harmless* host sysctl with its own
    value (no change) proves writability; the agent's root is host uid BASE, /proc/sys is
    read-only, and files it makes belong to BASE on the host."""
    from tr.envs.userns import subordinate_range
    base, count = subordinate_range()
    with make_sandbox("local", SandboxConfig(**SMALL)) as box:
        r = agent(box, """\
            id -u; cat /proc/self/uid_map
            v=$(cat /proc/sys/vm/stat_interval) && echo "$v" > /proc/sys/vm/stat_interval \\
                && echo SYSCTL-WRITTEN
            test -w /proc/sys/kernel/core_pattern && echo CORE-PATTERN-WRITABLE
            grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status
            echo mine > /app/mine""")
        assert "SYSCTL-WRITTEN" not in r.output and "CORE-PATTERN-WRITABLE" not in r.output
        lines = r.output.split("\n")
        assert lines[0] == "0", r.output                             # root inside
        assert lines[1].split() == ["0", str(base), str(count)], r.output
        assert all(line.endswith("0000000000000000") for line in lines if line.startswith("Cap"))
        assert os.stat(Path(box.ws.host_dir("app")) / "mine").st_uid == base != 0


def test_docker_agent_keeps_default_seccomp_and_few_capabilities(docker_problem):
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    from tr.envs.docker_sandbox import KEPT_CAPS
    names = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
             "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
             "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
             "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
             "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
             "AUDIT_CONTROL", "SETFCAP"]          # capability numbers 0..31, in order
    with make_sandbox("docker", SandboxConfig(**SMALL)) as box:
        r = agent(box, "grep -E '^(CapEff|Seccomp):' /proc/self/status; "
                       "echo 1 > /proc/sys/vm/stat_interval && echo SYSCTL-WRITTEN")
        fields = dict(line.split(":\t") for line in r.output.splitlines() if ":\t" in line)
        eff = int(fields["CapEff"], 16)
        have = {n for i, n in enumerate(names) if eff >> i & 1}
        assert have == set(KEPT_CAPS), have
        assert fields["Seccomp"] == "2" and "SYSCTL-WRITTEN" not in r.output


def test_seccomp_tables_match_the_kernel_headers():
    """The syscall numbers of the filter against the kernel's own headers (an independent
    reference: the installed linux-libc-dev)."""
    from tr.envs import seccomp
    headers = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
               "aarch64": Path("/usr/include/asm-generic/unistd.h")}
    checked = 0
    for machine, header in headers.items():
        if not header.exists():
            continue
        text = header.read_text()
        for name, nr in seccomp.SYSCALLS[machine].items():
            m = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
            assert m and int(m.group(1)) == nr, (machine, name, nr)
            checked += 1
    assert checked, "no kernel headers to check against"
    assert seccomp.program("sparc") is None


SYSCALL_PROBE = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def errno_of(nr, *args):
        r = libc.syscall(nr, *args)
        return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
    print("keyctl", errno_of(250, 0, 0))
    print("unshare_user", errno_of(272, 0x10000000))
    print("clone_newuser", errno_of(56, 0x10000000 | 17, 0, 0, 0, 0))
    print("clone3", errno_of(435, 0, 0))
    print("bpf", errno_of(321, 0, 0, 0))
    print("io_uring", errno_of(425, 1, 0))
    """)
LOCAL_ONLY = {"io_uring"}    # Docker 20.10's default profile (kept as it is) allows io_uring


def test_namespace_keyring_and_kernel_surface_syscalls_are_refused(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        box.write_file("/tmp/probe.py", SYSCALL_PROBE)
        r = agent(box, "unshare -U true; echo unshare=$?; python3 /tmp/probe.py")
        got = dict(line.split(" ", 1) for line in r.output.splitlines() if " " in line)
        assert "unshare=0" not in r.output, r.output
        for call in ("keyctl", "unshare_user", "clone_newuser", "bpf", "io_uring"):
            if backend != "local" and call in LOCAL_ONLY:
                continue
            assert got[call] == "Operation not permitted", (call, r.output)
        assert got["clone3"] in ("Function not implemented", "Operation not permitted"), r.output


# ----------------------------------------------------------------------------- forged passes

FORGERIES = {
    # pytest reads more configuration files than any deny-list names: -c/--rootdir settle it
    "pytest_config_files": """\
        cp /tmp/forge.py /app/forgeplugin.py
        cfg='[pytest]\\naddopts = -p forgeplugin\\npythonpath = /app\\n'
        toml='[pytest]\\naddopts = ["-p", "forgeplugin"]\\npythonpath = ["/app"]\\n'
        for d in / /app /tmp /logs; do
          printf "$cfg" > $d/.pytest.ini; printf "$cfg" > $d/pytest.ini
          printf "$cfg" | sed 's/\\[pytest\\]/[tool:pytest]/' > $d/setup.cfg
          printf "$cfg" | sed 's/\\[pytest\\]/[tool:pytest]/' > $d/tox.ini
          printf "$toml" > $d/pytest.toml; printf "$toml" > $d/.pytest.toml
          printf "$toml" | sed 's/\\[pytest\\]/[tool.pytest.ini_options]/' > $d/pyproject.toml
          cp /tmp/forge.py $d/conftest.py
        done 2>/dev/null; true""",
    # the harness's clean-up must not run the container's programs, nor trust them
    "harness_programs_replaced": """\
        mkdir -p /tests && cp /tmp/forge.py /tests/conftest.py
        cp /tmp/forge.py /tests/test_outputs.py
        (echo '#!/usr/bin/python3'; cat /tmp/forge.py) > /tmp/forge-program
        for p in rm mkdir cp tar sh dash bash; do
          for d in /usr/bin /bin /usr/local/bin; do
            [ -e $d/$p ] || continue
            /usr/bin/rm -f $d/$p; cat /tmp/forge-program > $d/$p; chmod 755 $d/$p
          done
        done 2>/dev/null
        echo 41 > /app/answer.txt   # a replaced program may have run meanwhile""",
    # a process born in an INT trap when the command times out; it waits for the verifier's
    # report and rewrites it (and plants one deeper, where a recursive search would find it)
    "orphan_rewrites_the_report": """\
        cat > /tmp/forge.sh <<'EOF'
        PASS='<testsuites><testsuite name="pytest" tests="1" errors="0" failures="0" skipped="0"><testcase classname="test_outputs" name="test_answer"/></testsuite></testsuites>'
        for i in $(seq 1 2400); do
          mkdir -p /logs/verifier/a 2>/dev/null && echo "$PASS" > /logs/verifier/a/junit.xml
          if grep -q failures=.1 /logs/verifier/junit.xml 2>/dev/null; then
            echo "$PASS" > /logs/verifier/junit.xml; echo 42 > /app/answer.txt
          fi
          sleep 0.05
        done
        EOF
        trap 'setsid bash /tmp/forge.sh TOKEN >/dev/null 2>&1 & bash /tmp/forge.sh TOKEN >/dev/null 2>&1 &' INT
        sleep 100""",
    "openssl_provider": """\
        mkdir -p /etc/ssl && cat > /etc/ssl/openssl.cnf <<'EOF'
        openssl_conf = openssl_init
        [openssl_init]
        providers = provider_sect
        [provider_sect]
        forge = forge_sect
        default = default_sect
        [forge_sect]
        module = /tmp/forge.so
        activate = 1
        [default_sect]
        activate = 1
        EOF
        cp /etc/ssl/openssl.cnf /usr/lib/ssl/openssl.cnf 2>/dev/null; true""",
    "python_startup_hooks": """\
        for d in /etc/python3.11 /usr/lib/python3.11 /usr/local/lib/python3.11/dist-packages; do
          mkdir -p $d 2>/dev/null && cp /tmp/forge.py $d/sitecustomize.py
        done 2>/dev/null
        mkdir -p /root/.local/lib/python3.11/site-packages
        cp /tmp/forge.py /root/.local/lib/python3.11/site-packages/usercustomize.py
        cp /tmp/forge.py /app/sitecustomize.py; true""",
    "git_config_hooks": """\
        printf '#!/bin/sh\\necho 42 > /app/answer.txt\\n' > /tmp/hook && chmod 755 /tmp/hook
        printf '[core]\\n\\tfsmonitor = /tmp/hook\\n\\tpager = /tmp/hook\\n' > /etc/gitconfig
        cp /etc/gitconfig /root/.gitconfig; mkdir -p /root/.config/git
        cp /etc/gitconfig /root/.config/git/config; true""",
    "loader_preload": """\
        echo /tmp/forge.so > /etc/ld.so.preload""",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forgeries_do_not_pass_a_wrong_answer(box, task, backend, forgery):
    build_payload(box)
    token = unique_sleep()
    script = FORGERIES[forgery].replace("TOKEN", token)
    agent(box, script, timeout_s=3 if "trap" in script else 60)
    assert box.read_file("/app/answer.txt") == b"41\n"        # the agent did not just solve it
    result = verdict(box, task)
    assert not result.strict_pass, f"{forgery} forged a pass on {backend}:\n{result.log}"
    assert result.error is None and result.executed == 1, result.log
    assert box.read_file("/app/answer.txt") == b"41\n", f"{forgery} ran inside the verifier"
    assert not host_pids_with(token), "an agent process survived into verification"


def test_honest_answer_still_passes_after_hardening(box, task):
    agent(box, "echo 42 > /app/answer.txt")
    result = verdict(box, task)
    assert result.strict_pass and result.error is None, result.log


# ----------------------------------------------------------------------------- verifier errors

class Says:
    """The agent of an episode: fixed commands in order, then DONE."""

    def __init__(self, commands):
        self.commands = list(commands)

    def __call__(self, request):
        from tr.agent.harness import format_action
        from tr.agent.transcript import Generation
        command = self.commands.pop(0) if self.commands else None
        return Generation(text=format_action("next", command))


def says_episode(task, backend, commands):
    from tr.agent.harness import EpisodeSpec, run_episode
    from tr.agent.rollout import TaskEnv
    from tr.agent.transcript import ChatLayout
    from tr.models.tokenizer import ByteTokenizer
    env = TaskEnv(backend, SandboxConfig(**SMALL))
    return run_episode(EpisodeSpec(task=task, episode_id="e0"), Says(commands), env,
                       ChatLayout(ByteTokenizer()), policy_name="says")


VERIFIER_SABOTAGE = {
    "answer_is_a_fifo": "rm /app/answer.txt && mkfifo /app/answer.txt",
    "logs_unwritable": "chmod 000 /logs; rm -rf /tmp/* 2>/dev/null; chmod 000 /tmp",
    "disk_full": "cat /dev/zero > /app/fill 2>/dev/null; for i in $(seq 1 5000); do "
                 ": > /app/f$i || break; done 2>/dev/null; true",
}


@pytest.mark.parametrize("sabotage", sorted(VERIFIER_SABOTAGE))
def test_verifier_errors_the_agent_causes_count_as_failures(tmp_path, backend, sabotage):
    from tr.agent.records import EpisodeStatus
    task = make_task(tmp_path, "quick", timeout_s=8)
    rec = says_episode(task, backend, [VERIFIER_SABOTAGE[sabotage]])
    assert rec.status is EpisodeStatus.VERIFIED_FAIL, (rec.status, rec.error)
    assert rec.passed is False and rec.status.counts
    assert rec.verifier_fault in ("agent", None), rec.error   # docker root may write 000 dirs


def test_a_verifier_broken_for_everyone_is_an_infra_failure(tmp_path):
    from tr.agent.records import EpisodeStatus
    hanging = "import time\n\ndef test_hangs():\n    time.sleep(600)\n"
    task = make_task(tmp_path, "hangs", test_text=hanging, timeout_s=3)
    rec = says_episode(task, "local", ["echo 42 > /app/answer.txt"])
    assert rec.status is EpisodeStatus.INFRA_FAILURE and rec.verifier_fault == "harness"
    assert "untouched environment" in rec.error and not rec.status.counts


def test_a_dead_sandbox_is_the_harness_fault(task, backend):
    from tr.agent.harness import EpisodeSpec
    from tr.agent.rollout import TaskEnv
    env = TaskEnv(backend, SandboxConfig(**SMALL))
    spec = EpisodeSpec(task=task, episode_id="e1")
    sandbox = env.open(spec)
    assert sandbox.alive()
    sandbox.close()
    assert env.verifier_fault(spec, sandbox) == ("harness", "the sandbox died")


# ----------------------------------------------------------------------------- exposure

def _mount_options(path: str) -> set[str]:
    best = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if path == fields[4] or path.startswith(fields[4].rstrip("/") + "/"):
            if best is None or len(fields[4]) > len(best[4]):
                best = fields
    return set(best[5].split(",")) | set(best[-1].split(","))


def test_setuid_files_give_no_privilege_on_the_host_nor_in_snapshots(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        r = agent(box, "cp /bin/true /app/su && chmod 6755 /app/su && stat -c %a /app/su")
        live = Path(box.ws.host_dir("app")) / "su"
        assert {"nosuid", "nodev"} <= _mount_options(str(live)), "workspace mount flags"
        if backend == "local":
            assert os.stat(live).st_uid != 0, "a setuid file of the agent owned by host root"
        snap = box.snapshot()
        copy = Path(snap.location) / "app" / "su"
        assert os.stat(copy).st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, r.output
        box.restore(snap)
        assert agent(box, "stat -c %a /app/su").output == "755\n"
        state = Path(box.ws.root)
        for p in (state.parent, state, Path(snap.location).parent):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o700, p


def test_snapshots_drop_file_capabilities(tmp_path):
    """``security.capability`` (set here by the test, as root: the agent has no right to) never
    reaches a snapshot copy; other extended attributes do."""
    from tr.envs import filetree
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "tool").write_bytes(b"x")
    cap = bytes.fromhex("0100000200200000000000000000000000000000")  # cap_net_raw+ep
    try:
        os.setxattr(src / "tool", "security.capability", cap)
    except OSError as e:
        pytest.skip(f"file capabilities unsupported here: {e}")
    os.setxattr(src / "tool", "trusted.keep", b"1")
    s, d = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDONLY)
    try:
        filetree.copy_tree(s, d)
    finally:
        os.close(s)
        os.close(d)
    assert "security.capability" not in os.listxattr(dst / "tool")
    assert os.getxattr(dst / "tool", "trusted.keep") == b"1"


def test_only_world_readable_host_etc_entries_reach_a_local_sandbox(tmp_path):
    """Against an independent reference: ``find`` over the host's /etc for entries other users
    cannot read (this host has some: .pwd.lock, postgres and polkit files...), and a fake /etc
    with each kind of private entry."""
    from tr.envs.local import ETC_EXCLUDE, etc_template
    private = subprocess.run(["find", "/etc", "(", "!", "-perm", "-o=r", "-o", "-type", "d",
                              "!", "-perm", "-o=x", ")", "!", "-type", "l"],
                             capture_output=True, text=True).stdout.split()
    private = [p for p in private if os.path.relpath(p, "/etc") not in ETC_EXCLUDE]
    with make_sandbox("local", SandboxConfig(**SMALL)) as box:
        listing = agent(box, "find /etc 2>/dev/null").output.split()
    leaked = set(private) & set(listing)
    assert not leaked, f"root-only host /etc entries copied into the sandbox: {sorted(leaked)}"


def test_etc_template_copies_only_world_readable_entries(tmp_path, monkeypatch):
    from tr.envs import local
    fake = tmp_path / "etc"
    (fake / "open").mkdir(parents=True)
    (fake / "open" / "readable").write_text("ok")
    (fake / "open" / "secret").write_text("no")
    os.chmod(fake / "open" / "secret", 0o600)
    (fake / "closed").mkdir()
    (fake / "closed" / "inside").write_text("no")
    os.chmod(fake / "closed", 0o700)
    os.mkfifo(fake / "pipe")
    os.symlink("open/readable", fake / "link")
    monkeypatch.setattr(local, "ETC_SOURCE", str(fake))
    state = tmp_path / "state"
    state.mkdir()
    tmpl = local.etc_template(state, 524288, 65536)
    got = sorted(str(p.relative_to(tmpl)) for p in tmpl.rglob("*"))
    assert got == ["hostname", "link", "open", "open/readable"], got
    assert os.stat(tmpl / "open" / "readable").st_uid == 524288


# ----------------------------------------------------------------------------- denial of service

DEEP = textwrap.dedent("""\
    import os
    fd = os.open("/app", os.O_RDONLY)
    for i in range(3000):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
        f.write("deep\\n")
    print("made")
    """)


def test_deep_trees_snapshot_restore_and_close_and_do_not_block_the_next_sandbox(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        box.write_file("/tmp/deep.py", DEEP)
        assert "made" in agent(box, "python3 /tmp/deep.py && rm /tmp/deep.py").output
        first = box.snapshot()
        agent(box, "rm -rf /app/d; echo changed > /app/x")
        second = box.snapshot()
        box.restore(first)
        r = agent(box, "cd /app && find . -name leaf | wc -l && ls /app")
        assert r.output.split() == ["1", "d"], r.output
        box.restore(second)
        assert agent(box, "ls /app").output.split() == ["x"]
        box.restore(first)
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        assert agent(box, "echo fine").output == "fine\n"


def test_reaper_survives_deep_and_unremovable_leftovers(tmp_path, monkeypatch):
    """Stale workspaces of dead owners: one 3000 levels deep is removed, one whose removal
    fails is reported and skipped; neither stops the reaper nor the next sandbox."""
    from tr.envs import workspace
    dead = f"{ROOT_PREFIX}999999999-1-"
    deep = tmp_path / f"{dead}aaaa"
    cur = os.open(tmp_path, os.O_RDONLY)
    os.mkdir(deep.name, dir_fd=cur)
    fd = os.open(deep.name, os.O_RDONLY, dir_fd=cur)
    os.close(cur)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    stuck = tmp_path / f"{dead}bbbb"
    stuck.mkdir()
    real = workspace.remove_tree

    def failing(root, *a, **k):
        if root == stuck:
            raise SandboxError("injected: cannot remove")
        return real(root, *a, **k)

    monkeypatch.setattr(workspace, "remove_tree", failing)
    assert reap_stale(tmp_path) == 1
    assert not deep.exists() and stuck.exists()
    with make_sandbox("local", SandboxConfig(**SMALL, state_dir=str(tmp_path))) as box:
        assert agent(box, "echo fine").output == "fine\n"


def test_tree_operations_stop_at_their_deadline(tmp_path):
    from tr.envs import filetree
    for i in range(50):
        (tmp_path / f"f{i}").write_text("x")
    dst = tmp_path.parent / (tmp_path.name + "-copy")
    dst.mkdir()
    s, d = os.open(tmp_path, os.O_RDONLY), os.open(dst, os.O_RDONLY)
    try:
        with pytest.raises(SandboxError, match="longer than"):
            filetree.copy_tree(s, d, deadline=filetree.Deadline(-1, "the copy"))
    finally:
        os.close(s)
        os.close(d)


def test_sparse_files_stay_sparse_in_snapshots_and_restores(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        agent(box, "truncate -s 200M /app/sparse && printf x | dd of=/app/sparse bs=1 "
                   "seek=100000000 conv=notrunc 2>/dev/null")
        box.snapshot()                                   # the next one is incremental
        agent(box, "echo edit > /app/other")
        snap = box.snapshot()
        copy = Path(snap.location) / "app" / "sparse"
        assert os.stat(copy).st_size == 200 << 20 and os.stat(copy).st_blocks * 512 < 1 << 20
        agent(box, "rm /app/sparse")
        box.restore(snap)
        r = agent(box, "stat -c '%s %b' /app/sparse; tail -c +100000001 /app/sparse | head -c 1")
        size, blocks, byte = r.output.split()
        assert int(size) == 200 << 20 and int(blocks) * 512 < 1 << 20 and byte.startswith("x")


def test_inodes_are_limited_by_disk_size(backend):
    from tr.envs.workspace import inode_limit
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        r = agent(box, "df --output=itotal /app | tail -1; mkdir /app/many && cd /app/many "
                       "&& for i in $(seq 1 6000); do : > f$i || { echo stopped; break; }; done "
                       "2>/dev/null; ls | wc -l")
        total, *rest = r.output.split()
        assert int(total) == inode_limit(SMALL["disk_mb"]), r.output
        assert "stopped" in rest and int(rest[-1]) < inode_limit(SMALL["disk_mb"])


def test_local_cpu_quota_covers_all_processes_of_a_sandbox():
    """cpus=0.1: the sandbox's cgroup has a 10 ms per 100 ms quota, every process of the
    sandbox is in it, and busy processes get throttled (counted by the kernel; four of them, so
    that they want more than the quota even on a loaded machine)."""
    from tr.envs.cgroups import CGROUP_V1, cgroup_v1_writable
    if not cgroup_v1_writable() or not (CGROUP_V1 / "cpu" / "cgroup.procs").exists():
        pytest.skip("no writable cgroup v1 cpu controller here")
    with make_sandbox("local", SandboxConfig(**SMALL, cpus=0.1)) as box:
        group = box.tree.parents["cpu"]
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "10000"
        assert (group / "cpu.cfs_period_us").read_text().strip() == "100000"
        r = agent(box, "for i in 1 2 3; do (timeout 1 sh -c 'while :; do :; done' &); done; "
                       "timeout 1 sh -c 'while :; do :; done'; echo $$")
        shell_pid = box.session.proc.pid
        assert str(group.relative_to(CGROUP_V1 / "cpu")) in \
            Path(f"/proc/{shell_pid}/cgroup").read_text(), r.output
        throttled = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
        assert int(throttled["nr_throttled"]) > 0, throttled


# ----------------------------------------------------------------------------- the shell itself

def test_the_shell_protocol_survives_redefined_helpers_and_shadowed_builtins(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        r = agent(box, "__tr_end() { echo fake; }; __tr_do() { :; }; __tr_eval() { :; }")
        assert "readonly function" in r.output
        agent(box, "printf() { :; }; read() { :; }; eval() { :; }; local() { :; }")
        r = agent(box, "false")
        assert r.exit_code == 1 and not r.timed_out and not r.shell_restarted
        assert agent(box, "echo still").output == "still\n"
        broken = box.run("builtin() { :; }", timeout_s=2)   # breaks only its own shell ...
        assert broken.timed_out or broken.exit_code is None
        after = box.run("echo fresh", timeout_s=30)         # ... which is then replaced
        assert after.output.endswith("fresh\n") and after.shell_restarted, after


def test_unix_sockets_survive_incremental_snapshots(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        agent(box, "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/app/s')\"")
        box.snapshot()
        agent(box, "echo change > /app/other")
        snap = box.snapshot()                          # incremental
        agent(box, "rm /app/s")
        box.restore(snap)
        assert agent(box, "test -S /app/s && echo socket").output == "socket\n"


# ----------------------------------------------------------------- TB1's run-tests.sh path

TB1_RUN_TESTS = textwrap.dedent("""\
    #!/bin/bash
    # Terminal-Bench 1's boilerplate: fetch uv, make a venv with pytest, run the tests
    apt-get update
    apt-get install -y curl
    curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
    source $HOME/.local/bin/env
    if [ "$PWD" = "/" ]; then
        echo "Error: No working directory set."
        exit 1
    fi
    uv init
    uv add pytest==8.4.1
    uv run pytest $TEST_DIR/test_outputs.py -rA
    """)


# The test itself runs no program of the sandbox (one that does runs the agent's, by design --
# TB1's own exposure, see tr.envs.protected): so none of the agent's programs may run at all.
TB1_TEST = textwrap.dedent("""\
    def test_answer():
        assert open("/app/answer.txt").read().strip() == "42"
    """)


def write_tb1_task(root: Path, name: str = "tb1-answer", tests: str = TB1_TEST) -> Path:
    """A TB1 task folder: write 42 to /app/answer.txt, TB1's uv harness, `tests` as its tests."""
    d = root / name
    (d / "tests").mkdir(parents=True)
    (d / "task.yaml").write_text("instruction: Write 42 to /app/answer.txt.\n"
                                 "difficulty: easy\ncategory: hardening\n"
                                 "max_test_timeout_sec: 120\n")
    (d / "solution.sh").write_text("echo 42 > /app/answer.txt\n")
    (d / "run-tests.sh").write_text(TB1_RUN_TESTS)
    (d / "tests" / "test_outputs.py").write_text(tests)
    return d


def make_tb1_task(root: Path, name: str = "tb1-answer"):
    return load_task(write_tb1_task(root, name))


@pytest.fixture(scope="session")
def tb1_task(tmp_path_factory):
    task = make_tb1_task(tmp_path_factory.mktemp("hardening-tb1"))
    assert task.layout == "tb1" and task.verifier.script_text, task.verifier
    return task


@pytest.fixture
def tb1_box(backend, tb1_task):
    config = sandbox_config(tb1_task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as sb:
        prepare(tb1_task, sb)
        agent(sb, "echo 41 > /app/answer.txt && git init -q /app/repo")
        yield sb


# Everything TB1's run-tests.sh names, or that a test run could read, replaced by the agent: a
# program that (inside the verifier: TR_PYTHON or TEST_DIR set) writes 42 and a passing report,
# and again after the tests from an orphan.
TB1_ATTACK = r"""
PASS='<testsuites><testsuite name="pytest" tests="1" errors="0" failures="0" skipped="0"><testcase classname="test_outputs" name="test_answer"/></testsuite></testsuites>'
cat > /tmp/fake <<EOF
#!/bin/sh
[ -n "\$TR_PYTHON\$TEST_DIR" ] || exit 0     # strikes only inside the verifier
echo 42 > /app/answer.txt
mkdir -p /logs/verifier; echo '$PASS' > /logs/verifier/junit.xml
( sleep 3; echo 42 > /app/answer.txt; echo '$PASS' > /logs/verifier/junit.xml ) >/dev/null 2>&1 &
exit 0
EOF
chmod 755 /tmp/fake
for d in /usr/local/bin /usr/local/sbin /usr/bin /bin /root/.local/bin /root/.cargo/bin \
         /app/.venv/bin /app/bin /tmp/bin; do
  mkdir -p $d 2>/dev/null
  for p in pytest py.test uv uvx python python3 pip pip3 curl apt-get apt bash sh env; do
    [ "$d/$p" = /bin/sh ] || [ "$d/$p" = /usr/bin/sh ] && continue   # the agent's own shell
    cp /tmp/fake $d/$p 2>/dev/null
  done
done
cp /tmp/fake /root/.local/bin/env; cp /tmp/fake /app/.venv/bin/activate
for f in /root/.bashrc /root/.profile /etc/profile /etc/bash.bashrc /etc/environment; do
  echo '. /tmp/fake' >> $f 2>/dev/null
done
for n in conftest sitecustomize usercustomize pytest; do cp /tmp/forge.py /app/$n.py; done
mkdir -p /app/_pytest && cp /tmp/forge.py /app/_pytest/__init__.py
printf '[pytest]\naddopts = -p conftest\n' > /app/pytest.ini
printf 'home = /tmp/bin\ninclude-system-site-packages = false\n' > /app/pyvenv.cfg
mkdir -p /tests 2>/dev/null && cp /tmp/forge.py /tests/conftest.py 2>/dev/null \
  && printf 'def test_answer():\n    pass\n' > /tests/test_outputs.py 2>/dev/null
mkdir -p /logs/verifier && echo "$PASS" > /logs/verifier/junit.xml
echo 41 > /app/answer.txt   # a replaced program may have run meanwhile
true
"""


def test_tb1_run_tests_path_ignores_what_the_agent_replaced(tb1_box, tb1_task, backend):
    """TB1's run-tests.sh runs as written inside the protected verifier: the programs it fetches
    (curl, uv, pytest) are the project's, so fakes of them, of python/bash on PATH, a sourced
    env file, conftest/sitecustomize/pytest.ini in the workdir and a replaced /tests change
    nothing -- nor does an orphan that rewrites the report afterwards."""
    tb1_box.write_file("/tmp/forge.py", PY_PAYLOAD)
    agent(tb1_box, TB1_ATTACK, timeout_s=120)
    assert tb1_box.read_file("/app/answer.txt") == b"41\n"
    result = verdict(tb1_box, tb1_task)
    assert not result.strict_pass, f"the TB1 path was forged on {backend}:\n{result.log}"
    assert result.error is None and result.executed == 1, result.log
    time.sleep(4)                                   # an orphan would have struck by now
    assert tb1_box.read_file("/app/answer.txt") == b"41\n", \
        f"a replaced program ran inside the verifier on {backend}:\n{result.log}"


def test_tb1_run_tests_path_passes_an_honest_answer(tb1_box, tb1_task):
    agent(tb1_box, "echo 42 > /app/answer.txt")
    result = verdict(tb1_box, tb1_task)
    assert result.strict_pass and result.error is None, result.log


# ------------------------------------------------------- tests that judge "their own" Python

# A test of the kind TB1's broken-python task has: it judges the interpreter that runs it
# (`import pip`).  Under the protected verifier that is the project's Python, whose pip the agent
# never touched -- so pip is not importable there, and an empty attempt cannot pass such a check.
# The harness's own pip (test-time installs) stays reachable at /opt/tr/pip.
PIP_TESTS = textwrap.dedent("""\
    import os
    import subprocess
    import sys

    def test_pip_imports():
        import pip
        assert pip.__file__

    def test_the_harness_pip_is_at_its_own_path():
        # as testscript.rewrite runs it: -P keeps the cwd (the agent's /app) off sys.path
        env = {**os.environ, "PYTHONPATH": "/opt/tr/pip:" + os.environ["PYTHONPATH"]}
        r = subprocess.run([sys.executable, "-P", "-m", "pip", "--version"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("pip "), r.stderr
    """)

PLANT_PIP = r"""
for d in /app /tmp /root /root/.local/lib/python3.{9,10,11,12,13,14}/site-packages \
         /usr/lib/python3/dist-packages /usr/local/lib/python3.{9,10,11,12,13,14}/site-packages \
         /usr/lib/python3.{9,10,11,12,13,14} /logs/verifier /opt/tr /opt/tr/pip; do
  mkdir -p $d/pip 2>/dev/null && cp /tmp/forge.py $d/pip/__init__.py 2>/dev/null
done
echo 'import sys; sys.path.insert(0, "/app")' > /app/sitecustomize.py
true
"""


@pytest.fixture(scope="session")
def pip_task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("hardening-pip"), "own-pip", PIP_TESTS,
                     timeout_s=180)


@pytest.mark.parametrize("plant", [False, True], ids=["empty-attempt", "planted-pip"])
def test_tests_that_import_pip_judge_no_pip_the_agent_did_not_make(pip_task, backend, plant):
    """`import pip` fails in the verifier's Python (its pip is mounted away), whatever pip the
    agent plants where it can write; the harness's pip still runs from /opt/tr/pip."""
    config = sandbox_config(pip_task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as box:
        prepare(pip_task, box, backend)
        if plant:
            box.write_file("/tmp/forge.py", PY_PAYLOAD)
            agent(box, PLANT_PIP)
        result = verdict(box, pip_task)
        outcome = {c.name: c.passed for c in result.checks}
        assert outcome == {"test_pip_imports": False,
                           "test_the_harness_pip_is_at_its_own_path": True}, result.log
        assert not result.strict_pass and result.error is None
        assert box.read_file("/app/answer.txt") == b"41\n", "a planted pip ran in the verifier"


# ---------------------------------------------- a project folder's own package (TB1's uv harness)

PROJECT_TESTS = textwrap.dedent("""\
    def test_project_package():
        from shelfpkg import answer
        assert answer() == 42

    def test_answer():
        assert open("/app/answer.txt").read().strip() == "42"
    """)

# The workdir is a Python project (TB1's `uv init; uv add pytest` would install it for the
# tests); next to it, modules that pytest or its plugins import -- lazily or optionally -- each
# writing 42 if it ever runs.
PROJECT_AND_DECOYS = r"""
mkdir -p /app/shelfpkg && printf 'def answer():\n    return 42\n' > /app/shelfpkg/__init__.py
[ "$1" = with-pyproject ] && printf '[project]\nname = "shelfpkg"\nversion = "0"\n' > /app/pyproject.toml
for m in _pytest pluggy iniconfig packaging pygments exceptiongroup tomli colorama argcomplete \
         xdist py attr more_itertools numpy readline sitecustomize usercustomize pytest; do
  mkdir -p /app/$m && cp /tmp/forge.py /app/$m/__init__.py && cp /tmp/forge.py /app/$m.py
done
echo 41 > /app/answer.txt
"""


@pytest.mark.parametrize("pyproject", [True, False], ids=["project", "no-project"])
def test_a_project_package_reaches_test_imports_only(tmp_path, backend, pyproject):
    """With a pyproject.toml in the workdir and TB1's uv harness, a test file's `import
    shelfpkg` finds the workdir's package (as TB1's harness installs it); pytest's own imports
    never reach the folder, so decoys of its modules there do not run.  Without the project
    file the package is not importable (TB1 would not install it either)."""
    d = write_tb1_task(tmp_path, "tb1-project", PROJECT_TESTS)
    task = load_task(d)
    config = sandbox_config(task, backend, SandboxConfig(**SMALL))
    with make_sandbox(backend, config) as box:
        prepare(task, box)
        box.write_file("/tmp/forge.py", PY_PAYLOAD)
        box.write_file("/tmp/decoys.sh", PROJECT_AND_DECOYS)
        agent(box, f"bash /tmp/decoys.sh {'with-pyproject' if pyproject else 'plain'}")
        result = verdict(box, task)
        outcome = {c.name: c.passed for c in result.checks}
        assert outcome == {"test_project_package": pyproject, "test_answer": False}, result.log
        assert box.read_file("/app/answer.txt") == b"41\n", f"a decoy ran:\n{result.log}"
