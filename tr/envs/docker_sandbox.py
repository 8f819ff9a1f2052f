"""The Docker sandbox (docker-py): a container per episode with the same semantics as local.

* Container from the task image (default: the locally built ``tr-base`` image), network ``none``
  unless ``config.network``, ``mem_limit``/``memswap``, ``pids_limit``, ``nano_cpus``,
  RLIMIT_FSIZE/CPU, ``no-new-privileges``, Docker's default seccomp (and AppArmor, where the host
  has it) profile, and only the capabilities system tasks use (:data:`KEPT_CAPS`: chown, file
  permissions, setuid/setgid to other users, kill, low ports, chroot).  PID 1 is a tiny loop of
  the *host's* ``bash`` and ``sleep`` (:data:`KEEPER`; PID 1 ignores signals from inside, so
  ``kill -9 1`` or ``pkill sleep`` cannot stop the container, and it reaps orphans).  The agent is root in the container; the container's root is
  host root with those capabilities (Docker's user-namespace remapping is a daemon-wide setting
  this harness does not own).
* The writable task areas (workdir, ``/root``, ``/tmp``, ``/logs``) are bind mounts of a
  size- and inode-limited ``nosuid,nodev`` host tmpfs (:mod:`tr.envs.workspace`), seeded from the
  image's own content; the rest of the root filesystem is the container's writable layer (bounded
  per file by RLIMIT_FSIZE only: the fuse-overlayfs driver here has no ``storage_opt size``).
* The persistent shell is ``bash`` in a ``docker exec`` with an attached socket; per-command
  process trees are tracked with child cgroups of the container's own cgroup (pids + freezer,
  cgroup v1, :mod:`tr.envs.cgroups`), exactly as locally.  ``end_session`` kills every process of
  the container but PID 1 (frozen meanwhile), whatever cgroup or parent it has.
* No harness step runs a program of the container, whose files the agent may have replaced: files
  outside the areas are written and deleted from the host through ``/proc/<PID 1>/root`` with
  ``openat(O_NOFOLLOW)`` walks, read through the Docker API, and ``run_fresh`` (setup scripts, the
  verifier) starts the *host's* ``bash`` through the host's own loader and libraries, mounted
  read-only at ``/opt/tr/host`` (the command's own programs are then the container's, as they
  must be).
* ``snapshot`` = ``docker commit`` (root filesystem; the container is paused meanwhile) + a copy of
  the areas.  Before the commit the writable layer is bounded as the areas are: its apparent size
  (sparse files are committed in full) beyond ``disk_mb`` refuses the snapshot, and its setuid /
  setgid bits and file capabilities are stripped.  Process memory and running processes are NOT preserved -- as in Recovery-Bench's
  pre-verifier commit, a restored or forked sandbox starts with a new shell.  ``restore`` replaces
  the container with one from the snapshot image; ``fork`` starts a new one.  Every container and
  snapshot image is labelled ``tr.managed`` and removed on close (persistent snapshots: by
  :func:`tr.envs.backends.discard_snapshot`).
* ``network_sibling``: the protected verifier's container for tests of the agent's servers -- a
  fork of a snapshot taken then that joins only this container's network namespace
  (``network_mode=container:<id>``), with read-only copies of Docker's network files; this
  container and its processes keep running (:mod:`tr.envs.protected`).
* Every container and image carries ``tr.owner`` (``<pid>-<start time>`` of the process that made
  it) and ``tr.scope`` (boot id + pid namespace).  The reaper run at a process's first start
  removes only those whose owner is known dead in this scope; other live processes' sandboxes
  (two test runs, a training job and a test run) are never touched.

What stays open: the agent is root in its container, so programs and libraries *the tests call*
(``python3``, ``git``, ``awk`` and the ``/etc/alternatives`` links to it, a replaced ``libc`` of
the container) are the agent's to change, as in Terminal-Bench's own harness; the protected
verifier's own shell, interpreter, loader, libraries and name service configuration are not
(:mod:`tr.envs.protected`; the container's ``/etc/nsswitch.conf`` is replaced by the harness's
before the tests).  Such a program can write a report, but not the runner's exit status nor what
it collected, so killing the runner fails (:func:`tr.envs.verifier.runner_word_problem`).
Script verifiers (``bash /tests/run-tests.sh``) run the container's tools by design.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import posixpath
import secrets
import select
import shlex
import shutil
import socket
import stat
import tarfile
import threading
import time
from pathlib import Path

from tr.envs import cgroups, filetree
from tr.envs.backends import Backend, remove_snapshot_folder
from tr.envs.images.base import LABEL, docker_client, ensure_base_image
from tr.envs.sandbox import (CommandResult, SandboxConfig, ShellSandbox, SandboxError, Snapshot,
                            SnapshotRefused)
from tr.envs.shell import ShellProcess, ShellSession, run_to_eof
from tr.envs.workspace import (HostWorkspace, copy_host_tree_into, copy_dir,
                               default_state_dir, host_scope, owner_id, owner_is_dead,
                               private_dir, reap_stale, run_reaper)
from tr.envs.endpoints import endpoint_client
from tr.envs.images import build_task_image
from tr.envs.protected import FILES, FILES_MOUNT, PYTHON_MOUNT, python_mounts

OWNER_LABEL = "tr.owner"
SNAP_REPO = "tr-snap"
# PID 1: the host's bash and sleep through the host's loader (HOST_MOUNT, read-only), never a
# program of the container -- a snapshot's /bin/sh, or a /usr/bin/sleep the agent replaced that
# PID 1 would start again right after end_session killed its child, would run beside the verifier.
# `-p`: no $BASH_ENV / $ENV file of the image's environment is read.
KEEPER = "trap '' TERM INT HUP QUIT USR1 USR2; while :; do {run} {sleep} 3600 & wait; done"
# Docker's default capabilities that system tasks use (SYS_CHROOT: sshd's privilege separation
# chroots each connection's child, or it resets every connection -- TB1's git-over-ssh tasks);
# the rest of the defaults (MKNOD, NET_RAW, AUDIT_WRITE, SETFCAP, SETPCAP, FSETID) are dropped.
KEPT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID", "KILL", "NET_BIND_SERVICE",
             "SYS_CHROOT")
HOST_MOUNT = "/opt/tr/host"        # the host's system folders, read-only: the verifier's runtime
# run_fresh's shell script: wait for "go" (the harness first moves it into its cgroup), then run
# the command with stdin /dev/null and stderr on stdout; ``tr-python`` runs the project
# interpreter through the host's loader (see DockerSandbox.verifier_python).
FRESH = ('read -r _ || exit 125; exec </dev/null 2>&1; '
         'tr-python() {{ {loader} --inhibit-cache --library-path {libpath} {python} "$@"; }}; '
         '__tr_cmd=$1; shift; eval "$__tr_cmd"')
SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Docker's per-container network files (bind mounts of the daemon's own copies)
NETWORK_FILES = ("/etc/hosts", "/etc/resolv.conf", "/etc/hostname")

_seed_lock = threading.Lock()
_reaped: set = set()               # endpoints (None: the default engine) reaped by this process


SCOPE_LABEL = "tr.scope"


def _owner_labels(kind: str) -> dict:
    """Labels of a container/image this process makes: what it is, who owns it, where."""
    return {LABEL: kind, OWNER_LABEL: owner_id(), SCOPE_LABEL: host_scope()}


def remove_image(image: str, endpoint: str | None = None) -> None:
    import docker
    if endpoint:
        client = endpoint_client(endpoint)
    else:
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
        self.runtime: HostRuntime | None = None
        self._pid1 = 0
        self.image: str | None = None
        self._fresh_count = 0
        self._python = None
        self.unreleased: list[tuple[str, str]] = []   # ("container"|"image", id) close left
        # (container id, {path: bytes}) of the sandbox whose network namespace this one joins
        # (network_sibling): Docker's network files are then these read-only copies
        self._network_of: tuple[str, dict] | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def _open(self, from_snapshot: Snapshot | None) -> None:
        endpoint = self.config.docker_endpoint
        if endpoint is None:
            self.client = docker_client()
        else:
            self.client = endpoint_client(endpoint)
        private_dir(self.state_dir)
        if endpoint not in _reaped:
            _reaped.add(endpoint)
            run_reaper(lambda: reap_stale_docker(self.client),
                       lambda: reap_stale(self.state_dir))
        self.ws = HostWorkspace(self.areas, self.config.disk_mb, self.state_dir)
        if from_snapshot is not None:
            self.image = from_snapshot.image
            self.ws.load(Path(from_snapshot.location))
        else:
            self.image = self.config.image or ensure_base_image(client=self.client)
            seed = self._seed(self.image)
            for name in self.areas.values():
                if (seed / name).is_dir():
                    copy_dir(str(seed / name), self.ws.host_dir(name))
        self._create_container()

    def _seed(self, image: str) -> Path:
        """The image's own content of the area paths, extracted once per image id."""
        import docker
        img = self.client.images.get(image)
        dest = self.state_dir / "docker-seed" / (img.id.replace(":", "-") + ".2")  # .2: modes kept
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
                    data = b"".join(stream)
                    _extract(data, tmp / name, strip_top=True, keep_symlinks=True)
                    with tarfile.open(fileobj=io.BytesIO(data)) as tar:   # the area's own mode
                        top = next((m for m in tar if m.isdir() and "/" not in m.name.strip("/")),
                                   None)                                  # (/tmp: 1777)
                    if top is not None:
                        os.chmod(tmp / name, top.mode & 0o7777)
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
        exe, binds = python_mounts(self.state_dir)
        runtime = host_runtime()
        mounts = [docker.types.Mount(target=path, source=self.ws.host_dir(name), type="bind")
                  for path, name in self.areas.items()]
        mounts += [docker.types.Mount(target=dst, source=src, type="bind", read_only=True)
                   for src, dst in binds + runtime.binds]
        network = {"network_mode": os.environ.get("TR_DOCKER_NETWORK", "bridge")
                   if cfg.network else "none", "hostname": "tr-sandbox"}
        if self._network_of is not None:
            owner, files = self._network_of
            network = {"network_mode": f"container:{owner}"}   # Docker refuses a hostname here
            folder = self.ws.root / "net"
            folder.mkdir(mode=0o755, exist_ok=True)
            for path, data in files.items():
                host = folder / posixpath.basename(path)
                host.write_bytes(data)
                host.chmod(0o644)
                mounts.append(docker.types.Mount(target=path, source=str(host), type="bind",
                                                 read_only=True))
        self._python = exe
        self.runtime = runtime
        env = {"PATH": SHELL_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(cfg.env)
        ulimits = [docker.types.Ulimit(name="fsize", soft=cfg.file_size_mb * mb,
                                       hard=cfg.file_size_mb * mb),
                   docker.types.Ulimit(name="cpu", soft=cfg.cpu_time_s, hard=cfg.cpu_time_s + 5),
                   docker.types.Ulimit(name="core", soft=0, hard=0)]
        self.container = self.client.containers.create(
            self.image, command=runtime.keeper(), entrypoint=[], detach=True,
            **network, mem_limit=cfg.memory_mb * mb, memswap_limit=cfg.memory_mb * mb,
            pids_limit=cfg.pids, nano_cpus=int(cfg.cpus * 1e9), ulimits=ulimits,
            mounts=mounts, environment=env, working_dir=cfg.workdir,
            cap_drop=["ALL"], cap_add=list(KEPT_CAPS), security_opt=["no-new-privileges"],
            labels=_owner_labels("sandbox"))
        self.container.start()
        cid = self.container.id
        self._pid1 = self.client.api.inspect_container(cid)["State"]["Pid"]
        parents = {c: cgroups.CGROUP_V1 / c / "docker" / cid for c in ("pids", "freezer")}
        if not all(p.is_dir() for p in parents.values()):
            raise SandboxError(f"container cgroups not found at {parents['pids']} (needs the "
                               "cgroupfs driver, cgroup v1, and this process on the engine's "
                               "host); cannot track command process trees")
        self.tree = cgroups.CgroupTree(parents, owned=False)
        self.session = ShellSession(self._spawn_shell, cgroups.CgroupTracker(self.tree),
                                    cfg.output_cap_bytes)
        if self._network_of is None:      # a verifier's sibling starts no shell of the snapshot
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
        """``command`` in a new exec of the *host's* bash (not the agent's shell, and no program of
        the container: :data:`HOST_MOUNT`), its own cgroup and timeout.  Read-only binds must
        exist at container creation: ``extra_ro_binds`` given here are refused."""
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
        rt = self.runtime
        script = FRESH.format(loader=shlex.quote(rt.loader),
                              libpath=shlex.quote(f"{PYTHON_MOUNT}/lib:{rt.libpath}"),
                              python=shlex.quote(self._python))
        exec_id, io_, pid = self._exec_start(
            [rt.loader, "--inhibit-cache", "--library-path", rt.libpath, rt.bash, "--noprofile",
             "--norc", "-c", script, "tr-fresh", command], env=run_env)
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
                             output_bytes=out.total, marks=tuple(out.marks))

    # --- the container's root filesystem, from the host -------------------------------------
    def _root_fd(self) -> int:
        """An open folder of the container's root, through its PID 1 (host side)."""
        try:
            return os.open(f"/proc/{self._pid1}/root", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise SandboxError(f"the container's PID 1 ({self._pid1}) is gone: the sandbox "
                               f"died ({e.strerror})") from e

    def _open_parent(self, sandbox_path, create: bool) -> tuple[int, str]:
        """(open parent folder, last name) of an absolute path outside the areas, walked from the
        container's root with O_NOFOLLOW: a link on the way is an error, never followed.
        ``create``: missing folders on the way are made (0755, root)."""
        path = posixpath.normpath(str(sandbox_path))
        parts = [p for p in path.split("/") if p]
        if not path.startswith("/") or not parts or ".." in parts:
            raise SandboxError(f"expected an absolute path below /, got {sandbox_path!r}")
        fd = self._root_fd()
        try:
            return filetree.open_below(fd, parts[:-1], create=create), parts[-1]
        except OSError as e:
            raise SandboxError(f"cannot reach {path!r} in the container: {e.strerror} (a link or "
                               "file where a folder is expected?)") from e
        finally:
            os.close(fd)

    def _host_remove(self, sandbox_path) -> None:
        fd, name = self._open_parent(sandbox_path, create=False)
        try:
            filetree.remove_entry(fd, name, filetree.Deadline(300, f"removing {sandbox_path}"))
        except OSError as e:
            raise SandboxError(f"remove_path {sandbox_path!r}: {e.strerror}") from e
        finally:
            os.close(fd)

    def _host_make_dir(self, sandbox_path) -> int:
        """``sandbox_path`` made an empty folder (whatever was there removed); returns it open."""
        self._host_remove(sandbox_path)
        fd, name = self._open_parent(sandbox_path, create=True)
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
            return os.open(name, filetree.DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            raise SandboxError(f"cannot make the folder {sandbox_path!r}: {e.strerror}") from e
        finally:
            os.close(fd)

    # --- files -----------------------------------------------------------------------------
    def _in_areas(self, path, follow_last: bool = True) -> bool:
        return self.ws.split_area(self.ws.canonical(str(path), follow_last)) is not None

    def write_file(self, sandbox_path, data: bytes | str, mode: int = 0o644) -> None:
        self._require()
        if isinstance(data, str):
            data = data.encode()
        if self._in_areas(sandbox_path):
            self.ws.write_file(sandbox_path, data, mode)
            return
        fd, name = self._open_parent(sandbox_path, create=True)
        try:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    filetree.remove_entry(fd, name)
            except FileNotFoundError:
                pass
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                          | os.O_CLOEXEC, mode & 0o7777, dir_fd=fd)
            try:
                os.fchmod(out, mode & 0o7777)
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            finally:
                os.close(out)
        except OSError as e:
            raise SandboxError(f"write_file {sandbox_path!r}: {e.strerror}") from e
        finally:
            os.close(fd)

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
        if host_path.is_file():
            self.write_file(sandbox_path, host_path.read_bytes(),
                            stat.S_IMODE(host_path.stat().st_mode))
            return
        fd, name = self._open_parent(sandbox_path, create=True)
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            sub = os.open(name, filetree.DIR_FLAGS, dir_fd=fd)
            try:
                os.fchmod(sub, stat.S_IMODE(host_path.stat().st_mode))
                copy_host_tree_into(host_path, sub, (0, 0))
            finally:
                os.close(sub)
        except OSError as e:
            raise SandboxError(f"copy_in {sandbox_path!r}: {e.strerror}") from e
        finally:
            os.close(fd)

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
        self._host_remove(sandbox_path)

    # --- state -----------------------------------------------------------------------------
    def snapshot(self, *, persist: bool | None = None) -> Snapshot:
        """``docker commit`` of the root filesystem + copy of the areas (paused meanwhile).
        Processes and their memory are not part of it."""
        self._require()
        persist = self.config.persist_snapshots if persist is None else persist
        sid = f"docker-{secrets.token_hex(8)}"
        dest = (self.state_dir / "snapshots" / sid) if persist else (self.ws.root / "snaps" / sid)
        self._pause()
        try:
            self._bound_writable_layer()
            img = self.container.commit(
                repository=SNAP_REPO, tag=sid, pause=False,
                conf={"Labels": {**_owner_labels("snapshot"),
                                 "tr.persistent": "1" if persist else "0"}})
            if not persist:
                self.images.append(img.id)
            self.ws.save(dest)
        finally:
            self.container.unpause()
        return Snapshot(id=sid, backend=self.backend, location=str(dest), image=img.id,
                        persistent=persist, endpoint=self.config.docker_endpoint or "")

    SNAPSHOT_MAX_ENTRIES = 500_000

    def _bound_writable_layer(self) -> None:
        """Before ``docker commit`` (container paused): the writable layer's *apparent* size --
        what commit writes, a sparse file in full -- must fit the sandbox's disk budget
        (``disk_mb``), else SandboxError; setuid/setgid bits and file capabilities of its files
        are stripped (through the container's root, links never followed), so no snapshot keeps
        them.  The layer is read from the engine's upper folder on this host; an engine whose
        storage is not reachable here is not bounded (its own limits apply)."""
        info = self.client.api.inspect_container(self.container.id)
        upper = ((info.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir")
        if not upper or not os.path.isdir(upper):
            return
        budget = self.config.disk_mb * 1024 * 1024
        total, entries, privileged = 0, 0, []
        stack = [("", upper)]
        while stack:
            rel, folder = stack.pop()
            try:
                it = os.scandir(folder)
            except OSError:
                continue
            with it:
                for e in it:
                    entries += 1
                    if entries > self.SNAPSHOT_MAX_ENTRIES:
                        raise SnapshotRefused(f"snapshot: the container's writable layer has more "
                                           f"than {self.SNAPSHOT_MAX_ENTRIES} entries outside "
                                           "the sandbox's areas; not committed")
                    path = f"{rel}/{e.name}"
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        stack.append((path, e.path))
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
                        if st.st_mode & (stat.S_ISUID | stat.S_ISGID) or _has_caps(e.path):
                            privileged.append(path)
        if total > budget:
            raise SnapshotRefused(f"snapshot: the container's writable layer (outside the areas) "
                               f"has an apparent size of {total / 2**20:.0f} MB, beyond the "
                               f"sandbox's disk budget of {self.config.disk_mb} MB (docker "
                               "commit writes sparse files in full); not committed")
        for path in privileged:
            self._strip_privilege(path)

    def _strip_privilege(self, sandbox_path: str) -> None:
        """Clear setuid/setgid and ``security.capability`` of a regular file of the container's
        root, reached from the host with no link followed."""
        try:
            fd, name = self._open_parent(sandbox_path, create=False)
        except SandboxError:
            return
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                        dir_fd=fd)
        except OSError:
            return
        finally:
            os.close(fd)
        try:
            st = os.fstat(f)
            if stat.S_ISREG(st.st_mode):
                os.fchmod(f, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                try:
                    os.removexattr(f, "security.capability")
                except OSError:
                    pass
        finally:
            os.close(f)

    PAUSE_TRIES = 6

    def _pause(self) -> None:
        """`docker pause`, retried: under load the cgroup freezer can fail to stop every task in
        time ("OCI runtime pause failed: unable to freeze", a 500; runc thaws the container and
        the freeze may be tried again), seen once in 200 episodes on 2 busy cores. Other errors,
        or the freeze failing `PAUSE_TRIES` times (~6 s of back-off), raise SandboxError."""
        import docker  # pylint: disable=g-import-not-at-top

        for attempt in range(self.PAUSE_TRIES):
            try:
                self.container.pause()
                return
            except docker.errors.APIError as exc:
                if "unable to freeze" not in str(exc) or attempt == self.PAUSE_TRIES - 1:
                    raise SandboxError(f"snapshot: cannot pause container {self.container.short_id} "
                                       f"to commit it ({attempt + 1} tries): {exc}") from exc
                time.sleep(0.2 * 2 ** attempt)

    def restore(self, snapshot) -> None:
        """The container is replaced by one from the snapshot image, the areas are copied back;
        processes are not restored (a new shell starts)."""
        self._require()
        snapshot = self._own_snapshot(snapshot, "restore")
        self.end_session()
        old = self.container
        self.container = None
        if old is not None:
            old.remove(force=True)
        self.ws.load(Path(snapshot.location))
        self.image = snapshot.image
        self._create_container()

    # --- protected verifier hooks -----------------------------------------------------------
    def install_tests(self, tests_dir, mount: str) -> list:
        """Replace ``mount`` by a fresh copy of the tests, written from the host."""
        self._require()
        if self._in_areas(mount, follow_last=False):
            self.ws.make_empty_dir(mount)
            self.ws.copy_in(tests_dir, mount)
            return []
        fd = self._host_make_dir(mount)
        try:
            copy_host_tree_into(Path(tests_dir), fd, (0, 0))
        finally:
            os.close(fd)
        return []

    def reset_dir(self, sandbox_path) -> None:
        self._require()
        if self._in_areas(sandbox_path, follow_last=False):
            self.ws.make_empty_dir(sandbox_path)
        else:
            os.close(self._host_make_dir(sandbox_path))

    def verifier_python(self) -> tuple[str, list]:
        """``tr-python``: a function of run_fresh's shell that starts the project interpreter
        (mounted read-only at creation) through the host's loader with ``--inhibit-cache`` and
        the host's libraries, so neither the container's loader, its ``/etc/ld.so.cache`` nor its
        libraries (the agent's to replace) load into the verifier; ``/etc/ld.so.preload``, which
        every loader reads, is deleted.  The mounts are checked to be still in place."""
        self._require()
        self.remove_path("/etc/ld.so.preload")
        # the host's libc in the verifier reads the container's /etc/nsswitch.conf: the
        # harness's (files only) replaces the agent's, after the pre-verifier snapshot
        self.remove_path("/etc/nsswitch.conf")
        self.write_file("/etc/nsswitch.conf", FILES["nsswitch.conf"], mode=0o644)
        mounts = Path(f"/proc/{self._pid1}/mountinfo").read_text().split("\n")
        points = {m.split()[4] for m in mounts if len(m.split()) > 4}
        for root in (PYTHON_MOUNT, FILES_MOUNT, *(dst for _, dst in self.runtime.binds)):
            if root not in points:
                raise SandboxError(f"the verifier's mount {root} is gone from the container")
        return "tr-python", []

    def network_sibling(self) -> "DockerSandbox":
        """The protected verifier's container for tests that talk to servers the agent left
        running: a new sandbox started from a snapshot of this one's files (taken now, the
        container paused meanwhile) that joins ONLY this container's network namespace
        (``network_mode=container:<id>``).  ``localhost:<port>`` there reaches this container's
        servers, which keep running; its own root filesystem, areas, PID namespace, cgroups and
        mounts are its own, so no process of this container can see or change its files
        (tests, results, the verifier's interpreter) or its processes.  Docker would bind this
        container's writable ``/etc/hosts``, ``/etc/resolv.conf`` and ``/etc/hostname`` into it
        too (a file the agent could rewrite while the tests run): they are replaced by read-only
        copies of their content now.  The caller closes it; closing it leaves this one running."""
        self._require()
        files = {path: self._read_small(path) for path in NETWORK_FILES}
        snapshot = self.snapshot(persist=False)
        sibling = DockerSandbox(self.config)
        sibling._network_of = (self.container.id, files)
        return sibling.start(_from_snapshot=snapshot)

    def _read_small(self, sandbox_path, limit: int = 1 << 20) -> bytes:
        """A regular file of the container's root (not an area) read from the host without
        following links; b"" when it is missing or not a regular file; at most ``limit`` bytes."""
        try:
            fd, name = self._open_parent(sandbox_path, create=False)
        except SandboxError:
            return b""
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                        dir_fd=fd)
        except OSError:
            return b""
        finally:
            os.close(fd)
        try:
            if not stat.S_ISREG(os.fstat(f).st_mode):
                return b""
            return os.read(f, limit)
        finally:
            os.close(f)

    def _alive(self) -> bool:
        import docker
        if self.container is None or self.ws is None or self.ws.closed:
            return False
        try:
            return bool(self.client.api.inspect_container(self.container.id)["State"]["Running"])
        except (docker.errors.APIError, OSError):
            return False

    def _kill_stragglers(self) -> None:
        """Every process of the container but its PID 1 -- whatever its cgroup or parent (an
        orphan of a trap, a double fork) -- is killed, the container frozen meanwhile."""
        if self.tree is None:
            return
        left = self.tree.kill_all(keep={self._pid1})
        if left:
            raise SandboxError(f"processes {sorted(left)} of the container survived SIGKILL")

    def _release(self) -> None:
        import docker
        try:
            if self.container is not None:
                self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except Exception:   # the engine went away: the endpoint pool removes it when it is back
            self.unreleased.append(("container", self.container.id))
        for image in self.images:
            try:
                self.client.images.remove(image, force=True)
            except docker.errors.ImageNotFound:
                pass
            except Exception:
                self.unreleased.append(("image", image))
        if self.ws is not None:
            self.ws.close()
        if self.client is not None:
            self.client.close()


@dataclasses.dataclass(frozen=True)
class HostRuntime:
    """The host's system folders mounted read-only in every container (``binds``), and inside
    it: the host's program loader, its library path, the host's bash."""

    binds: list
    loader: str
    libpath: str
    bash: str
    sleep: str

    def run(self, program: str) -> list[str]:
        """The command line that starts a host program inside through the host's loader."""
        return [self.loader, "--inhibit-cache", "--library-path", self.libpath, program]

    def keeper(self) -> list[str]:
        """PID 1's command (:data:`KEEPER`): host programs only."""
        script = KEEPER.format(run=" ".join(shlex.quote(w) for w in self.run("")[:-1]),
                               sleep=shlex.quote(self.sleep))
        return self.run(self.bash) + ["--noprofile", "--norc", "-p", "-c", script]


@functools.cache
def host_runtime() -> HostRuntime:
    """What the verifier's shell and interpreter run on, from the host (see :class:`HostRuntime`):
    ``/usr`` (and ``/lib*`` where they are folders, not merged-/usr links) at ``HOST_MOUNT``."""
    import sys
    import sysconfig
    binds = [(d, HOST_MOUNT + d) for d in ("/usr", "/lib", "/lib64", "/lib32")
             if os.path.isdir(d) and not os.path.islink(d)]

    def inside(host_path: str) -> str:
        real = os.path.realpath(host_path)
        for src, dst in binds:
            if real.startswith(src + "/"):
                return dst + real[len(src):]
        raise SandboxError(f"{real} is outside the host folders mounted for the verifier")

    interp = _elf_interpreter(os.path.realpath(sys.executable))
    triplet = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    libdirs = [d for d in (f"/usr/lib/{triplet}", f"/lib/{triplet}", "/usr/lib", "/lib")
               if os.path.isdir(d)]
    libpath = ":".join(dict.fromkeys(inside(d) for d in libdirs))
    bash = shutil.which("bash") or "/bin/bash"
    sleep = shutil.which("sleep") or "/bin/sleep"
    return HostRuntime(binds=binds, loader=inside(interp), libpath=libpath, bash=inside(bash),
                       sleep=inside(sleep))


def _elf_interpreter(executable: str) -> str:
    """The program interpreter (PT_INTERP) an ELF executable names, e.g. the dynamic loader."""
    import struct
    with open(executable, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            raise SandboxError(f"{executable} is not a 64-bit ELF executable")
        end = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack(end + "IIQQQQ", f.read(40))
            if p_type == 3:                                     # PT_INTERP
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    raise SandboxError(f"{executable} names no program interpreter (statically linked?)")


def _has_caps(path: str) -> bool:
    try:
        os.getxattr(path, "security.capability", follow_symlinks=False)
        return True
    except OSError:
        return False


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



class DockerBackend(Backend):
    """A Docker engine of this machine's kernel (``SandboxConfig.docker_endpoint``; several:
    ``tr.envs.endpoints``): a task's Dockerfile is built into an image
    (:func:`tr.envs.images.build_task_image`, a stand-in base when its ``FROM`` is missing)."""

    name = "docker"
    builds_images = True
    disk_is_memory = False
    endpoints = True
    network_sibling = True

    def sandbox_class(self) -> type:
        return DockerSandbox

    def task_image(self, dockerfile, context, *, notes, log, timeout_s, config) -> str:
        return build_task_image(dockerfile, context, log=log, notes=notes, timeout_s=timeout_s)

    def discard_snapshot(self, snapshot: Snapshot) -> None:
        if snapshot.image:
            remove_image(snapshot.image, snapshot.endpoint or None)
        remove_snapshot_folder(snapshot)


BACKEND = DockerBackend()
