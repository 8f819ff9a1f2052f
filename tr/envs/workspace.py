"""A sandbox's writable areas on the host, and file transfer that never follows planted links.

The writable areas (the task root ``/app``, home ``/root``, ``/tmp``, ``/logs`` and, locally,
``/etc``) are folders of one size-limited tmpfs that the host mounts per sandbox
(``size=disk_mb``: filling it fails with ENOSPC) and bind-mounts into the sandbox.  The local
``/etc`` is an overlay of a cached, secret-free copy of the host's ``/etc`` whose upper folder lies
on that tmpfs: a writable copy that costs nothing at start.  Because the host holds them:

* a snapshot copies the tmpfs into a snapshot folder (ext4 and tmpfs have no reflinks): the
  first one with ``cp -a``, later ones incrementally -- files unchanged since the previous
  snapshot (same inode, ctime and size) become hard links to that snapshot's copy, which is safe
  because snapshot files are never written or handed to the sandbox.  Restore empties nothing it
  does not have to: unchanged live files stay, the rest is deleted or copied back, in place (the
  bind mounts keep pointing at the same folders).  A fork is a new workspace filled from the
  snapshot.  Live files are never hard-linked to snapshot files: an in-place edit would change
  the snapshot through the shared inode.
* copy_in/copy_out resolve the sandbox path in *sandbox* space (an absolute link ``/app/x ->
  /root`` means the sandbox's ``/root``) and then walk it with ``openat(O_NOFOLLOW)`` from the
  area folder, so a link swapped in meanwhile fails instead of reaching a host file.

Without the right to mount (not root), the areas are plain folders and ``disk_limited`` is False.
"""

from __future__ import annotations

import ctypes
import os
import posixpath
import secrets
import shutil
import stat
import subprocess
import time
from pathlib import Path

from tr.envs.sandbox import SandboxError

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2
ROOT_PREFIX = "tr-sbx-"
try:
    COARSE_TICK_S = max(time.clock_getres(5), 0.001)   # CLOCK_REALTIME_COARSE: file times
except OSError:
    COARSE_TICK_S = 0.01
CTIME_MARGIN_NS = max(50_000_000, int(4 * COARSE_TICK_S * 1e9))


def _mount_tmpfs(target: str, size_mb: int) -> bool:
    r = _libc.mount(b"tr-sandbox", target.encode(), b"tmpfs", 0,
                    f"size={size_mb}m,mode=0755".encode())
    return r == 0


def _mount_overlay(lower: str, upper: str, work: str, target: str) -> bool:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    return _libc.mount(b"tr-overlay", target.encode(), b"overlay", 0, opts) == 0


def _umount(target: str) -> None:
    _libc.umount2(target.encode(), MNT_DETACH)


def _is_mountpoint(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == path for line in f)
    except OSError:
        return False


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_ = f.read()
        return stat_[stat_.rindex(b")") + 2:].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_id(pid: int | None = None) -> str:
    """``<pid>-<start time in clock ticks>``: names a process uniquely on this boot (a reused
    pid has another start time).  Recorded on everything a sandbox leaves on the host."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_proc_start_time(pid)}"


def host_scope() -> str:
    """``<boot id>/<pid namespace>``: where owner ids can be checked.  A resource recorded in
    another scope (another machine or pid namespace sharing the Docker engine) is never judged
    dead from here."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{boot}/{ns}"


def owner_is_dead(owner: str | None, scope: str | None = None) -> bool:
    """True only when ``owner`` (an :func:`owner_id`) is known to have exited: its pid is gone
    or now belongs to a process started at another time.  Unparseable owners and owners of
    another :func:`host_scope` are never called dead, so their resources are left alone."""
    if scope is not None and scope != host_scope():
        return False
    pid_s, _, start = (owner or "").partition("-")
    if not pid_s.isdigit() or not start:
        return False
    return _proc_start_time(int(pid_s)) != start


def default_state_dir() -> Path:
    return Path(os.environ.get("TR_SANDBOX_STATE_DIR") or
                Path(os.environ.get("TMPDIR", "/tmp")) / "tr-sandboxes")


def reap_stale(state_dir: Path) -> int:
    """Remove workspaces whose owning process is gone (killed -9 before it could clean up)."""
    removed = 0
    if not state_dir.is_dir():
        return 0
    for entry in state_dir.iterdir():
        if not entry.name.startswith(ROOT_PREFIX):
            continue
        try:
            pid_s, start, _ = entry.name[len(ROOT_PREFIX):].split("-", 2)
        except ValueError:
            continue
        if owner_is_dead(f"{pid_s}-{start}"):
            remove_tree(entry)
            removed += 1
    return removed


def remove_tree(root: Path) -> None:
    w = str(root / "w")
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4] for line in f]
    except OSError:
        mounts = []
    for m in sorted(mounts, key=len, reverse=True):   # overlays inside w first, then w
        if m == w or m.startswith(w + "/"):
            _umount(m)
    shutil.rmtree(root, ignore_errors=True)


def cp_tree(src: str, dst: str) -> None:
    """``cp -ax`` src/. into dst (links copied as links, modes/times/hard links kept, mounts
    inside -- the /etc overlay -- not entered)."""
    r = subprocess.run(["cp", "-a", "-x", "--reflink=auto", "-T", src, dst],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SandboxError(f"copying {src} -> {dst} failed: {r.stderr.strip()}")


def empty_dir(path: str) -> None:
    """Delete everything inside ``path`` without following links; keep ``path`` itself."""
    with os.scandir(path) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)


class HostWorkspace:
    """The writable areas of one sandbox, as host folders; ``areas`` maps sandbox path -> name."""

    def __init__(self, areas: dict[str, str], disk_mb: int, state_dir: Path | None = None,
                 overlays: dict[str, str] | None = None):
        """``overlays`` maps an area name to a read-only lower folder: the area is an overlay of
        it (upper/work folders ``.<name>-upper``/``.<name>-work`` on the tmpfs), so a writable
        copy of e.g. /etc costs no copying; snapshots hold only the upper (changed) part."""
        self.areas = dict(areas)
        self.overlays = dict(overlays or {})
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        self.root = self.state_dir / f"{ROOT_PREFIX}{owner_id(me)}-{secrets.token_hex(6)}"
        self.root.mkdir()
        self.w = self.root / "w"
        self.w.mkdir()
        self.disk_limited = _mount_tmpfs(str(self.w), disk_mb)
        for name in self.areas.values():
            (self.w / name).mkdir(exist_ok=True)
        for name in ("tmp", "shm"):
            if name in self.areas.values():
                (self.w / name).chmod(0o1777)
        (self.root / "snaps").mkdir()
        self.closed = False
        self.trusted: dict[str, dict] = {}
        self.last_snapshot: str | None = None
        if not self.disk_limited and self.overlays:   # no mount rights: plain copies
            for name, lower in self.overlays.items():
                cp_tree(lower, self.host_dir(name))
            self.overlays = {}
        for name in self.overlays:
            (self.w / f".{name}-upper").mkdir()
            (self.w / f".{name}-work").mkdir()
        self._mount_overlays()

    def _mount_overlays(self) -> None:
        for name, lower in self.overlays.items():
            if not _mount_overlay(lower, str(self.w / f".{name}-upper"),
                                  str(self.w / f".{name}-work"), self.host_dir(name)):
                err = ctypes.get_errno()
                raise SandboxError(f"mounting the {name} overlay failed: {os.strerror(err)}")

    def _umount_overlays(self) -> None:
        for name in self.overlays:
            _umount(self.host_dir(name))

    def host_dir(self, name: str) -> str:
        return str(self.w / name)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            remove_tree(self.root)

    # --- snapshots -------------------------------------------------------------------------
    # Incremental: ``self.trusted[snapshot]`` maps area-relative paths of live regular files and
    # links (one link each) to (inode, ctime_ns, size) when that live file is known to equal the
    # snapshot's copy.  ctime cannot be set from user space and changes on every write or chmod,
    # so an equal key means an unchanged file.  Timestamps are coarse (one clock tick, ~4 ms), so
    # files changed in the last CTIME_MARGIN_NS before a snapshot are never trusted, and host-side
    # writes (write_file, copy_in, remove) drop all trust.  Unchanged files are then hard-linked
    # from the previous snapshot (snapshots are never written, so sharing inodes between them is
    # safe) and left alone on restore; a snapshot's own files never become live inodes.

    def _live_dev(self) -> int:
        return os.stat(self.w).st_dev

    def save(self, dest: Path) -> None:
        """Snapshot every area into ``dest`` (the sandbox's processes must be stopped)."""
        t_snap = time.time_ns()
        dest.mkdir(parents=True)
        prev = self.last_snapshot
        if prev is not None and prev in self.trusted and os.path.isdir(prev):
            _copy_tree_linking(str(self.w), str(dest), prev, self.trusted[prev])
        else:
            cp_tree(str(self.w), str(dest))
        self.trusted[str(dest)] = _live_keys(str(self.w), before_ns=t_snap - CTIME_MARGIN_NS)
        self.last_snapshot = str(dest)

    def load(self, src: Path) -> None:
        """Make every area equal to the snapshot at ``src``, in place: files whose live copy is
        known unchanged stay, the rest is deleted or copied back."""
        if not src.is_dir():
            raise SandboxError(f"snapshot folder {src} does not exist (discarded, or its sandbox "
                               "closed without persist_snapshots)")
        trusted = self.trusted.get(str(src), {})
        self._umount_overlays()
        try:
            names = list(self.areas.values())
            for name in self.overlays:
                names += [f".{name}-upper", f".{name}-work"]
            for name in names:
                here, there = self.w / name, src / name
                if not there.is_dir():
                    empty_dir(str(here))
                elif trusted:
                    _sync_tree(str(there), str(here), name, trusted, {})
                else:
                    empty_dir(str(here))
                    cp_tree(str(there), str(here))
        finally:
            self._mount_overlays()
        # Our own copies are exact; wait out one clock tick so that no later write can share
        # their ctime, then trust them for the next restore/snapshot of this snapshot.
        time.sleep(COARSE_TICK_S)
        self.trusted = {str(src): _live_keys(str(self.w), before_ns=None)}
        self.last_snapshot = str(src)

    def distrust(self) -> None:
        """A host-side write happened: the next snapshot/restore copies everything."""
        self.trusted = {}
        self.last_snapshot = None

    # --- safe path resolution ----------------------------------------------------------------
    def _split(self, path: str) -> tuple[str, list[str]] | None:
        """('area name', [components below it]) for a canonical sandbox path, or None."""
        for prefix in sorted(self.areas, key=len, reverse=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                rest = path[len(prefix):].strip("/")
                return self.areas[prefix], [p for p in rest.split("/") if p]
        return None

    def canonical(self, path: str, follow_last: bool = True) -> str:
        """Resolve ``path`` in sandbox space: links inside the areas are read and followed as the
        sandbox would (absolute targets restart at the sandbox root).  Raises on loops."""
        if not isinstance(path, (str, os.PathLike)) or not str(path).startswith("/"):
            raise SandboxError(f"sandbox path must be absolute, got {path!r}")
        queue = [p for p in str(path).split("/") if p]
        out: list[str] = []
        hops = 0
        while queue:
            c = queue.pop(0)
            if c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = out + [c]
            if not queue and not follow_last:
                out = cand
                break
            split = self._split("/" + "/".join(cand))
            if split is None or not split[1]:
                out = cand
                continue
            host = os.path.join(self.host_dir(split[0]), *split[1])
            try:
                st = os.lstat(host)
            except (FileNotFoundError, NotADirectoryError):
                out = cand
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > 40:
                    raise SandboxError(f"too many levels of symbolic links in {path!r}")
                target = os.readlink(host)
                if target.startswith("/"):
                    out = []
                queue = [p for p in target.split("/") if p] + queue
            else:
                out = cand
        return "/" + "/".join(out)

    def locate(self, path, follow_last: bool = True) -> tuple[str, list[str]]:
        canon = self.canonical(str(path), follow_last)
        split = self._split(canon)
        if split is None:
            raise SandboxError(f"sandbox path {path!r} (resolved {canon!r}) is outside the "
                               f"writable areas {sorted(self.areas)}")
        return split

    def open_dir(self, area: str, parts: list[str], create: bool) -> int:
        """fd of the folder ``area/parts``, walked with O_NOFOLLOW (created when ``create``)."""
        fd = os.open(self.host_dir(area), os.O_RDONLY | os.O_DIRECTORY)
        try:
            for p in parts:
                if create:
                    try:
                        os.mkdir(p, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError as e:
            os.close(fd)
            raise SandboxError(f"cannot open folder {'/'.join([area, *parts])} in the sandbox: "
                               f"{e.strerror} (a link or file where a folder is expected?)") from e
        return fd

    # --- transfers ---------------------------------------------------------------------------
    def remove(self, path) -> None:
        """Delete a file, link or folder (links not followed); a missing path is fine."""
        self.distrust()
        area, parts = self.locate(path, follow_last=False)
        if not parts:
            raise SandboxError(f"cannot remove {path!r}: it is a writable area's root")
        dfd = self.open_dir(area, parts[:-1], create=False)
        try:
            try:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=dfd)
            else:
                os.unlink(parts[-1], dir_fd=dfd)
        finally:
            os.close(dfd)

    def make_empty_dir(self, path) -> None:
        """``path`` becomes a new empty folder, whatever (file, link, folder) was there."""
        self.remove(path)
        area, parts = self.locate(path, follow_last=False)
        os.close(self.open_dir(area, parts, create=True))

    def write_file(self, path, data: bytes, mode: int) -> None:
        self.distrust()
        area, parts = self.locate(path)
        if not parts:
            raise SandboxError(f"write_file: {path!r} is an area folder, not a file")
        dfd = self.open_dir(area, parts[:-1], create=True)
        try:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                             mode & 0o7777, dir_fd=dfd)
            except OSError as e:
                raise SandboxError(f"write_file {path!r}: {e.strerror}") from e
            try:
                os.fchmod(fd, mode & 0o7777)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as e:
                raise SandboxError(f"write_file {path!r}: {e.strerror}") from e
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def read_file(self, path) -> bytes:
        area, parts = self.locate(path)
        if not parts:
            raise SandboxError(f"read_file: {path!r} is a folder")
        dfd = self.open_dir(area, parts[:-1], create=False)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        except OSError as e:
            raise SandboxError(f"read_file {path!r}: {e.strerror}") from e
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"read_file {path!r}: not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def copy_in(self, host_path, path) -> None:
        """Copy a host file or folder to sandbox ``path`` (a folder's contents are merged)."""
        self.distrust()
        host_path = Path(host_path)
        if not host_path.exists():
            raise SandboxError(f"copy_in: host path {host_path} does not exist")
        if host_path.is_file():
            self.write_file(path, host_path.read_bytes(), stat.S_IMODE(host_path.stat().st_mode))
            return
        area, parts = self.locate(path)
        dfd = self.open_dir(area, parts, create=True)
        try:
            os.fchmod(dfd, stat.S_IMODE(host_path.stat().st_mode))
            _copy_host_tree_into(host_path, dfd)
        finally:
            os.close(dfd)

    def copy_out(self, path, host_path, *, keep_symlinks: bool = True) -> list[str]:
        """Copy sandbox ``path`` to the host without following links inside it; links are kept as
        links (or skipped with ``keep_symlinks=False``), special files skipped.  Returns the
        relative paths that were skipped."""
        area, parts = self.locate(path, follow_last=False)
        host_path = Path(host_path)
        skipped: list[str] = []
        if parts:
            dfd = self.open_dir(area, parts[:-1], create=False)
            name = parts[-1]
        else:
            dfd = os.open(str(self.w), os.O_RDONLY | os.O_DIRECTORY)
            name = area
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError as e:
                raise SandboxError(f"copy_out: {path!r} does not exist in the sandbox") from e
            _copy_entry_out(dfd, name, st, host_path, keep_symlinks, skipped, "")
        finally:
            os.close(dfd)
        return skipped


def _copy_host_tree_into(src: Path, dfd: int) -> None:
    for entry in os.scandir(src):
        if entry.is_symlink():
            try:
                os.unlink(entry.name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                pass
            os.symlink(os.readlink(entry.path), entry.name, dir_fd=dfd)
        elif entry.is_dir():
            try:
                os.mkdir(entry.name, 0o755, dir_fd=dfd)
            except FileExistsError:
                pass
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                os.fchmod(sub, stat.S_IMODE(entry.stat().st_mode))
                _copy_host_tree_into(Path(entry.path), sub)
            finally:
                os.close(sub)
        elif entry.is_file():
            mode = stat.S_IMODE(entry.stat().st_mode)
            fd = os.open(entry.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode,
                         dir_fd=dfd)
            try:
                os.fchmod(fd, mode)
                with open(entry.path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
            finally:
                os.close(fd)


def _copy_entry_out(dfd: int, name: str, st: os.stat_result, dest: Path, keep_symlinks: bool,
                    skipped: list[str], rel: str) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        if keep_symlinks:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            os.symlink(os.readlink(name, dir_fd=dfd), dest)
        else:
            skipped.append(rel or name)
    elif stat.S_ISDIR(mode):
        dest.mkdir(parents=True, exist_ok=True)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            for child in os.listdir(sub):
                cst = os.stat(child, dir_fd=sub, follow_symlinks=False)
                _copy_entry_out(sub, child, cst, dest / child, keep_symlinks, skipped,
                                posixpath.join(rel, child) if rel else child)
        finally:
            os.close(sub)
        os.chmod(dest, stat.S_IMODE(mode) | 0o700)
    elif stat.S_ISREG(mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):   # swapped meanwhile
                skipped.append(rel or name)
                return
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink():
                dest.unlink()
            with open(dest, "wb") as out:
                while chunk := os.read(fd, 1 << 20):
                    out.write(chunk)
            os.chmod(dest, stat.S_IMODE(mode))
        finally:
            os.close(fd)
    else:
        skipped.append(rel or name)


# ----------------------------------------------------------------------------------------------
# Incremental snapshot helpers (see HostWorkspace: "Incremental").

def _walk(root: str):
    """(relative path, lstat) of everything under ``root``, not entering other mounts."""
    dev = os.lstat(root).st_dev
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                r = f"{rel}/{e.name}" if rel else e.name
                st = e.stat(follow_symlinks=False)
                yield r, st
                if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                    stack.append(r)


def _live_keys(root: str, before_ns: int | None) -> dict[str, tuple[int, int, int]]:
    """Trust keys of the single-link regular files and links under ``root`` whose ctime is
    older than ``before_ns`` (None: all)."""
    keys = {}
    for rel, st in _walk(root):
        if (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and st.st_nlink == 1 and \
                (before_ns is None or st.st_ctime_ns < before_ns):
            keys[rel] = (st.st_ino, st.st_ctime_ns, st.st_size)
    return keys


def _copy_meta(st: os.stat_result, dst: str, src: str | None = None) -> None:
    """Mode, owner, times -- and extended attributes (overlayfs keeps "opaque folder" marks in
    ``trusted.overlay.*``) when ``src`` is given."""
    if src is not None and not stat.S_ISLNK(st.st_mode):
        try:
            for name in os.listxattr(src, follow_symlinks=False):
                os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False),
                            follow_symlinks=False)
        except OSError:
            pass
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    try:
        os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    except OSError:
        pass
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy_entry(src: str, dst: str, st: os.stat_result, links: dict) -> None:
    """Copy one non-directory entry; ``links`` maps source inode -> first copy (hard links)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        if st.st_nlink > 1 and st.st_ino in links:
            os.link(links[st.st_ino], dst)
            return
        shutil.copyfile(src, dst, follow_symlinks=False)
        links[st.st_ino] = dst
    elif stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(dst)
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:       # overlayfs whiteout
        os.mknod(dst, mode, 0)
    else:
        return                                          # sockets, devices: not kept
    _copy_meta(st, dst, src)


def _copy_tree_linking(live: str, dest: str, prev: str, trusted: dict) -> None:
    """Snapshot ``live`` into ``dest``: trusted unchanged files become hard links to their copy
    in the previous snapshot ``prev``, the rest is copied."""
    dirs, links = [], {}
    for rel, st in _walk(live):
        src, dst = os.path.join(live, rel), os.path.join(dest, rel)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(dst)
            dirs.append((rel, st))
            continue
        key = (st.st_ino, st.st_ctime_ns, st.st_size)
        if st.st_nlink == 1 and trusted.get(rel) == key:
            try:
                os.link(os.path.join(prev, rel), dst, follow_symlinks=False)
                continue
            except OSError:
                pass
        _copy_entry(src, dst, st, links)
    for rel, st in reversed(dirs):
        _copy_meta(st, os.path.join(dest, rel), os.path.join(live, rel))
    _copy_meta(os.lstat(live), dest, live)


def _sync_tree(snap: str, live: str, rel: str, trusted: dict, links: dict) -> None:
    """Make folder ``live`` equal to ``snap`` keeping trusted unchanged files."""
    snap_entries = {e.name: e.stat(follow_symlinks=False) for e in os.scandir(snap)}
    kept = set()
    with os.scandir(live) as it:
        for e in it:
            lst = e.stat(follow_symlinks=False)
            sst = snap_entries.get(e.name)
            r = f"{rel}/{e.name}"
            if sst is not None and stat.S_IFMT(lst.st_mode) == stat.S_IFMT(sst.st_mode):
                if stat.S_ISDIR(lst.st_mode):
                    continue
                if lst.st_nlink == 1 and trusted.get(r) == \
                        (lst.st_ino, lst.st_ctime_ns, lst.st_size):
                    kept.add(e.name)
                    continue
            if stat.S_ISDIR(lst.st_mode):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
    for name, sst in snap_entries.items():
        src, dst = os.path.join(snap, name), os.path.join(live, name)
        if stat.S_ISDIR(sst.st_mode):
            if not os.path.isdir(dst) or os.path.islink(dst):
                os.mkdir(dst)
            _sync_tree(src, dst, f"{rel}/{name}", trusted, links)
        elif name not in kept:
            _copy_entry(src, dst, sst, links)
    _copy_meta(os.lstat(snap), live, snap)

