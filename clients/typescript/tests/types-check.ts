// Compile-time checks of the public types (tsc -p tsconfig.check.json; not run).
import { Tollgate, type RunState, type Task, type TaskStatus } from "../src/index.js";
const tg = new Tollgate({ apiKey: "k" });
async function f() {
  const t = await tg.run({ kind: "classify", scope: "s", request: { input: "x", labels: ["a", { name: "b", description: "B" }] } });
  const label: string | undefined = t.output?.label;
  const m = await tg.submit({ kind: "classify_many", scope: "s", request: { items: [{ id: "a", input: "x" }], labels: ["p"] } });
  const ids: string[] | undefined = m.output?.results.map((r) => r.id);
  // @ts-expect-error: classify needs labels
  await tg.submit({ kind: "classify", scope: "s", request: { input: "x" } });
  // @ts-expect-error: not a kind
  await tg.submit({ kind: "summarize", scope: "s", request: {} });
  const g: Task<"generate_text"> = await tg.run({ kind: "generate_text", scope: "s", request: { prompt: "hi" } });
  const text: string | undefined = g.output?.text;
  const e = await tg.run({ kind: "embed", scope: "s", request: { input: ["a", { text: "b", id: "d", revision: "v1" }], dimensions: 8 } });
  const vectors: number[][] | undefined = e.output?.embeddings;
  // @ts-expect-error: embed needs an input
  await tg.submit({ kind: "embed", scope: "s", request: { dimensions: 8 } });
  const page = await tg.listTasks({ scope: "s", status: ["queued", "running"], created_after: new Date() });
  const status: TaskStatus | undefined = page.tasks[0]?.status;
  // @ts-expect-error: not a status
  await tg.listTasks({ status: "done" });
  for await (const run of tg.allRuns({ state: "waiting" })) {
    const state: RunState = run.state;
    void state;
  }
  const spent: number = (await tg.usage()).settled_usd;
  const queued: number = (await tg.stats()).queued;
  return [label, ids, text, vectors, status, spent, queued];
}
f;
async function webhooks() {
  const w = await tg.createWebhook({ url: "https://hooks.example.com/t", events: ["task.succeeded", "run.finished"] });
  // @ts-expect-error: not an event type
  await tg.createWebhook({ url: "https://hooks.example.com/t", events: ["task.started"] });
  // @ts-expect-error: url is required
  await tg.createWebhook({ events: ["task.failed"] });
  const updated = await tg.updateWebhook(w.id, { enabled: false, description: null });
  const enabled: boolean = updated.enabled;
  const deliveries = await tg.listDeliveries(w.id, { state: "dead", limit: 10 });
  // @ts-expect-error: not a delivery state
  await tg.listDeliveries(w.id, { state: "failed" });
  const replay = await tg.replayDelivery(w.id, deliveries[0]!.id);
  const replayOf: string | null | undefined = replay.replay_of;
  const nothing: void = await tg.deleteWebhook(w.id);
  const ids: string[] = (await tg.listWebhooks()).map((x) => x.id);
  return [enabled, replayOf, nothing, ids, (await tg.getWebhook(w.id)).secret];
}
webhooks;
