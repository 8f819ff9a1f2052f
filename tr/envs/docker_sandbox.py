"""The Docker sandbox (docker-py): a container per episode with the same semantics as local.

* Container from the task image (default: the locally built ``tr-base`` image), network ``none``
  unless ``config.network``, ``mem_limit``/``memswap``, ``pids_limit``, ``nano_cpus``,
  RLIMIT_FSIZE/CPU, ``no-new-privileges``, NET_RAW and MKNOD dropped.  PID 1 is a tiny ``sh``
  loop (PID 1 ignores signals from inside, so ``kill -9 1`` or ``pkill sleep`` cannot stop the
  container, and it reaps orphans).
* The writable task areas (workdir, ``/root``, ``/tmp``, ``/logs``) are bind mounts of a
  size-limited host tmpfs (:mod:`tr.envs.workspace`), seeded from the image's own content; the
  rest of the root filesystem is the container's writable layer (bounded per file by
  RLIMIT_FSIZE only: the fuse-overlayfs driver here has no ``storage_opt size``).
* The persistent shell is ``bash`` in a ``docker exec`` with an attached socket; per-command
  process trees are tracked with child cgroups of the container's own cgroup (pids + freezer,
  cgroup v1, :mod:`tr.envs.cgroups`), exactly as locally.
* ``snapshot`` = ``docker commit`` (root filesystem; the container is paused meanwhile) + a copy of
  the areas.  Process memory and running processes are NOT preserved -- as in Recovery-Bench's
  pre-verifier commit, a restored or forked sandbox starts with a new shell.  ``restore`` replaces
  the container with one from the snapshot image; ``fork`` starts a new one.  Every container and
  snapshot image is labelled ``tr.managed`` and removed on close (persistent snapshots: by
  :func:`tr.envs.sandbox.discard_snapshot`).
* Every container and image carries ``tr.owner`` (``<pid>-<start time>`` of the process that made
  it) and ``tr.scope`` (boot id + pid namespace).  The reaper run at a process's first start
  removes only those whose owner is known dead in this scope; other live processes' sandboxes
  (two test runs, a training job and a test run) are never touched.

Known exposure (not closed): the agent is root in its container, and the container's root
filesystem (``/usr``, ``/lib``, ``/bin``) is its writable layer.  So the agent can replace what the
verifier runs on besides the read-only mounts: the dynamic loader and system libraries that the
verifier's interpreter at ``/opt/tr/python`` loads (libc, libm, libssl...), ``/bin/sh`` and
``/bin/bash`` that start the verifier command, and every program the tests call (``python3``,
``git``, ``gcc``).  A self-contained interpreter (host loader + libraries mounted read-only and the
interpreter started through that loader) would not be enough alone: the tests themselves run the
container's programs and the agent's scripts as root next to pytest, which can rewrite the
results file after pytest writes it -- the same exposure as "code of the agent that the tests
import" (:mod:`tr.envs.protected`), shared with Terminal-Bench's own harness.  Closing it needs
the agent to run unprivileged (its files and the system read-only to it) and the tests to run
the agent's programs unprivileged too, while only the verifier (root) writes the results; the
built-in suite's system-config tasks expect a root agent (``/etc`` edits, ``chown``), as on the
local backend, so this is a design change for a later issue, not done here.  Locally the system
directories are read-only host mounts, so only the agent-code route remains there.
"""

from __future__ import annotations

import io
import os
import secrets
import select
import shutil
import socket
import tarfile
import threading
import time
from pathlib import Path

from tr.envs import cgroups
from tr.envs.images.base import LABEL, docker_client, ensure_base_image
from tr.envs.sandbox import (CommandResult, SandboxConfig, ShellSandbox, SandboxError, Snapshot,
                             snapshot_fields)
from tr.envs.shell import ShellProcess, ShellSession, run_to_eof
from tr.envs.workspace import (HostWorkspace, copy_dir, default_state_dir, host_scope,
                               owner_id, owner_is_dead, reap_stale)

OWNER_LABEL = "tr.owner"
SNAP_REPO = "tr-snap"
KEEPER = "trap '' TERM INT HUP QUIT USR1 USR2; while :; do sleep 3600 & wait; done"
SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_seed_lock = threading.Lock()
_reaped = False


SCOPE_LABEL = "tr.scope"


def _owner_labels(kind: str) -> dict:
    """Labels of a container/image this process makes: what it is, who owns it, where."""
    return {LABEL: kind, OWNER_LABEL: owner_id(), SCOPE_LABEL: host_scope()}


def remove_image(image: str) -> None:
    import docker
    client = docker_client()
    try:
        client.images.remove(image, force=True, noprune=False)
    except docker.errors.ImageNotFound:
        pass
    finally:
        client.close()


def _stale(labels: dict | None) -> bool:
    labels = labels or {}
    return owner_is_dead(labels.get(OWNER_LABEL), labels.get(SCOPE_LABEL))


def reap_stale_docker(client) -> int:
    """Remove containers and non-persistent snapshot images whose owner process is dead (killed
    -9 before it could clean up).  Resources of live owners -- other processes using sandboxes
    right now -- are never touched.  Safe against concurrent owners and reapers: one listing
    call each (no per-container inspect that a concurrent removal turns into "No such
    container"), and a resource already gone or being removed is skipped.  Returns the number
    removed."""
    import docker
    removed = 0
    for c in client.api.containers(all=True, filters={"label": LABEL}):
        labels = c.get("Labels") or {}
        if labels.get(LABEL) in ("sandbox", "seed") and _stale(labels):
            try:
                client.api.remove_container(c["Id"], force=True)
                removed += 1
            except docker.errors.APIError:   # gone meanwhile, or already being removed
                pass
    for img in client.api.images(filters={"label": f"{LABEL}=snapshot"}):
        labels = img.get("Labels") or {}
        if labels.get("tr.persistent") != "1" and _stale(labels):
            try:
                client.api.remove_image(img["Id"], force=True)
                removed += 1
            except docker.errors.APIError:
                pass
    return removed


class SocketIO:
    """A docker exec attach socket: writes raw, reads demultiplexed stdout/stderr frames."""

    def __init__(self, sock_wrapper):
        self._wrapper = sock_wrapper
        self.sock: socket.socket = sock_wrapper._sock
        self.sock.setblocking(False)
        self.buf = bytearray()
        self.eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_available(self) -> bytes | None:
        if not self.eof:
            try:
                data = self.sock.recv(1 << 20)
                if data:
                    self.buf += data
                else:
                    self.eof = True
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.eof = True
        out = bytearray()
        while len(self.buf) >= 8:
            size = int.from_bytes(self.buf[4:8], "big")
            if len(self.buf) < 8 + size:
                break
            if self.buf[0] in (1, 2):
                out += self.buf[8:8 + size]
            del self.buf[:8 + size]
        if out:
            return bytes(out)
        return None if self.eof else b""

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = self.sock.send(view)
                view = view[n:]
            except (BlockingIOError, InterruptedError):
                select.select([], [self.sock], [], 1.0)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self._wrapper.close()
        except Exception:
            pass


class DockerSandbox(ShellSandbox):
    """A Docker sandbox (see module doc).  Use as a context manager."""

    backend = "docker"

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.state_dir = Path(config.state_dir) if config.state_dir else default_state_dir()
        self.areas = {config.workdir: "app", "/root": "home", "/tmp": "tmp", "/logs": "logs"}
        if config.workdir in ("/root", "/tmp", "/logs", "/"):
            raise ValueError(f"SandboxConfig.workdir {config.workdir!r} collides with a "
                             "built-in writable area")
        self.client = None
        self.container = None
        self.ws: HostWorkspace | None = None
        self.tree: cgroups.CgroupTree | None = None
        self.session: ShellSession | None = None
        self.images: list[str] = []      # snapshot images this sandbox made (non-persistent)
        self.image: str | None = None
        self._fresh_count = 0
        self._started = False
        self._closed = False
        self._python = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, _from_snapshot: Snapshot | None = None) -> "DockerSandbox":
        global _reaped
        if self._started:
            return self
        self._started = True
        self._track()
        try:
            self.client = docker_client()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if not _reaped:
                _reaped = True
                reap_stale_docker(self.client)
                reap_stale(self.state_dir)
            self.ws = HostWorkspace(self.areas, self.config.disk_mb, self.state_dir)
            if _from_snapshot is not None:
                self.image = _from_snapshot.image
                self.ws.load(Path(_from_snapshot.location))
            else:
                self.image = self.config.image or ensure_base_image(client=self.client)
                seed = self._seed(self.image)
                for name in self.areas.values():
                    if (seed / name).is_dir():
                        copy_dir(str(seed / name), self.ws.host_dir(name))
            self._create_container()
        except BaseException:
            self.close()
            raise
        return self

    def _seed(self, image: str) -> Path:
        """The image's own content of the area paths, extracted once per image id."""
        import docker
        img = self.client.images.get(image)
        dest = self.state_dir / "docker-seed" / img.id.replace(":", "-")
        with _seed_lock:
            if dest.is_dir():
                return dest
            tmp = Path(str(dest) + f".{os.getpid()}.{secrets.token_hex(3)}")
            tmp.mkdir(parents=True)
            c = self.client.containers.create(img.id, command=["true"], network_mode="none",
                                              labels=_owner_labels("seed"))
            try:
                for path, name in self.areas.items():
                    (tmp / name).mkdir()
                    try:
                        stream, _ = c.get_archive(path)
                    except docker.errors.NotFound:
                        continue
                    _extract(b"".join(stream), tmp / name, strip_top=True, keep_symlinks=True)
            finally:
                c.remove(force=True)
            try:
                os.rename(tmp, dest)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
            return dest

    def _create_container(self) -> None:
        import docker
        cfg = self.config
        mb = 1024 * 1024
        from tr.envs.protected import python_mounts
        exe, binds = python_mounts()
        mounts = [docker.types.Mount(target=path, source=self.ws.host_dir(name), type="bind")
                  for path, name in self.areas.items()]
        mounts += [docker.types.Mount(target=dst, source=src, type="bind", read_only=True)
                   for src, dst in binds]
        self._python = exe
        env = {"PATH": SHELL_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(cfg.env)
        ulimits = [docker.types.Ulimit(name="fsize", soft=cfg.file_size_mb * mb,
                                       hard=cfg.file_size_mb * mb),
                   docker.types.Ulimit(name="cpu", soft=cfg.cpu_time_s, hard=cfg.cpu_time_s + 5),
                   docker.types.Ulimit(name="core", soft=0, hard=0)]
        self.container = self.client.containers.create(
            self.image, command=["/bin/sh", "-c", KEEPER], entrypoint=[], detach=True,
            network_mode="bridge" if cfg.network else "none", hostname="tr-sandbox",
            mem_limit=cfg.memory_mb * mb, memswap_limit=cfg.memory_mb * mb,
            pids_limit=cfg.pids, nano_cpus=int(cfg.cpus * 1e9), ulimits=ulimits,
            mounts=mounts, environment=env, working_dir=cfg.workdir,
            cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE"], security_opt=["no-new-privileges"],
            labels=_owner_labels("sandbox"))
        self.container.start()
        cid = self.container.id
        parents = {c: cgroups.CGROUP_V1 / c / "docker" / cid for c in ("pids", "freezer")}
        if not all(p.is_dir() for p in parents.values()):
            raise SandboxError(f"container cgroups not found at {parents['pids']} (needs the "
                               "cgroupfs driver, cgroup v1, and this process on the engine's "
                               "host); cannot track command process trees")
        self.tree = cgroups.CgroupTree(parents, owned=False)
        self.session = ShellSession(self._spawn_shell, cgroups.CgroupTracker(self.tree),
                                    cfg.output_cap_bytes)
        self.session.ensure_started()

    def _exec_start(self, cmd: list[str], env: dict | None = None, stdin: bool = True):
        api = self.client.api
        ex = api.exec_create(self.container.id, cmd, stdin=stdin, tty=False,
                             environment=env or {}, workdir=self.config.workdir)
        sock = api.exec_start(ex["Id"], socket=True)
        pid = 0
        for _ in range(2000):
            info = api.exec_inspect(ex["Id"])
            pid = info.get("Pid") or 0
            if pid or not info.get("Running", True) and info.get("ExitCode") is not None:
                break
            time.sleep(0.001)
        return ex["Id"], SocketIO(sock), pid

    def _spawn_shell(self) -> ShellProcess:
        # One pipe for stdout and stderr: docker frames the two streams separately and may
        # reorder them, which would put an error message after the end-of-command sentinel.
        exec_id, io_, pid = self._exec_start(
            ["/bin/sh", "-c", "exec /bin/bash --noprofile --norc 2>&1"])
        if not pid:
            raise SandboxError(f"the shell did not start in {self.image} (no /bin/bash?)")
        api = self.client.api

        def exit_code():
            return api.exec_inspect(exec_id).get("ExitCode")

        def kill():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

        return ShellProcess(io=io_, pid=pid, exit_code=exit_code, kill=kill)

    # --- commands --------------------------------------------------------------------------
    def run_fresh(self, command: str, timeout_s: float = 30.0, *, extra_ro_binds=(),
                  env: dict | None = None, clean_env: bool = False) -> CommandResult:
        """``bash -c command`` in a new exec (not the agent's shell), its own cgroup and
        timeout.  Read-only binds must exist at container creation: ``extra_ro_binds`` given
        here are refused."""
        self._require()
        if extra_ro_binds:
            raise SandboxError("docker: extra_ro_binds cannot be added to a running container; "
                               "copy the files in instead")
        if not (timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._fresh_count += 1
        child = f"fresh-{self._fresh_count}"
        self.tree.make_child(child)
        run_env = {"PYTHONPATH": "", "PYTHONSTARTUP": "", "PATH": SHELL_PATH} if clean_env else {}
        run_env.update(env or {})
        t0 = time.monotonic()
        exec_id, io_, pid = self._exec_start(
            ["/bin/sh", "-c", 'read _ && exec /bin/bash --noprofile --norc -c "$1" </dev/null 2>&1',
             "sh", command], env=run_env)
        try:
            if pid:
                self.tree.move(pid, child)
            io_.write(b"go\n")

            def on_timeout():
                self.tree.kill(child)
                self.tree.set_frozen(child, False)

            def main_done():
                done = not pid or not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
                if done:
                    self.tree.kill(child)
                    self.tree.set_frozen(child, False)
                return done

            out, timed_out, _ = run_to_eof(io_, self.config.output_cap_bytes, timeout_s,
                                           on_timeout, is_done=main_done)
        finally:
            io_.close()
            self.tree.kill(child)
            self.tree.remove_child(child)
        code = None
        if not timed_out:
            for _ in range(200):
                info = self.client.api.exec_inspect(exec_id)
                if not info.get("Running"):
                    code = info.get("ExitCode")
                    break
                time.sleep(0.005)
        else:
            out.add(f"\n[command timed out after {timeout_s:g}s; its processes were killed]\n"
                    .encode())
        return CommandResult(output=out.text(), exit_code=code, timed_out=timed_out,
                             truncated=out.truncated, duration_s=time.monotonic() - t0,
                             output_bytes=out.total)

    def _root_exec(self, cmd: list[str]) -> tuple[int, str]:
        r = self.container.exec_run(cmd, user="root", workdir="/")
        return r.exit_code, r.output.decode(errors="replace")

    # --- files -----------------------------------------------------------------------------
    def _in_areas(self, path, follow_last: bool = True) -> bool:
        return self.ws._split(self.ws.canonical(str(path), follow_last)) is not None

    def write_file(self, sandbox_path, data: bytes | str, mode: int = 0o644) -> None:
        self._require()
        if isinstance(data, str):
            data = data.encode()
        if self._in_areas(sandbox_path):
            self.ws.write_file(sandbox_path, data, mode)
            return
        parent, name = os.path.split(self.ws.canonical(str(sandbox_path)))
        code, out = self._root_exec(["mkdir", "-p", parent or "/"])
        if code != 0:
            raise SandboxError(f"write_file {sandbox_path!r}: mkdir failed: {out.strip()}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode & 0o7777
            tar.addfile(info, io.BytesIO(data))
        if not self.container.put_archive(parent or "/", buf.getvalue()):
            raise SandboxError(f"write_file {sandbox_path!r}: docker refused the archive")

    def read_file(self, sandbox_path) -> bytes:
        self._require()
        if self._in_areas(sandbox_path):
            return self.ws.read_file(sandbox_path)
        with tarfile.open(fileobj=io.BytesIO(self._get_archive(sandbox_path))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise SandboxError(f"read_file {sandbox_path!r}: not a regular file")
            return tar.extractfile(member).read()

    def _get_archive(self, sandbox_path) -> bytes:
        import docker
        try:
            stream, _ = self.container.get_archive(str(sandbox_path))
        except docker.errors.NotFound:
            raise SandboxError(f"{sandbox_path!r} does not exist in the sandbox") from None
        return b"".join(stream)

    def copy_in(self, host_path, sandbox_path) -> None:
        self._require()
        host_path = Path(host_path)
        if not host_path.exists():
            raise SandboxError(f"copy_in: host path {host_path} does not exist")
        if self._in_areas(sandbox_path):
            self.ws.copy_in(host_path, sandbox_path)
            return
        target = self.ws.canonical(str(sandbox_path))
        parent, name = os.path.split(target)
        code, out = self._root_exec(["mkdir", "-p", parent or "/"])
        if code != 0:
            raise SandboxError(f"copy_in {sandbox_path!r}: mkdir failed: {out.strip()}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(host_path), arcname=name)
        if not self.container.put_archive(parent or "/", buf.getvalue()):
            raise SandboxError(f"copy_in {sandbox_path!r}: docker refused the archive")

    def copy_out(self, sandbox_path, host_path, *, keep_symlinks: bool = True) -> list[str]:
        self._require()
        if self._in_areas(sandbox_path, follow_last=False):
            return self.ws.copy_out(sandbox_path, host_path, keep_symlinks=keep_symlinks)
        data = self._get_archive(sandbox_path)
        host_path = Path(host_path)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            first = tar.next()
            if first is not None and first.issym():
                if not keep_symlinks:
                    return [first.name]
                host_path.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(first.linkname, host_path)
                return []
            if first is not None and first.isfile():
                host_path.parent.mkdir(parents=True, exist_ok=True)
                host_path.write_bytes(tar.extractfile(first).read())
                os.chmod(host_path, first.mode & 0o7777)
                return []
        host_path.mkdir(parents=True, exist_ok=True)
        return _extract(data, host_path, strip_top=True, keep_symlinks=keep_symlinks)

    def remove_path(self, sandbox_path) -> None:
        self._require()
        if self._in_areas(sandbox_path, follow_last=False):
            self.ws.remove(sandbox_path)
            return
        code, out = self._root_exec(["rm", "-rf", "--", str(sandbox_path)])
        if code != 0:
            raise SandboxError(f"remove_path {sandbox_path!r}: {out.strip()}")

    # --- state -----------------------------------------------------------------------------
    def snapshot(self, *, persist: bool | None = None) -> Snapshot:
        """``docker commit`` of the root filesystem + copy of the areas (paused meanwhile).
        Processes and their memory are not part of it."""
        self._require()
        persist = self.config.persist_snapshots if persist is None else persist
        sid = f"docker-{secrets.token_hex(8)}"
        dest = (self.state_dir / "snapshots" / sid) if persist else (self.ws.root / "snaps" / sid)
        self.container.pause()
        try:
            img = self.container.commit(
                repository=SNAP_REPO, tag=sid, pause=False,
                conf={"Labels": {**_owner_labels("snapshot"),
                                 "tr.persistent": "1" if persist else "0"}})
            if not persist:
                self.images.append(img.id)
            self.ws.save(dest)
        finally:
            self.container.unpause()
        return Snapshot(id=sid, backend="docker", location=str(dest), image=img.id,
                        persistent=persist)

    def restore(self, snapshot) -> None:
        """The container is replaced by one from the snapshot image, the areas are copied back;
        processes are not restored (a new shell starts)."""
        self._require()
        snapshot = snapshot_fields(snapshot)
        if snapshot.backend != "docker":
            raise SandboxError(f"cannot restore a {snapshot.backend!r} snapshot into a docker "
                               "sandbox")
        self.end_session()
        old = self.container
        self.container = None
        if old is not None:
            old.remove(force=True)
        self.ws.load(Path(snapshot.location))
        self.image = snapshot.image
        self._create_container()

    def fork(self, snapshot) -> "DockerSandbox":
        self._require()
        snapshot = snapshot_fields(snapshot)
        if snapshot.backend != "docker":
            raise SandboxError(f"cannot fork a {snapshot.backend!r} snapshot with docker")
        return DockerSandbox(self.config).start(_from_snapshot=snapshot)

    # --- protected verifier hooks -----------------------------------------------------------
    def install_tests(self, tests_dir, mount: str) -> list:
        """Replace ``mount`` by a fresh copy of the tests; drop pytest config/conftest files the
        agent may have planted in the folders above it."""
        self._require()
        self.remove_path(mount)
        parent = os.path.dirname(mount.rstrip("/")) or "/"
        planted = [os.path.join(d, f) for d in _ancestors(parent)
                   for f in ("conftest.py", "pytest.ini", "pyproject.toml", "tox.ini",
                             "setup.cfg", "setup.py")]
        self._root_exec(["rm", "-f", "--", *planted])
        self.copy_in(tests_dir, mount)
        return []

    def reset_dir(self, sandbox_path) -> None:
        self._require()
        if self._in_areas(sandbox_path, follow_last=False):
            self.ws.make_empty_dir(sandbox_path)
        else:
            self.remove_path(sandbox_path)
            self._root_exec(["mkdir", "-p", str(sandbox_path)])

    def verifier_python(self) -> tuple[str, list]:
        """The project interpreter, mounted read-only at creation; checked to still be that
        mount (from the host, in the container's mount table)."""
        self._require()
        from tr.envs.protected import PYTHON_MOUNT
        self.remove_path("/etc/ld.so.preload")
        root = PYTHON_MOUNT
        pid = self.container.attrs.get("State", {}).get("Pid") or \
            self.client.api.inspect_container(self.container.id)["State"]["Pid"]
        mounts = Path(f"/proc/{pid}/mountinfo").read_text().split("\n")
        if not any(len(m.split()) > 4 and m.split()[4] == root for m in mounts):
            raise SandboxError(f"the verifier interpreter mount {root} is gone from the container")
        return self._python, []

    def _release(self) -> None:
        try:
            if self.container is not None:
                self.container.remove(force=True)
        except Exception:
            pass
        for image in self.images:
            try:
                self.client.images.remove(image, force=True)
            except Exception:
                pass
        if self.ws is not None:
            self.ws.close()
        if self.client is not None:
            self.client.close()


def _ancestors(path: str) -> list[str]:
    out = []
    while True:
        out.append(path)
        if path == "/":
            return out
        path = os.path.dirname(path)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
        return s[s.rindex(b")") + 2:s.rindex(b")") + 3] == b"Z"
    except OSError:
        return True


def _extract(data: bytes, dest: Path, *, strip_top: bool, keep_symlinks: bool) -> list[str]:
    """Extract a docker archive under ``dest`` safely: no absolute or ``..`` paths, no device
    files; links kept as links only with ``keep_symlinks`` and only if relative-safe."""
    skipped = []
    dest = Path(dest)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            name = m.name
            if strip_top:
                name = name.split("/", 1)[1] if "/" in name else ""
                if not name:
                    continue
            parts = Path(name).parts
            if name.startswith("/") or ".." in parts:
                skipped.append(m.name)
                continue
            target = dest / name
            if any(p.is_symlink() for p in [dest.joinpath(*parts[:i])
                                             for i in range(1, len(parts))]):
                skipped.append(m.name)
                continue
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                os.chmod(target, (m.mode & 0o7777) | 0o700)
            elif m.isfile():
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                with open(target, "wb") as f:
                    shutil.copyfileobj(tar.extractfile(m), f)
                os.chmod(target, m.mode & 0o7777)
            elif m.issym() and keep_symlinks:
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink() or target.exists():
                    target.unlink()
                os.symlink(m.linkname, target)
            else:
                skipped.append(m.name)
    return skipped

