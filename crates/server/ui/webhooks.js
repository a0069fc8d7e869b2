// The Webhooks page (docs/webhooks.md): the app's endpoints and, for the one chosen, its
// deliveries newest first, each with a Replay button (a new delivery of the same event).

import { get, post } from "./api.js";
import { ago, h, replace, shortId, table } from "./dom.js";

/** A delivery's state, coloured like the task status it resembles. */
const STATE_COLOURS = { pending: "queued", delivered: "succeeded", dead: "failed" };
function stateBadge(state) {
  return h("span", { class: `badge s-${STATE_COLOURS[state] || "queued"}` }, state);
}

/** The endpoint's events; `budget.threshold` with its thresholds as percentages. */
function events(e) {
  return e.events.map((name) => name === "budget.threshold" && e.budget_thresholds
    ? `${name} (${e.budget_thresholds.map((t) => `${Math.round(t * 1000) / 10} %`).join(", ")})`
    : name).join(", ");
}

function notice(err) {
  return h("p", { class: "error", role: "alert" }, err.message || String(err));
}

function replayButton(endpoint, d, done) {
  const problem = h("span", { class: "error", role: "alert", hidden: true });
  const button = h("button", { type: "button", class: "quiet replay", dataset: { delivery: d.id }, onclick: async () => {
    button.disabled = true;
    try {
      await post(`/v1/webhooks/${encodeURIComponent(endpoint)}/deliveries/${encodeURIComponent(d.id)}/replay`);
      await done();
    } catch (e) {
      button.disabled = false;
      problem.hidden = false;
      problem.textContent = `Replay failed: ${e.message}`;
    }
  } }, "Replay");
  return h("span", {}, button, problem);
}

export async function webhooks(page, [chosen]) {
  const endpoints = h("div");
  const deliveries = h("div");
  replace(page, h("div", { class: "page-head" }, h("h1", {}, "Webhooks")),
    h("section", { class: "card", id: "webhook-endpoints" }, h("h2", {}, "Endpoints"), endpoints),
    h("section", { class: "card", id: "webhook-deliveries" }, h("h2", {}, "Deliveries"), deliveries));
  async function refresh() {
    let list = [];
    try {
      list = (await get("/v1/webhooks")).webhooks;
      replace(endpoints, table(["Endpoint", "URL", "Events", "Enabled", "Created"], list.map((e) =>
        h("tr", { dataset: { webhook: e.id }, class: e.id === chosen ? "selected" : "" }, [
          h("a", { href: `#/webhooks/${encodeURIComponent(e.id)}`, class: "mono", title: e.id }, shortId(e.id)),
          h("span", { class: "mono" }, e.url), events(e),
          e.enabled ? "yes" : h("span", { class: "muted" }, "no"), ago(e.created_at),
        ].map((c) => h("td", {}, c)))), "No endpoints: add one with POST /v1/webhooks or in the configuration file."));
    } catch (e) {
      replace(endpoints, notice(e));
      return;
    }
    const endpoint = chosen || (list[0] && list[0].id);
    if (!endpoint) {
      replace(deliveries, h("p", { class: "muted" }, "No endpoint, no deliveries."));
      return;
    }
    try {
      const r = await get(`/v1/webhooks/${encodeURIComponent(endpoint)}/deliveries`, { limit: 100 });
      replace(deliveries, h("p", { class: "muted" }, "Endpoint ", h("span", { class: "mono" }, endpoint)),
        table(["Delivery", "Event", "State", "Attempts", "Answer", "Last error", "Created", ""], r.deliveries.map((d) =>
          h("tr", { dataset: { delivery: d.id } }, [
            h("span", { class: "mono", title: d.id }, shortId(d.id)),
            h("span", {}, d.event_type, " ", h("span", { class: "mono muted", title: d.event_id }, shortId(d.event_id))),
            stateBadge(d.state),
            String(d.attempts), d.response_code === null ? "—" : String(d.response_code),
            d.last_error ? h("span", { class: "muted", title: d.last_error }, d.last_error.slice(0, 80)) : "—",
            ago(d.created_at), replayButton(endpoint, d, refresh),
          ].map((c) => h("td", {}, c)))), "No deliveries yet."));
    } catch (e) {
      replace(deliveries, notice(e));
    }
  }
  await refresh();
  return refresh;
}
