"""Package installs in Dockerfile `RUN` lines: what they ask for, whether this host has it, and
Ubuntu package names that differ on Debian.

    parts = split_commands("apt-get update && apt-get install -y jq && rm -rf /var/lib/apt/lists/*")
    [install_request(p) for p in parts]   # [('apt', ()), ('apt', ('jq',)), ('noop', ())]

Used by the local backend (a RUN whose installs the host already has is skipped; one that needs
missing packages names them) and by the Docker stand-in base (Ubuntu names mapped to Debian's).
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess

# Ubuntu (or older Debian) names -> the Debian bookworm package that provides the same thing.
UBUNTU_TO_DEBIAN = {
    "python3.12": "python3", "python3.12-venv": "python3-venv", "python3.12-dev": "python3-dev",
    "python3.10": "python3", "python3.10-venv": "python3-venv", "python3.10-dev": "python3-dev",
    "python-is-python3": "python-is-python3", "python3-distutils": "python3-setuptools",
    "libgl1-mesa-glx": "libgl1", "netcat": "netcat-openbsd", "libssl1.1": "libssl3",
    "libffi7": "libffi8", "libncurses5": "libncurses6", "libtinfo5": "libtinfo6",
    "software-properties-common": "software-properties-common", "openjdk-21-jdk": "openjdk-17-jdk",
    "openjdk-21-jre": "openjdk-17-jre", "openjdk-11-jdk": "openjdk-17-jdk",
    "libasound2t64": "libasound2", "libicu74": "libicu72", "libicu70": "libicu72",
    "gcc-13": "gcc-12", "g++-13": "g++-12", "clang-18": "clang-16", "llvm-18": "llvm-16",
}
# What Terminal-Bench's harness installs for itself (its tmux session and asciinema recording):
# the local backend skips them with a note.
HARNESS_TOOLS = {"tmux", "asciinema"}
# apt/pip commands that only prepare or clean up (no package of their own).
_NOOP = re.compile(r"^\s*((sudo\s+)?apt(-get)?\s+(-\S+\s+)*(update|clean|autoclean|autoremove)\b.*|"
                   r"rm\s+-r?f+r?\s+/var/lib/apt/lists/?\*?\s*|"
                   r"(export\s+)?DEBIAN_FRONTEND=\S+\s*|true|:)\s*$")
_APT_INSTALL = re.compile(r"^\s*(\w+=\S+\s+)*(sudo\s+)?apt(-get)?\s+(-\S+\s+)*install\b(.*)$")
_PIP_INSTALL = re.compile(r"^\s*(\w+=\S+\s+)*((python3?(\.\d+)?|\S*/python3?)\s+-m\s+pip|pip3?|uv\s+pip)"
                          r"\s+install\b(.*)$")
_PIP_VALUE_FLAGS = {"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c",
                    "--constraint", "--target", "-t", "--prefix", "--root", "--platform",
                    "--python-version", "--trusted-host", "--timeout", "--retries"}


def split_commands(command: str) -> list[str]:
    """Top-level `&&`, `;` and newlines split (quotes respected; `||`, pipes and subshells keep
    a part whole)."""
    parts, buf, quote, i = [], [], None, 0
    while i < len(command):
        c = command[i]
        if quote:
            buf.append(c)
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(command):
                buf.append(command[i + 1])
                i += 1
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif c == "\\" and i + 1 < len(command):
            buf.append(command[i:i + 2])
            i += 1
        elif command.startswith("&&", i) or c in ";\n":
            parts.append("".join(buf))
            buf = []
            i += 2 if c == "&" else 1
            continue
        else:
            buf.append(c)
        i += 1
    parts.append("".join(buf))
    return [p.strip() for p in parts if p.strip()]


def install_request(part: str) -> tuple[str, tuple[str, ...]] | None:
    """('apt', names) / ('pip', requirements) / ('noop', ()) for an install-only command, else
    None (any other command, or an install this cannot read: `-r file`, a path, a URL)."""
    if _NOOP.match(part):
        return "noop", ()
    m = _APT_INSTALL.match(part)
    if m:
        try:
            words = shlex.split(m.group(5))
        except ValueError:
            return None
        names = tuple(w.split("=")[0] for w in words if not w.startswith("-"))
        if any(not re.fullmatch(r"[a-z0-9][a-z0-9+.:-]*", n) for n in names):
            return None
        return "apt", names
    m = _PIP_INSTALL.match(part)
    if m:
        try:
            words = shlex.split(m.group(5))
        except ValueError:
            return None
        reqs, skip = [], False
        for w in words:
            if skip:
                skip = False
                continue
            if w in _PIP_VALUE_FLAGS:
                skip = True
                continue
            if w in ("-r", "--requirement", "-e", "--editable"):
                return None
            if w.startswith("-"):
                continue
            if w.startswith((".", "/", "$")) or "://" in w:
                return None
            reqs.append(w)
        return "pip", tuple(reqs)
    return None


def debian_name(name: str) -> str:
    """The Debian bookworm name of an Ubuntu package name (the same name when not known to
    differ; Ubuntu 24.04's `t64` library suffix dropped)."""
    if name in UBUNTU_TO_DEBIAN:
        return UBUNTU_TO_DEBIAN[name]
    if re.fullmatch(r"lib[\w.+-]+t64", name):
        return name[:-3]
    return name


@functools.lru_cache(maxsize=1)
def _host_packages() -> frozenset[str]:
    """Installed Debian packages of this host (and what they provide)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\t${Provides}\n"],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    names = set()
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[1].startswith("ii"):
            names.add(parts[0].split(":")[0])
            for virtual in (parts[2].split(",") if len(parts) > 2 else ()):
                names.add(re.sub(r"[ (].*", "", virtual.strip()).split(":")[0])
    return frozenset(n for n in names if n)


def missing_apt(names) -> list[str]:
    """The apt packages (Debian names) this host does not have installed."""
    have = _host_packages()
    return [n for n in names if debian_name(n) not in have]


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;@]", requirement, maxsplit=1)[0]


@functools.lru_cache(maxsize=256)
def _host_python_has(dist: str, python: str) -> bool:
    code = ("import importlib.metadata as m, sys\n"
            "try:\n    m.distribution(sys.argv[1])\nexcept m.PackageNotFoundError:\n    sys.exit(1)\n")
    try:
        return subprocess.run([python, "-c", code, dist], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def missing_pip(requirements, python: str = "/usr/bin/python3") -> list[str]:
    """The pip requirements the sandbox's `python3` (the host's) lacks (any version counts)."""
    return [r for r in requirements if not _host_python_has(_dist_name(r), python)]
