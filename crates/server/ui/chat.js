// A `chat` task, readably: the conversation (each message's role, text, tool calls with
// their arguments, tool results with the call they answer), the tools offered, and the
// answer (its text and tool calls). Rendered with textContent only, like every page.

import { h, json } from "./dom.js";

/** Arguments as indented JSON when they parse, else as given. */
function args(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return String(text);
  }
}

function calls(list) {
  return (list || []).map((c) => h("div", { class: "tool-call" },
    h("div", {}, h("span", { class: "badge" }, "calls"), " ", h("strong", { class: "mono" }, c.function?.name ?? "?"),
      " ", h("span", { class: "muted mono" }, c.id ?? "")),
    h("pre", { class: "json" }, args(c.function?.arguments ?? ""))));
}

function message(m) {
  const who = m.role === "tool" ? `tool result · ${m.tool_call_id}` : m.role;
  return h("div", { class: `chat-turn chat-${m.role}` },
    h("div", { class: "chat-role muted" }, who),
    m.content === null || m.content === undefined ? null : h("div", { class: "chat-text" }, m.content),
    ...calls(m.tool_calls));
}

/** The request's conversation and tools, and the answer when there is one. */
export function chatView(t) {
  const r = t.request || {};
  const tools = (r.tools || []).map((x) => x.function);
  const choice = typeof r.tool_choice === "object" && r.tool_choice !== null ? r.tool_choice.function?.name : r.tool_choice;
  return h("div", { class: "grid2", id: "chat-view" },
    h("section", { class: "card" }, h("h2", {}, "Conversation"),
      ...(r.messages || []).map(message),
      t.output ? h("div", { id: "chat-answer" }, message({ role: "assistant", ...t.output })) : h("p", { class: "muted" }, "No answer yet."),
      t.output ? h("p", { class: "muted" }, `finish reason: ${t.output.finish_reason}`) : null),
    h("section", { class: "card" }, h("h2", {}, "Tools"),
      tools.length === 0 ? h("p", { class: "muted" }, "No tools offered.") : null,
      ...tools.map((f) => h("div", { class: "tool" },
        h("strong", { class: "mono" }, f.name), f.description ? h("p", {}, f.description) : null,
        f.parameters ? json(f.parameters) : h("p", { class: "muted" }, "No arguments."))),
      tools.length ? h("p", { class: "muted" }, `tool choice: ${choice ?? "auto"}${r.parallel_tool_calls === false ? " · one call at most" : ""}`) : null));
}
