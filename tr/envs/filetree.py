"""File trees a sandbox wrote, copied, synced, walked and removed from the host -- safely.

Every operation here is iterative and works on open folders, never on path strings: it follows
no link (each step is an ``openat(O_NOFOLLOW)``), has no depth limit (no recursion, and one open
folder per tree at a time: a folder's parent is reopened through ``..`` and checked to be the same
folder by device and inode), stays on one filesystem (mounts inside are not entered), and stops
with :class:`~tr.envs.sandbox.SandboxError` at a deadline.  A sandbox's writes are untrusted input:
a 10,000-level tree, a sparse 100 GB file or a socket must neither crash nor slow the host side.

Copies keep modes, owners, times, extended attributes and hard links within the tree, write only
the data extents of sparse files (``SEEK_DATA``/``SEEK_HOLE``), keep symlinks, FIFOs, sockets and
overlayfs whiteouts (0/0 character devices) and drop other device files.  With ``strip``
(snapshots) regular files lose their setuid/setgid bits and file capabilities
(``security.capability``), so a snapshot holds no file that grants privileges when run.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field

from tr.envs.sandbox import SandboxError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
FILE_CAPS_XATTR = "security.capability"
PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
# Trust keys (see :func:`trust_keys`) are kept for entries at most this deep; deeper ones are
# always copied, so key building stays linear in the number of entries whatever the depth.
MAX_KEY_DEPTH = 128
CHUNK = 1 << 20


class Deadline:
    """A wall-clock bound for one tree operation: ``check()`` raises once it has passed."""

    def __init__(self, seconds: float | None, what: str):
        self.seconds, self.what = seconds, what
        self.end = None if seconds is None else time.monotonic() + seconds

    def check(self) -> None:
        if self.end is not None and time.monotonic() > self.end:
            raise SandboxError(f"{self.what} took longer than {self.seconds:g}s (a tree too large "
                               "for the time allowed); stopped")


NO_DEADLINE = Deadline(None, "")


def _lstat(name: str, dir_fd: int) -> os.stat_result:
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def _open_dir(name: str, dir_fd: int) -> int:
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def _same(st: os.stat_result, other: os.stat_result) -> bool:
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def _up(fd: int, expect: os.stat_result) -> int:
    """The parent of open folder ``fd`` (which is closed), checked to be ``expect``."""
    try:
        parent = os.open("..", DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    if not _same(os.fstat(parent), expect):
        os.close(parent)
        raise SandboxError("a folder was moved while its tree was being walked; stopped")
    return parent


@dataclass
class _Frame:
    """One folder on the walk's path: its names still to visit and how to get back up."""

    names: list[str]
    parts: list[str]                   # path below the root (only kept to MAX_KEY_DEPTH)
    depth: int
    st: list                           # per tree: the folder's own stat (None: tree absent)
    meta: os.stat_result | None = None  # source stat applied to the copy once it is done
    extra: dict = field(default_factory=dict)


class _Walk:
    """Parallel folders in several trees, moved down into a child and back up together.

    ``fds[i]`` is tree ``i``'s open folder at the current position (None where that tree has no
    such folder).  Tree 0 drives the walk; a tree given in ``create`` gets missing folders made,
    other trees (a previous snapshot) may lack them."""

    def __init__(self, fds: list[int | None]):
        self.fds = [None if fd is None else os.dup(fd) for fd in fds]
        self.stack: list[_Frame] = []

    def push(self, names: list[str], parts: list[str], depth: int,
             meta: os.stat_result | None = None) -> None:
        st = [None if fd is None else os.fstat(fd) for fd in self.fds]
        self.stack.append(_Frame(names, parts, depth, st, meta))

    def down(self, name: str, names_of, create: dict[int, int] | None = None,
             meta: os.stat_result | None = None) -> None:
        """Enter child folder ``name`` (``create``: tree -> mode of a folder made where missing);
        ``names_of(fd)`` lists tree 0's new folder."""
        create = create or {}
        top = self.stack[-1]
        new: list[int | None] = []
        try:
            for i, fd in enumerate(self.fds):
                if fd is None:
                    new.append(None)
                    continue
                if i in create:
                    try:
                        os.mkdir(name, create[i], dir_fd=fd)
                    except FileExistsError:
                        pass
                try:
                    new.append(_open_dir(name, fd))
                except OSError:
                    if i == 0 or i in create:
                        raise
                    new.append(None)          # an optional tree without this folder
            names = names_of(new[0])
        except BaseException:
            for fd in new:
                if fd is not None:
                    os.close(fd)
            raise
        for fd in self.fds:
            if fd is not None:
                os.close(fd)
        self.fds = new
        depth = top.depth + 1
        parts = top.parts + [name] if depth <= MAX_KEY_DEPTH else top.parts
        self.push(names, parts, depth, meta)
        self.stack[-1].extra["name"] = name

    def up(self) -> _Frame:
        """Leave the current folder; returns its frame.  At the root, the walk just ends."""
        done = self.stack.pop()
        if not self.stack:
            return done
        parent = self.stack[-1]
        fds: list[int | None] = []
        try:
            for i, fd in enumerate(self.fds):
                self.fds[i] = None
                if fd is None:
                    fds.append(None)
                elif parent.st[i] is None:
                    os.close(fd)
                    fds.append(None)
                else:
                    fds.append(_up(fd, parent.st[i]))
        except BaseException:
            for fd in fds + self.fds:
                if fd is not None:
                    os.close(fd)
            self.fds = [None] * len(self.fds)
            raise
        self.fds = fds
        return done

    def close(self) -> None:
        for fd in self.fds:
            if fd is not None:
                os.close(fd)
        self.fds = [None] * len(self.fds)


def _names(fd: int) -> list[str]:
    names = os.listdir(fd)
    names.sort(reverse=True)       # popped from the end: visited in name order
    return names


# ----------------------------------------------------------------------------------------------
# Single entries.

def _copy_xattrs(src_fd: int, dst_fd: int, strip: bool) -> None:
    try:
        names = os.listxattr(src_fd)
    except OSError:
        return
    for name in names:
        if strip and name == FILE_CAPS_XATTR:
            continue
        try:
            os.setxattr(dst_fd, name, os.getxattr(src_fd, name))
        except OSError:
            pass


def _apply_meta(fd: int, st: os.stat_result, *, strip: bool, owner: bool) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if strip and stat.S_ISREG(st.st_mode):
        mode &= ~PRIVILEGE_BITS
    if not owner and stat.S_ISDIR(st.st_mode):
        mode |= 0o700                 # a copy for the caller: always walkable by it
    if owner:
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass
    os.fchmod(fd, mode)              # after chown, which clears setuid bits
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_data(src_fd: int, dst_fd: int, size: int, deadline: Deadline = NO_DEADLINE) -> None:
    """Copy ``size`` bytes of file data, only its data extents: holes stay holes."""
    offset = 0
    while offset < size:
        deadline.check()
        try:
            start = os.lseek(src_fd, offset, os.SEEK_DATA)
            end = min(os.lseek(src_fd, start, os.SEEK_HOLE), size)
        except OSError as e:
            if e.errno == errno.ENXIO:           # only a hole is left
                break
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            start, end = offset, size           # no hole support here: copy it all
        if end <= start:
            break
        os.lseek(dst_fd, start, os.SEEK_SET)
        position = start
        while position < end:
            sent = os.sendfile(dst_fd, src_fd, position, min(16 * CHUNK, end - position))
            if sent == 0:                        # the file shrank meanwhile
                break
            position += sent
        offset = max(position, start + 1)
    os.ftruncate(dst_fd, size)


class _HardLinks:
    """First copies of multiply-linked files: (device, inode) of the source -> the copy's path
    below the destination root, so later names become hard links to it.  Only entries at most
    MAX_KEY_DEPTH deep are remembered (their paths are exact); deeper ones are copied."""

    def __init__(self, dst_root: int):
        self.dst_root = dst_root
        self.first: dict[tuple[int, int], str] = {}

    def link(self, st: os.stat_result, dst_dir: int, name: str) -> bool:
        rel = self.first.get((st.st_dev, st.st_ino))
        if rel is None:
            return False
        try:   # every folder on ``rel`` is one this copy made: no link can be on the way
            os.link(rel, name, src_dir_fd=self.dst_root, dst_dir_fd=dst_dir,
                    follow_symlinks=False)
            return True
        except OSError:
            return False

    def remember(self, st: os.stat_result, parts: list[str], depth: int, name: str) -> None:
        if st.st_nlink > 1 and depth < MAX_KEY_DEPTH:
            self.first.setdefault((st.st_dev, st.st_ino), "/".join(parts + [name]))


def copy_entry(src_dir: int, dst_dir: int, name: str, st: os.stat_result, *,
               strip: bool = True, owner: bool = True, keep_symlinks: bool = True,
               deadline: Deadline = NO_DEADLINE) -> bool:
    """Copy one non-folder entry ``name`` (lstat ``st``) from folder ``src_dir`` to ``dst_dir``.
    Returns False when it was not copied (a device file; a link with ``keep_symlinks=False``;
    a file swapped for something else meanwhile)."""
    mode = st.st_mode
    if stat.S_ISREG(mode) and st.st_size == 0:    # nothing to read (nor to run: no caps kept)
        dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=dst_dir)
        try:
            _apply_meta(dfd, st, strip=strip, owner=owner)
        finally:
            os.close(dfd)
        return True
    if stat.S_ISREG(mode):
        sfd = os.open(name, FILE_FLAGS, dir_fd=src_dir)
        try:
            sst = os.fstat(sfd)
            if not stat.S_ISREG(sst.st_mode) or not _same(sst, st):
                return False
            dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=dst_dir)
            try:
                copy_data(sfd, dfd, sst.st_size, deadline)
                _copy_xattrs(sfd, dfd, strip)
                _apply_meta(dfd, sst, strip=strip, owner=owner)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        return True
    if stat.S_ISLNK(mode):
        if not keep_symlinks:
            return False
        os.symlink(os.readlink(name, dir_fd=src_dir), name, dir_fd=dst_dir)
    elif stat.S_ISFIFO(mode):
        os.mkfifo(name, 0o600, dir_fd=dst_dir)
    elif stat.S_ISSOCK(mode):
        os.mknod(name, stat.S_IFSOCK | 0o600, dir_fd=dst_dir)
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:       # overlayfs whiteout
        os.mknod(name, stat.S_IFCHR | 0o600, 0, dir_fd=dst_dir)
    else:
        return False                                    # devices: never carried
    if owner:
        try:
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst_dir, follow_symlinks=False)
        except OSError:
            pass
    if not stat.S_ISLNK(mode):
        os.chmod(name, stat.S_IMODE(mode), dir_fd=dst_dir)
    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst_dir, follow_symlinks=False)
    return True


def _copy_one(walk: "_Walk", links: _HardLinks, name: str, st: os.stat_result, **kw) -> bool:
    top = walk.stack[-1]
    src, dst = walk.fds[0], walk.fds[1]
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and links.link(st, dst, name):
        return True
    copied = copy_entry(src, dst, name, st, **kw)
    if copied and stat.S_ISREG(st.st_mode):
        links.remember(st, top.parts, top.depth, name)
    return copied


def _finish_dir(walk: "_Walk", done: _Frame, strip: bool, owner: bool) -> None:
    """Apply a finished folder's source metadata to its copy (the walk is back at its parent,
    or -- the root -- still at it)."""
    if walk.stack:
        name = done.extra["name"]
        src = _open_dir(name, walk.fds[0])
        try:
            dst = _open_dir(name, walk.fds[1])
        except BaseException:
            os.close(src)
            raise
    else:
        src, dst = os.dup(walk.fds[0]), os.dup(walk.fds[1])
    try:
        _copy_xattrs(src, dst, strip)
        _apply_meta(dst, done.meta, strip=strip, owner=owner)
    finally:
        os.close(src)
        os.close(dst)


# ----------------------------------------------------------------------------------------------
# Whole trees.

def trust_key(st: os.stat_result) -> tuple[int, int, int]:
    """(inode, ctime, size): equal keys mean an unchanged file (ctime cannot be set from user
    space and changes on every write, chmod or rename of the file)."""
    return (st.st_ino, st.st_ctime_ns, st.st_size)


def _trustable(st: os.stat_result, before_ns: int | None) -> bool:
    """A single-link file or link, changed before ``before_ns``, without setuid/setgid bits
    (its stripped snapshot copy differs from it, so it is never "unchanged")."""
    return ((stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)) and st.st_nlink == 1
            and not st.st_mode & PRIVILEGE_BITS
            and (before_ns is None or st.st_ctime_ns < before_ns))


def copy_tree(src_fd: int, dst_fd: int, *, prev_fd: int | None = None,
              trusted: dict | None = None, strip: bool = True, owner: bool = True,
              keep_symlinks: bool = True, deadline: Deadline = NO_DEADLINE,
              keys_out: dict | None = None, keys_before_ns: int | None = None) -> list[str]:
    """Copy the contents of open folder ``src_fd`` into the empty open folder ``dst_fd``, then
    the folder's own metadata.  With ``prev_fd`` and ``trusted`` (incremental snapshots), a
    single-link file or link whose :func:`trust_key` equals ``trusted[relative path]`` is
    hard-linked from the same path under ``prev_fd`` instead of copied.  ``owner``: keep owners
    (else the copies belong to the caller).  ``keys_out`` collects the source's
    :func:`trust_keys` (with ``keys_before_ns``) on the way.  Returns the relative paths not
    copied."""
    skipped: list[str] = []
    root_dev = os.fstat(src_fd).st_dev
    links = _HardLinks(dst_fd)
    kw = dict(strip=strip, owner=owner, keep_symlinks=keep_symlinks, deadline=deadline)
    walk = _Walk([src_fd, dst_fd, prev_fd])
    try:
        walk.push(_names(walk.fds[0]), [], 0, os.fstat(src_fd))
        while walk.stack:
            top = walk.stack[-1]
            if not top.names:
                _finish_dir(walk, walk.up(), strip, owner)
                continue
            deadline.check()
            name = top.names.pop()
            sfd, dfd, pfd = walk.fds
            st = _lstat(name, sfd)
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev == root_dev:
                    walk.down(name, _names, create={1: 0o700}, meta=st)
                else:                           # a mount inside: its folder only
                    os.mkdir(name, 0o700, dir_fd=dfd)
                    fd = _open_dir(name, dfd)
                    try:
                        _apply_meta(fd, st, strip=strip, owner=owner)
                    finally:
                        os.close(fd)
                continue
            rel = "/".join(top.parts + [name]) if top.depth < MAX_KEY_DEPTH else None
            if keys_out is not None and rel is not None and _trustable(st, keys_before_ns):
                keys_out[rel] = trust_key(st)
            if (pfd is not None and trusted and st.st_nlink == 1 and rel is not None
                    and trusted.get(rel) == trust_key(st)):
                try:
                    os.link(name, name, src_dir_fd=pfd, dst_dir_fd=dfd, follow_symlinks=False)
                    continue
                except OSError:
                    pass
            if not _copy_one(walk, links, name, st, **kw):
                skipped.append(rel or name)
    finally:
        walk.close()
    return skipped


def remove_entry(dir_fd: int, name: str, deadline: Deadline = NO_DEADLINE) -> None:
    """Delete ``name`` in open folder ``dir_fd`` -- a whole tree if it is a folder -- without
    following links.  A missing entry is fine."""
    try:
        st = _lstat(name, dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    sub = _open_dir(name, dir_fd)
    try:
        clear_dir(sub, deadline)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dir_fd)


def _visit(fd: int, deadline: Deadline, enter, visit, leave=None) -> None:
    """Depth-first over everything below open folder ``fd``, iteratively, never following a
    link: ``enter(name, st, same_device, depth)`` says whether to go into a folder;
    ``visit(dir_fd, parts, name, st)`` gets every other entry; ``leave(dir_fd, name)`` runs after
    a folder's entries (its parent open).  An entry gone meanwhile is skipped."""
    root_dev = os.fstat(fd).st_dev
    walk = _Walk([fd])
    try:
        walk.push(_names(walk.fds[0]), [], 0)
        while walk.stack:
            top = walk.stack[-1]
            if not top.names:
                done = walk.up()
                if leave is not None and walk.stack:
                    leave(walk.fds[0], done.extra["name"])
                continue
            deadline.check()
            name = top.names.pop()
            try:
                st = _lstat(name, walk.fds[0])
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and enter(name, st, st.st_dev == root_dev, top.depth):
                walk.down(name, _names)
            else:
                visit(walk.fds[0], top.parts, name, st)
    finally:
        walk.close()


def clear_dir(fd: int, deadline: Deadline = NO_DEADLINE) -> None:
    """Delete everything inside open folder ``fd`` (not the folder itself), not following links.
    A mount inside is an error (unmount it first)."""
    def enter(name, st, same_device, depth):
        if not same_device:
            raise SandboxError(f"a mount inside a tree being removed (at {name!r}); stopped")
        return True

    _visit(fd, deadline, enter, lambda dfd, parts, name, st: os.unlink(name, dir_fd=dfd),
           leave=lambda dfd, name: os.rmdir(name, dir_fd=dfd))


def trust_keys(fd: int, before_ns: int | None,
               deadline: Deadline = NO_DEADLINE) -> dict[str, tuple[int, int, int]]:
    """``relative path -> trust_key`` of the single-link regular files and links under open
    folder ``fd`` (fewer than MAX_KEY_DEPTH folders deep, not entering mounts) whose ctime is
    older than ``before_ns`` (None: all) -- setuid/setgid files aside: their snapshot copies are
    stripped, so they are never "unchanged"."""
    keys: dict[str, tuple[int, int, int]] = {}

    def visit(dfd, parts, name, st):
        if not stat.S_ISDIR(st.st_mode) and _trustable(st, before_ns):
            keys["/".join(parts + [name])] = trust_key(st)

    _visit(fd, deadline, lambda name, st, same_device, depth:
           same_device and depth + 1 < MAX_KEY_DEPTH, visit)
    return keys


def open_below(fd: int, parts, *, create: bool = False, mode: int = 0o755,
               owner: tuple[int, int] | None = None) -> int:
    """A new fd of the folder ``fd/parts...``, walked with O_NOFOLLOW (a link or file on the way
    raises OSError, never followed); missing folders are made (``mode``, ``owner``) when
    ``create``.  ``fd`` stays open."""
    cur = os.dup(fd)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=cur)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=cur, follow_symlinks=False)
                except FileExistsError:
                    pass
            nfd = os.open(part, DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = nfd
    except BaseException:
        os.close(cur)
        raise
    return cur


def sync_tree(snap_fd: int, live_fd: int, trusted: dict, *,
              deadline: Deadline = NO_DEADLINE) -> None:
    """Make open folder ``live_fd`` equal to the snapshot ``snap_fd``, in place: a live
    single-link file or link whose :func:`trust_key` equals ``trusted[relative path]`` is known
    unchanged and stays; everything else that differs is deleted, or copied from the snapshot."""
    links = _HardLinks(live_fd)
    walk = _Walk([snap_fd, live_fd])
    try:
        walk.push(_sync_level(walk.fds[0], walk.fds[1], [], 0, trusted, deadline), [], 0,
                  os.fstat(snap_fd))
        while walk.stack:
            top = walk.stack[-1]
            if not top.names:
                _finish_dir(walk, walk.up(), True, True)
                continue
            deadline.check()
            name = top.names.pop()
            st = _lstat(name, walk.fds[0])
            if stat.S_ISDIR(st.st_mode):
                depth = top.depth + 1
                parts = top.parts + [name] if depth <= MAX_KEY_DEPTH else top.parts
                walk.down(name, lambda fd: [], create={1: 0o700}, meta=st)
                walk.stack[-1].names = _sync_level(walk.fds[0], walk.fds[1], parts, depth,
                                                   trusted, deadline)
            else:
                _copy_one(walk, links, name, st, deadline=deadline)
    finally:
        walk.close()


def _sync_level(snap: int, live: int, parts: list[str], depth: int, trusted: dict,
                deadline: Deadline) -> list[str]:
    """At one folder: delete the live entries that differ from the snapshot's; return the
    snapshot names still to bring over (folders, and files not kept), in visiting order."""
    wanted = {n: _lstat(n, snap) for n in os.listdir(snap)}
    for name in os.listdir(live):
        deadline.check()
        lst = _lstat(name, live)
        sst = wanted.get(name)
        if sst is not None and stat.S_IFMT(lst.st_mode) == stat.S_IFMT(sst.st_mode):
            if stat.S_ISDIR(lst.st_mode):
                continue
            if (lst.st_nlink == 1 and depth < MAX_KEY_DEPTH
                    and trusted.get("/".join(parts + [name])) == trust_key(lst)):
                del wanted[name]
                continue
        remove_entry(live, name, deadline)
    return sorted(wanted, reverse=True)
