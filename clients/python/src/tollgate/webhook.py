"""Verifying Tollgate's webhooks (docs/webhooks.md, "Signing"): Standard Webhooks
signatures, HMAC-SHA256 over ``"<webhook-id>.<webhook-timestamp>.<body>"`` keyed by the
decoded ``whsec_`` secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any


class WebhookVerificationError(Exception):
    """A webhook that failed verification: a missing header, an old timestamp or a wrong
    signature."""


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: str | bytes,
    *,
    tolerance: float = 300,
    now: float | None = None,
) -> dict[str, Any]:
    """Verifies a webhook from Tollgate and returns its event (``type``, ``id``,
    ``timestamp``, ``data``). ``body`` is the raw body exactly as received (parse it only
    after verifying). Raises :class:`WebhookVerificationError` when a header is missing,
    the timestamp is more than ``tolerance`` seconds from now, or no ``v1`` signature
    matches."""
    msg_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not msg_id or not timestamp or not signatures:
        raise WebhookVerificationError(
            "missing webhook-id, webhook-timestamp or webhook-signature"
        )
    try:
        sent = int(timestamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a number") from None
    if abs((time.time() if now is None else now) - sent) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too far from now")
    if not secret.startswith("whsec_"):
        raise WebhookVerificationError("the secret must start with whsec_")
    try:
        key = base64.b64decode(secret[len("whsec_") :], validate=True)
    except binascii.Error:
        raise WebhookVerificationError("the secret is not base64 after whsec_") from None
    raw = body.encode() if isinstance(body, str) else body
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + raw, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(digest).decode()
    if not any(hmac.compare_digest(expected, s) for s in signatures.split(" ")):
        raise WebhookVerificationError("no matching webhook signature")
    event: dict[str, Any] = json.loads(raw)
    return event
