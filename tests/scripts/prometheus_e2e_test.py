#!/usr/bin/env python3
"""A real Prometheus server scrapes a real slime_train job (CPU, tiny model).

Starts `slime_train --config job.yaml --async` (a tiny random Qwen3, 1 trainer + 2 engines on CPU
slots, algorithm.get_mismatch_metrics on), then Debian's `prometheus` with its own config and
storage in a temporary directory, on a free port, scraping every second the targets the driver
writes to <run_dir>/prometheus_targets.json (file-based service discovery: the driver's /metrics
and each engine's). Checks through Prometheus's HTTP API:
  - every target is up and scraped without error (our exposition parses);
  - the reward (slime_rollout_raw_reward, in [0, 1]), the step time (slime_perf_step_time, > 0)
    and the engines' throughput (rate of slime_engine_generation_tokens_total, > 0, one series per
    engine labelled slime_engine) are there with sane values;
  - the Grafana dashboard (configs/grafana/slime-dashboard.json): every metric name its queries
    use is one Prometheus ingested from the job, and every query, with Grafana's $__ variables
    replaced, runs and returns data.
Then stops the job with SIGTERM. Every process started here runs in its own process group and
gets SIGKILL when this script dies (PR_SET_PDEATHSIG); all are stopped on every exit path.

usage: prometheus_e2e_test.py SLIME_TRAIN REPO_ROOT
Environment: SLIME_TEST_DATA (the fetched test data, default REPO_ROOT/.cache/testdata),
SLIME_PROMETHEUS (the prometheus binary, default `prometheus` on PATH).
"""
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

DEADLINE_S = 170  # the whole test; ctest's TIMEOUT is above it
PROCS = []  # (name, Popen), stopped in reverse order on exit


class Failure(Exception):
    pass


def log(msg):
    print(f"prometheus_e2e: {msg}", flush=True)


def die_with_parent():
    # In the child before exec: its own process group, and SIGKILL when this script dies.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start(name, args, out_dir, cwd=None):
    out = open(os.path.join(out_dir, f"{name}.log"), "wb")
    p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                         start_new_session=True, preexec_fn=die_with_parent)
    PROCS.append((name, p))
    return p


def stop(p, sig, wait_s):
    if p.poll() is not None:
        return p.returncode
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return p.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return p.wait()


def stop_all():
    for _, p in reversed(PROCS):
        stop(p, signal.SIGTERM, 30)
        try:  # whatever is left in its group (workers of slime_train)
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tail(path, n=40):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError as e:
        return str(e)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def query(base, expr):
    """The instant-query result list, or raises Failure naming the query."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        d = http_json(url)
    except urllib.error.HTTPError as e:
        raise Failure(f"query {expr!r}: HTTP {e.code}: {e.read().decode(errors='replace')}")
    if d.get("status") != "success":
        raise Failure(f"query {expr!r}: {d}")
    return d["data"]["result"]


def wait_for(what, check, deadline, procs_alive, interval=1.0):
    """Polls check() until it returns a true value; Failure at the deadline or if a process died."""
    last = None
    while time.time() < deadline:
        for name, p in procs_alive:
            if p.poll() is not None:
                raise Failure(f"{name} exited with {p.returncode} while waiting for {what}")
        try:
            v = check()
            if v:
                return v
        except (OSError, ValueError, KeyError, Failure) as e:
            last = e
        time.sleep(interval)
    raise Failure(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


# Grafana's built-in interval variables, as the dashboard's queries use them.
GRAFANA_VARS = {"$__rate_interval": "15s", "$__interval": "1s", "$__range": "1m"}
LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def dashboard_queries(path):
    with open(path) as f:
        dash = json.load(f)
    exprs = []
    for panel in dash["panels"]:
        for sub in [panel] + panel.get("panels", []):
            for t in sub.get("targets", []):
                exprs.append((sub["title"], t["expr"]))
    if not exprs:
        raise Failure(f"{path}: no queries")
    return exprs


def metric_names(expr):
    """The metric names a PromQL expression selects (label names and label lists left out)."""
    e = LABEL_LISTS.sub(" ", expr)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range selectors
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # Grafana variables
    e = re.sub(r'"[^"]*"', " ", e)
    e = re.sub(r"\b\d+(\.\d+)?(ms|[smhdwy])?\b", " ", e)  # numbers and durations
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end():].lstrip()
        if after.startswith("("):
            continue  # a function
        if word in ("by", "without", "on", "ignoring", "bool", "and", "or", "unless", "offset",
                    "group_left", "group_right"):
            continue
        names.add(word)
    return names


def write_job(tmp, model, repo):
    run = os.path.join(tmp, "run")
    yaml = f"""cluster:
  device: cpu
  cpu_slots_per_node: 4
  actor_num_nodes: 1
  actor_num_gpus_per_node: 1
  rollout_num_gpus: 2
  rollout_num_gpus_per_engine: 1
  colocate: false
  run_dir: {run}
model:
  hf_checkpoint: {model}
data:
  prompt_data: {repo}/data/demo/train.jsonl@[0:40]
  label_key: label
  apply_chat_template: true
  rollout_batch_size: 4
  n_samples_per_prompt: 2
  num_rollout: 1000
rollout:
  max_response_len: 6
reward:
  rm_type: exact_match
algorithm:
  get_mismatch_metrics: true
train:
  bf16: false
  lr: 1.0e-4
  global_batch_size: 8
  micro_batch_size: 4
"""
    path = os.path.join(tmp, "job.yaml")
    with open(path, "w") as f:
        f.write(yaml)
    return path, run


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    train_bin, repo = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    deadline = time.time() + DEADLINE_S
    prometheus = os.environ.get("SLIME_PROMETHEUS") or shutil.which("prometheus") or \
        ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if not prometheus:
        raise Failure("no prometheus binary: run scripts/setup.sh (Debian package prometheus)")
    data = os.environ.get("SLIME_TEST_DATA") or os.path.join(repo, ".cache", "testdata")
    tokenizer = os.path.join(data, "qwen3")
    if not os.path.exists(os.path.join(tokenizer, "tokenizer.json")):
        raise Failure(f"{tokenizer}/tokenizer.json missing: run scripts/fetch_test_data.sh")
    dashboard = os.path.join(repo, "configs", "grafana", "slime-dashboard.json")
    queries = dashboard_queries(dashboard)

    tmp = tempfile.mkdtemp(prefix="slime_prom_e2e_")
    ok = False
    try:
        model = os.path.join(tmp, "model")
        r = subprocess.run([train_bin, "init-model", "--config",
                            os.path.join(repo, "tests/data/model/configs/qwen3-tiny.json"),
                            "--tokenizer", tokenizer, "--out", model, "--dtype", "fp32",
                            "--seed", "3"], capture_output=True, text=True, timeout=120,
                           preexec_fn=die_with_parent)
        if r.returncode != 0:
            raise Failure(f"init-model exited {r.returncode}: {r.stderr[-2000:]}")
        job, run = write_job(tmp, model, repo)
        train = start("slime_train", [train_bin, "--config", job, "--async"], tmp, cwd=repo)
        job_log = os.path.join(tmp, "slime_train.log")
        alive = [("slime_train", train)]

        # The targets file names the driver and both engines once the engines are up.
        targets_file = os.path.join(run, "prometheus_targets.json")

        def targets_ready():
            with open(targets_file) as f:
                groups = json.load(f)
            kinds = [g["labels"]["slime_component"] for g in groups]
            return groups if kinds.count("engine") == 2 and kinds.count("driver") == 1 else None
        groups = wait_for("two engines in " + targets_file, targets_ready, deadline, alive)
        log(f"targets: {[g['targets'][0] + ' ' + json.dumps(g['labels']) for g in groups]}")

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: slime
    file_sd_configs:
      - files: ['{targets_file}']
        refresh_interval: 1s
""")
        prom = start("prometheus", [prometheus, f"--config.file={config}",
                                    f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                                    f"--web.listen-address=127.0.0.1:{port}",
                                    "--log.level=warn"], tmp)
        alive.append(("prometheus", prom))
        wait_for("prometheus /-/ready", lambda: urllib.request.urlopen(
            base + "/-/ready", timeout=2).status == 200, deadline, alive, 0.3)

        # Every target scraped, healthy, without a parse error.
        def targets_up():
            active = http_json(base + "/api/v1/targets?state=active")["data"]["activeTargets"]
            bad = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in active
                   if t["health"] != "up" or t["lastError"]]
            if len(active) != 3 or bad:
                raise Failure(f"{len(active)} targets, not up: {bad}")
            return active
        wait_for("3 healthy targets", targets_up, deadline, alive)

        # The series a dashboard is built on, with sane values.
        def sample(expr, n=1):
            res = query(base, expr)
            if len(res) != n:
                raise Failure(f"{expr}: {len(res)} series, want {n}: {res}")
            return res

        reward = wait_for("slime_rollout_raw_reward", lambda: sample("slime_rollout_raw_reward"),
                          deadline, alive)
        v = float(reward[0]["value"][1])
        if not 0.0 <= v <= 1.0:
            raise Failure(f"slime_rollout_raw_reward = {v}, not in [0, 1] (exact_match)")
        step = wait_for("slime_perf_step_time", lambda: sample("slime_perf_step_time"),
                        deadline, alive)
        v = float(step[0]["value"][1])
        if not 0.0 < v < 600.0:
            raise Failure(f"slime_perf_step_time = {v} s")
        # Each engine's generated tokens grow between scrapes.
        rate = "rate(slime_engine_generation_tokens_total[15s])"

        def engines_generate():
            res = sample(rate, 2)
            engines = sorted(r["metric"].get("slime_engine", "") for r in res)
            values = [float(r["value"][1]) for r in res]
            if not all(e.startswith("engine") for e in engines) or len(set(engines)) != 2:
                raise Failure(f"engine series labels: {engines}")
            return all(x > 0 for x in values) and values
        tps = wait_for("tokens/s of both engines", engines_generate, deadline, alive)
        log(f"reward {reward[0]['value'][1]}, step {step[0]['value'][1]} s, "
            f"engine tokens/s {[round(x, 1) for x in tps]}")

        # The dashboard: known metric names, queries that run and return data.
        names = set(http_json(base + "/api/v1/label/__name__/values")["data"])
        unknown = sorted({(title, n) for title, e in queries for n in metric_names(e)
                          if n not in names})
        if unknown:
            raise Failure("the dashboard uses metric names the job does not export: "
                          + ", ".join(f"{n} ({t})" for t, n in unknown))

        def substituted(e):
            for k, v in GRAFANA_VARS.items():
                e = e.replace(k, v)
            if "$" in e:
                raise Failure(f"dashboard query with an unknown variable: {e}")
            return e

        def dashboard_has_data():
            empty = [(t, e) for t, e in queries if not query(base, substituted(e))]
            if empty:
                raise Failure(f"dashboard queries without data: {empty}")
            return True
        wait_for("data for every dashboard query", dashboard_has_data, deadline, alive)
        log(f"dashboard: {len(queries)} queries over "
            f"{len({n for _, e in queries for n in metric_names(e)})} metrics, all with data")

        # A clean stop of the job (the driver stops its workers).
        train.send_signal(signal.SIGTERM)
        code = stop(train, signal.SIGTERM, 60)
        if code != -signal.SIGTERM and code != 128 + signal.SIGTERM:
            raise Failure(f"slime_train exited {code} on SIGTERM")
        ok = True
        log("PASS")
        return 0
    except Failure as e:
        log(f"FAIL: {e}")
        for name in ("slime_train", "prometheus"):
            path = os.path.join(tmp, f"{name}.log")
            if os.path.exists(path):
                print(f"---- {name}.log (last lines)\n{tail(path)}", flush=True)
        return 1
    finally:
        stop_all()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"files kept in {tmp}")


def on_signal(sig, frame):
    raise SystemExit(128 + sig)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sys.exit(main())
    except Failure as e:
        log(f"FAIL: {e}")
        sys.exit(1)
