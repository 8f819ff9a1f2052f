"""Turn layout of an agent conversation as token ids, with `actor_mask` and `turn_ids` (SPEC §2).

The layout is ChatML (Qwen's chat template), built from special-token *ids*, never from parsing text:

    turn 0 (prompt):    <|im_start|>system\\n{system}<|im_end|>\\n
                        <|im_start|>user\\n{task}<|im_end|>\\n<|im_start|>assistant\\n
    turn t action:      {the sampled ids, usually ending with <|im_end|>}        (actor_mask = True)
    turn t observation: [<|im_end|> if the action was cut off]\\n
                        <|im_start|>user\\n{obs}<|im_end|>\\n<|im_start|>assistant\\n

Observation tokens carry the turn they answer and include the next assistant header, so the ids
after turn t are exactly the prompt of turn t+1 (`next_prompt`). Action tokens are exactly the
sampled ids (token-in / token-out): nothing is re-tokenised, so sampler, records and training
batches agree token for token. `layout_conversation` is the batch form of the same pieces.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tr.models.tokenizer import IM_END, IM_START, Tokenizer


@dataclasses.dataclass(frozen=True)
class Turn:
    """One agent turn: the sampled action ids and the observation that answered it (None if last)."""

    action_ids: tuple[int, ...]
    observation: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "action_ids", tuple(int(i) for i in self.action_ids))


@dataclasses.dataclass(frozen=True)
class ChatLayout:
    """Flat token ids of a conversation with per-token `actor_mask` (bool) and `turn_ids` (int32)."""

    tokens: np.ndarray
    actor_mask: np.ndarray
    turn_ids: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.actor_mask) != n or len(self.turn_ids) != n:
            raise ValueError(f"ChatLayout: tokens ({n}), actor_mask ({len(self.actor_mask)}) and turn_ids "
                             f"({len(self.turn_ids)}) must have the same length")

    @property
    def n_turns(self) -> int:
        return int(self.turn_ids.max()) if len(self.turn_ids) else 0

    def __len__(self) -> int:
        return len(self.tokens)


def _block(tokenizer: Tokenizer, role: str, text: str) -> list[int]:
    """`<|im_start|>{role}\\n{text}<|im_end|>\\n`."""
    return ([tokenizer.special_id(IM_START)] + tokenizer.encode(f"{role}\n{text}")
            + [tokenizer.special_id(IM_END)] + tokenizer.encode("\n"))


def assistant_header(tokenizer: Tokenizer) -> list[int]:
    return [tokenizer.special_id(IM_START)] + tokenizer.encode("assistant\n")


def prompt_ids(tokenizer: Tokenizer, system: str | None, task: str) -> list[int]:
    """Turn 0: optional system block, the task as the user block, then the assistant header."""
    ids = _block(tokenizer, "system", system) if system else []
    return ids + _block(tokenizer, "user", task) + assistant_header(tokenizer)


def observation_ids(tokenizer: Tokenizer, observation: str, action_ids: Sequence[int]) -> list[int]:
    """Tokens after an action: close it if the sampler cut it off, the observation as a user block,
    and the next assistant header. The first `\\n` after `<|im_end|>` is part of these tokens."""
    end = tokenizer.special_id(IM_END)
    closed = len(action_ids) > 0 and int(action_ids[-1]) == end
    return ([] if closed else [end]) + tokenizer.encode("\n") + _block(tokenizer, "user", observation) \
        + assistant_header(tokenizer)


def next_prompt(tokenizer: Tokenizer, previous_ids: Sequence[int], action_ids: Sequence[int],
                observation: str) -> list[int]:
    """The prompt for the next turn: previous prompt + sampled action + observation tokens."""
    return list(previous_ids) + [int(i) for i in action_ids] + observation_ids(tokenizer, observation, action_ids)


def append_turn(layout: ChatLayout, tokenizer: Tokenizer, turn: Turn) -> ChatLayout:
    """`layout` extended by one turn (action tokens, then observation tokens if any)."""
    t = layout.n_turns + 1
    obs = [] if turn.observation is None else observation_ids(tokenizer, turn.observation, turn.action_ids)
    n_act = len(turn.action_ids)
    return ChatLayout(
        tokens=np.concatenate([layout.tokens, np.asarray(turn.action_ids + tuple(obs), np.int32)]),
        actor_mask=np.concatenate([layout.actor_mask, np.ones(n_act, bool), np.zeros(len(obs), bool)]),
        turn_ids=np.concatenate([layout.turn_ids, np.full(n_act + len(obs), t, np.int32)]),
    )


def layout_conversation(tokenizer: Tokenizer, system: str | None, task: str,
                        turns: Sequence[Turn | tuple[Sequence[int], str | None]]) -> ChatLayout:
    """The whole conversation: prompt (turn 0, not actor) then each turn's action and observation.

    `turns` holds `Turn`s or `(action_ids, observation)` pairs; every turn but the last must have
    an observation (the environment answers every action except the final one).
    """
    prompt = np.asarray(prompt_ids(tokenizer, system, task), np.int32)
    layout = ChatLayout(tokens=prompt, actor_mask=np.zeros(len(prompt), bool),
                        turn_ids=np.zeros(len(prompt), np.int32))
    for index, turn in enumerate(turns):
        turn = turn if isinstance(turn, Turn) else Turn(*turn)
        if turn.observation is None and index != len(turns) - 1:
            raise ValueError(f"layout_conversation: turn {index + 1} of {len(turns)} has no observation; "
                             "only the last turn may end without one")
        if any(not 0 <= i < tokenizer.vocab_size for i in turn.action_ids):
            bad = [i for i in turn.action_ids if not 0 <= i < tokenizer.vocab_size][:3]
            raise ValueError(f"layout_conversation: turn {index + 1} has action ids {bad} outside the "
                             f"vocabulary [0, {tokenizer.vocab_size})")
        layout = append_turn(layout, tokenizer, turn)
    return layout
