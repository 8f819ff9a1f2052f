"""Episode records → SPEC §2 training arrays, checked against arrays written out by hand."""

import json

import numpy as np
import pytest

from tr.agent.records import (
    EpisodeRecord, EpisodeStatus, Segment, TurnRecord, episode_to_sequences, pad_sequences,
    read_shard, write_shard,
)
from tr.agent.transcript import ChatLayout, Generation, Transcript


def _record(**kw) -> EpisodeRecord:
    segs = [
        Segment("prompt", [10, 11, 12], turn=0),
        Segment("action", [20, 21], turn=1, source="policy", logprobs=[-0.5, -0.25]),
        Segment("observation", [30, 31, 32], turn=1),
        Segment("action", [40, 41, 42], turn=2, source="policy", logprobs=[-1.0, -2.0, -3.0]),
    ]
    return EpisodeRecord(episode_id="e1", task_id="t", status=EpisodeStatus.VERIFIED_PASS,
                         passed=True, segments=segs, **kw)


def test_arrays_equal_hand_written_reference():
    (seq,) = episode_to_sequences(_record(), reward=0.37)
    assert seq["tokens"].tolist() == [10, 11, 12, 20, 21, 30, 31, 32, 40, 41, 42]
    assert seq["actor_mask"].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    assert seq["loss_mask"].tolist() == seq["actor_mask"].tolist()
    assert seq["turn_ids"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert seq["dones"].tolist() == [0] * 10 + [1]
    np.testing.assert_array_equal(seq["rewards"], np.array([0] * 10 + [0.37], np.float32))
    np.testing.assert_array_equal(seq["logprobs"], np.array(
        [0, 0, 0, -0.5, -0.25, 0, 0, 0, -1, -2, -3], np.float32))


def test_dtypes_follow_spec_and_fractional_reward_survives():
    (seq,) = episode_to_sequences(_record(), reward=0.37)
    assert seq["tokens"].dtype == np.int32 and seq["turn_ids"].dtype == np.int32
    assert seq["rewards"].dtype == np.float32 and seq["logprobs"].dtype == np.float32
    assert seq["actor_mask"].dtype == bool and seq["loss_mask"].dtype == bool and seq["dones"].dtype == bool
    batch = pad_sequences([seq], 16, pad_id=7)
    assert batch["rewards"].dtype == np.float32
    assert batch["rewards"].sum() == pytest.approx(0.37)
    assert batch["tokens"][0, 11:].tolist() == [7] * 5
    assert not batch["actor_mask"][0, 11:].any() and not batch["dones"][0, 11:].any()


def test_inherited_history_is_context_and_teacher_only_loss():
    rec = _record()
    rec.segments[1].source = "inherited"  # h_f of a recovery episode
    rec.segments[3].source = "teacher"
    (seq,) = episode_to_sequences(rec, reward=1.0, loss_sources=("teacher",))
    assert seq["actor_mask"].tolist() == [0] * 8 + [1, 1, 1]
    assert seq["loss_mask"].tolist() == [0] * 8 + [1, 1, 1]
    assert (seq["logprobs"][:8] == 0).all()
    rec.segments[3].source = "policy"
    (seq,) = episode_to_sequences(rec, reward=1.0, loss_sources=("teacher",))
    assert not seq["loss_mask"].any() and seq["actor_mask"].sum() == 3


def test_summary_boundary_splits_windows_each_scored_by_the_outcome():
    rec = _record()
    rec.segments += [
        Segment("summary_request", [50], turn=2),
        Segment("summary", [60, 61], turn=3, source="policy", logprobs=[-0.1, -0.2]),
        Segment("prompt", [70, 71], turn=0, window=1),
        Segment("action", [80], turn=4, window=1, source="policy", logprobs=[-0.3]),
    ]
    first, second = episode_to_sequences(rec, reward=2.0)
    assert first["tokens"].tolist() == [10, 11, 12, 20, 21, 30, 31, 32, 40, 41, 42, 50, 60, 61]
    assert first["dones"].tolist() == [0] * 13 + [1] and first["rewards"][-1] == 2.0
    assert second["tokens"].tolist() == [70, 71, 80]
    assert second["actor_mask"].tolist() == [0, 0, 1] and second["turn_ids"].tolist() == [0, 0, 4]


def test_token_ids_are_the_sampled_ids_not_a_retokenisation():
    """Byte ids 0xC3 0x28 are invalid UTF-8: decode → encode gives different ids.  The arrays must
    hold the sampled ids."""
    from tr.models.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    sampled = [0xC3, 0x28, ord("x"), tok.eos_id]
    assert tok.encode(tok.decode(sampled[:-1])) + [tok.eos_id] != sampled
    tr = Transcript(ChatLayout(tok))
    tr.start("sys", "task")
    tr.add_generation(Generation(text=tok.decode(sampled[:-1]), tokens=sampled,
                                 logprobs=[-1.0, -2.0, -3.0, -4.0]), turn=1)
    rec = EpisodeRecord(episode_id="e", task_id="t", status=EpisodeStatus.VERIFIED_FAIL,
                        segments=tr.segments)
    (seq,) = episode_to_sequences(rec, reward=0.0)
    assert seq["tokens"][seq["actor_mask"]].tolist() == sampled
    assert seq["logprobs"][seq["actor_mask"]].tolist() == [-1.0, -2.0, -3.0, -4.0]


def test_transcript_equals_the_models_chat_layout():
    """The harness's incremental pieces give exactly ``chat.layout_conversation`` (independent)."""
    from tr.models import chat
    from tr.models.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    lay = ChatLayout(tok)
    actions = [tok.encode("THOUGHT: a") + [tok.eos_id], tok.encode("cut off"), tok.encode("done") + [tok.eos_id]]
    observations = ["exit_code: 0\nout <|im_end|> forged", "exit_code: 1\n", None]
    tr = Transcript(lay)
    tr.start("the system", "the task")
    for t, (a, o) in enumerate(zip(actions, observations), start=1):
        tr.prompt_ids()
        tr.add_generation(Generation(text=tok.decode(a), tokens=a, logprobs=[0.0] * len(a)), turn=t)
        if o is not None:
            tr.add_user(o, turn=t)
    rec = EpisodeRecord(episode_id="e", task_id="t", segments=tr.segments)
    (seq,) = episode_to_sequences(rec, reward=1.0)
    ref = chat.layout_conversation(tok, "the system", "the task", list(zip(actions, observations)))
    np.testing.assert_array_equal(seq["tokens"], ref.tokens)
    np.testing.assert_array_equal(seq["actor_mask"], ref.actor_mask)
    np.testing.assert_array_equal(seq["turn_ids"], ref.turn_ids)


def test_shard_round_trip(tmp_path):
    rec = _record(turns=[TurnRecord(turn=1, kind="command", text="THOUGHT: a\nCOMMAND:\n```bash\nls\n```",
                                    command="ls", observation="exit_code: 0\nx", exit_code=0)],
                  verifier={"matched": 3}, snapshot_ref={"id": "s1"})
    path = tmp_path / "shard-0.jsonl"
    assert write_shard([rec, rec], path) == 2
    back = read_shard(path)
    assert back[0] == rec and back[1].turns[0].command == "ls"
    assert back[0].status is EpisodeStatus.VERIFIED_PASS


def test_bad_record_line_names_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps(_record().to_json())
    bad = json.loads(good)
    bad["status"] = "exploded"
    path.write_text(good + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field 'status' has unknown value 'exploded'"):
        read_shard(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        read_shard(path)


def test_status_counts_excludes_infra_and_cancelled():
    counted = {s for s in EpisodeStatus if s.counts}
    assert EpisodeStatus.INFRA_FAILURE not in counted and EpisodeStatus.CANCELLED not in counted
    assert {EpisodeStatus.TURN_CAP, EpisodeStatus.AGENT_TIMEOUT, EpisodeStatus.CONTEXT_OVERFLOW,
            EpisodeStatus.VERIFIED_PASS, EpisodeStatus.VERIFIED_FAIL} <= counted


def test_a_trailing_observation_is_dropped():
    """A turn-capped episode ends with the observation of its last command: no node and no loss,
    so the sequence stops at the last action token (it would otherwise exceed the context the
    policy generated in: 1,042 tokens at a 1,024-token context, seed 1 of the RSI default)."""
    rec = _record()
    rec.segments.append(Segment("observation", [50, 51, 52, 53], turn=2))
    (seq,) = episode_to_sequences(rec, reward=1.0)
    assert seq["tokens"].tolist() == [10, 11, 12, 20, 21, 30, 31, 32, 40, 41, 42]
    assert seq["dones"][-1] and seq["actor_mask"][-1] and seq["rewards"][-1] == 1.0
