"""verify_webhook against the Standard Webhooks example and a signature made here."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest

from tollgate import WebhookVerificationError, verify_webhook

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TS = 1614265330
EXAMPLE = '{"test": 2432232314}'
GOOD = {
    "webhook-id": MSG_ID,
    "webhook-timestamp": str(TS),
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
}


def test_verifies_the_standard_webhooks_example() -> None:
    assert verify_webhook(SECRET, GOOD, EXAMPLE, now=TS) == {"test": 2432232314}
    upper = {k.upper(): v for k, v in GOOD.items()}
    assert verify_webhook(SECRET, upper, EXAMPLE.encode(), now=TS) == {"test": 2432232314}


def test_verifies_a_tollgate_event() -> None:
    body = json.dumps({"type": "task.failed", "id": "evt_1", "timestamp": "x", "data": {}})
    now = int(time.time())
    key = base64.b64decode(SECRET[len("whsec_") :])
    sig = base64.b64encode(
        hmac.new(key, f"evt_1.{now}.{body}".encode(), hashlib.sha256).digest()
    ).decode()
    headers = {"webhook-id": "evt_1", "webhook-timestamp": str(now), "webhook-signature": f"v1,bad v1,{sig}"}
    assert verify_webhook(SECRET, headers, body)["type"] == "task.failed"


@pytest.mark.parametrize(
    "headers,body,now,secret",
    [
        (GOOD, '{"test": 1}', TS, SECRET),
        ({**GOOD, "webhook-id": "msg_other"}, EXAMPLE, TS, SECRET),
        (GOOD, EXAMPLE, TS + 301, SECRET),
        ({k: v for k, v in GOOD.items() if k != "webhook-signature"}, EXAMPLE, TS, SECRET),
        (GOOD, EXAMPLE, TS, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ({**GOOD, "webhook-timestamp": "soon"}, EXAMPLE, TS, SECRET),
    ],
)
def test_refuses(headers: dict[str, str], body: str, now: int, secret: str) -> None:
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body, now=now)


def test_tolerance_is_configurable() -> None:
    assert verify_webhook(SECRET, GOOD, EXAMPLE, now=TS + 301, tolerance=400) == {"test": 2432232314}
