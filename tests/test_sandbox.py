"""Sandboxes, for real: real bash in real bubblewrap and real Docker containers, attacked.

Every behavioural test runs on both backends.  Docker tests skip (with the reason) only when no
Docker engine answers; the base image is built on first use (cached by tag).
"""

from __future__ import annotations

import os
import random
import resource
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tr.envs.backends import make_sandbox
from tr.envs.sandbox import CappedOutput, CommandResult, SandboxConfig, SandboxError, Snapshot
from tr.envs.shell import _Scanner
from tr.envs.workspace import ROOT_PREFIX, default_state_dir

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(memory_mb=512, pids=128, disk_mb=64, file_size_mb=256, cpu_time_s=120)


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def docker_problem():
    """None when a Docker engine answers and the base image exists (built if needed)."""
    try:
        from tr.envs.images import ensure_base_image
        ensure_base_image()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


@pytest.fixture(params=["local", "docker"])
def backend(request):
    if request.param == "docker":
        problem = request.getfixturevalue("docker_problem")
        if problem:
            pytest.skip(f"NO DOCKER ENGINE ANSWERS -- docker backend untested: {problem}")
    return request.param


@pytest.fixture
def sb(backend):
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        yield box


def host_pids_with(token: str) -> list[int]:
    """Host processes whose command line contains ``token`` (independent /proc scan)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmd and int(entry.name) != os.getpid():
                try:
                    state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state != "Z":
                    found.append(int(entry.name))
    return found


def wait_until(pred, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def unique_sleep() -> str:
    """A sleep duration no other process on the host has in its command line."""
    return f"{1000 + random.randint(1, 10**6)}.{random.randint(10**5, 10**6 - 1)}"


def leftovers(owner_pid: int) -> dict:
    """Everything a sandbox of process ``owner_pid`` could leave behind on the host."""
    prefix = f"{ROOT_PREFIX}{owner_pid}-"
    state = default_state_dir()
    dirs = sorted(p.name for p in state.glob(prefix + "*")) if state.is_dir() else []
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if prefix in line]
    cgs = []
    from tr.envs.cgroups import own_cgroup
    for base in (Path("/sys/fs/cgroup/pids/tr-sandboxes"),
                 Path("/sys/fs/cgroup/freezer/tr-sandboxes"),
                 Path("/sys/fs/cgroup/memory", own_cgroup("memory"), "tr-sandboxes"),
                 Path("/sys/fs/cgroup/cpu", own_cgroup("cpu"))):
        if base.is_dir():
            cgs += [str(p) for p in base.glob(prefix + "*")]
    containers, images = [], []
    try:
        import docker
        from tr.envs.workspace import _proc_start_time
        client = docker.from_env()
        owner = f"{owner_pid}-{_proc_start_time(owner_pid)}"
        containers = [c.id for c in client.containers.list(
            all=True, filters={"label": f"tr.owner={owner}"})]
        images = [i.id for i in client.images.list(filters={"label": f"tr.owner={owner}"})]
    except Exception:  # noqa: BLE001 - no engine: nothing of docker can leak
        pass
    return {"dirs": dirs, "mounts": mounts, "cgroups": cgs, "containers": containers,
            "images": images}


NOTHING = {"dirs": [], "mounts": [], "cgroups": [], "containers": [], "images": []}


# ----------------------------------------------------------------------------- pure parts

def test_capped_output_keeps_head_and_tail_against_slicing_reference():
    rng = random.Random(0)
    for _ in range(200):
        cap = rng.randint(1, 64)
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
        out = CappedOutput(cap)
        i = 0
        while i < len(data):
            j = i + rng.randint(1, 50)
            out.add(data[i:j])
            i = j
        head, tail = cap // 2, cap - cap // 2
        if len(data) <= cap:
            assert not out.truncated and bytes(out.head + out.tail) == data
        else:
            assert out.truncated
            assert bytes(out.head) == data[:head]
            assert bytes(out.tail) == data[len(data) - tail:]
            assert f"[... {len(data) - cap} bytes of output cut ...]" in out.text()
        assert out.total == len(data)


def test_sentinel_found_whatever_the_chunking():
    rng = random.Random(1)
    marker = b"__TR_DONE_abc_"
    for _ in range(300):
        body = bytes(rng.choice(b"ab_\n") for _ in range(rng.randint(0, 60)))
        stream = body + marker + b"17\n" + b"later"
        out = CappedOutput(10_000)
        sc = _Scanner(out, marker)
        i = 0
        while i < len(stream) and not sc.done:
            j = i + rng.randint(1, 7)
            sc.feed(stream[i:j])
            i = j
        assert sc.done and sc.exit_code == 17
        assert bytes(out.head + out.tail) == body
        assert sc.leftover + stream[i:] == b"later"


def test_bad_inputs_get_clear_errors():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=0)
    with pytest.raises(ValueError, match="workdir"):
        SandboxConfig(workdir="app")
    with pytest.raises(ValueError, match="unknown backend 'podman'"):
        make_sandbox("podman", SandboxConfig())
    with pytest.raises(SandboxError, match="not started"):
        make_sandbox("local").run("true")


# ----------------------------------------------------------------------------- the shell

def test_shell_state_persists_across_commands(sb):
    assert sb.run("cd /tmp && export FOO=bar && declare -a ARR=(x y z) && greet() { echo hi $1; }"
                  ).exit_code == 0
    r = sb.run('echo "$PWD $FOO ${ARR[2]}"; greet you')
    assert r.output == "/tmp bar z\nhi you\n" and r.exit_code == 0


def test_exit_code_and_combined_output(sb):
    r = sb.run("echo out; echo err >&2; exit_code() { return 7; }; exit_code")
    assert r.exit_code == 7 and "out\n" in r.output and "err\n" in r.output
    assert not r.timed_out and not r.truncated


def test_shell_exit_is_reported_and_a_new_shell_follows(sb):
    sb.run("echo kept > /app/kept")
    r = sb.run("exit 3")
    assert r.exit_code == 3
    r = sb.run("cat /app/kept")
    assert r.output == "kept\n" and r.shell_restarted


def test_builtin_infinite_loop_times_out_and_shell_survives(sb):
    sb.run("X=41")
    r = sb.run("while :; do :; done", timeout_s=1)
    assert r.timed_out and r.exit_code is None and "timed out" in r.output
    r = sb.run("echo $((X+1))")
    assert r.output == "42\n" and not r.shell_restarted
    assert sb.run("sleep 30", timeout_s=1).timed_out
    assert sb.run("echo clean").output == "clean\n"     # no "Killed" job notice carried over


def test_timeout_kills_the_whole_tree_but_not_earlier_jobs(sb):
    keep, bg, fg = unique_sleep(), unique_sleep(), unique_sleep()
    sb.run(f"sleep {keep} &")
    r = sb.run(f"sleep {bg} & (sleep {bg} &) ; sh -c 'sleep {fg}'", timeout_s=1)
    assert r.timed_out
    assert wait_until(lambda: not host_pids_with(bg) and not host_pids_with(fg))
    assert host_pids_with(keep), "the job of an earlier command must survive"
    assert "sleep" in sb.run("jobs").output
    sb.close()
    assert wait_until(lambda: not host_pids_with(keep))


def test_background_job_left_behind_dies_with_the_sandbox(backend):
    token = unique_sleep()
    with make_sandbox(backend, SandboxConfig(**SMALL)) as box:
        r = box.run(f"sleep {token} & disown; nohup sleep {token} >/dev/null 2>&1 & echo ok")
        assert r.output.strip().endswith("ok") and not r.timed_out
        assert wait_until(lambda: len(host_pids_with(token)) == 2)
    assert wait_until(lambda: not host_pids_with(token))


def test_interactive_programs_get_end_of_file(sb):
    r = sb.run('read x; echo "read=$?"; cat; python3 -c "input()" 2>&1 | tail -1', timeout_s=20)
    assert not r.timed_out
    assert "read=1" in r.output and "EOFError" in r.output


def test_fork_bomb_is_contained(backend):
    with make_sandbox(backend, SandboxConfig(**{**SMALL, "pids": 64})) as box:
        before = len(os.listdir("/proc"))
        r = box.run("bomb() { bomb | bomb & }; bomb; sleep 30", timeout_s=3)
        assert r.timed_out
        assert len(os.listdir("/proc")) < before + 200   # the host never saw the bomb grow
        r = box.run("ls / | wc -l; echo alive", timeout_s=20)
        assert r.exit_code == 0 and "alive" in r.output


def test_memory_cpu_and_file_size_limits_hold(backend):
    config = SandboxConfig(**{**SMALL, "memory_mb": 256, "cpu_time_s": 2, "file_size_mb": 1})
    with make_sandbox(backend, config) as box:
        r = box.run("python3 -c \"x = b'x' * (800 * 1024 * 1024); print('alloc' + 'ated')\"",
                    timeout_s=60)
        assert r.exit_code not in (0, None) and "allocated" not in r.output, r
        r = box.run("python3 -c 'while True: pass'", timeout_s=60)
        assert not r.timed_out and r.exit_code == 128 + signal.SIGXCPU, r   # RLIMIT_CPU
        r = box.run("head -c 5000000 /dev/zero > /tmp/big; stat -c %s /tmp/big")
        assert r.output.split()[-1] == str(1024 * 1024), r                  # RLIMIT_FSIZE
        assert box.run("echo still here").output == "still here\n"


def test_gigabyte_of_output_is_capped_in_bounded_memory(sb):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sb.run("printf START; head -c 1000000000 /dev/zero; printf END", timeout_s=120)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert r.exit_code == 0 and not r.timed_out
    assert r.truncated and r.output_bytes == 1_000_000_008
    assert r.output.startswith("START") and r.output.endswith("END")
    assert len(r.output.encode()) < 10_000 + 100
    assert grown_mb < 64, f"reading 1 GB grew the host process by {grown_mb:.0f} MB"


def test_filling_the_disk_stops_at_the_limit(sb, backend):
    r = sb.run("dd if=/dev/zero of=/app/fill bs=1M count=200 2>&1; echo rc=$?", timeout_s=60)
    assert "No space left" in r.output and "rc=0" not in r.output
    size = int(sb.run("stat -c %s /app/fill").output)
    assert size <= 64 * 1024 * 1024
    r = sb.run("head -c 10000000 /dev/zero > /tmp/more; echo rc=$?")
    assert "rc=1" in r.output                     # /tmp shares the same limit
    if backend == "local":                        # and so does /dev/shm
        r = sb.run("head -c 10000000 /dev/zero > /dev/shm/more; echo rc=$?; rm /dev/shm/more")
        assert "rc=1" in r.output
    r = sb.run("rm -f /app/fill /tmp/more && echo fine > /app/x && cat /app/x")
    assert r.output == "fine\n"


def test_writes_outside_the_writable_areas_do_not_reach_the_host(sb, backend):
    token = secrets.token_hex(6)
    targets = [f"/usr/tr-{token}", f"/usr/bin/tr-{token}", f"/tr-{token}", f"/var/tr-{token}",
               f"/dev/tr-{token}", f"/etc/tr-{token}"]
    r = sb.run("; ".join(f"{{ echo x > {t}; }} 2>/dev/null && echo WROTE {t}" for t in targets))
    for t in targets:
        assert not os.path.exists(t), f"{t} appeared on the host"
    if backend == "local":   # read-only system folders and root; /etc is the sandbox's copy
        assert r.output.split() == ["WROTE", f"/etc/tr-{token}"]


def test_host_paths_cannot_be_read(sb):
    secret = Path("/root") / f".tr-secret-{secrets.token_hex(6)}"
    secret.write_text("host secret\n")
    try:
        r = sb.run(f"cat {secret}")
        assert r.exit_code != 0 and "host secret" not in r.output
        r = sb.run(f"cat {REPO}/LAYOUT.md; ls /work")
        assert r.exit_code != 0 and "Imports run downward" not in r.output
        r = sb.run("find / -name '.tr-secret-*' -not -path '/proc/*' 2>/dev/null", timeout_s=60)
        assert r.output == ""
        visible = set(sb.run("ls -A /root").output.split())
        host_root = {p.name for p in Path("/root").iterdir()}
        assert not visible & host_root, f"host /root entries visible: {visible & host_root}"
    finally:
        secret.unlink()


def test_no_connection_to_the_host_loopback(sb):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except socket.timeout:
                pass
    t = threading.Thread(target=accept)
    t.start()
    try:
        host_ips = {"127.0.0.1", socket.gethostbyname(socket.gethostname()), "172.17.0.1"}
        script = "; ".join(
            f"python3 -c \"import socket; socket.create_connection(('{ip}', {port}), timeout=2)"
            f"\" >/dev/null 2>&1 && echo CONNECTED {ip}" for ip in sorted(host_ips))
        r = sb.run(script, timeout_s=30)
        assert "CONNECTED" not in r.output
    finally:
        stop.set()
        t.join()
        server.close()
    assert not accepted


def test_killing_pid_1_changes_nothing(sb):
    r = sb.run("kill -9 1; kill -TERM 1; kill -INT 1; echo after=$?")
    r = sb.run("echo alive; ls /app >/dev/null && echo fs-ok")
    assert r.output == "alive\nfs-ok\n" and not r.shell_restarted


# ----------------------------------------------------------------------------- files

def manifest(box, roots="/app /root /tmp") -> str:
    """Independent record of a tree: path, type, mode, link target, size and content hash."""
    r = box.run(f"cd / && find {roots} -mindepth 1 -printf '%p %y %m %l %s %n %T@\\n' | sort; "
                f"find {roots} -type f -exec md5sum {{}} + | sort", timeout_s=60)
    assert r.exit_code == 0, r.output
    return r.output


def populate(box) -> None:
    r = box.run(textwrap.dedent("""\
        mkdir -p /app/src/deep /app/empty /root/.cfg /tmp/t
        echo hello > /app/src/a.txt && chmod 600 /app/src/a.txt
        printf 'x%.0s' $(seq 1 5000) > /app/src/deep/big
        echo '#!/bin/sh' > /app/run.sh && chmod 755 /app/run.sh
        ln -s src/a.txt /app/rel-link && ln -s /app/src /app/abs-link && ln -s /nope /app/dangling
        ln /app/src/a.txt /app/hard && chmod 2750 /app/empty && echo k > /root/.cfg/k
        echo t > /tmp/t/f
        """))
    assert r.exit_code == 0, r.output


def test_snapshot_change_restore_gives_back_files_modes_and_links(sb):
    populate(sb)
    before = manifest(sb)
    snap = sb.snapshot()
    assert isinstance(snap, Snapshot)
    sb.run("rm -rf /app/src/deep && echo changed > /app/src/a.txt && chmod 644 /app/run.sh && "
           "rm /app/rel-link && ln -s /etc /app/rel-link && touch /app/new /root/new /tmp/new && "
           "chmod 700 /app/empty")
    assert manifest(sb) != before
    sb.restore(snap)
    assert manifest(sb) == before
    assert sb.run("cat /app/hard; echo x >> /app/hard; cat /app/src/a.txt").output == \
        "hello\nhello\nx\n", "hard links stay hard links"


EDITS = [
    "echo {r} > /app/f{k}",
    "echo {r} >> /app/src/a.txt",
    "printf {c} | dd of=/app/src/deep/big bs=1 seek={k} count=1 conv=notrunc 2>/dev/null",
    "chmod 6{k}{k} /app/f{k} 2>/dev/null; chmod 7{k}5 /app/run.sh",
    "ln -sfn /app/f{k} /app/rel-link",
    "mkdir -p /app/d{k}/e && echo {r} > /app/d{k}/e/g",
    "rm -rf /app/d{k} /app/f{k}",
    "mv /app/f{k} /app/moved{k} 2>/dev/null; true",
    "ln /app/run.sh /app/hl{k} 2>/dev/null; true",
    "touch -d '2001-01-0{k} 00:00' /app/src/a.txt",
    "rm -f /app/fifo{k}; mkfifo /app/fifo{k}",
    "echo {r} > /root/.cfg/k; echo {r} > /tmp/t/f",
]


def test_incremental_snapshots_restore_exactly_under_random_edits():
    """Random edits (same-size in-place writes right after a snapshot included), snapshots and
    restores of random earlier snapshots: each restore equals the manifest taken with it."""
    rng = random.Random(7)
    with make_sandbox("local", SandboxConfig(**SMALL)) as box:
        populate(box)
        taken = []
        for step in range(60):
            edit = rng.choice(EDITS).format(k=rng.randint(1, 4), r=rng.random(),
                                            c=rng.choice("XYZ"))
            assert box.run(edit).exit_code == 0, edit
            if rng.random() < 0.3:
                taken.append((box.snapshot(), manifest(box)))
                if rng.random() < 0.5:     # edit within the same clock tick as the snapshot
                    box.run("printf Q | dd of=/app/src/a.txt bs=1 count=1 conv=notrunc "
                            "2>/dev/null")
            if taken and rng.random() < 0.3:
                snap, expected = rng.choice(taken)
                box.restore(snap)
                assert manifest(box) == expected, f"step {step}: restore differs"
        assert len(taken) > 5


def test_local_etc_copy_snapshots_deletions_and_replaced_folders():
    """/etc is an overlay of the host's: whiteouts and opaque folders must survive snapshots."""
    with make_sandbox("local", SandboxConfig(**SMALL)) as box:
        box.snapshot()                                  # the next one is incremental
        box.run("rm /etc/hostname && rm -rf /etc/apt && mkdir /etc/apt && echo n > /etc/apt/new"
                " && echo added > /etc/added")
        expected = box.run("ls /etc/apt; ls /etc/hostname 2>&1; cat /etc/added").output
        snap = box.snapshot()
        box.run("echo back > /etc/hostname; rm -rf /etc/apt /etc/added")
        box.restore(snap)
        assert box.run("ls /etc/apt; ls /etc/hostname 2>&1; cat /etc/added").output == expected
        assert expected.startswith("new\n") and "No such file" in expected
        assert Path("/etc/hostname").exists() and Path("/etc/apt").is_dir()   # host untouched


def test_fork_diverges_without_touching_its_parent(sb):
    populate(sb)
    snap = sb.snapshot()
    before = manifest(sb)
    with sb.fork(snap) as child:
        assert manifest(child) == before
        child.run("echo fork > /app/src/a.txt && rm /app/run.sh && touch /root/forked")
        assert manifest(sb) == before
        sb.run("echo parent > /app/parent-only")
        assert child.run("ls /app/parent-only 2>&1").exit_code != 0
        assert child.run("cat /app/src/a.txt").output == "fork\n"


def test_restore_into_another_sandbox_of_the_same_backend(backend):
    config = SandboxConfig(**SMALL, persist_snapshots=True)
    from tr.envs.backends import discard_snapshot
    with make_sandbox(backend, config) as first:
        first.run("echo 42 > /app/answer && mkdir -p /root/x")
        snap = first.snapshot()
    try:
        with make_sandbox(backend, config) as second:
            second.restore(snap)
            assert second.run("cat /app/answer; ls -d /root/x").output == "42\n/root/x\n"
    finally:
        discard_snapshot(snap)
    assert not Path(snap.location).exists()


def test_copy_in_out_and_write_file_roundtrip(sb, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.py").write_text("print(1)\n")
    (src / "x.sh").write_text("echo x\n")
    (src / "x.sh").chmod(0o750)
    sb.copy_in(src, "/app/proj")
    sb.write_file("/app/proj/new/deep.txt", "deep", mode=0o640)
    assert sb.run("stat -c %a /app/proj/x.sh /app/proj/new/deep.txt; cat /app/proj/sub/f.py"
                  ).output == "750\n640\nprint(1)\n"
    sb.copy_out("/app/proj", tmp_path / "back")
    assert (tmp_path / "back" / "new" / "deep.txt").read_text() == "deep"
    assert (tmp_path / "back" / "x.sh").stat().st_mode & 0o777 == 0o750
    assert sb.read_file("/app/proj/sub/f.py") == b"print(1)\n"


def test_planted_links_never_lead_file_transfers_to_the_host(sb, tmp_path):
    token = secrets.token_hex(6)
    sb.run(f"ln -s /root /app/to-root; ln -s {REPO}/LAYOUT.md /app/layout; "
           f"ln -s /etc/hostname /app/name; mkfifo /app/fifo")
    sb.write_file(f"/app/to-root/{token}", "inside")            # lands in the sandbox's /root
    assert not Path(f"/root/{token}").exists()
    assert sb.run(f"cat /root/{token}").output == "inside"
    sb.copy_out("/app/layout", tmp_path / "layout")            # a link stays a link
    assert (tmp_path / "layout").is_symlink()
    assert sb.copy_out("/app", tmp_path / "app", keep_symlinks=False) is not None
    assert not (tmp_path / "app" / "layout").exists()          # skipped, not followed
    with pytest.raises(SandboxError):
        sb.read_file("/app/fifo")                                # never blocks on a FIFO
    with pytest.raises(SandboxError, match="absolute"):
        sb.write_file("relative/path", "x")


# ----------------------------------------------------------------------------- cleanup

CHILD = textwrap.dedent("""\
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if pytest runs under nohup
    from tr.envs.backends import make_sandbox
    from tr.envs.sandbox import SandboxConfig
    backend, token, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    with make_sandbox(backend, SandboxConfig(memory_mb=256, disk_mb=32)) as box:
        box.run(f"sleep {token} &")
        box.snapshot()
        print("READY", flush=True)
        if mode == "raise":
            raise RuntimeError("boom")
        box.run("sleep 60", timeout_s=120)
""")


@pytest.mark.parametrize("mode", ["sigint", "raise"])
def test_interrupted_or_failing_episode_leaves_nothing(backend, mode):
    token = unique_sleep()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, backend, token, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    if mode == "sigint":
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert ("KeyboardInterrupt" if mode == "sigint" else "boom") in err
    assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(proc.pid) == NOTHING


def test_two_hundred_short_episodes_leave_nothing():
    """200 local episodes (start, 2 commands, snapshot, change, restore, close)."""
    token = unique_sleep()
    for i in range(200):
        with make_sandbox("local", SandboxConfig(**SMALL)) as box:
            box.run(f"echo {i} > /app/i; sleep {token} &")
            snap = box.snapshot()
            box.run("echo changed > /app/i")
            if i % 10 == 0:
                box.restore(snap)
                assert box.run("cat /app/i").output == f"{i}\n"
    assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(os.getpid()) == NOTHING


def test_two_hundred_docker_episodes_leave_nothing(docker_problem):
    """200 docker episodes, 8 at once (~0.4 s each that way; sequentially ~1 s): start, 2
    commands, close; every 25th also snapshot (commit), change, restore."""
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    from concurrent.futures import ThreadPoolExecutor
    token = unique_sleep()

    def episode(i: int) -> str:
        with make_sandbox("docker", SandboxConfig(**SMALL)) as box:
            box.run(f"echo {i} > /app/i; sleep {token} &")
            if i % 25 == 0:
                snap = box.snapshot()
                box.run("echo changed > /app/i")
                box.restore(snap)
            return box.run("cat /app/i").output

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(episode, range(200)))
    assert outs == [f"{i}\n" for i in range(200)]
    assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(os.getpid()) == NOTHING


def test_docker_snapshot_retries_a_freeze_that_fails_under_load(docker_problem, monkeypatch):
    """The engine's "OCI runtime pause failed: unable to freeze" (seen once in the 200-episode test
    on 2 busy cores: the cgroup freezer could not stop every task in time) cannot be provoked on
    demand, so the real container's first two pauses raise it; the snapshot retries, commits,
    unpauses and restores. Any other pause error, or a freeze that keeps failing, is a SandboxError
    naming the container, and the container is left running."""
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    import docker

    def failing(times, message):
        calls = []

        def pause():
            calls.append(1)
            if len(calls) <= times:
                raise docker.errors.APIError("500 Server Error", explanation=message)
            return real()
        return pause, calls

    with make_sandbox("docker", SandboxConfig(**SMALL)) as box:
        box.run("echo kept > /app/f")
        real = box.container.pause
        monkeypatch.setattr(box.container, "pause", failing(2, "Cannot pause container x: OCI runtime "
                                                               "pause failed: unable to freeze: unknown")[0])
        snap = box.snapshot()
        box.container.reload()
        assert box.container.status == "running"
        box.run("echo changed > /app/f")
        box.restore(snap)
        assert box.run("cat /app/f").output == "kept\n"
        for times, message in ((1, "no such container"), (99, "unable to freeze")):
            pause, calls = failing(times, message)
            monkeypatch.setattr(box.container, "pause", pause)
            monkeypatch.setattr(type(box), "PAUSE_TRIES", 3)
            with pytest.raises(SandboxError, match=f"cannot pause container {box.container.short_id}"):
                box.snapshot()
            assert len(calls) == (1 if times == 1 else 3)
            assert box.run("echo alive").output == "alive\n"
    assert leftovers(os.getpid()) == NOTHING


def test_result_type_is_the_contract(sb):
    r = sb.run("true")
    assert isinstance(r, CommandResult) and r.exit_code == 0 and r.duration_s >= 0


def test_without_cgroups_timeouts_still_kill_the_tree(monkeypatch):
    """Hosts where cgroups are not writable: the /proc-scan tracker and rlimits take over."""
    from tr.envs import cgroups
    monkeypatch.setattr(cgroups, "_V1_OK", False)
    keep, fg = unique_sleep(), unique_sleep()
    with make_sandbox("local", SandboxConfig(**SMALL)) as box:
        assert box.tree is None
        box.run(f"X=1; sleep {keep} &")
        r = box.run(f"sleep {fg} & sleep {fg}", timeout_s=1)
        assert r.timed_out
        assert wait_until(lambda: not host_pids_with(fg))
        assert host_pids_with(keep)
        assert box.run("echo $X; ulimit -v").output == f"1\n{512 * 1024}\n"
    assert wait_until(lambda: not host_pids_with(keep))
    assert leftovers(os.getpid()) == NOTHING


def test_owner_killed_with_sigkill_is_cleaned_up(backend):
    """kill -9 of the owner: locally --die-with-parent stops the processes at once; the folders,
    mounts, cgroups (and containers) are reaped by the next process that starts a sandbox."""
    token = unique_sleep()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, backend, token, "sigint"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    proc.kill()
    proc.wait()
    if backend == "local":
        assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(proc.pid) != NOTHING                 # nobody could clean up yet
    from tr.envs.local import reap_stale_cgroups
    from tr.envs.workspace import reap_stale
    reap_stale(default_state_dir())
    reap_stale_cgroups()
    if backend == "docker":
        from tr.envs.docker_sandbox import reap_stale_docker
        from tr.envs.images.base import docker_client
        client = docker_client()
        reap_stale_docker(client)
        client.close()
    assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(proc.pid) == NOTHING


# ----------------------------------------------------------------------------- two processes

def reap_everything() -> None:
    """What a process starting its first sandbox does: every reaper, local and docker."""
    from tr.envs.local import reap_stale_cgroups
    from tr.envs.workspace import reap_stale
    reap_stale(default_state_dir())
    reap_stale_cgroups()
    try:
        from tr.envs.images.base import docker_client
        client = docker_client()
    except Exception:  # noqa: BLE001 - no engine: nothing of docker to reap
        return
    try:
        from tr.envs.docker_sandbox import reap_stale_docker
        reap_stale_docker(client)
    finally:
        client.close()


HOLDER = textwrap.dedent("""\
    import sys
    from tr.envs.backends import make_sandbox
    from tr.envs.sandbox import SandboxConfig
    backend, token = sys.argv[1], sys.argv[2]
    with make_sandbox(backend, SandboxConfig(memory_mb=256, disk_mb=32)) as box:
        box.run(f"echo kept > /app/x; sleep {token} &")
        box.snapshot()
        print("READY", flush=True)
        sys.stdin.readline()
        print(box.run("cat /app/x").output.strip(), flush=True)
""")


def test_reapers_spare_live_sandboxes_of_another_process(backend):
    """Another live process's sandbox (folders, mounts, cgroups, container, snapshot image) is
    not reaped by this process's stale-resource reapers; it keeps working."""
    token = unique_sleep()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, backend, token],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        before = leftovers(proc.pid)
        assert before["dirs"] and before["mounts"]
        assert before["containers"] and before["images"] if backend == "docker" \
            else before["cgroups"]
        reap_everything()
        assert leftovers(proc.pid) == before
        assert host_pids_with(token)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.split() == ["kept"]
    assert wait_until(lambda: not host_pids_with(token))
    assert leftovers(proc.pid) == NOTHING


CHURN = textwrap.dedent("""\
    import sys, time
    from tr.envs.docker_sandbox import _owner_labels
    from tr.envs.images.base import docker_client, ensure_base_image
    client = docker_client()
    image = ensure_base_image(client=client)
    live, cycles = [], 0
    print("READY", flush=True)
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline or cycles < 15:
        live.append(client.api.create_container(image, command=["true"], network_disabled=True,
                                                labels=_owner_labels("sandbox"))["Id"])
        if len(live) > 6:
            client.api.remove_container(live.pop(0))   # fails if anyone else removed it
            cycles += 1
    for cid in live:
        client.api.remove_container(cid)
    print("CYCLES", cycles, flush=True)
""")


def test_reaping_races_no_live_owner_of_another_process(docker_problem):
    """Two processes at once: one keeps creating and removing its labelled containers, the other
    reaps stale resources in a loop.  The reaper never fails ("No such container" from a
    container removed between listing and inspecting it) and never removes a live one."""
    if docker_problem:
        pytest.skip(f"NO DOCKER ENGINE ANSWERS: {docker_problem}")
    from tr.envs.docker_sandbox import reap_stale_docker
    from tr.envs.images.base import docker_client
    proc = subprocess.Popen([sys.executable, "-c", CHURN, "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    client = docker_client()
    reaps = 0
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        while proc.poll() is None:
            reap_stale_docker(client)    # may reap real leftovers of dead processes: any count
            reaps += 1
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        client.close()
    assert proc.returncode == 0, err
    assert int(out.split()[-1]) >= 15 and reaps >= 5, (out, reaps)
    assert leftovers(proc.pid) == NOTHING


IGNORES_SIGINT = textwrap.dedent("""\
    import signal, sys
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # as under nohup or in a script's background job
    from tr.envs.backends import make_sandbox
    from tr.envs.sandbox import SandboxConfig
    with make_sandbox("local", SandboxConfig(memory_mb=256, disk_mb=32)) as box:
        box.run("X=41")
        loop = box.run("while :; do :; done", timeout_s=1)
        after = box.run("echo $((X+1))")
        print(loop.timed_out, after.output.strip(), after.shell_restarted)
""")


def test_owner_ignoring_sigint_does_not_hand_that_to_the_sandbox_shell():
    """Signal dispositions are inherited through exec: an owner started with SIGINT ignored must
    not give the sandbox's bash an ignored SIGINT (it could not break a builtin loop on a
    timeout and would be replaced, losing its state)."""
    r = subprocess.run([sys.executable, "-c", IGNORES_SIGINT], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "42", "False"], r.stdout
