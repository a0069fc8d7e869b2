// Verifying Tollgate's webhooks (docs/webhooks.md, "Signing"): Standard Webhooks
// signatures, HMAC-SHA256 over "<webhook-id>.<webhook-timestamp>.<body>" keyed by the
// decoded `whsec_` secret. Web Crypto only, so it runs on Node ≥ 20, Bun, Deno and
// browsers alike.

/** A webhook that failed verification: a missing header, an old timestamp or a wrong signature. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

/** What a delivery carries: `{type, id, timestamp, data}`. */
export interface WebhookEvent {
  type: "task.succeeded" | "task.failed" | "task.canceled" | "run.finished" | "budget.threshold";
  id: string;
  timestamp: string;
  data: Record<string, unknown>;
}

/** Headers as a `Headers` object or a plain record (names compared case-insensitively). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") {
    return (headers as Headers).get(name) ?? undefined;
  }
  for (const [key, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
    if (key.toLowerCase() === name) {
      return Array.isArray(value) ? value[0] : value;
    }
  }
  return undefined;
}

function decodeBase64(text: string): Uint8Array<ArrayBuffer> {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

function encodeBase64(bytes: Uint8Array): string {
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary);
}

/** Equal strings, compared in time that does not depend on where they differ. */
function constantTimeEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Verifies a webhook from Tollgate and returns its event. `body` is the raw body exactly
 * as received (a string or bytes: parse it only after verifying). Throws
 * {@link WebhookVerificationError} when a header is missing, the timestamp is more than
 * `toleranceSeconds` (default 300) from now, or no `v1` signature matches.
 */
export async function verifyWebhook(
  secret: string,
  headers: WebhookHeaders,
  body: string | Uint8Array,
  options: { toleranceSeconds?: number; now?: Date } = {},
): Promise<WebhookEvent> {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) {
    throw new WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature");
  }
  const sent = Number(timestamp);
  const now = Math.floor((options.now ?? new Date()).getTime() / 1000);
  if (!Number.isInteger(sent) || Math.abs(now - sent) > (options.toleranceSeconds ?? 300)) {
    throw new WebhookVerificationError("webhook-timestamp is too far from now");
  }
  if (!secret.startsWith("whsec_")) {
    throw new WebhookVerificationError("the secret must start with whsec_");
  }
  const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const message = new Uint8Array(prefix.length + bytes.length);
  message.set(prefix, 0);
  message.set(bytes, prefix.length);
  const key = await crypto.subtle.importKey(
    "raw",
    decodeBase64(secret.slice("whsec_".length)),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const expected = `v1,${encodeBase64(new Uint8Array(await crypto.subtle.sign("HMAC", key, message)))}`;
  if (!signatures.split(" ").some((s) => constantTimeEqual(s, expected))) {
    throw new WebhookVerificationError("no matching webhook signature");
  }
  return JSON.parse(new TextDecoder().decode(bytes)) as WebhookEvent;
}
