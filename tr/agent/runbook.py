"""RSR's data path (SPEC §6), no JAX: clean a verified success, a planner turns it into a runbook,
a reviewer's binary gate q(x, b) rejects leaks, the actor replays the runbook, q_leak checks the
replay too, and the accepted replay becomes an SFT row on the plain task prompt.

    steps = clean_steps(record)                 # successful, state-changing-or-reading commands
    runbook = planner.plan(task, steps)         # CommandListPlanner | HttpPlanner
    verdict = reviewer.review(task, runbook)    # LeakRuleReviewer | HttpReviewer -> Verdict(q, reasons)
    replay_task = with_runbook(task, runbook)   # instruction + RUNBOOK_HEADER + runbook
    q_leak = not replay_leaks(replay_record, TaskSecrets.of(task))
    a = V · q_leak; row = plain_prompt(replay_record, layout, replay_task.instruction, task.instruction)

Leak rules (`TaskSecrets`, `leak_findings`): a runbook or a replay action must not name a verifier
path (`/tests`, `tests/`, the solution folder or script, the verifier's log folder), name a test
file (`test_checks.py`, its stem), or quote a value the tests hold that the public task does not
(a string or number literal of the test files, or a token of one, absent from the instruction and
the initial files: a hard-coded artefact). Each rule is waived when the public task itself says
the same thing (a task about a `tests/` folder may name it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
from typing import Protocol, Sequence

from tr.agent.harness import GenerationRequest
from tr.agent.http_policy import HttpPolicy
from tr.agent.records import EpisodeRecord

PROMPTS_DIR = pathlib.Path(__file__).resolve().parent / "prompts"
PLANNER_PROMPT = PROMPTS_DIR / "rsr_planner.md"
REVIEWER_PROMPT = PROMPTS_DIR / "rsr_reviewer.md"
RUNBOOK_HEADER = "\n\nRunbook (steps that solved this task before):\n"
MAX_RUNBOOK_CHARS = 2000
# Paths of the verifier and the reference solution (Terminal-Bench / Harbor / tr layouts).
VERIFIER_PATTERNS = (
    r"(?<![\w.-])/tests\b", r"(?<![\w./-])tests/", r"(?<![\w.-])/solution\b",
    r"(?<![\w./-])solution/", r"\bsolve\.sh\b", r"(?<![\w.-])/logs/verifier\b", r"\brun-tests\.sh\b",
    r"\btest_outputs\.py\b", r"\breward\.txt\b", r"/oracle\b",
)
# No-op commands (exact, after stripping): they change nothing and show nothing new.
NOOP = re.compile(r"^(true|:|pwd|clear|sleep\s+\d+(\.\d+)?|exit(\s+0)?|cd|cd\s+/app/?|echo)$")


@dataclasses.dataclass(frozen=True)
class Step:
    """One kept command of a success, with what the shell answered."""

    command: str
    observation: str
    exit_code: int | None


def clean_steps(record: EpisodeRecord) -> list[Step]:
    """The commands of `record` without the failed ones (non-zero or missing exit code, timed out)
    and the no-ops (empty, `true`, `pwd`, `echo` alone, ... and an exact repeat of the previous
    kept command)."""
    out: list[Step] = []
    for turn in record.turns:
        if turn.kind != "command" or turn.command is None:
            continue
        command = turn.command.strip()
        lines = [x for x in command.splitlines() if x.strip() and not x.strip().startswith("#")]
        if not lines or turn.timed_out or turn.exit_code != 0:
            continue
        if NOOP.match(" ".join(" ".join(lines).split())):
            continue
        if out and out[-1].command == command:
            continue
        out.append(Step(command, turn.observation, turn.exit_code))
    return out


# ------------------------------------------------------------------------------------------------
# What the verifier knows and the public task does not


@dataclasses.dataclass(frozen=True)
class TaskSecrets:
    """`public`: the instruction and the initial files (names and text); `test_names`: the test
    files' names and stems; `test_values`: literals of the test files absent from `public`."""

    public: str
    test_names: tuple[str, ...]
    test_values: tuple[str, ...]

    @classmethod
    def of(cls, task, *, max_file_bytes: int = 200_000) -> "TaskSecrets":
        public = [task.instruction]
        env_dir = pathlib.Path(task.source_dir) / "environment"
        for path in sorted(env_dir.rglob("*")) if env_dir.is_dir() else ():
            if path.is_file():
                public.append(str(path.relative_to(env_dir)))
                public.append(_read_text(path, max_file_bytes))
        public_text = "\n".join(public)
        names, values = set(), set()
        tests_dir = pathlib.Path(task.tests_dir)
        for path in sorted(tests_dir.rglob("*")) if tests_dir.is_dir() else ():
            if not path.is_file():
                continue
            rel = str(path.relative_to(tests_dir))
            names.update({rel, path.name})
            if path.stem.startswith("test") and len(path.stem) > 4:
                names.add(path.stem)
            values.update(test_literals(_read_text(path, max_file_bytes), path.suffix))
        names = {n for n in names if n not in public_text}
        values = {v for v in values if not _contains(public_text, v)}
        return cls(public_text, tuple(sorted(names)), tuple(sorted(values)))


def _read_text(path: pathlib.Path, limit: int) -> str:
    return path.read_bytes()[:limit].decode("utf-8", errors="replace")


def test_literals(source: str, suffix: str = ".py") -> set[str]:
    """The values a test file holds: its string and number literals (a string holding a JSON
    string, list or object is decoded, as the gym writes its constants; docstrings are skipped),
    each also split into whitespace-free tokens; only tokens of at least 2 characters with a
    letter or digit (the literals only, never the code)."""
    literals: list[str] = []
    if suffix == ".py":
        try:
            tree = ast.parse(source)
        except SyntaxError:
            tree = None
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) \
                        and not isinstance(node.value, bool):
                    decoded = None
                    if isinstance(node.value, str) and node.value[:1] in '"[{':
                        try:
                            decoded = _flatten_json(json.loads(node.value))
                        except (ValueError, TypeError):
                            decoded = None
                    literals.extend([str(node.value)] if decoded is None else decoded)
            docstrings = {ast.get_docstring(n, clean=False) for n in ast.walk(tree)
                          if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))}
            literals = [x for x in literals if x not in docstrings]
    else:   # a shell or other script: quoted strings
        literals = re.findall(r"'([^'\n]*)'|\"([^\"\n]*)\"", source)
        literals = [a or b for a, b in literals]
    out = set()
    for literal in literals:
        literal = literal.strip()
        if not literal:
            continue
        pieces = {literal} | set(literal.split())
        for piece in pieces:
            piece = piece.strip(".,;:()[]{}'\"")
            if len(piece) >= 2 and re.search(r"[A-Za-z0-9]", piece) and "\n" not in piece:
                out.add(piece)
    return out


def _flatten_json(value) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [str(k), *_flatten_json(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _flatten_json(v)]
    if isinstance(value, bool) or value is None:
        return []
    return [str(value)]


def _contains(text: str, value: str) -> bool:
    """`value` occurs in `text` as a whole token (not inside a longer word or number)."""
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w])", text) is not None


def leak_findings(text: str, secrets: TaskSecrets) -> list[str]:
    """Why `text` (a runbook, or a replay's commands) leaks the verifier; [] = clean."""
    found = []
    for pattern in VERIFIER_PATTERNS:
        m = re.search(pattern, text)
        if m and not re.search(pattern, secrets.public):
            found.append(f"verifier path {m.group(0)!r}")
    for name in secrets.test_names:
        if _contains(text, name):
            found.append(f"test file name {name!r}")
    for value in secrets.test_values:
        if _contains(text, value):
            found.append(f"value {value!r} appears only in the tests")
    return found


def schema_findings(runbook: str, max_chars: int = MAX_RUNBOOK_CHARS) -> list[str]:
    """A runbook the harness cannot carry: empty, too long, chat control tokens, no step."""
    found = []
    if not runbook.strip():
        found.append("empty runbook")
    if len(runbook) > max_chars:
        found.append(f"runbook of {len(runbook)} characters > {max_chars}")
    if "<|" in runbook or "|>" in runbook:
        found.append("chat control token in the runbook")
    if runbook.strip() and not re.search(r"^\s*(\d+[.)]|[-*])\s+\S", runbook, re.M):
        found.append("no numbered or bulleted step")
    return found


def replay_leaks(record: EpisodeRecord, secrets: TaskSecrets) -> list[str]:
    """q_leak of a replay (0 when non-empty): its commands must not touch the verifier or the
    solution, name a test file, or write a test-only value it had not seen in an observation."""
    found, seen = [], ""
    for turn in record.turns:
        if turn.kind == "command" and turn.command:
            for finding in leak_findings(turn.command, secrets):
                value = re.match(r"value '(.*)' appears only in the tests", finding)
                if value and _contains(seen, value.group(1)):
                    continue          # read from the environment earlier in the replay: derived
                found.append(f"turn {turn.turn}: {finding}")
        seen += "\n" + (turn.observation or "")
    return found


# ------------------------------------------------------------------------------------------------
# Planner and reviewer


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The reviewer's gate q(x, b) ∈ {0, 1} and its reasons (empty when accepted)."""

    accept: bool
    reasons: tuple[str, ...] = ()


class Planner(Protocol):
    name: str

    def plan(self, task, steps: Sequence[Step]) -> str: ...


class Reviewer(Protocol):
    name: str

    def review(self, task, runbook: str) -> Verdict: ...


class CommandListPlanner:
    """The embedded planner for CPU runs: the cleaned success's commands as numbered steps, then
    "reply DONE" (no model: the runbook is exactly what worked)."""

    name = "command-list"

    def plan(self, task, steps: Sequence[Step]) -> str:
        del task
        lines = [f"{i}. Run: {' '.join(s.command.split())}" for i, s in enumerate(steps, 1)]
        lines.append(f"{len(steps) + 1}. Check the result, then reply DONE.")
        return "\n".join(lines)


class LeakRuleReviewer:
    """The embedded reviewer for CPU runs: q(x, b) = 1 iff `leak_findings` and `schema_findings`
    find nothing (verifier paths, test file names, test-only values, harness schema)."""

    name = "leak-rules"

    def __init__(self, max_chars: int = MAX_RUNBOOK_CHARS):
        self.max_chars = max_chars

    def review(self, task, runbook: str) -> Verdict:
        reasons = leak_findings(runbook, TaskSecrets.of(task)) + schema_findings(runbook,
                                                                                 self.max_chars)
        return Verdict(not reasons, tuple(reasons))


def render_steps(steps: Sequence[Step], max_observation_chars: int = 400) -> str:
    """The cleaned trajectory as the planner sees it: each command and the head of its output."""
    out = []
    for i, s in enumerate(steps, 1):
        obs = s.observation if len(s.observation) <= max_observation_chars else (
            s.observation[:max_observation_chars] + " ...")
        out.append(f"Step {i}:\n$ {s.command}\n{obs}")
    return "\n\n".join(out) if out else "(no command was needed)"


def _chat(policy, system: str, user: str, *, max_tokens: int, task_id: str, seed: int,
          purpose: str) -> str:

    req = GenerationRequest(messages=({"role": "system", "content": system},
                                      {"role": "user", "content": user}),
                            prompt_tokens=(), max_tokens=max_tokens, task_id=task_id, seed=seed,
                            purpose=purpose)
    return policy.generate([req])[0].text


def load_prompt(path: pathlib.Path) -> tuple[str, str]:
    """A prompt file: the system text, a line `---`, the user template (`{field}` placeholders)."""
    text = pathlib.Path(path).read_text(encoding="utf-8")
    if "\n---\n" not in text:
        raise ValueError(f"{path}: expected a system part, a line '---', then the user template")
    system, user = text.split("\n---\n", 1)
    return system.strip(), user.strip()


class HttpPlanner:
    """A planner behind an OpenAI-compatible endpoint (`tr.agent.http_policy.HttpPolicy`), prompted
    with `rsr_planner.md` (public task + cleaned trajectory, never the tests). The reply is the
    runbook (a ``` fence around it is removed)."""

    name = "http-planner"

    def __init__(self, policy, *, prompt: pathlib.Path = PLANNER_PROMPT, max_tokens: int = 512,
                 seed: int = 0):
        self.policy, self.max_tokens, self.seed = policy, max_tokens, seed
        self.system, self.template = load_prompt(prompt)

    def plan(self, task, steps: Sequence[Step]) -> str:
        user = self.template.format(instruction=task.instruction, trajectory=render_steps(steps))
        text = _chat(self.policy, self.system, user, max_tokens=self.max_tokens, task_id=task.id,
                     seed=self.seed, purpose="plan").strip()
        fenced = re.fullmatch(r"```[\w-]*\n(.*?)\n?```", text, re.S)
        return (fenced.group(1) if fenced else text).strip()


class HttpReviewer:
    """A reviewer behind an OpenAI-compatible endpoint, prompted with `rsr_reviewer.md` (the task,
    the runbook and the test files, which only the reviewer sees). The reply's last
    `VERDICT: ACCEPT` / `VERDICT: REJECT <reason>` line is the gate; anything else rejects."""

    name = "http-reviewer"

    def __init__(self, policy, *, prompt: pathlib.Path = REVIEWER_PROMPT, max_tokens: int = 256,
                 seed: int = 0, max_test_chars: int = 6000):
        self.policy, self.max_tokens, self.seed = policy, max_tokens, seed
        self.max_test_chars = max_test_chars
        self.system, self.template = load_prompt(prompt)

    def review(self, task, runbook: str) -> Verdict:
        tests = []
        tests_dir = pathlib.Path(task.tests_dir)
        for path in sorted(tests_dir.rglob("*")) if tests_dir.is_dir() else ():
            if path.is_file():
                tests.append(f"--- {path.relative_to(tests_dir)}\n"
                             f"{_read_text(path, self.max_test_chars)}")
        user = self.template.format(instruction=task.instruction, runbook=runbook,
                                    tests="\n".join(tests) or "(none)")
        text = _chat(self.policy, self.system, user, max_tokens=self.max_tokens, task_id=task.id,
                     seed=self.seed, purpose="review")
        verdicts = re.findall(r"^\s*VERDICT:\s*(ACCEPT|REJECT)\b[ \t:-]*(.*)$", text, re.M | re.I)
        if not verdicts:
            return Verdict(False, (f"no VERDICT line in the reviewer's reply: {text[:200]!r}",))
        word, reason = verdicts[-1]
        if word.upper() == "ACCEPT":
            return Verdict(True)
        return Verdict(False, (reason.strip() or "rejected by the reviewer",))


PLANNERS = ("embedded", "http")
REVIEWERS = ("embedded", "http")


def make_planner(kind: str, *, base_url: str = "", model: str = "", seed: int = 0,
                 **http) -> Planner:
    """`embedded` (CommandListPlanner) or `http` (HttpPlanner on an HttpPolicy)."""
    if kind == "embedded":
        return CommandListPlanner()
    if kind == "http":

        return HttpPlanner(HttpPolicy(base_url, model, source="teacher", **http), seed=seed)
    raise ValueError(f"planner {kind!r}: expected one of {PLANNERS}")


def make_reviewer(kind: str, *, base_url: str = "", model: str = "", seed: int = 0,
                  **http) -> Reviewer:
    """`embedded` (LeakRuleReviewer) or `http` (HttpReviewer on an HttpPolicy)."""
    if kind == "embedded":
        return LeakRuleReviewer()
    if kind == "http":

        return HttpReviewer(HttpPolicy(base_url, model, source="teacher", **http), seed=seed)
    raise ValueError(f"reviewer {kind!r}: expected one of {REVIEWERS}")


# ------------------------------------------------------------------------------------------------
# Replay and the plain prompt


def with_runbook(task, runbook: str):
    """The task the replay runs: the same task, its instruction followed by the runbook."""
    return dataclasses.replace(task, instruction=task.instruction + RUNBOOK_HEADER + runbook)


def plain_prompt(record: EpisodeRecord, layout, system_prompt: str, replay_instruction: str,
                 plain_instruction: str) -> EpisodeRecord:
    """A copy of a replay whose prompt (system + task with runbook) is the plain task's: the prompt
    segment's tokens and the user message are swapped, everything after is unchanged. Raises if
    the record has more than one context window or its prompt is not the replay prompt."""
    if any(s.window for s in record.segments):
        raise ValueError(f"episode {record.episode_id}: a replay split by summarisation has no "
                         "single prompt to swap")
    out = EpisodeRecord.from_json(json.loads(json.dumps(record.to_json())))
    old = layout.prompt_ids(system_prompt, replay_instruction)
    first = out.segments[0] if out.segments else None
    if first is None or first.kind != "prompt" or first.tokens[:len(old)] != old:
        raise ValueError(f"episode {record.episode_id}: its first segment is not the replay prompt")
    first.tokens = layout.prompt_ids(system_prompt, plain_instruction) + first.tokens[len(old):]
    for m in out.messages:
        if m["role"] == "user" and m["content"] == replay_instruction:
            m["content"] = plain_instruction
    return out
