"""HttpPolicy against a real OpenAI-compatible server on 127.0.0.1 (tr's own server.py)."""

import json
import urllib.error
import urllib.request

import pytest

from tr.agent.harness import Budgets, GenerationRequest
from tr.agent.http_policy import HttpPolicy, HttpPolicyError
from tr.agent.policies import ScriptedPolicy
from tr.agent.records import EpisodeStatus
from tr.agent.rollout import RolloutConfig, group_specs, run_rollouts
from tr.agent.server import ChatServer
from tr.agent.transcript import ChatLayout


@pytest.fixture(scope="module")
def tasks():
    from tr.envs.tasks import load_suite

    return sorted(load_suite(), key=lambda t: (t.tier != "easy", t.id))[:2]


@pytest.fixture(scope="module")
def layout():
    from tr.models.tokenizer import ByteTokenizer

    return ChatLayout(ByteTokenizer())


@pytest.fixture
def scripted_server(tasks, layout):
    with ChatServer(ScriptedPolicy(tasks), layout, model_name="scripted-teacher") as server:
        yield server


def test_server_speaks_openai_chat_completions(scripted_server, tasks):
    task = tasks[0]
    body = {"model": "scripted-teacher", "max_tokens": 256,
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": task.instruction}]}
    req = urllib.request.Request(scripted_server.url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    assert out["object"] == "chat.completion" and out["model"] == "scripted-teacher"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    direct = ScriptedPolicy(tasks).generate([GenerationRequest(
        messages=tuple(body["messages"]), prompt_tokens=(), max_tokens=256, task_id=task.id)])[0]
    assert choice["message"]["content"] == direct.text
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    with urllib.request.urlopen(scripted_server.url + "/models", timeout=30) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "scripted-teacher"


def test_http_teacher_solves_tasks_through_the_engine(scripted_server, tasks, layout):
    policy = HttpPolicy(scripted_server.url, "scripted-teacher")
    out = run_rollouts(group_specs(tasks, 1), policy, layout,
                       RolloutConfig(concurrency=2, progress=False))
    assert [r.status for r in out.records] == [EpisodeStatus.VERIFIED_PASS] * 2, [r.error for r in out.records]
    for rec in out.records:
        assert rec.policy == "http:scripted-teacher"
        actions = [s for s in rec.segments if s.kind == "action"]
        assert all(s.source == "teacher" and s.logprobs is None for s in actions)
        assert layout.tokenizer.decode(actions[0].tokens[:-1]) == rec.turns[0].text  # text → ids once


def test_bad_requests_get_clear_errors(scripted_server):
    policy = HttpPolicy(scripted_server.url, "scripted-teacher", retries=0)
    bad = GenerationRequest(messages=({"role": "robot", "content": "hi"},), prompt_tokens=(), max_tokens=8)
    with pytest.raises(HttpPolicyError, match=r"HTTP 400.*messages\[0\]"):
        policy.generate([bad])
    unknown = GenerationRequest(messages=({"role": "user", "content": "an unknown task"},),
                                prompt_tokens=(), max_tokens=8, task_id="nope")
    with pytest.raises(HttpPolicyError, match=r"HTTP 400.*no reference solution for task 'nope'"):
        policy.generate([unknown])
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(scripted_server.url + "/nothing", timeout=10)


def test_unreachable_endpoint_is_named():
    policy = HttpPolicy("http://127.0.0.1:9/v1", "m", retries=0, timeout_s=2)
    req = GenerationRequest(messages=({"role": "user", "content": "x"},), prompt_tokens=(), max_tokens=8)
    with pytest.raises(HttpPolicyError, match="127.0.0.1:9/v1/chat/completions"):
        policy.generate([req])
    with pytest.raises(ValueError, match="base_url"):
        HttpPolicy("127.0.0.1:8000", "m")


def test_http_client_on_the_tiny_model_server(tasks):
    """The served JAX policy: a real untrained tiny model behind the same endpoint."""
    from tr.agent.policies import load_model_policy

    policy = load_model_policy("tiny", seed=0)
    with ChatServer(policy, policy.layout, max_output_tokens=16) as server:
        client = HttpPolicy(server.url, server.model_name, retries=0)
        out = run_rollouts(group_specs(tasks[:1], 1), client, policy.layout,
                           RolloutConfig(concurrency=1, progress=False,
                                         budgets=Budgets(max_turns=2, max_output_tokens=16)))
    (rec,) = out.records
    assert rec.status is EpisodeStatus.TURN_CAP and rec.num_turns == 2  # untrained: never well-formed
    assert rec.format_errors == 2 and rec.passed is False
    assert all(t.output_tokens <= 16 for t in rec.turns)
