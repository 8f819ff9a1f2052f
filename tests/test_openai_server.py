"""tr.agent.server driven by the official ``openai`` client: streaming, errors, and each parameter
honoured or refused with 400 (never silently ignored)."""

import json
import urllib.error
import urllib.request

import openai
import pytest

from tr.agent.harness import GenerationRequest
from tr.agent.policies import ScriptedPolicy
from tr.agent.server import ChatServer
from tr.agent.transcript import ChatLayout
from tr.models.tokenizer import ByteTokenizer

MODEL = "scripted-teacher"


@pytest.fixture(scope="module")
def tasks():
    from tr.envs.tasks import load_suite

    return sorted(load_suite(), key=lambda t: (t.tier != "easy", t.id))[:2]


@pytest.fixture(scope="module")
def server(tasks):
    with ChatServer(ScriptedPolicy(tasks), ChatLayout(ByteTokenizer()), model_name=MODEL,
                    max_output_tokens=4096) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def ask(task):
    return [{"role": "system", "content": "sys"}, {"role": "user", "content": task.instruction}]


def reference(tasks, task, **kw) -> str:
    """What the policy answers when called directly, not through HTTP."""
    req = GenerationRequest(messages=tuple(ask(task)), prompt_tokens=(), max_tokens=4096, task_id=task.id, **kw)
    return ScriptedPolicy(tasks).generate([req])[0].text


def test_completion_is_the_policys_answer(client, tasks):
    task = tasks[0]
    out = client.chat.completions.create(model=MODEL, messages=ask(task), metadata={"task_id": task.id})
    assert out.object == "chat.completion" and out.model == MODEL
    (choice,) = out.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == reference(tasks, task)
    assert out.usage.completion_tokens == len(choice.message.content.encode())
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_stream_yields_the_content_then_done(client, server, tasks):
    task = tasks[0]
    stream = client.chat.completions.create(model=MODEL, messages=ask(task), stream=True,
                                            metadata={"task_id": task.id},
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference(tasks, task)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(text.encode())
    # The wire format itself: SSE frames ending with [DONE].
    body = {"model": MODEL, "messages": ask(task), "stream": True, "metadata": {"task_id": task.id}}
    req = urllib.request.Request(server.url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        raw = resp.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"
    assert "".join(json.loads(f[6:])["choices"][0]["delta"].get("content", "") for f in frames[:-1]) == text


def error_of(exc_info) -> dict:
    body = exc_info.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_unknown_model_is_404_with_an_openai_error(client, tasks):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-nonexistent", messages=ask(tasks[0]))
    err = error_of(e)
    assert err["code"] == "model_not_found" and err["param"] == "model" and "gpt-nonexistent" in err["message"]
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-nonexistent")


def test_unknown_or_missing_task_is_400(client, tasks):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "an unknown task"}],
                                       metadata={"task_id": "nope"})
    err = error_of(e)
    assert err["param"] == "metadata.task_id" and "'nope'" in err["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    assert "no task_id" in error_of(e)["message"]
    # Without task_id the scripted teacher finds the task by its instruction: not an error.
    out = client.chat.completions.create(model=MODEL, messages=ask(tasks[1]))
    assert out.choices[0].message.content == reference(tasks, tasks[1])


def test_n_gives_n_choices_each_with_its_own_seed(client, tasks):
    task = tasks[0]
    out = client.chat.completions.create(model=MODEL, messages=ask(task), n=3, seed=5,
                                         metadata={"task_id": task.id})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.message.content for c in out.choices] == [reference(tasks, task, seed=5 * 3 + i) for i in range(3)]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ask(task), n=100)
    assert error_of(e)["param"] == "n"


def test_stop_cuts_before_the_first_stop_string(client, tasks):
    task = tasks[0]
    full = reference(tasks, task)
    stops = [full[10:14], full[5:8]]              # the earlier one in the text wins
    out = client.chat.completions.create(model=MODEL, messages=ask(task), stop=stops,
                                         metadata={"task_id": task.id})
    expected = full[:min(full.index(s) for s in stops)]
    assert out.choices[0].message.content == expected and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == len(expected.encode())
    one = client.chat.completions.create(model=MODEL, messages=ask(task), stop="NOT-IN-THE-TEXT",
                                         metadata={"task_id": task.id})
    assert one.choices[0].message.content == full
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=ask(task), stop=["a", "b", "c", "d", "e"])
    assert error_of(e)["param"] == "stop"


def test_max_tokens_caps_the_reply_or_is_refused(client, tasks):
    task = tasks[0]
    full = reference(tasks, task)
    out = client.chat.completions.create(model=MODEL, messages=ask(task), max_tokens=7,
                                         metadata={"task_id": task.id})
    assert out.choices[0].message.content == full.encode()[:7].decode()
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 7
    out = client.chat.completions.create(model=MODEL, messages=ask(task), max_completion_tokens=7,
                                         metadata={"task_id": task.id})
    assert out.choices[0].message.content == full.encode()[:7].decode()
    for bad in (0, 10_000):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=ask(task), max_tokens=bad,
                                           metadata={"task_id": task.id})
        assert error_of(e)["param"] == "max_tokens"


def test_sampling_parameters_are_checked(client, tasks):
    task = tasks[0]
    # A deterministic policy honours every valid temperature / top_p: its answer does not change.
    for kw in ({"temperature": 0.0}, {"temperature": 1.7, "top_p": 0.3}):
        out = client.chat.completions.create(model=MODEL, messages=ask(task), metadata={"task_id": task.id}, **kw)
        assert out.choices[0].message.content == reference(tasks, task)
    for kw, param in (({"temperature": 2.5}, "temperature"), ({"top_p": 0.0}, "top_p"),
                      ({"top_p": 1.5}, "top_p"), ({"presence_penalty": 0.5}, "presence_penalty"),
                      ({"logprobs": True}, "logprobs"), ({"extra_body": {"best_of": 2}}, "best_of"),
                      ({"stream_options": {"include_usage": True}}, "stream_options")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=ask(task), metadata={"task_id": task.id}, **kw)
        assert error_of(e)["param"] == param, kw
    # Neutral values are what the server does anyway: accepted.
    out = client.chat.completions.create(model=MODEL, messages=ask(task), metadata={"task_id": task.id},
                                         presence_penalty=0, frequency_penalty=0, logprobs=False)
    assert out.choices[0].message.content == reference(tasks, task)


def test_bad_messages_and_routes(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "hi"}])
    err = error_of(e)
    assert err["param"] == "messages" and "messages[0]" in err["message"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(server.url + "/completions", data=b"{}"), timeout=10)
    assert e.value.code == 404 and json.loads(e.value.read())["error"]["code"] == "unknown_url"
    req = urllib.request.Request(server.url + "/chat/completions", data=b"{not json")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "not valid JSON" in json.loads(e.value.read())["error"]["message"]


def test_sampling_policy_refuses_other_temperatures_and_streams():
    """The JAX model samples at the temperature / top_p it was built with: those are accepted (and
    the reply streamed), any other value is a 400, never silently ignored."""
    from tr.agent.policies import load_model_policy

    policy = load_model_policy("tiny", seed=0)        # eval sampling: 0.6 / 0.95
    with ChatServer(policy, policy.layout, max_output_tokens=8) as s, \
            openai.OpenAI(base_url=s.url, api_key="unused", max_retries=0, timeout=300) as c:
        msgs = [{"role": "user", "content": "list the files"}]
        for kw, param in (({"temperature": 1.0}, "temperature"), ({"top_p": 1.0}, "top_p")):
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(model=s.model_name, messages=msgs, **kw)
            assert error_of(e)["param"] == param and str(policy.temperature if param == "temperature"
                                                           else policy.top_p) in error_of(e)["message"]
        chunks = list(c.chat.completions.create(model=s.model_name, messages=msgs, temperature=0.6,
                                                top_p=0.95, max_tokens=4, n=2, stream=True,
                                                stream_options={"include_usage": True}))
        assert sorted({ch.choices[0].index for ch in chunks if ch.choices}) == [0, 1]
        assert 2 <= chunks[-1].usage.completion_tokens <= 8      # each choice 1..4 tokens
