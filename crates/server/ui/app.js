// The dashboard's shell: sign-in, the hash router (#/page/arg?query) and live refresh.

import { apiKey, forget, get, setKey } from "./api.js";
import { clear } from "./dom.js";
import * as pages from "./pages.js";
import { webhooks } from "./webhooks.js";

const REFRESH_MS = 3000;
const routes = {
  overview: pages.overview,
  tasks: (page, args, query) => (args.length ? pages.task(page, args) : pages.tasks(page, args, query)),
  runs: (page, args, query) => (args.length ? pages.run(page, args) : pages.runs(page, args, query)),
  scopes: (page, args) => (args.length ? pages.scope(page, args) : pages.scopes(page)),
  models: pages.models,
  webhooks,
};

const $ = (id) => document.getElementById(id);
let timer = null;
let generation = 0;

function showSignin(message) {
  $("nav").hidden = true;
  $("signout").hidden = true;
  $("page").hidden = true;
  clear($("page"));
  $("signin").hidden = false;
  const err = $("signin-error");
  err.hidden = !message;
  err.textContent = message || "";
  $("key").focus();
}

/** The route of the hash; `bad` holds the address when a part of it is not well-formed
 * percent-encoding (`#/tasks/%E0%A4%A`): that is shown as such, never thrown. */
function parseHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, search] = hash.split("?");
  let parts;
  try {
    parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch (e) {
    return { name: "bad", args: [], query: new URLSearchParams(), bad: location.hash };
  }
  const [name, ...args] = parts;
  return { name: routes[name] ? name : "overview", args, query: new URLSearchParams(search || "") };
}

async function route() {
  if (!apiKey()) return showSignin();
  clearInterval(timer);
  const mine = ++generation;
  const { name, args, query, bad } = parseHash();
  $("signin").hidden = true;
  $("nav").hidden = false;
  $("signout").hidden = false;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
  const page = $("page");
  page.hidden = false;
  page.dataset.page = name;
  page.setAttribute("aria-busy", "true");
  const render = bad !== undefined ? async () => pages.badAddress(page, bad) : routes[name];
  const refresh = await render(page, args, query).catch((e) => {
    if (e && e.status === 401) {
      forget();
      showSignin("The key is no longer accepted: sign in again.");
    }
    return undefined;
  });
  page.setAttribute("aria-busy", "false");
  if (mine !== generation || typeof refresh !== "function") return;
  timer = setInterval(() => {
    if (document.visibilityState === "visible") Promise.resolve(refresh()).catch(() => {});
  }, REFRESH_MS);
}

$("signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const key = $("key").value.trim();
  const button = ev.target.querySelector("button");
  button.disabled = true;
  try {
    await get("/v1/models", {}, key);
    setKey(key);
    $("key").value = "";
    if (!location.hash || location.hash === "#") location.hash = "#/overview";
    await route();
  } catch (e) {
    showSignin(e.status === 401
      ? "Sign-in failed: the server does not know this API key. Check it and try again."
      : `Sign-in failed: ${e.message}`);
  } finally {
    button.disabled = false;
  }
});

$("signout").addEventListener("click", () => {
  forget();
  clearInterval(timer);
  showSignin();
});

window.addEventListener("hashchange", route);
route();
