#!/usr/bin/env python3
"""Runs what `cargo test --workspace` runs, with test binaries side by side.

`cargo test` runs one test binary at a time; ours mostly wait on real
processes and sockets (a server, a daemon, Synapse, PostgreSQL), so one at a
time leaves the machine idle for most of the stage. This builds the same
test binaries (`cargo test --workspace --no-run`), runs them a few at a time
(longest first, each from its package's directory as cargo would, each
binary's tests on its own threads), runs the doc tests beside them, and
prints each binary's output only when it failed. Every binary is still one
process, so what a binary shares (one PostgreSQL cluster per binary, see
store/src/testing.rs) stays shared.

    python3 .ci/test.py [FILTER...]   # FILTER: run binaries whose name has it

Environment: BYOM_TEST_JOBS (binaries at once, default 3),
RUST_TEST_THREADS (tests at once in a binary, default 2),
BYOM_TEST_TIMEOUT (seconds one binary may take, default 1200).
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the last run's durations are kept: the next run starts the slowest
# first (a clean clone has none and falls back to SLOW).
TIMES = os.path.join(ROOT, "target", "ci-test-times.json")
# The slowest binaries as measured on CI's machine (2 cores), for a run
# with no recorded times: started first so the stage ends when they do.
SLOW = [
    "streams", "machine_pg", "machine", "matrix", "packaging", "agents_pg",
    "agents", "install", "exactly_once", "sleep", "replicas", "github",
    "sandbox", "sim", "tcp_fallback",
]


def build():
    """The test executables `cargo test --workspace` would run."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"test.py: `{' '.join(cmd)}` failed ({p.returncode})")
    out = []
    for line in p.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if not m.get("profile", {}).get("test"):
            continue
        t = m["target"]
        kind = t["kind"][0]
        # package_id: "path+file:///…/tests#byom-tests@0.1.0"
        pkg = m["package_id"].rsplit("#", 1)[-1].split("@")[0]
        name = f"{pkg}/{t['name']}" if kind == "test" else f"{pkg} ({kind})"
        out.append({
            "name": name,
            "exe": m["executable"],
            "dir": os.path.dirname(m["manifest_path"]),
        })
    return out


def order(jobs):
    try:
        with open(TIMES) as f:
            times = json.load(f)
    except (OSError, ValueError):
        times = {}

    def key(j):
        if j["name"] in times:
            return -times[j["name"]]
        short = j["name"].split("/")[-1]
        if short in SLOW:
            return -1000 + SLOW.index(short)
        return 0

    return sorted(jobs, key=key)


def main():
    filters = sys.argv[1:]
    jobs = [j for j in build() if not filters or any(f in j["name"] for f in filters)]
    for j in jobs:
        j["cmd"] = [j["exe"]]
    if not filters:
        jobs.append({"name": "doc tests", "dir": ROOT, "cmd": ["cargo", "test", "--workspace", "--doc", "-q"]})
    jobs = order(jobs)
    parallel = int(os.environ.get("BYOM_TEST_JOBS", "3"))
    timeout = int(os.environ.get("BYOM_TEST_TIMEOUT", "1200"))
    env = dict(os.environ)
    env.setdefault("RUST_TEST_THREADS", "2")
    lock = threading.Lock()
    pending = list(jobs)
    results = []
    start = time.monotonic()

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                j = pending.pop(0)
            t0 = time.monotonic()
            with tempfile.TemporaryFile(mode="w+") as log:
                try:
                    rc = subprocess.run(j["cmd"], cwd=j["dir"], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, timeout=timeout).returncode
                    why = f"exit {rc}" if rc else ""
                except subprocess.TimeoutExpired:
                    rc, why = 1, f"still running after {timeout}s (BYOM_TEST_TIMEOUT)"
                took = time.monotonic() - t0
                log.seek(0)
                text = log.read()
            summary = next((l for l in reversed(text.splitlines()) if l.startswith("test result:")), "")
            with lock:
                results.append((j["name"], rc, took))
                mark = "ok  " if rc == 0 else "FAIL"
                print(f"{mark} {took:6.1f}s  {j['name']}  {summary[len('test result: '):] if summary else why}", flush=True)
                if rc != 0:
                    print(f"---- {j['name']}: {why} ----\n{text}\n---- end of {j['name']} ----", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, parallel))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [n for n, rc, _ in results if rc != 0]
    try:
        with open(TIMES) as f:
            times = json.load(f)
    except (OSError, ValueError):
        times = {}
    times.update({n: round(took, 1) for n, _, took in results})
    os.makedirs(os.path.dirname(TIMES), exist_ok=True)
    with open(TIMES, "w") as f:
        json.dump(times, f, indent=1, sort_keys=True)
    total = sum(took for _, _, took in results)
    print(f"test.py: {len(results)} binaries in {time.monotonic() - start:.0f}s "
          f"({total:.0f}s one after another), {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
