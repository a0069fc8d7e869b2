// The official `openai` npm package, unchanged except for baseURL and apiKey, against a
// real `tollgate serve` whose model calls go to a scripted fake OpenAI-compatible
// provider that counts them. Started by crates/cli/tests/openai_sdk.rs, which passes
// the addresses and keys in the environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import OpenAI from "openai";

const BASE_URL = process.env.TOLLGATE_OPENAI_BASE_URL;
const ACME = process.env.TOLLGATE_ACME_KEY;
const BETA = process.env.TOLLGATE_BETA_KEY;
const FAKE = process.env.TOLLGATE_FAKE_PROVIDER_URL;
const RUN = "node-" + randomUUID().slice(0, 12);
const FAKE_TOTAL = 18; // 11 prompt + 7 completion tokens, what the fake reports

const client = (apiKey = ACME, opts = {}) => new OpenAI({ baseURL: BASE_URL, apiKey, ...opts });
const providerCalls = async () => (await fetch(`${FAKE}/calls`)).json();
const count = async () => (await providerCalls()).count;
const hello = (text = "Hello") => [
  { role: "system", content: "You are terse." },
  { role: "user", content: text },
];

test("a chat completion is a task with OpenAI's shape", async () => {
  const before = await count();
  const { data, response } = await client()
    .chat.completions.create({
      model: "default",
      messages: hello(`Hello ${RUN}`),
      max_completion_tokens: 40,
      top_p: 0.5,
      stop: "END",
      seed: 3,
    })
    .withResponse();
  assert.equal(data.id, `chatcmpl-${response.headers.get("x-tollgate-task-id")}`);
  assert.equal(data.object, "chat.completion");
  assert.equal(data.choices[0].message.content, `fake answer to: Hello ${RUN}`);
  assert.equal(data.choices[0].finish_reason, "stop");
  assert.equal(data.usage.total_tokens, FAKE_TOTAL);
  const seen = await providerCalls();
  assert.equal(seen.count, before + 1);
  assert.equal(seen.last.max_tokens, 40);
  assert.deepEqual(seen.last.stop, ["END"]);
  assert.equal(seen.last.top_p, 0.5);
  assert.equal(seen.last.seed, 3);
});

test("a json_schema structured output is valid JSON of the schema", async () => {
  const before = await count();
  const r = await client().chat.completions.create({
    model: "default",
    messages: [{ role: "user", content: `Who wrote the first program? ${RUN}` }],
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "person",
        strict: true,
        schema: {
          type: "object",
          properties: { name: { type: "string" }, year: { type: "integer" } },
          required: ["name", "year"],
          additionalProperties: false,
        },
      },
    },
  });
  assert.deepEqual(JSON.parse(r.choices[0].message.content), { name: "Ada Lovelace", year: 1815 });
  assert.equal(await count(), before + 1);
});

test("a stream arrives while the provider still sends it", async () => {
  // The fake holds its last piece until /release: a piece read before that came live.
  const stream = await client().chat.completions.create({
    model: "default",
    messages: hello(`gated: ${RUN}`),
    stream: true,
    stream_options: { include_usage: true },
  });
  const pieces = [];
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
    const piece = chunk.choices[0]?.delta?.content;
    if (piece) {
      pieces.push(piece);
      if (pieces.length === 1) await fetch(`${FAKE}/release`, { method: "POST" });
    }
  }
  assert.deepEqual(pieces, ["piece one ", "piece two ", "the end"]);
  assert.equal(chunks.at(-1).usage.completion_tokens, 3);
});

test("a streamed completion arrives as chunks ending with usage", async () => {
  const stream = await client().chat.completions.create({
    model: "default",
    messages: hello(`Stream ${RUN}`),
    stream: true,
    stream_options: { include_usage: true },
  });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? "").join("");
  assert.equal(text, `fake answer to: Stream ${RUN}`);
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk"));
  assert.deepEqual(
    chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0].finish_reason),
    ["stop"],
  );
  assert.equal(chunks.at(-1).usage.total_tokens, FAKE_TOTAL);
});

test("a retried call with the same Idempotency-Key runs once", async () => {
  const headers = { "Idempotency-Key": `${RUN}-retry` };
  const before = await count();
  const body = { model: "default", messages: hello(`Once ${RUN}`) };
  const first = await client().chat.completions.create(body, { headers });
  const again = await client().chat.completions.create(body, { headers });
  assert.equal(again.id, first.id);
  assert.equal(again.created, first.created);
  assert.equal(again.choices[0].message.content, first.choices[0].message.content);
  assert.equal(await count(), before + 1, "the replay never reached the provider");
});

test("the SDK's own retry of a slow call waits for the same task", async () => {
  // The fake takes longer than the server's longest wait: the first attempt is a 504
  // (x-should-retry: true, as the call has a key); the SDK retries with the same headers.
  const before = await count();
  const r = await client(ACME, { maxRetries: 2 }).chat.completions.create(
    { model: "default", messages: hello(`slow: ${RUN}`) },
    { headers: { "Idempotency-Key": `${RUN}-slow` } },
  );
  assert.equal(r.choices[0].message.content, `fake answer to: slow: ${RUN}`);
  assert.equal(await count(), before + 1, "the task ran once across the SDK's attempts");
});

test("a budget refusal is a RateLimitError", async () => {
  // The task-rate bucket is a limit about sources: the calls name theirs.
  const headers = (source) => ({
    "X-Tollgate-Scope": `${RUN}-tight`,
    "X-Tollgate-Budget": "tight",
    "X-Tollgate-Source": `${RUN}-${source}`,
  });
  const c = client(ACME, { maxRetries: 0 });
  await c.chat.completions.create(
    { model: "default", messages: hello("one") },
    { headers: headers("one") },
  );
  const before = await count();
  await assert.rejects(
    c.chat.completions.create(
      { model: "default", messages: hello("two") },
      { headers: headers("two") },
    ),
    (e) => {
      assert.ok(e instanceof OpenAI.RateLimitError, `${e}`);
      assert.equal(e.status, 429);
      assert.equal(e.code, "WORKFLOW_AI_RATE_LIMIT");
      assert.ok(Number(e.headers.get("retry-after")) >= 1);
      return true;
    },
  );
  assert.equal(await count(), before, "a refused call never reaches the provider");
});

test("the cache answers the same app and never another", async () => {
  const headers = { "X-Tollgate-Source": `${RUN}-doc`, "X-Tollgate-Source-Revision": "v1" };
  const body = { model: "default", messages: hello(`Summarize ${RUN}`) };
  const before = await count();
  const first = await client().chat.completions.create(body, { headers }).withResponse();
  assert.equal(first.response.headers.get("x-tollgate-cached"), "false");
  const hit = await client().chat.completions.create(body, { headers }).withResponse();
  assert.equal(hit.response.headers.get("x-tollgate-cached"), "true");
  assert.equal(hit.data.choices[0].message.content, first.data.choices[0].message.content);
  assert.equal(await count(), before + 1, "the cache hit never reached the provider");
  const other = await client(BETA).chat.completions.create(body, { headers }).withResponse();
  assert.equal(other.response.headers.get("x-tollgate-cached"), "false");
  assert.equal(await count(), before + 2, "another app's call runs on its own");
});

test("unsupported parameters are BadRequestErrors and models are listed", async () => {
  await assert.rejects(
    client(ACME, { maxRetries: 0 }).chat.completions.create({
      model: "default",
      messages: hello(),
      logprobs: true,
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "logprobs",
  );
  const ids = [];
  for await (const m of client().models.list()) ids.push(m.id);
  assert.ok(ids.includes("default"), `${ids}`);
});

const TOOLS = ["get_weather", "get_time"].map((name) => ({
  type: "function",
  function: {
    name,
    description: `${name} of a city`,
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
}));

test("a tool-call round trip with parallel calls", async () => {
  const c = client();
  const messages = [{ role: "user", content: `Weather and time in Paris? ${RUN}` }];
  const first = await c.chat.completions.create({
    model: "default",
    messages,
    tools: TOOLS,
    parallel_tool_calls: true,
  });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  const calls = choice.message.tool_calls;
  assert.deepEqual(
    calls.map((t) => t.function.name),
    ["get_weather", "get_time"],
  );
  for (const t of calls) assert.deepEqual(JSON.parse(t.function.arguments), { city: "Paris" });
  // The client runs both tools and sends both results back.
  messages.push(choice.message);
  for (const t of calls) {
    messages.push({ role: "tool", tool_call_id: t.id, content: `${t.function.name} says ok` });
  }
  const final = await c.chat.completions.create({ model: "default", messages, tools: TOOLS });
  assert.equal(final.choices[0].finish_reason, "stop");
  assert.equal(
    final.choices[0].message.content,
    "fake answer to tool results: call_0=get_weather says ok, call_1=get_time says ok",
  );
  const sent = (await providerCalls()).last;
  assert.deepEqual(
    sent.messages.map((m) => m.role),
    ["user", "assistant", "tool", "tool"],
  );
});

test("embeddings.create with a list, in floats and base64", async () => {
  const input = [`${RUN} alpha`, `${RUN} beta`];
  const { data: floats, response } = await client()
    .embeddings.create(
      { model: "embed", input, encoding_format: "float" },
      { headers: { "Idempotency-Key": `${RUN}-embed` } },
    )
    .withResponse();
  assert.equal(floats.object, "list");
  assert.deepEqual(floats.data.map((d) => d.index), [0, 1]);
  assert.ok(floats.data.every((d) => d.object === "embedding" && d.embedding.length === 8));
  assert.ok(floats.usage.prompt_tokens > 0);
  // The SDK's default asks for base64 and decodes it: the same vectors, from the item cache.
  const decoded = await client().embeddings.create({ model: "embed", input });
  decoded.data.forEach((d, i) =>
    d.embedding.forEach((x, j) => assert.ok(Math.abs(x - floats.data[i].embedding[j]) < 1e-6)),
  );
  assert.equal(decoded.usage.prompt_tokens, 0);
  // base64 asked for explicitly: little-endian f32 bytes.
  const explicit = await client().embeddings.create({ model: "embed", input, encoding_format: "base64" });
  const bytes = Buffer.from(explicit.data[1].embedding, "base64");
  const values = Array.from({ length: bytes.length / 4 }, (_, k) => bytes.readFloatLE(4 * k));
  values.forEach((x, j) => assert.ok(Math.abs(x - floats.data[1].embedding[j]) < 1e-6));
  const again = await client()
    .embeddings.create(
      { model: "embed", input, encoding_format: "float" },
      { headers: { "Idempotency-Key": `${RUN}-embed` } },
    )
    .withResponse();
  assert.equal(
    again.response.headers.get("x-tollgate-task-id"),
    response.headers.get("x-tollgate-task-id"),
  );
});
