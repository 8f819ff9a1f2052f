"""Evaluation: Mean@k / Pass@1 against a hand computation, and a real run of the suite."""

import json

import pytest

from tr.agent.evaluation import evaluate, summarise
from tr.agent.policies import ScriptedPolicy
from tr.agent.records import EpisodeRecord, EpisodeStatus
from tr.agent.transcript import ChatLayout


class T:
    def __init__(self, id, family, tier):
        self.id, self.family, self.tier = id, family, tier


def _rec(task, r, passed, status=None):
    status = status or (EpisodeStatus.VERIFIED_PASS if passed else EpisodeStatus.VERIFIED_FAIL)
    return EpisodeRecord(episode_id=f"{task.id}-{r}", task_id=task.id, rollout_index=r,
                         status=status, passed=None if status is EpisodeStatus.INFRA_FAILURE else passed)


def test_mean_at_k_and_pass_at_1_match_hand_computation():
    a, b, c = T("a", "f1", "easy"), T("b", "f1", "hard"), T("c", "f2", "hard")
    recs = [_rec(a, 0, True), _rec(a, 1, False), _rec(a, 2, True),
            _rec(b, 0, False), _rec(b, 1, False), _rec(b, 2, False),
            _rec(c, 0, False, EpisodeStatus.INFRA_FAILURE), _rec(c, 1, True), _rec(c, 2, True)]
    s = summarise(recs, [a, b, c], k=3)
    assert s["overall"]["mean@3"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert s["overall"]["pass@1"] == pytest.approx((1 + 0 + 1) / 3)  # c: first *valid* attempt
    assert s["by_family"]["f1"]["mean@3"] == pytest.approx((2 / 3 + 0) / 2)
    assert s["by_family"]["f2"]["pass@1"] == 1.0
    assert s["by_tier"]["hard"]["mean@3"] == pytest.approx(0.5)
    assert s["by_tier"]["easy"]["pass@1"] == 1.0
    assert s["infra_failures"] == 1 and s["tasks"]["c"]["valid"] == 2


def test_turn_capped_episode_counts_by_its_verifier_verdict():
    a = T("a", "f", "easy")
    s = summarise([_rec(a, 0, True, EpisodeStatus.TURN_CAP)], [a], k=1)
    assert s["overall"]["pass@1"] == 1.0


def test_evaluate_writes_json_and_table(tmp_path):
    from tr.envs.tasks import load_suite
    from tr.models.tokenizer import ByteTokenizer

    suite = load_suite()
    tasks = [next(t for t in suite if t.tier == tier) for tier in ("easy", "medium")]
    layout = ChatLayout(ByteTokenizer())
    res = evaluate({"scripted": ScriptedPolicy(tasks), "sloppy": ScriptedPolicy(tasks, mistake_prob=1.0)},
                   tasks, k=2, workdir=tmp_path, layout=layout, concurrency=2, progress=False)
    assert res["scripted"]["overall"]["mean@2"] == 1.0 and res["scripted"]["overall"]["pass@1"] == 1.0
    assert res["sloppy"]["overall"]["mean@2"] == 0.0
    data = json.loads((tmp_path / "eval.json").read_text())
    assert set(data) == {"scripted", "sloppy"} and data["scripted"]["episodes"] == 4
    table = (tmp_path / "eval.txt").read_text()
    assert "policy: scripted" in table and "Mean@2" in table and f"family {tasks[0].family}" in table
    assert (tmp_path / "episodes-scripted.jsonl").read_text().count("\n") == 4


def test_cli_writes_the_table(tmp_path, capsys):
    from tr.agent.evaluation import main
    from tr.envs.tasks import load_suite

    easy = next(t for t in load_suite() if t.tier == "easy")
    assert main(["--policies", "scripted", "--k", "1", "--tasks", easy.id, "--workdir", str(tmp_path),
                 "--concurrency", "1"]) == 0
    assert "Mean@1" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval.json").read_text())["scripted"]["overall"]["pass@1"] == 1.0
    with pytest.raises(SystemExit):
        main(["--tasks", "no-such-task", "--workdir", str(tmp_path)])
