"""The official `openai` Python package, unchanged except for base_url and api_key,
against a real `tollgate serve` whose model calls go to a scripted fake
OpenAI-compatible provider that counts them. Started by crates/cli/tests/openai_sdk.rs,
which passes the addresses and keys in the environment."""

import json
import os
import urllib.request
import uuid

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

BASE_URL = os.environ["TOLLGATE_OPENAI_BASE_URL"]
ACME = os.environ["TOLLGATE_ACME_KEY"]
BETA = os.environ["TOLLGATE_BETA_KEY"]
FAKE = os.environ["TOLLGATE_FAKE_PROVIDER_URL"]
RUN = "py-" + uuid.uuid4().hex[:12]

FAKE_USAGE = (11, 7)  # what the fake provider reports for every call


def client(key=ACME, **kw):
    return OpenAI(base_url=BASE_URL, api_key=key, **kw)


def provider_calls():
    with urllib.request.urlopen(FAKE + "/calls") as r:
        return json.load(r)


def count():
    return provider_calls()["count"]


def hello(text="Hello"):
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": text},
    ]


def test_a_chat_completion_is_a_task_with_openai_shape():
    before = count()
    raw = client().chat.completions.with_raw_response.create(
        model="default",
        messages=hello(f"Hello {RUN}"),
        max_tokens=50,
        temperature=0.2,
        top_p=0.9,
        stop=["END"],
        seed=7,
        user="end-user-1",
        metadata={"feature": "greeting"},
    )
    r = raw.parse()
    task_id = raw.headers["x-tollgate-task-id"]
    assert r.id == f"chatcmpl-{task_id}"
    assert r.object == "chat.completion"
    assert r.model == "default"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == f"fake answer to: Hello {RUN}"
    assert r.choices[0].finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == FAKE_USAGE
    assert r.usage.total_tokens == sum(FAKE_USAGE)
    seen = provider_calls()
    assert seen["count"] == before + 1
    sent = seen["last"]
    assert sent["top_p"] == 0.9 and sent["stop"] == ["END"] and sent["seed"] == 7
    assert sent["max_tokens"] == 50 and sent["temperature"] == 0.2
    assert sent["messages"][-1] == {"role": "user", "content": f"Hello {RUN}"}
    # user and metadata never reach the provider
    assert "user" not in sent and "metadata" not in sent


class Person(BaseModel):
    name: str
    year: int


def test_json_schema_structured_output_is_parsed():
    before = count()
    r = client().chat.completions.parse(
        model="default",
        messages=[{"role": "user", "content": f"Who wrote the first program? {RUN}"}],
        response_format=Person,
    )
    person = r.choices[0].message.parsed
    assert person == Person(name="Ada Lovelace", year=1815)
    assert count() == before + 1
    sent = provider_calls()["last"]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["required"] == ["name", "year"]


def test_a_stream_arrives_while_the_provider_still_sends_it():
    # The fake holds its last piece until /release: a piece read before that came live.
    stream = client().chat.completions.create(
        model="default",
        messages=hello(f"gated: {RUN}"),
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = []
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 1:
                release = urllib.request.Request(FAKE + "/release", method="POST")
                urllib.request.urlopen(release).close()
    assert pieces == ["piece one ", "piece two ", "the end"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 3
    assert provider_calls()["last"]["stream_options"] == {"include_usage": True}


def test_a_streamed_completion_ends_with_usage():
    stream = client().chat.completions.create(
        model="default",
        messages=hello(f"Stream {RUN}"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"fake answer to: Stream {RUN}"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == sum(FAKE_USAGE)


def test_a_retried_call_with_the_same_idempotency_key_runs_once():
    key = {"Idempotency-Key": f"{RUN}-retry"}
    before = count()
    first = client().chat.completions.create(
        model="default", messages=hello(f"Once {RUN}"), extra_headers=key
    )
    again = client().chat.completions.create(
        model="default", messages=hello(f"Once {RUN}"), extra_headers=key
    )
    assert again.id == first.id
    assert again.created == first.created
    assert again.choices[0].message.content == first.choices[0].message.content
    assert count() == before + 1, "the replay never reached the provider"
    # The same key with another request is a conflict, not a silent replay.
    with pytest.raises(openai.ConflictError) as e:
        client(max_retries=0).chat.completions.create(
            model="default", messages=hello(f"Other {RUN}"), extra_headers=key
        )
    assert e.value.code == "idempotency_key_conflict"


def test_the_sdks_own_retry_of_a_slow_call_waits_for_the_same_task():
    # The fake takes longer than the server's longest wait: the first attempt is a 504
    # (x-should-retry: true, as the call has a key), the SDK retries by itself with the
    # same headers, and the retry answers the same task.
    before = count()
    raw = client(max_retries=2).chat.completions.with_raw_response.create(
        model="default",
        messages=hello(f"slow: {RUN}"),
        extra_headers={"Idempotency-Key": f"{RUN}-slow"},
    )
    assert raw.retries_taken >= 1
    assert raw.parse().choices[0].message.content == f"fake answer to: slow: {RUN}"
    assert count() == before + 1, "the task ran once across the SDK's attempts"


def test_a_budget_refusal_is_a_rate_limit_error():
    # The task-rate bucket is a limit about sources: the calls name theirs.
    def headers(source):
        return {"X-Tollgate-Scope": f"{RUN}-tight", "X-Tollgate-Budget": "tight",
                "X-Tollgate-Source": f"{RUN}-{source}"}
    c = client(max_retries=0)
    c.chat.completions.create(model="default", messages=hello("one"), extra_headers=headers("one"))
    before = count()
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="default", messages=hello("two"),
                                  extra_headers=headers("two"))
    assert e.value.status_code == 429
    assert e.value.code == "WORKFLOW_AI_RATE_LIMIT"
    assert e.value.type == "rate_limit_error"
    assert int(e.value.response.headers["retry-after"]) >= 1
    assert count() == before, "a refused call never reaches the provider"


def test_the_cache_answers_the_same_app_and_never_another():
    headers = {"X-Tollgate-Source": f"{RUN}-doc", "X-Tollgate-Source-Revision": "v1"}
    ask = dict(model="default", messages=hello(f"Summarize {RUN}"), extra_headers=headers)
    before = count()
    first = client().chat.completions.with_raw_response.create(**ask)
    assert first.headers["x-tollgate-cached"] == "false"
    assert count() == before + 1
    hit = client().chat.completions.with_raw_response.create(**ask)
    assert hit.headers["x-tollgate-cached"] == "true"
    assert hit.parse().id != first.parse().id, "a new call is a new task"
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert hit.parse().usage.total_tokens == 0, "a cache hit spends nothing"
    assert count() == before + 1, "the cache hit never reached the provider"
    other = client(BETA).chat.completions.with_raw_response.create(**ask)
    assert other.headers["x-tollgate-cached"] == "false"
    assert count() == before + 2, "another app's call runs on its own"


def test_unsupported_parameters_are_bad_requests():
    with pytest.raises(openai.BadRequestError) as e:
        client(max_retries=0).chat.completions.create(
            model="default", messages=hello(), logprobs=True
        )
    assert e.value.param == "logprobs"
    assert e.value.type == "invalid_request_error"
    # A bad tool is refused naming it.
    with pytest.raises(openai.BadRequestError) as e:
        client(max_retries=0).chat.completions.create(
            model="default",
            messages=hello(),
            tools=[{"type": "function", "function": {"name": "has space"}}],
        )
    assert e.value.param == "tools[0].function.name"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]


def test_a_tool_call_round_trip_with_parallel_calls():
    c = client()
    messages = [{"role": "user", "content": f"Weather and time in Paris? {RUN}"}]
    raw = c.chat.completions.with_raw_response.create(
        model="default", messages=messages, tools=TOOLS, parallel_tool_calls=True
    )
    first = raw.parse()
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert [t.function.name for t in calls] == ["get_weather", "get_time"]
    assert all(json.loads(t.function.arguments) == {"city": "Paris"} for t in calls)
    # Behind it, a `chat` task.
    request = urllib.request.Request(
        BASE_URL.replace("/openai/v1", "/v1/tasks/") + raw.headers["x-tollgate-task-id"],
        headers={"Authorization": f"Bearer {ACME}"},
    )
    with urllib.request.urlopen(request) as r:
        assert json.load(r)["kind"] == "chat"
    # The client runs both tools and sends both results back.
    messages.append(choice.message.model_dump(exclude_none=True))
    for t in calls:
        messages.append(
            {"role": "tool", "tool_call_id": t.id, "content": f"{t.function.name} says ok"}
        )
    final = c.chat.completions.create(model="default", messages=messages, tools=TOOLS)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content == (
        "fake answer to tool results: call_0=get_weather says ok, call_1=get_time says ok"
    )
    sent = provider_calls()["last"]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool", "tool"]
    assert [t["id"] for t in sent["messages"][1]["tool_calls"]] == ["call_0", "call_1"]


def test_models_are_listed():
    ids = [m.id for m in client().models.list()]
    assert "default" in ids
    assert client().models.retrieve("default").id == "default"
    with pytest.raises(openai.NotFoundError):
        client().models.retrieve("no-such-model")


def _close(a, b):
    return len(a) == len(b) and all(abs(x - y) < 1e-6 for x, y in zip(a, b))


def test_embeddings_create_with_a_list_in_floats_and_base64():
    import base64
    import math
    import struct

    texts = [f"{RUN} alpha", f"{RUN} beta", f"{RUN} gamma"]
    raw = client().embeddings.with_raw_response.create(
        model="embed",
        input=texts,
        encoding_format="float",
        extra_headers={"Idempotency-Key": f"{RUN}-embed"},
    )
    floats = raw.parse()
    assert floats.object == "list"
    assert floats.model == "embed"
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == 8 for d in floats.data)
    for d in floats.data:
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-4
    assert floats.usage.prompt_tokens > 0
    assert floats.usage.total_tokens == floats.usage.prompt_tokens
    assert raw.headers["x-tollgate-task-id"]

    # The SDK's default asks for base64 and decodes it: the same vectors, all from the
    # item cache (nothing charged).
    decoded = client().embeddings.create(model="embed", input=texts)
    assert all(
        _close(list(a.embedding), b.embedding) for a, b in zip(decoded.data, floats.data)
    )
    assert decoded.usage.prompt_tokens == 0
    # base64 asked for explicitly: the little-endian f32 bytes, as OpenAI sends them.
    explicit = client().embeddings.create(model="embed", input=texts, encoding_format="base64")
    for a, b in zip(explicit.data, floats.data):
        raw_bytes = base64.b64decode(a.embedding)
        assert _close(list(struct.unpack(f"<{len(raw_bytes) // 4}f", raw_bytes)), b.embedding)

    # A replay of the key answers the same task.
    again = client().embeddings.with_raw_response.create(
        model="embed",
        input=texts,
        encoding_format="float",
        extra_headers={"Idempotency-Key": f"{RUN}-embed"},
    )
    assert again.headers["x-tollgate-task-id"] == raw.headers["x-tollgate-task-id"]
    one = client().embeddings.create(model="embed", input=f"{RUN} single", dimensions=4)
    assert len(one.data) == 1 and len(one.data[0].embedding) == 4
    with pytest.raises(openai.BadRequestError) as e:
        client(max_retries=0).embeddings.create(model="embed", input=[])
    assert e.value.param == "input"
