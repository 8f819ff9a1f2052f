"""The conversation of one episode, kept twice in lock-step: as chat messages (what text policies
such as HTTP teachers read) and as token segments (what token policies read and what training uses).

The token layout is ``tr.models.chat``'s ChatML layout (special tokens by id, never parsed from
text); this module only cuts it into the pieces an episode produces one at a time:

    prompt       = <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{task}<|im_end|>\n
    header       = <|im_start|>assistant\n          (appended to the context before each generation)
    action       = sampled ids as they are (a text policy's reply is encoded once, + <|im_end|>)
    observation  = [<|im_end|> if the action was cut] \n<|im_start|>user\n{obs}<|im_end|>\n

so a finished window equals ``chat.layout_conversation`` of the same turns, token for token.
``turn_ids``: prompt 0; the action of turn t and the observation answering it carry t; the header
before action t+1 belongs to observation t.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tr.agent.records import EpisodeRecord, Segment
from tr.models import chat
from tr.models.tokenizer import Tokenizer


class ChatLayout:
    """The pieces of ``tr.models.chat``'s layout for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.end_ids = [int(tokenizer.eos_id)]
        self.header_ids = list(chat.assistant_header(tokenizer))

    def prompt_ids(self, system: str, user: str) -> list[int]:
        ids = chat.prompt_ids(self.tokenizer, system, user)
        return ids[:len(ids) - len(self.header_ids)]

    def action_ids(self, text: str) -> list[int]:
        """Ids for a reply that came as text (scripted / HTTP): encoded once, + end-of-turn."""
        return list(self.tokenizer.encode(text)) + self.end_ids

    def user_ids(self, text: str, *, close_action: bool) -> list[int]:
        """A user block after an action (closing it first if it was cut off)."""
        ids = chat.observation_ids(self.tokenizer, text, [] if close_action else self.end_ids)
        return ids[:len(ids) - len(self.header_ids)]

    def ends_turn(self, ids: Sequence[int]) -> bool:
        return len(ids) > 0 and int(ids[-1]) in self.end_ids


@dataclasses.dataclass
class Generation:
    """A policy's reply: text, and for token policies the sampled ids and behaviour logprobs."""

    text: str
    tokens: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # "stop" | "length"
    source: str = "policy"       # "policy" | "teacher"


class Transcript:
    """Messages + segments of one episode; mutated by the harness only."""

    def __init__(self, layout: ChatLayout):
        self.layout = layout
        self.messages: list[dict[str, str]] = []
        self.segments: list[Segment] = []
        self.window = 0
        self._awaiting_action = False
        self._last_closed = True

    # -- building -------------------------------------------------------------------------------
    def start(self, system: str, user: str) -> None:
        """Opens a context window with the system prompt and one user message."""
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.segments.append(Segment("prompt", self.layout.prompt_ids(system, user), turn=0,
                                     window=self.window, source="env"))
        self._awaiting_action = False
        self._last_closed = True

    def inherit(self, parent: EpisodeRecord, history_turns: int = 0) -> None:
        """Appends the last context window of ``parent`` (a failed attempt h_f) as context: its
        actions become ``inherited`` segments (no loss, no behaviour logprobs).  ``history_turns``
        N > 0 keeps only its prompt and last N turns (:func:`inherited_history`)."""
        segs, messages = inherited_history(parent, self.layout, history_turns)
        for s in segs:
            source = "inherited" if s.source in ("policy", "teacher") else s.source
            self.segments.append(Segment(s.kind, list(s.tokens), s.turn, self.window, source, None))
        last = self.segments[-1]
        hdr = self.layout.header_ids
        if last.kind not in ("action", "summary") and last.tokens[-len(hdr):] == hdr:
            last.tokens = last.tokens[:-len(hdr)]
        self._last_closed = last.kind not in ("action", "summary") or self.layout.ends_turn(last.tokens)
        self._awaiting_action = False
        self.messages = messages

    def add_user(self, text: str, turn: int, kind: str = "observation") -> None:
        """An environment message (observation, format reminder, recovery or summary prompt)."""
        ids = self.layout.user_ids(text, close_action=not self._last_closed)
        self.segments.append(Segment(kind, ids, turn, self.window, "env"))
        self.messages.append({"role": "user", "content": text})
        self._last_closed = True
        self._awaiting_action = False

    def prompt_ids(self) -> list[int]:
        """The exact token context for the next generation (header appended once)."""
        if not self._awaiting_action:
            last = self.segments[-1]
            if last.kind in ("action", "summary"):
                raise RuntimeError("two generations in a row without an observation in between")
            last.tokens = last.tokens + self.layout.header_ids
            self._awaiting_action = True
        return self.context_ids()

    def add_generation(self, gen: Generation, turn: int, kind: str = "action") -> list[int]:
        """Records a reply; returns the ids stored (sampled ids as they are, else encoded text)."""
        if not self._awaiting_action:
            self.prompt_ids()
        if gen.tokens is not None:
            ids = [int(t) for t in gen.tokens]
            lps = None if gen.logprobs is None else [float(x) for x in gen.logprobs]
        else:
            ids = self.layout.action_ids(gen.text)
            lps = None
        self.segments.append(Segment(kind, ids, turn, self.window, gen.source, lps))
        self.messages.append({"role": "assistant", "content": gen.text})
        self._awaiting_action = False
        self._last_closed = self.layout.ends_turn(ids)
        return ids

    def new_window(self, system: str, user: str) -> None:
        """Active summarisation: the history is replaced; later segments live in a new window."""
        self.window += 1
        self.start(system, user)

    # -- reading --------------------------------------------------------------------------------
    def context_ids(self) -> list[int]:
        return [t for s in self.segments if s.window == self.window for t in s.tokens]

    def context_len(self) -> int:
        return sum(len(s.tokens) for s in self.segments if s.window == self.window)


# The env note in place of the turns of h_f a capped recovery does not inherit.
HISTORY_NOTE = "({n} earlier turn{s} omitted)"


def history_note(dropped: int) -> str:
    return HISTORY_NOTE.format(n=dropped, s="" if dropped == 1 else "s")


def inherited_history(parent: EpisodeRecord, layout: ChatLayout,
                      history_turns: int = 0) -> tuple[list[Segment], list[dict]]:
    """What a recovery inherits of a failed attempt h_f: the segments and messages of ``parent``'s
    last context window (copies, sources unchanged).  ``history_turns`` N > 0 keeps the window's
    prompt (system + task) and only the segments and messages of its last N turns; the dropped
    turns are replaced by one env message :func:`history_note` (their number), laid out as
    :meth:`Transcript.add_user` would after the prompt.  N = 0, or N >= the window's turns: all.

    The window's messages are its prompt's two (system, user) then one per non-prompt segment, in
    order; a record that breaks this raises ValueError (it cannot be cut consistently)."""
    if history_turns < 0:
        raise ValueError(f"history_turns={history_turns} must be >= 0 (0 = the whole window)")
    w = max((s.window for s in parent.segments), default=0)
    segs = [dataclasses.replace(s, tokens=list(s.tokens)) for s in parent.segments if s.window == w]
    if not segs:
        raise ValueError(f"episode {parent.episode_id}: no segments to inherit")
    messages = [dict(m) for m in parent.messages]
    turns = sorted({s.turn for s in segs if s.kind != "prompt"})
    if not history_turns or len(turns) <= history_turns:
        return segs, messages
    head = [s for s in segs if s.kind == "prompt"]
    body = segs[len(head):]
    if len(head) != 1 or segs[0].kind != "prompt" or len(messages) != 2 + len(body):
        raise ValueError(f"episode {parent.episode_id}: {len(segs)} segments ({len(head)} prompt) "
                         f"and {len(messages)} messages in its last window do not pair up")
    first = turns[-history_turns]
    cut = next(i for i, s in enumerate(body) if s.turn >= first)
    prompt, hdr = head[0], layout.header_ids
    if prompt.tokens[-len(hdr):] == hdr:      # the header before action 1: now before the note
        prompt.tokens = prompt.tokens[:-len(hdr)]
    note = history_note(len(turns) - history_turns)
    ids = layout.user_ids(note, close_action=False)
    if body[cut].kind in ("action", "summary"):
        ids = ids + hdr                           # the header before the first kept action
    return ([prompt, Segment("observation", ids, first - 1, w, "env")] + body[cut:],
            messages[:2] + [{"role": "user", "content": note}] + messages[2 + cut:])


def transcript_from_messages(layout: ChatLayout, messages: Sequence[dict]) -> Transcript:
    """Lays out a chat given as text (an HTTP request) exactly as an episode would have: assistant
    texts are encoded once (+ end-of-turn).  Raises ValueError naming the bad message."""
    msgs = list(messages)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in (
                "system", "user", "assistant"):
            raise ValueError(f"messages[{i}]: expected {{'role': system|user|assistant, "
                             f"'content': str}}, got {m!r:.200}")
    system = ""
    if msgs and msgs[0]["role"] == "system":
        system = msgs.pop(0)["content"]
    if not msgs or msgs[0]["role"] != "user":
        raise ValueError("messages: the first non-system message must be a user message")
    tr = Transcript(layout)
    tr.start(system, msgs[0]["content"])
    turn = 0
    for i, m in enumerate(msgs[1:], start=1):
        if m["role"] == "assistant":
            turn += 1
            tr.add_generation(Generation(text=m["content"]), turn)
        elif m["role"] == "user":
            tr.add_user(m["content"], turn)
        else:
            raise ValueError(f"messages[{i}]: a system message may only come first")
    return tr
