// verifyWebhook against the Standard Webhooks example and against a signature made here
// with node:crypto (an implementation independent of the client's Web Crypto one).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";

import { verifyWebhook, WebhookVerificationError } from "../dist/index.js";

const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS = 1614265330;
const EXAMPLE = '{"test": 2432232314}';
const AT = new Date(TS * 1000);

test("verifies the Standard Webhooks example", async () => {
  const headers = {
    "webhook-id": ID,
    "webhook-timestamp": String(TS),
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  };
  assert.deepEqual(await verifyWebhook(SECRET, headers, EXAMPLE, { now: AT }), { test: 2432232314 });
  // Header names in any case, bytes as well as text.
  const upper = { "Webhook-Id": ID, "WEBHOOK-TIMESTAMP": String(TS), "Webhook-Signature": headers["webhook-signature"] };
  assert.deepEqual(await verifyWebhook(SECRET, upper, new TextEncoder().encode(EXAMPLE), { now: AT }), { test: 2432232314 });
});

test("verifies a Tollgate event signed independently", async () => {
  const body = JSON.stringify({ type: "task.succeeded", id: "evt_1", timestamp: "2026-12-03T06:10:00.000Z", data: { task_id: "1" } });
  const key = Buffer.from(SECRET.slice("whsec_".length), "base64");
  const now = Math.floor(Date.now() / 1000);
  const sig = createHmac("sha256", key).update(`evt_1.${now}.${body}`).digest("base64");
  const headers = new Headers({ "webhook-id": "evt_1", "webhook-timestamp": String(now), "webhook-signature": `v1,bad v1,${sig}` });
  const event = await verifyWebhook(SECRET, headers, body);
  assert.equal(event.type, "task.succeeded");
  assert.equal(event.data.task_id, "1");
});

test("refuses a wrong body, id, old timestamp, missing header or bad secret", async () => {
  const good = { "webhook-id": ID, "webhook-timestamp": String(TS), "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" };
  const refuses = (p) => assert.rejects(p, WebhookVerificationError);
  await refuses(verifyWebhook(SECRET, good, '{"test": 1}', { now: AT }));
  await refuses(verifyWebhook(SECRET, { ...good, "webhook-id": "msg_other" }, EXAMPLE, { now: AT }));
  await refuses(verifyWebhook(SECRET, good, EXAMPLE, { now: new Date((TS + 301) * 1000) }));
  await refuses(verifyWebhook(SECRET, { "webhook-id": ID, "webhook-timestamp": String(TS) }, EXAMPLE, { now: AT }));
  await refuses(verifyWebhook("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", good, EXAMPLE, { now: AT }));
  await verifyWebhook(SECRET, good, EXAMPLE, { now: new Date((TS + 301) * 1000), toleranceSeconds: 400 });
});
