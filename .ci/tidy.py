#!/usr/bin/env python3
"""Tidy checks that keep the architecture true (ARCHITECTURE.md):

1. Crate boundaries: no crate's normal dependency tree holds a crate its
   column in ARCHITECTURE.md forbids (`cargo tree -e normal`), and the CLI
   depends on no store or agent crate directly.
2. Module graphs: inside each crate, modules that `use` each other form no
   cycle, apart from parent and child.
3. Size: no source file over MAX_FILE_LINES and no `impl` block over
   MAX_IMPL_LINES in the control plane's crates.

Exits 1 with every violation listed.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# crate -> crates that must never appear in its normal dependency tree.
FORBIDDEN = {
    "byom-protocol": ["tokio", "quinn", "sled", "tonic", "hyper", "wasmtime", "rustls",
                      "byom-wire", "byom-store", "byom-agent", "byom-api", "byom-server",
                      "byom-sandbox", "byom-daemon"],
    "byom-wire": ["sled", "tonic", "wasmtime", "rcgen", "byom-store", "byom-agent",
                  "byom-api", "byom-server", "byom-sandbox"],
    # rustls is allowed here only for the PostgreSQL connection (pg_tls.rs).
    "byom-store": ["tonic", "quinn", "rcgen", "hyper", "wasmtime", "byom-agent", "byom-api",
                   "byom-server", "byom-sandbox", "byom-wire"],
    "byom-agent": ["tokio", "sled", "tonic", "quinn", "hyper", "wasmtime", "rustls",
                   "byom-wire", "byom-store", "byom-api", "byom-server", "byom-sandbox",
                   "byom-daemon"],
    "byom-api": ["sled", "quinn", "wasmtime", "byom-store", "byom-agent", "byom-server",
                 "byom-sandbox", "byom-daemon"],
    "byom-sandbox": ["sled", "tonic", "quinn", "byom-store", "byom-agent", "byom-api",
                     "byom-server", "byom-daemon"],
    "byom-daemon": ["wasmtime", "sled", "tonic", "hyper", "byom-store", "byom-agent",
                    "byom-api", "byom-server", "byom-sandbox"],
    "byom-server": ["clap"],
}
# crate -> crates it must not depend on directly (it speaks the API instead).
FORBIDDEN_DIRECT = {
    "byom-control-plane": ["byom-store", "byom-agent", "sled"],
}
# Crates whose modules are checked for cycles, and their source roots.
MODULE_CRATES = ["protocol", "wire", "store", "agent", "api", "server", "control-plane",
                 "endpoint-daemon", "sandbox"]
SIZE_CRATES = ["agent", "server", "control-plane", "endpoint-daemon", "sandbox"]
MAX_FILE_LINES = 1000
MAX_IMPL_LINES = 500


def tree(crate, depth=None):
    cmd = ["cargo", "tree", "-p", crate, "-e", "normal", "--prefix", "none", "--offline"]
    if depth is not None:
        cmd += ["--depth", str(depth)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        # Offline may not resolve on a fresh machine; try online once.
        cmd.remove("--offline")
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def check_crates():
    bad = []
    for crate, forbidden in FORBIDDEN.items():
        deps = tree(crate) - {crate}
        for f in forbidden:
            if f in deps:
                bad.append(f"{crate} depends on {f} (forbidden by ARCHITECTURE.md)")
    for crate, forbidden in FORBIDDEN_DIRECT.items():
        deps = tree(crate, depth=1) - {crate}
        for f in forbidden:
            if f in deps:
                bad.append(f"{crate} depends directly on {f} (it must speak byom-api)")
    return bad


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] if "//" in line and '"' not in line.split("//", 1)[0]
                     else re.sub(r"^\s*//.*$", "", line) for line in text.splitlines())


def modules(src):
    """file path -> module path (tuple), for every .rs file under src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[path] = tuple(rel)
    return mods


def expand(group):
    """`a::{b, c::{d}}` -> ["a::b", "a::c::d"] (roughly, enough for paths)."""
    m = re.match(r"^([\w:]*?)::\{(.*)\}$", group.strip(), flags=re.S)
    if not m:
        return [group.strip()]
    head, body = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if p:
            out += [head + "::" + x for x in expand(p)]
    return out


def resolve(path, here, known):
    """The module a `crate::…`/`super::…`/`self::…` path refers to."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] == "super":
        base = here
        while segs and segs[0] == "super":
            base = base[:-1]
            segs = segs[1:]
        rest = segs
    elif segs[0] == "self":
        base, rest = here, segs[1:]
    else:
        return None
    best = base
    cur = base
    for s in rest:
        cur = cur + (s,)
        if cur in known:
            best = cur
        else:
            break
    return best


def check_modules(crate_dir):
    src = os.path.join(ROOT, crate_dir, "src")
    mods = modules(src)
    known = set(mods.values())
    edges = {m: set() for m in known}
    for path, here in mods.items():
        text = strip_comments(open(path, encoding="utf-8").read())
        found = []
        for m in re.finditer(r"\buse\s+((?:crate|super|self)(?:::[\w*]+)*(?:::\{.*?\})?)\s*;", text, flags=re.S):
            found += expand(m.group(1))
        for m in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", text):
            found.append(m.group(1))
        for p in found:
            target = resolve(p, here, known)
            if target is None or target == here:
                continue
            # Parent and child may know each other.
            if target[: len(here)] == here or here[: len(target)] == target:
                continue
            edges[here].add(target)
    return cycles(edges, crate_dir)


def cycles(edges, crate_dir):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                names = sorted("::".join(c) or "crate" for c in comp)
                out.append(f"{crate_dir}: modules in a cycle: {', '.join(names)}")

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def check_sizes(crate_dir):
    bad = []
    src = os.path.join(ROOT, crate_dir, "src")
    for path in modules(src):
        lines = open(path, encoding="utf-8").read().splitlines()
        rel = os.path.relpath(path, ROOT)
        if len(lines) > MAX_FILE_LINES:
            bad.append(f"{rel}: {len(lines)} lines (at most {MAX_FILE_LINES})")
        for i, line in enumerate(lines):
            if re.match(r"^\s*impl\b.*\{\s*$", line):
                indent = len(line) - len(line.lstrip())
                for j in range(i + 1, len(lines)):
                    if lines[j].startswith(" " * indent + "}") and len(lines[j]) - len(lines[j].lstrip()) == indent:
                        if j - i > MAX_IMPL_LINES:
                            bad.append(f"{rel}:{i + 1}: impl block of {j - i} lines (at most {MAX_IMPL_LINES})")
                        break
    return bad


def main():
    bad = check_crates()
    for c in MODULE_CRATES:
        bad += check_modules(c)
    for c in SIZE_CRATES:
        bad += check_sizes(c)
    if bad:
        print("tidy: the architecture is broken:", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        sys.exit(1)
    print("tidy: crate boundaries, module graphs and sizes are as ARCHITECTURE.md says")


if __name__ == "__main__":
    main()
