#!/usr/bin/env python3
"""Issue 26 items 7 and 8, measured from outside against a real `tollgate serve`.
usage: fair.py BINARY
item 7: app `flood` submits one batch of 1,000 tasks in 1,000 new scopes while app `live`
has an active scope; time until live's next task (submitted right after) succeeds.
item 8: app `flood` fills global capacity with slow tasks across 20 scopes; how many of
app `other`'s submissions are admitted, and the refusal's message."""
import json, os, subprocess, sys, tempfile, time, urllib.request, urllib.error

BIN = sys.argv[1]

def start(cfg):
    d = tempfile.mkdtemp()
    path = os.path.join(d, "t.toml")
    open(path, "w").write(cfg.replace("DB", os.path.join(d, "t.db")))
    p = subprocess.Popen([BIN, "serve", "--addr", "127.0.0.1:0", "--config", path],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("Tollgate listening on "):
            return p, line.split()[-1]
    raise SystemExit("no start")

def call(base, method, path, key, body=None, headers=None):
    req = urllib.request.Request(base + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", "Bearer " + key)
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")

BUDGET = """
[budgets.standard]
max_steps_per_source = 100
sources_per_24_hours = 100000
scope_concurrent = 1000
burst = 100000
tasks_per_minute = 100000
"""

def item7():
    cfg = f"""[database]
url = "sqlite://DB"
[apps.flood]
api_keys = ["flood-key-0123456789abcdef"]
[apps.live]
api_keys = ["live-key-0123456789abcdef"]
[workers]
concurrency = 8
[admission]
global_concurrent = 100000
[models.default]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 20 }}
{BUDGET}"""
    p, base = start(cfg)
    try:
        F, L = "flood-key-0123456789abcdef", "live-key-0123456789abcdef"
        req = {"input": "x", "labels": ["a", "b"]}
        # live's scope is active: a backlog of 200 tasks.
        items = [{"kind": "classify", "scope": "live", "effect_key": f"l{i}",
                  "source": {"id": f"d{i}", "revision": "1"}, "request": req} for i in range(200)]
        st, _ = call(base, "POST", "/v1/tasks/batch", L, {"tasks": items})
        assert st == 200, st
        time.sleep(0.5)
        items = [{"kind": "classify", "scope": f"s{i}", "effect_key": f"f{i}",
                  "source": {"id": f"d{i}", "revision": "1"}, "request": req} for i in range(1000)]
        st, _ = call(base, "POST", "/v1/tasks/batch", F, {"tasks": items})
        assert st == 200, st
        t0 = time.time()
        st, t = call(base, "POST", "/v1/tasks", L, {"kind": "classify", "scope": "live",
                     "source": {"id": "probe", "revision": "1"}, "request": req},
                     {"Idempotency-Key": "probe"})
        tid = t["id"]
        while True:
            st, t = call(base, "GET", f"/v1/tasks/{tid}?wait=5s", L)
            if t["status"] in ("succeeded", "failed", "canceled") or time.time() - t0 > 240:
                break
        took = time.time() - t0
        st, q = call(base, "GET", "/v1/tasks?scope=live&status=queued&limit=500", L)
        print(f"item 7: live's probe {t['status']} after {took:.2f} s; live tasks still queued then: {len(q.get('tasks', []))}")
    finally:
        p.kill()

def item8():
    cfg = f"""[database]
url = "sqlite://DB"
[apps.flood]
api_keys = ["flood-key-0123456789abcdef"]
[apps.other]
api_keys = ["other-key-0123456789abcdef"]
[workers]
concurrency = 8
[admission]
global_concurrent = 100
[models.default]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 60000 }}
{BUDGET}"""
    p, base = start(cfg)
    try:
        F, O = "flood-key-0123456789abcdef", "other-key-0123456789abcdef"
        req = {"input": "x", "labels": ["a", "b"]}
        admitted = 0
        for b in range(20):
            items = [{"kind": "classify", "scope": f"s{b}", "effect_key": f"f{b}-{i}",
                      "source": {"id": f"d{i}", "revision": "1"}, "request": req} for i in range(50)]
            st, ans = call(base, "POST", "/v1/tasks/batch", F, {"tasks": items})
            admitted += sum(1 for r in ans["results"] if r.get("status") in (200, 201))
        ok, refused, msg = 0, 0, ""
        for i in range(20):
            st, ans = call(base, "POST", "/v1/tasks", O, {"kind": "classify", "scope": "o",
                           "source": {"id": f"o{i}", "revision": "1"}, "request": req},
                           {"Idempotency-Key": f"o{i}"})
            if st in (200, 201):
                ok += 1
            else:
                refused += 1
                msg = ans["error"]["message"]
        print(f"item 8: flood admitted {admitted} of 1000 (global_concurrent 100); other app admitted {ok} of 20, refused {refused}: {msg!r}")
    finally:
        p.kill()

item7()
item8()
