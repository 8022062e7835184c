#!/usr/bin/env python3
"""An external agent framework for driver_e2e_test's trajectory-buffer job: finds the driver's
HTTP address in RUN_DIR/driver.json, checks that a bad trajectory is refused with a 400 naming
its field (and nothing is added), then POSTs GROUPS groups of N trajectories, each tagged with
the weight version GET /trajectories reports. Exits 0 when every answer was as expected.

usage: post_trajectories.py RUN_DIR GROUPS N
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

run_dir, groups, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


deadline = time.time() + 300
while not os.path.exists(os.path.join(run_dir, "driver.json")):
    assert time.time() < deadline, "no driver.json"
    time.sleep(0.2)
base = json.load(open(os.path.join(run_dir, "driver.json")))["metrics_url"].rsplit("/", 1)[0]
url = base + "/trajectories"


def trajectory(group, k, version):
    prompt = [100 + group, 200, 300]
    response = [400 + k, 500 + group]
    return {"group": f"g{group}", "tokens": prompt + response, "response_length": len(response),
            "reward": float(k % 2), "rollout_log_probs": [-0.7, -1.1],
            "weight_version": version}


# 503 while the job restores its checkpoint's buffer, then open.
while True:
    status, reply = call("POST", url, {"trajectories": []})
    if status == 200:
        break
    assert status == 503, (status, reply)
    assert time.time() < deadline, "the buffer never opened"
    time.sleep(0.2)

status, reply = call("GET", url)
assert status == 200 and reply["samples_per_group"] == n, reply
version = reply["weight_version"]
bad = [trajectory(0, 0, version), dict(trajectory(0, 1, version), loss_mask=[1, 1, 1])]
status, reply = call("POST", url, {"trajectories": bad})
assert status == 400, (status, reply)
assert "trajectories[1].loss_mask" in reply["error"]["message"], reply
status, reply = call("GET", url)
assert reply["trajectories"] == 0, f"a refused body left trajectories behind: {reply}"

for g in range(groups):
    status, reply = call("GET", url)
    body = {"trajectories": [trajectory(g, k, reply["weight_version"]) for k in range(n)]}
    status, reply = call("POST", url, body)
    assert status == 200 and reply["added_now"] == n, (status, reply)
print(f"posted {groups} groups of {n}; last reply {reply}")
