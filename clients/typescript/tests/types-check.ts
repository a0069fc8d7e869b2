// Compile-time checks of the public types (tsc -p tsconfig.check.json; not run).
import { Tollgate, type Task } from "../src/index.js";
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
  return [label, ids, text];
}
f;
