"""The local sandbox: bubblewrap, its own user namespace, no network, cgroup limits.

Who runs as what: bubblewrap starts as host root and builds the sandbox's mount, PID, network,
IPC and UTS namespaces (they belong to the host's user namespace); then ``nsenter --user``
moves the sandbox's first process into the sandbox's own user namespace (:mod:`tr.envs.userns`)
as its uid/gid 0, ``setpriv`` empties its capability sets, and a seccomp filter
(:mod:`tr.envs.seccomp`) is in force.  So the agent is root inside (it owns the writable areas
and the ``/etc`` copy) but, to the host kernel, the unprivileged subordinate uid ``BASE`` with
no capabilities anywhere: host sysctls, host processes and host files other than its own are out
of reach, ``/proc/sys`` is read-only besides, and it cannot make new namespaces.  Host files it
sees (``/usr``) are owned by ``nobody`` inside.  Without root (no right to map ids) the sandbox
falls back to bubblewrap's own unprivileged user namespace.

Layout inside: host ``/usr`` (and the merged-/usr links ``/bin``, ``/lib*``, ``/sbin``) read-only;
``/proc`` and a minimal ``/dev`` of its own; writable ``/app`` (the workdir), ``/root`` (home),
``/tmp``, ``/logs`` (verifier results), ``/dev/shm`` and a copy of the host ``/etc`` (only its
world-readable entries, secrets such as ssh keys left out), all folders of one size- and
inode-limited ``nosuid,nodev`` tmpfs (:mod:`tr.envs.workspace`).  Nothing else of the host exists
inside (no ``/work``, no host ``/root``).  ``--die-with-parent`` and ``--new-session``.

Limits: a cgroup v1 per sandbox (``pids.max``, ``memory.limit_in_bytes`` + ``memsw``, and
``cpu.cfs_quota_us`` = ``cpus`` cores across all its processes) when the host allows it, else
RLIMIT_AS and RLIMIT_NPROC (NPROC then counts per uid, a weaker bound) and no CPU quota;
RLIMIT_FSIZE and RLIMIT_CPU always.  Disk: the tmpfs ``size=`` and ``nr_inodes=``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shlex
import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

from tr.envs import cgroups, seccomp
from tr.envs.backends import Backend
from tr.envs.sandbox import CommandResult, SandboxConfig, SandboxError, ShellSandbox, Snapshot
from tr.envs.shell import PipeIO, ShellProcess, ShellSession, run_to_eof
from tr.envs.userns import UserNamespace, UserNamespaceError, shift_owners
from tr.envs.workspace import (HostWorkspace, default_state_dir, private_dir, reap_stale,
                               run_reaper)
from tr.envs.protected import python_mounts, verifier_files
from tr.envs.workspace import owner_is_dead

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_GROUP = "tr-sandboxes"
CPU_PERIOD_US = 100_000
ETC_SOURCE = "/etc"
# Capabilities the launcher keeps until the sandbox's first process has joined its user namespace
# (nsenter: SYS_ADMIN) and emptied its capability sets (setpriv: SETPCAP).
LAUNCH_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP")
# Host /etc entries never copied into a sandbox (secrets, engine configs); besides these only
# world-readable entries are copied.
ETC_EXCLUDE = ("shadow", "shadow-", "gshadow", "gshadow-", "ssh", "ssl/private", "docker",
               "containerd", "sudoers", "sudoers.d", "security/opasswd", "machine-id",
               "ld.so.preload")

# /etc entries whose content makes the host's programs load or run other files: in the verifier's
# tree they are the pristine copy's, whatever the agent made of them (tr.envs.protected)
PRISTINE_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "pam.d", "pam.conf",
                "security", "gconv")

_etc_lock = threading.Lock()
_reaped = False


def etc_template(state_dir: Path, base: int = 0, count: int = 0) -> Path:
    """A cached copy of host /etc: its world-readable entries minus :data:`ETC_EXCLUDE` (built
    once, atomically).  With a sandbox id range ``base:count``, owners are shifted into it, so
    the sandbox's root owns the copy as root owns the host's."""
    dest = state_dir / (f"etc-template-{base}" if base else "etc-template")
    with _etc_lock:
        if dest.is_dir():
            return dest
        tmp = state_dir / f"{dest.name}.{os.getpid()}.{secrets.token_hex(4)}"
        shutil.copytree(ETC_SOURCE, tmp, symlinks=True, ignore=_etc_ignore)
        (tmp / "hostname").write_text("tr-sandbox\n")
        if base:
            shift_owners(tmp, base, count)
        try:
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest


def world_readable(st: os.stat_result) -> bool:
    """Whether any host user may read this /etc entry: a link, a file readable by others, or a
    folder others may list and enter.  Sockets, FIFOs and devices never are."""
    if stat.S_ISLNK(st.st_mode):
        return True
    if stat.S_ISREG(st.st_mode):
        return bool(st.st_mode & stat.S_IROTH)
    if stat.S_ISDIR(st.st_mode):
        return st.st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
    return False


def _etc_ignore(directory: str, names: list[str]) -> set[str]:
    rel = os.path.relpath(directory, ETC_SOURCE)
    skip = set()
    for n in names:
        path = n if rel == "." else os.path.join(rel, n)
        try:
            st = os.lstat(os.path.join(directory, n))
        except OSError:
            skip.add(n)
            continue
        if path in ETC_EXCLUDE or not world_readable(st):
            skip.add(n)
    return skip


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = "/" + d
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    return args


class LocalSandbox(ShellSandbox):
    """A bubblewrap sandbox (see module doc).  Use as a context manager."""

    backend = "local"

    def __init__(self, config: SandboxConfig):
        if not os.path.exists(BWRAP):
            raise SandboxError("bubblewrap (bwrap) is not installed; run launch/setup.sh "
                               "(apt-get install bubblewrap)")
        self.config = config
        self.state_dir = Path(config.state_dir) if config.state_dir else default_state_dir()
        self.areas = {config.workdir: "app", "/root": "home", "/tmp": "tmp", "/etc": "etc",
                      "/logs": "logs", "/dev/shm": "shm", "/solution": "solution"}
        if config.workdir in ("/root", "/tmp", "/etc", "/logs", "/solution") or config.workdir == "/":
            raise ValueError(f"SandboxConfig.workdir {config.workdir!r} collides with a "
                             "built-in writable area")
        self.ws: HostWorkspace | None = None
        self.tree: cgroups.CgroupTree | None = None
        self.session: ShellSession | None = None
        self.userns: UserNamespace | None = None
        self._fresh_count = 0

    # --- lifecycle -------------------------------------------------------------------------
    def _open(self, from_snapshot: Snapshot | None) -> None:
        global _reaped
        private_dir(self.state_dir)
        if not _reaped:
            _reaped = True
            run_reaper(lambda: reap_stale(self.state_dir), reap_stale_cgroups)
        if os.geteuid() == 0:       # never run the agent as host root: map it elsewhere
            try:
                self.userns = UserNamespace()
            except UserNamespaceError as e:
                raise SandboxError(f"the local sandbox needs a user namespace: {e}") from e
            owner = self.userns.root
            etc = etc_template(self.state_dir, self.userns.base, self.userns.count)
        else:
            owner = (os.getuid(), os.getgid())
            etc = etc_template(self.state_dir)
        self.etc_template = etc
        self.ws = HostWorkspace(self.areas, self.config.disk_mb, self.state_dir,
                                overlays={"etc": str(etc)}, owner=owner)
        if from_snapshot is not None:
            self.ws.load(Path(from_snapshot.location))
        self.tree = self._make_cgroups()
        tracker = (cgroups.CgroupTracker(self.tree) if self.tree is not None else None)
        self.session = ShellSession(self._spawn_shell, tracker or _LazyScan(self),
                                    self.config.output_cap_bytes,
                                    prelude=self._close_inherited(),
                                    init=f"cd {self.config.workdir}")
        self.session.ensure_started()

    def _make_cgroups(self) -> cgroups.CgroupTree | None:
        if not cgroups.cgroup_v1_writable():
            return None
        name = self.ws.root.name
        root = cgroups.CGROUP_V1
        parents = {}
        for c in ("pids", "freezer"):
            (root / c / CGROUP_GROUP).mkdir(exist_ok=True)
            parents[c] = root / c / CGROUP_GROUP / name
        if (root / "memory" / "cgroup.procs").exists():   # nested in ours: our limit bounds it
            group = root / "memory" / cgroups.own_cgroup("memory") / CGROUP_GROUP
            group.mkdir(parents=True, exist_ok=True)
            parents["memory"] = group / name
        if (root / "cpu" / "cgroup.procs").exists():
            # Directly in ours, no shared parent group: each sandbox then weighs as much as one
            # process of ours (a shared parent would split one process's weight among them all).
            parents["cpu"] = root / "cpu" / cgroups.own_cgroup("cpu") / name
        mem_bytes = str(self.config.memory_mb * 1024 * 1024)
        limits = {"pids.max": str(self.config.pids),
                  "memory.limit_in_bytes": mem_bytes,
                  "memory.memsw.limit_in_bytes": mem_bytes,
                  "cpu.cfs_period_us": str(CPU_PERIOD_US),
                  "cpu.cfs_quota_us": str(max(1000, round(self.config.cpus * CPU_PERIOD_US)))}
        return cgroups.CgroupTree(parents, owned=True, limits=limits)

    def _bwrap_args(self, extra_ro_binds=(), etc_binds=()) -> list[str]:
        ws, cfg = self.ws, self.config
        if self.userns is not None:
            # No bwrap user namespace: the mounts are made as host root (so they belong to the
            # host's namespaces) and the launch chain (_confined) joins ours afterwards.
            args = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
            if not cfg.network:
                args.append("--unshare-net")
            args += ["--cap-drop", "ALL"]
            for cap in LAUNCH_CAPS:
                args += ["--cap-add", cap]
        else:
            args = ["--unshare-all", "--cap-drop", "ALL"]
            if cfg.network:
                args.append("--share-net")
        args += ["--die-with-parent", "--new-session", "--hostname", "tr-sandbox"]
        args += _system_binds()
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
                 "--bind", ws.host_dir("etc"), "/etc",
                 "--bind", ws.host_dir("home"), "/root",
                 "--bind", ws.host_dir("tmp"), "/tmp",
                 "--bind", ws.host_dir("logs"), "/logs",
                 "--bind", ws.host_dir("solution"), "/solution",   # Harbor's reference solution
                 "--bind", ws.host_dir("app"), cfg.workdir,
                 "--dir", "/var", "--symlink", "../tmp", "/var/tmp",
                 # /dev/shm on the size-limited tmpfs; the rest of /dev read-only
                 "--bind", ws.host_dir("shm"), "/dev/shm", "--remount-ro", "/dev"]
        for src, dst in etc_binds:
            args += ["--ro-bind", str(src), str(dst)]
        mounted = {"/usr", "/etc", "/root", "/tmp", "/logs", "/dev", "/proc", "/var", "/solution",
                   cfg.workdir}
        made: set[str] = set()
        for src, dst in extra_ro_binds:
            if not os.path.exists(src):
                raise SandboxError(f"extra_ro_binds: host path {src} does not exist")
            args += _parent_dirs(str(dst), mounted, made)
            args += ["--ro-bind", str(src), str(dst)]
            mounted.add(str(dst))
        args += ["--remount-ro", "/", "--chdir", cfg.workdir]
        return args

    def _close_inherited(self) -> str:
        """Shell text that closes the user-namespace descriptor the launch chain inherited (run
        first thing by the sandbox's bash, before any command of the agent or the verifier)."""
        return f"exec {self.userns.fd}<&- ; " if self.userns is not None else ""

    def _confined(self, argv: list[str]) -> list[str]:
        """The sandbox's command started as root of its user namespace with no capabilities:
        ``nsenter`` joins the namespace as uid/gid 0 (clearing groups), ``setpriv`` empties the
        capability sets that execve would give that root."""
        if self.userns is None:
            return argv
        return ["/usr/bin/nsenter", f"--user=/proc/self/fd/{self.userns.fd}", "--setuid", "0",
                "--setgid", "0", "--", "/usr/bin/setpriv", "--inh-caps=-all",
                "--bounding-set=-all", "--", *argv]

    def _popen_bwrap(self, cgroup_child: str | None, options: list[str], command: list[str],
                     **kwargs) -> subprocess.Popen:
        """Start bwrap with ``options`` passed through a pipe (``--args``), so the sandbox's
        /proc/1/cmdline does not show the host folders behind its mounts, and the seccomp filter
        through another (``--seccomp``)."""
        fds = []
        program = _seccomp_program() if self.userns is not None else None
        try:
            args_fd = _pipe_with(b"".join(o.encode() + b"\0" for o in options))
            fds.append(args_fd)
            head = [BWRAP, "--args", str(args_fd)]
            if program is not None:
                seccomp_fd = _pipe_with(program)
                fds.append(seccomp_fd)
                head += ["--seccomp", str(seccomp_fd)]
            if self.userns is not None:
                fds.append(self.userns.fd)
            return subprocess.Popen(self._launcher(cgroup_child) + head + self._confined(command),
                                    pass_fds=tuple(fds), close_fds=True, **kwargs)
        finally:
            for fd in fds:
                if self.userns is None or fd != self.userns.fd:
                    os.close(fd)

    def _env(self, extra: dict | None = None) -> dict:
        env = {"PATH": SANDBOX_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root",
               "TERM": "dumb", "LANG": "C.UTF-8", "SHELL": "/bin/bash", "TMPDIR": "/tmp",
               "PAGER": "cat", "GIT_PAGER": "cat"}
        env.update(self.config.env)
        env.update(extra or {})
        return env

    def _launcher(self, cgroup_child: str | None) -> list[str]:
        """``sh -c`` prefix that joins the sandbox cgroups and sets the rlimits, then execs
        bwrap.  (A shell instead of ``preexec_fn`` lets Python spawn with vfork: forking a
        process holding a model's gigabytes costs tens of milliseconds.)"""
        cfg = self.config
        files = self.tree.join_files(cgroup_child) if self.tree is not None else []
        kb = 1024
        script = "".join(f"echo $$ > {shlex.quote(f)} || exit 125; " for f in files)
        # dash's ulimit: -f in 512-byte blocks, -v in KiB, -t seconds.
        # CPU: SIGXCPU at the soft limit ("CPU time limit exceeded"), SIGKILL 5 s later.
        script += (f"ulimit -f {cfg.file_size_mb * 2 * kb} && ulimit -S -t {cfg.cpu_time_s}"
                   f" && ulimit -H -t {cfg.cpu_time_s + 5} && ulimit -c 0 || exit 125; ")
        if not files:
            script += (f"ulimit -v {cfg.memory_mb * kb} && ulimit -p {cfg.pids} 2>/dev/null; ")
        # Signal dispositions are inherited: a host process started with SIGINT ignored (nohup,
        # a background job of a script) would hand an ignored SIGINT to the sandbox's bash,
        # which then cannot trap it -- and a timed-out builtin loop could not be interrupted.
        reset = "env --default-signal " if _env_resets_signals() else ""
        return ["/bin/sh", "-c", script + f'exec {reset}"$@"', "tr-launch"]

    def _spawn_shell(self) -> ShellProcess:
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            proc = self._popen_bwrap("base", self._bwrap_args(),
                                     ["/bin/bash", "--noprofile", "--norc"],
                                     stdin=stdin_r, stdout=out_w, stderr=out_w, env=self._env())
        finally:
            os.close(stdin_r)
            os.close(out_w)
        self._bwrap = proc
        shell_pid = _grandchild(proc)

        def kill():
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()

        return ShellProcess(io=PipeIO(stdin_w, out_r), pid=shell_pid, exit_code=proc.poll,
                            kill=kill)

    # --- commands --------------------------------------------------------------------------
    def run_fresh(self, command: str, timeout_s: float = 30.0, *, extra_ro_binds=(),
                  env: dict | None = None, etc_binds=(), clean_env: bool = False
                  ) -> CommandResult:
        """Run ``command`` with ``bash -c`` in a new process tree (own PID namespace) over the
        same files -- not the agent's shell.  ``clean_env``: only PATH/HOME/LANG + ``env``."""
        self._require()
        if not (timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._fresh_count += 1
        child = f"fresh-{self._fresh_count}"
        if self.tree is not None:
            self.tree.make_child(child)
        base_env = ({"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
                    if clean_env else self._env())
        base_env.update(env or {})
        out_r, out_w = os.pipe()
        t0 = time.monotonic()
        try:
            proc = self._popen_bwrap(child if self.tree is not None else None,
                                     self._bwrap_args(extra_ro_binds, etc_binds),
                                     ["/bin/bash", "--noprofile", "--norc", "-c",
                                      self._close_inherited() + command],
                                     stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w,
                                     env=base_env)
        finally:
            os.close(out_w)
        io = PipeIO(-1, out_r)

        def on_timeout():
            if self.tree is not None:
                self.tree.kill(child)
                self.tree.set_frozen(child, False)
            proc.kill()

        try:
            out, timed_out, _ = run_to_eof(io, self.config.output_cap_bytes, timeout_s,
                                           on_timeout)
        finally:
            try:
                os.close(out_r)
            except OSError:
                pass
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if self.tree is not None:
                self.tree.kill(child)
                self.tree.remove_child(child)
        code = None if timed_out else proc.returncode
        if timed_out:
            out.add(f"\n[command timed out after {timeout_s:g}s; its processes were killed]\n"
                    .encode())
        return CommandResult(output=out.text(), exit_code=code, timed_out=timed_out,
                             truncated=out.truncated, duration_s=time.monotonic() - t0,
                             output_bytes=out.total, marks=tuple(out.marks))

    # --- files -----------------------------------------------------------------------------
    def write_file(self, sandbox_path, data: bytes | str, mode: int = 0o644) -> None:
        self._require()
        if isinstance(data, str):
            data = data.encode()
        self.ws.write_file(sandbox_path, data, mode)

    def read_file(self, sandbox_path) -> bytes:
        self._require()
        return self.ws.read_file(sandbox_path)

    def copy_in(self, host_path, sandbox_path) -> None:
        self._require()
        self.ws.copy_in(host_path, sandbox_path)

    def copy_out(self, sandbox_path, host_path, *, keep_symlinks: bool = True) -> list[str]:
        self._require()
        return self.ws.copy_out(sandbox_path, host_path, keep_symlinks=keep_symlinks)

    def remove_path(self, sandbox_path) -> None:
        """Delete a file, link or folder (not following links) in a writable area."""
        self._require()
        self.ws.remove(sandbox_path)

    # --- state -----------------------------------------------------------------------------
    def snapshot(self, *, persist: bool | None = None) -> Snapshot:
        """Copy every writable area (processes frozen meanwhile, so the copy is consistent)."""
        self._require()
        persist = self.config.persist_snapshots if persist is None else persist
        sid = f"local-{secrets.token_hex(8)}"
        dest = (self.state_dir / "snapshots" / sid) if persist else (self.ws.root / "snaps" / sid)
        if self.tree is not None:
            self.tree.set_frozen(None, True)
        try:
            self.ws.save(dest)
        finally:
            if self.tree is not None:
                self.tree.set_frozen(None, False)
        return Snapshot(id=sid, backend=self.backend, location=str(dest), persistent=persist)

    def restore(self, snapshot) -> None:
        """Files, modes and links of every writable area become the snapshot's; running
        processes (the shell included) are stopped -- the next command gets a new shell."""
        self._require()
        snapshot = self._own_snapshot(snapshot, "restore")
        self.end_session()
        self.ws.load(Path(snapshot.location))

    # --- protected verifier hooks (tr.envs.protected) -----------------------------------------
    def install_tests(self, tests_dir, mount: str) -> list:
        """Tests are a read-only bind seen only by the verifier's process tree."""
        self._require()
        return [(str(tests_dir), mount)]

    def reset_dir(self, sandbox_path) -> None:
        """Remove whatever is at ``sandbox_path`` (links not followed), make an empty folder."""
        self._require()
        self.ws.make_empty_dir(sandbox_path)

    def verifier_python(self) -> tuple[str, list]:
        """The project interpreter at /opt/tr/python with the project's site-packages, the
        harness-owned files at /opt/tr/verifier, and over the agent's ``/etc``: the indirections
        the verifier's (host) programs follow from the pristine ``/etc`` copy
        (:data:`PRISTINE_ETC`: the loader's configuration, ``/etc/alternatives`` -- ``awk``,
        ``python`` ... are links through it --, PAM's) and the harness's files-only
        ``nsswitch.conf`` (``/etc/ld.so.preload`` deleted); read-only, in the verifier's tree
        only.  The rest of ``/etc`` (``passwd``, ``hosts``, ...) is the agent's, read as data."""
        exe, binds = python_mounts(self.state_dir)
        self.remove_path("/etc/ld.so.preload")
        tmpl = self.etc_template
        pristine = [n for n in PRISTINE_ETC if (tmpl / n).exists() or (tmpl / n).is_symlink()]
        for name in [*pristine, "nsswitch.conf"]:    # a link of the agent's is not a mount point
            self.remove_path(f"/etc/{name}")
        binds += [(str(tmpl / n), f"/etc/{n}") for n in pristine]
        binds.append((str(verifier_files(self.state_dir) / "nsswitch.conf"), "/etc/nsswitch.conf"))
        return exe, binds

    def network_sibling(self) -> "LocalSandbox":
        """Not on this backend (every command of the sandbox shares one set of namespaces, so a
        verifier beside the agent's live processes would share their files): SandboxError."""
        self._require()
        raise SandboxError("the local backend cannot run the tests beside the agent's live "
                           "processes (its servers are ended with them before the tests): run "
                           "this task with --backend docker")

    def _alive(self) -> bool:
        return self.ws is not None and not self.ws.closed and self.ws.w.is_dir()

    def _kill_stragglers(self) -> None:
        """Every process of the sandbox's cgroup tree -- whatever cgroup, session or parent it
        has -- is killed (the shell's bwrap is gone already, taking its PID namespace with it)."""
        if self.tree is not None:
            left = self.tree.kill_all()
            if left:
                raise SandboxError(f"processes {sorted(left)} of the sandbox survived SIGKILL")

    def _release(self) -> None:
        try:
            if self.tree is not None:
                self.tree.destroy()
        finally:
            try:
                if self.ws is not None:
                    self.ws.close()
            finally:
                if self.userns is not None:
                    self.userns.close()


@functools.cache
def _seccomp_program() -> bytes | None:
    return seccomp.program()


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe holding ``data`` (written whole, then closed)."""
    r, w = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def _parent_dirs(dst: str, mounted: set[str], made: set[str]) -> list[str]:
    """bwrap options making the missing parents of ``dst`` world-traversable folders (bwrap
    makes them 0700, which the sandbox's root -- not host root -- could not enter).  Paths in
    or below ``mounted`` exist already; ``made`` collects the folders made so far."""
    out = []
    parts = [p for p in dst.split("/") if p][:-1]
    for i in range(1, len(parts) + 1):
        path = "/" + "/".join(parts[:i])
        if path in made or any(path == m or path.startswith(m.rstrip("/") + "/")
                               for m in mounted):
            continue
        out += ["--perms", "0755", "--dir", path]
        made.add(path)
    return out


class _LazyScan:
    """ScanTracker rooted at the current bwrap process (fallback without cgroups)."""

    def __init__(self, sandbox: LocalSandbox):
        self.sandbox = sandbox
        self.inner: cgroups.ScanTracker | None = None

    def _get(self) -> cgroups.ScanTracker:
        pid = self.sandbox._bwrap.pid
        if self.inner is None or self.inner.root_pid != pid:
            self.inner = cgroups.ScanTracker(pid)
        return self.inner

    def begin(self, shell_pid):
        self._get().begin(shell_pid)

    def end(self, shell_pid):
        self._get().end(shell_pid)

    def kill_command(self, shell_pid):
        self._get().kill_command(shell_pid)

    def sweep(self, shell_pid):
        self._get().sweep(shell_pid)

    def kill_session(self, shell_pid):
        self._get().kill_session(shell_pid)


def _grandchild(proc: subprocess.Popen, timeout_s: float = 5.0) -> int:
    """Host pid of the shell: bwrap -> bwrap's PID-1 -> bash."""
    deadline = time.monotonic() + timeout_s
    pid = proc.pid
    for _ in range(2):
        while True:
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except FileNotFoundError:
                kids = []
            if kids:
                pid = int(kids[0])
                break
            if proc.poll() is not None:
                raise SandboxError(f"bubblewrap exited with {proc.returncode} before the shell "
                                   "started")
            if time.monotonic() > deadline:
                raise SandboxError("bubblewrap did not start the shell within "
                                   f"{timeout_s:g}s")
            time.sleep(0.0002)
    return pid


@functools.cache
def _env_resets_signals() -> bool:
    """Whether this host's ``env`` has ``--default-signal`` (coreutils >= 8.31)."""
    try:
        return subprocess.run(["env", "--default-signal", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def reap_stale_cgroups() -> None:
    """Remove empty cgroups left by sandboxes of processes killed with -9."""
    root = cgroups.CGROUP_V1
    dirs = [root / "pids" / CGROUP_GROUP, root / "freezer" / CGROUP_GROUP,
            root / "memory" / cgroups.own_cgroup("memory") / CGROUP_GROUP,
            root / "cpu" / cgroups.own_cgroup("cpu")]
    for d in dirs:
        if not d.is_dir():
            continue
        for entry in d.iterdir():
            if not entry.is_dir() or not entry.name.startswith("tr-sbx-"):
                continue
            try:
                pid_s, start, _ = entry.name[len("tr-sbx-"):].split("-", 2)
            except ValueError:
                continue
            if not owner_is_dead(f"{pid_s}-{start}"):
                continue
            for sub in sorted(entry.glob("*/"), reverse=True):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                entry.rmdir()
            except OSError:
                pass


class LocalBackend(Backend):
    """bubblewrap on this host: no images; a task's Dockerfile steps run in the started sandbox
    (``tr.envs.tasks.runner.prepare``); the disk is a tmpfs (RAM)."""

    name = "local"
    builds_images = False
    disk_is_memory = True

    def sandbox_class(self) -> type:
        return LocalSandbox


BACKEND = LocalBackend()
