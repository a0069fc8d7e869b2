// The API as the dashboard calls it: the key lives in sessionStorage (this tab only).

const KEY = "tollgate.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function setKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forget() {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** GET a path of the API (with query parameters); JSON answer or ApiError. */
export function get(path, params = {}, key = apiKey()) {
  return call("GET", path, params, key);
}

/** POST to a path of the API with no body (an action such as cancel); JSON answer or ApiError. */
export function post(path, key = apiKey()) {
  return call("POST", path, {}, key);
}

async function call(method, path, params, key) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  let response;
  try {
    response = await fetch(url, {
      method,
      headers: { Authorization: `Bearer ${key ?? ""}`, Accept: "application/json", "Content-Type": "application/json" },
      cache: "no-store",
      credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, "network", "The server cannot be reached.");
  }
  let body = null;
  try {
    body = await response.json();
  } catch (e) {
    body = null;
  }
  if (!response.ok) {
    const err = body && body.error ? body.error : {};
    throw new ApiError(response.status, err.code || "error", err.message || response.statusText);
  }
  return body;
}
