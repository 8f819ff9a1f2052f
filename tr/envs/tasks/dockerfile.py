"""Carrying out a simple Dockerfile on the local backend, without building an image.

Supported: one `FROM` of a Debian/Ubuntu-based image, `WORKDIR`, `ENV`, `ARG`, `COPY`/`ADD` of
files from the build context, `RUN` steps that work offline (executed inside the sandbox with
`/bin/sh -c`, as Docker does), `USER root`; `CMD`, `ENTRYPOINT`, `LABEL`, `EXPOSE`, `VOLUME`,
`MAINTAINER`, `HEALTHCHECK`, `STOPSIGNAL` are ignored. Anything else raises `NeedsDocker` naming
the line: the task must run with `--backend docker`.

`plan(dockerfile, context)` is pure (reads files, runs nothing); the runner executes the plan.
"""

from __future__ import annotations

import glob
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tr.envs.tasks import packages

IGNORED = {"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "VOLUME", "MAINTAINER", "HEALTHCHECK",
           "STOPSIGNAL"}

# Base images whose userland matches the local sandbox's (Debian/Ubuntu, glibc).
_LOCAL_BASES = re.compile(
    r"^(?:docker\.io/)?(?:library/)?(debian|ubuntu|python|buildpack-deps)(?::(?P<tag>[\w.-]+))?$"
    r"|^ghcr\.io/laude-institute/t-bench/(ubuntu-\d\d-\d\d|python-3-\d+)(?::[\w.-]+)?$"
)

# Images that have `python` on PATH (the local backend then provides it too).
PYTHON_IMAGES = re.compile(r"^(?:docker\.io/)?(?:library/)?python(?::|$)"
                           r"|^ghcr\.io/laude-institute/t-bench/python-")

# Terminal-Bench's own base images set WORKDIR /app.
_TBENCH = re.compile(r"^ghcr\.io/laude-institute/t-bench/")

# RUN steps that need the network (or install packages): refused on the local backend.
_NETWORK = re.compile(
    r"\b(apt(-get)?\s+(-\S+\s+)*(install|update|upgrade|dist-upgrade)|apk\s+add|yum\s+install|"
    r"dnf\s+install|pip3?\s+install|python3?\s+-m\s+pip\s+install|uv\s+(pip|add|sync|tool|python)|"
    r"uvx|curl|wget|git\s+clone|npm\s+(install|ci|i)\b|yarn\s+(install|add)|pnpm\s+(install|add)|"
    r"conda\s+install|mamba\s+install|gem\s+install|cargo\s+(install|fetch|build)|go\s+(get|install|"
    r"mod\s+download)|rustup|nvm\s+install)"
)


class DockerfileError(ValueError):
    """The Dockerfile is malformed (a syntax problem), whatever the backend."""

    def __init__(self, path: Path | str, lineno: int, message: str):
        self.path, self.lineno = Path(path), lineno
        super().__init__(f"{path}:{lineno}: {message}")


class NeedsDocker(Exception):
    """The Dockerfile uses something the local backend cannot carry out."""

    def __init__(self, path: Path | str, lineno: int, line: str, reason: str):
        self.path, self.lineno, self.reason = Path(path), lineno, reason
        super().__init__(f"{path}:{lineno}: `{line[:120]}`: {reason}; this task needs the Docker "
                         "backend (--backend docker)")


@dataclass(frozen=True)
class Instruction:
    lineno: int
    keyword: str  # upper case
    args: str  # the rest of the (joined) line
    text: str  # the original logical line
    heredocs: tuple[tuple[str, str], ...] = ()  # (delimiter, body) of `<<EOF` documents, in order


# A here-document opener in a RUN/COPY/ADD line (Dockerfile 1.4 syntax): <<EOF, <<-EOF, <<"EOF"
HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")


@dataclass(frozen=True)
class CopyStep:
    lineno: int
    sources: tuple[Path, ...]  # host paths inside the build context (files or directories)
    dest: str  # absolute sandbox path
    dest_is_dir: bool
    chmod: int | None = None
    inline: tuple[tuple[str, str], ...] = ()  # here-documents: (file name, text)


@dataclass(frozen=True)
class RunStep:
    lineno: int
    command: str  # for /bin/sh -c
    workdir: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalPlan:
    base_image: str
    workdir: str  # the final WORKDIR
    env: dict[str, str]  # the final ENV
    steps: tuple[CopyStep | RunStep, ...]
    notes: tuple[str, ...] = ()   # RUN installs skipped because the host has the packages


def parse(text: str, path: Path | str = "Dockerfile") -> list[Instruction]:
    """Logical lines (continuations joined, comments dropped) as instructions."""
    instructions = []
    pending: list[str] = []
    start = 0
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        raw = lines[index]
        index += 1
        lineno = index
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped, as Docker does
        if not pending:
            start = lineno
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        logical = " ".join(p.strip() for p in pending).strip()
        pending = []
        if not logical:
            continue
        keyword, _, args = logical.partition(" ")
        if not re.fullmatch(r"[A-Za-z]+", keyword):
            raise DockerfileError(path, start, f"not an instruction: {logical[:80]!r}")
        docs = []
        if keyword.upper() in ("RUN", "COPY", "ADD"):
            for m in HEREDOC.finditer(args):
                body = []
                while True:
                    if index >= len(lines):
                        raise DockerfileError(path, start, f"here-document <<{m.group(3)} is not "
                                              f"closed (no line {m.group(3)!r})")
                    line = lines[index]
                    index += 1
                    if (line.lstrip("\t") if m.group(1) else line) == m.group(3):
                        break
                    body.append(line.lstrip("\t") if m.group(1) else line)
                docs.append((m.group(3), "".join(b + "\n" for b in body)))
        instructions.append(Instruction(start, keyword.upper(), args.strip(), logical,
                                        tuple(docs)))
    if pending:
        raise DockerfileError(path, start, "the file ends inside a line continuation (\\)")
    if not instructions:
        raise DockerfileError(path, 1, "no instructions")
    if instructions[0].keyword not in ("FROM", "ARG"):
        raise DockerfileError(path, instructions[0].lineno, "the first instruction must be FROM")
    return instructions


def _substitute(value: str, variables: dict[str, str]) -> str:
    """Docker-style `$VAR`, `${VAR}`, `${VAR:-default}` substitution."""

    def repl(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        got = variables.get(name, "")
        return got if got or default is None else default

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", repl, value)


def _exec_or_shell(args: str) -> list[str] | None:
    """JSON exec form `["a", "b"]` -> list; shell form -> None."""
    if args.startswith("["):
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return None


def _key_values(args: str) -> list[tuple[str, str]]:
    """`ENV A=1 B="x y"` or legacy `ENV A value with spaces`."""
    if "=" in args.split(None, 1)[0]:
        pairs = []
        for word in shlex.split(args):
            name, sep, value = word.partition("=")
            if not sep or not name:
                raise ValueError(f"expected NAME=value, got {word!r}")
            pairs.append((name, value))
        return pairs
    name, _, value = args.partition(" ")
    return [(name, value.strip())]


def plan(dockerfile: Path, context: Path, default_workdir: str = "/") -> LocalPlan:
    """Turn a Dockerfile into local steps, or raise NeedsDocker / DockerfileError."""
    text = dockerfile.read_text(encoding="utf-8")
    instructions = parse(text, dockerfile)
    base = None
    workdir = default_workdir
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    steps: list[CopyStep | RunStep] = []
    notes: list[str] = []
    for ins in instructions:
        variables = {**args, **env}
        if ins.keyword == "FROM":
            if base is not None:
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, "multi-stage builds (a second "
                                  "FROM) are not carried out locally")
            words = _substitute(ins.args, variables).split()
            words = [w for w in words if not w.startswith("--platform")]
            if not words:
                raise DockerfileError(dockerfile, ins.lineno, "FROM without an image")
            if len(words) > 1 and words[1].upper() != "AS":
                raise DockerfileError(dockerfile, ins.lineno, f"unexpected FROM arguments {words[1:]}")
            base = words[0]
            if _TBENCH.match(base):
                workdir = "/app"
            match = _LOCAL_BASES.match(base)
            if not match or "alpine" in (match.group("tag") or ""):
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"base image {base!r} is not a "
                                  "plain Debian/Ubuntu image the local sandbox can stand in for")
        elif ins.keyword == "ARG":
            name, _, value = ins.args.partition("=")
            if not name.strip():
                raise DockerfileError(dockerfile, ins.lineno, "ARG without a name")
            args[name.strip()] = _substitute(value.strip().strip('"'), variables)
        elif base is None:
            raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} before FROM")
        elif ins.keyword == "ENV":
            try:
                pairs = _key_values(ins.args)
            except ValueError as exc:
                raise DockerfileError(dockerfile, ins.lineno, f"ENV: {exc}") from None
            for name, value in pairs:
                env[name] = _substitute(value, {**args, **env})
        elif ins.keyword == "WORKDIR":
            target = _substitute(ins.args.strip().strip('"'), variables)
            if not target:
                raise DockerfileError(dockerfile, ins.lineno, "WORKDIR without a path")
            workdir = posixpath.normpath(posixpath.join(workdir, target))
            steps.append(RunStep(ins.lineno, f"mkdir -p {shlex.quote(workdir)}", "/", {}))
        elif ins.keyword == "RUN":
            exec_form = _exec_or_shell(ins.args)
            command = shlex.join(exec_form) if exec_form is not None else ins.args
            if ins.heredocs:
                command = heredoc_script(ins)
            if command.startswith("--"):
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, "RUN flags (--mount, "
                                  "--network) need BuildKit")
            if _NETWORK.search(command):
                command = _without_installs(dockerfile, ins, command, notes)
                if command is None:
                    continue
            steps.append(RunStep(ins.lineno, command, workdir, {**args, **env}))
        elif ins.keyword in ("COPY", "ADD"):
            steps.append(_copy_step(dockerfile, context, ins, workdir, variables))
        elif ins.keyword == "USER":
            user = ins.args.strip().split(":")[0]
            if user not in ("root", "0"):
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, "a non-root USER is not carried "
                                  "out locally")
        elif ins.keyword in IGNORED:
            continue
        else:
            raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"{ins.keyword} is not supported "
                              "on the local backend")
    if base is None:
        raise DockerfileError(dockerfile, 1, "no FROM instruction")
    return LocalPlan(base_image=base, workdir=workdir, env=env, steps=tuple(steps),
                     notes=tuple(notes))


def _without_installs(dockerfile: Path, ins: Instruction, command: str,
                      notes: list[str]) -> str | None:
    """A RUN whose package installs the host already has: those parts dropped (a note says so),
    the rest kept (None when nothing is left).  NeedsDocker names missing packages and what to
    do, or the part that needs the network."""

    kept, apt, pip = [], [], []
    for part in packages.split_commands(command):
        request = packages.install_request(part)
        if request is None:
            hit = _NETWORK.search(part)
            if hit:
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"`{hit.group(0)}` needs the "
                                  "network or a package install")
            kept.append(part)
        elif request[0] == "apt":
            apt.extend(request[1])
        elif request[0] == "pip":
            pip.extend(request[1])
    harness = [n for n in apt if n in packages.HARNESS_TOOLS]
    apt = [n for n in apt if n not in packages.HARNESS_TOOLS]
    if harness:
        notes.append(f"{dockerfile.name}:{ins.lineno}: skipped {', '.join(harness)}: Terminal-"
                     "Bench's own session tools, which tr does not use")
    missing_apt, missing_pip = packages.missing_apt(apt), packages.missing_pip(pip)
    if missing_apt or missing_pip:
        what = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in
                         (("apt", missing_apt), ("pip", missing_pip)) if names)
        todo = " and ".join(cmd for cmd, names in (
            (f"`apt-get install -y {' '.join(packages.debian_name(n) for n in missing_apt)}`",
             missing_apt),
            (f"`/usr/bin/python3 -m pip install {' '.join(missing_pip)}`", missing_pip)) if names)
        raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"installs packages this host does "
                          f"not have ({what}); run it with --backend docker, or install them on "
                          f"the host ({todo}) to run it locally")
    have = ", ".join([*apt, *pip])
    if harness and not have:
        return " && ".join(kept) if kept else None
    notes.append(f"{dockerfile.name}:{ins.lineno}: skipped the install of "
                 f"{have or 'nothing (apt-get update)'}: the host has "
                 f"{'them' if have else 'what the sandbox uses'}")
    return " && ".join(kept) if kept else None


def final_workdir(dockerfile: Path) -> str | None:
    """The WORKDIR in force at the end of a Dockerfile (None if it sets none); no refusals."""
    workdir = None
    variables: dict[str, str] = {}
    for ins in parse(dockerfile.read_text(encoding="utf-8"), dockerfile):
        if ins.keyword in ("ARG", "ENV"):
            try:
                pairs = ([tuple(ins.args.partition("=")[::2])] if ins.keyword == "ARG"
                         else _key_values(ins.args))
            except ValueError:
                continue
            variables.update({k.strip(): v.strip().strip('"') for k, v in pairs})
        elif ins.keyword == "FROM":
            words = [w for w in _substitute(ins.args, variables).split()
                     if not w.startswith("--platform")]
            workdir = "/app" if words and _TBENCH.match(words[0]) else None
        elif ins.keyword == "WORKDIR":
            target = _substitute(ins.args.strip().strip('"'), variables)
            workdir = posixpath.normpath(posixpath.join(workdir or "/", target))
    return workdir


HEREDOC_DIR = ".tr-heredocs"    # where inline_heredocs puts COPY documents in a build context


def inline_heredocs(text: str, path: Path | str = "Dockerfile") -> tuple[str, dict[str, str]]:
    """The Dockerfile without here-documents, for a builder without BuildKit (the engine API's
    classic builder): a COPY/ADD document becomes a file of the build context
    (``.tr-heredocs/<n>/<DELIM>``, returned as {path: text}) copied by name; a RUN with documents
    becomes ``RUN /bin/sh -c "$(echo <base64 of the script> | base64 -d)"`` (:func:`heredoc_script`).
    Other lines are kept as written; pure."""
    import base64

    by_line = {ins.lineno: ins for ins in parse(text, path) if ins.heredocs}
    if not by_line:
        return text, {}
    lines = text.splitlines()
    out: list[str] = []
    files: dict[str, str] = {}
    index = 0
    while index < len(lines):
        ins = by_line.get(index + 1)
        if ins is None:
            out.append(lines[index])
            index += 1
            continue
        while lines[index].rstrip().endswith("\\"):     # the instruction's continuation lines
            index += 1
        index += 1
        for _, body in ins.heredocs:                    # then each document and its delimiter
            index += body.count("\n") + 1
        if ins.keyword == "RUN":
            script = base64.b64encode(heredoc_script(ins).encode()).decode()
            out.append(f'RUN /bin/sh -c "$(echo {script} | base64 -d)"')
            continue
        heredoc_files(Path(path), ins)                  # refuses unexpanded variables
        n = len(files)
        args = ins.args
        for delim, body in ins.heredocs:
            rel = f"{HEREDOC_DIR}/{n}/{delim}"
            files[rel] = body
            args = HEREDOC.sub(lambda m, d=delim, r=rel: r if m.group(3) == d else m.group(0),
                               args)
        out.append(f"{ins.keyword} {args}")
    return "\n".join(out) + "\n", files


def heredoc_script(ins: Instruction) -> str:
    """The shell script a RUN with here-documents stands for (BuildKit's meaning): `RUN <<EOF`
    alone runs the document as the script; `RUN cmd <<EOF ...` is the line with its documents
    after it, as a shell reads it."""
    rest = HEREDOC.sub("", ins.args).strip()
    if not rest and len(ins.heredocs) == 1:
        return ins.heredocs[0][1]
    return ins.args + "\n" + "".join(body + name + "\n" for name, body in ins.heredocs)


def heredoc_files(dockerfile: Path, ins: Instruction) -> list[tuple[str, str]]:
    """A COPY/ADD's here-documents as (file name, text); the name is the delimiter, as BuildKit
    names them.  Variable expansion in an unquoted document is not done: refused by name."""
    for m in HEREDOC.finditer(ins.args):
        body = dict(ins.heredocs)[m.group(3)]
        if not m.group(2) and "$" in body:
            raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} <<{m.group(3)}: "
                                  "variables in an unquoted here-document are not expanded by "
                                  f"tr; quote the delimiter (<<\"{m.group(3)}\") to copy it as "
                                  "written")
    return list(ins.heredocs)


def _copy_step(dockerfile: Path, context: Path, ins: Instruction, workdir: str,
               variables: dict[str, str]) -> CopyStep:
    if ins.heredocs:
        inline = tuple(heredoc_files(dockerfile, ins))
        words = [w for w in shlex.split(HEREDOC.sub("", ins.args)) if not w.startswith("--")]
        if len(words) != 1:
            raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} with here-documents "
                                  "takes them as its only sources and one destination")
        dest = _substitute(words[0], variables)
        absolute = posixpath.normpath(posixpath.join(workdir, dest))
        return CopyStep(ins.lineno, (), absolute, dest.endswith("/") or len(inline) > 1,
                        inline=inline)
    exec_form = _exec_or_shell(ins.args)
    words = exec_form if exec_form is not None else shlex.split(ins.args)
    chmod = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        name, _, value = flag[2:].partition("=")
        if name == "chmod":
            try:
                chmod = int(value, 8)
            except ValueError:
                raise DockerfileError(dockerfile, ins.lineno, f"bad --chmod {value!r}") from None
        elif name in ("chown", "link"):
            continue
        else:
            raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"{ins.keyword} --{name} is not "
                              "carried out locally")
    words = [_substitute(w, variables) for w in words]
    if len(words) < 2:
        raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} needs a source and a destination")
    *sources, dest = words
    resolved: list[Path] = []
    root = context.resolve()
    for source in sources:
        if re.match(r"^[a-z]+://", source) or source.startswith("git@"):
            raise NeedsDocker(dockerfile, ins.lineno, ins.text, f"{ins.keyword} from a URL needs "
                              "the network")
        if not _within(context / source, root):
            raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} source {source!r} is "
                                  "outside the build context")
        matches = sorted(glob.glob(str(context / source))) if any(c in source for c in "*?[") \
            else [str(context / source)]
        if not matches or not Path(matches[0]).exists():
            raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} source {source!r} does not "
                                  f"exist in the build context {context}")
        for m in matches:
            path = Path(m)
            if not _within(path, root):
                raise DockerfileError(dockerfile, ins.lineno, f"{ins.keyword} source {source!r} is "
                                      "outside the build context")
            if ins.keyword == "ADD" and path.is_file() and re.search(
                    r"\.(tar|tgz|tar\.\w+|txz|tbz2?)$", path.name):
                raise NeedsDocker(dockerfile, ins.lineno, ins.text, "ADD of a tar archive (which "
                                  "Docker unpacks) is not carried out locally")
            resolved.append(path)
    absolute = posixpath.normpath(posixpath.join(workdir, dest))
    # `COPY f .` (or onto the WORKDIR itself): the destination is a folder, as in Docker
    dest_is_dir = (dest.endswith(("/", "/.")) or dest == "." or absolute == workdir
                   or len(resolved) > 1 or resolved[0].is_dir())
    return CopyStep(ins.lineno, tuple(resolved), absolute, dest_is_dir, chmod)


def _within(path: Path, root: Path) -> bool:
    try:
        Path(posixpath.normpath(str(path))).resolve().relative_to(root)
    except ValueError:
        return False
    return True
