#!/usr/bin/env bash
# Builds a native QuickJS (`qjs`, same quickjs-ng sources as the sandbox
# guest) as the benchmark's baseline: target/qjs-native/qjs. Then run
#   BYOM_QJS=target/qjs-native/qjs cargo bench -p byom-sandbox
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=$(cargo metadata --quiet --format-version 1 --manifest-path "$root/sandbox/guest/fetch/Cargo.toml" \
  | python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="rquickjs-sys"))')
qjs=$(dirname "$src")/quickjs
out="$root/target/qjs-native"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$qjs"/. "$work"/
mkdir -p "$out"
(cd "$work" && gcc -O2 -D_GNU_SOURCE -DCONFIG_VERSION='"native"' -w quickjs.c libregexp.c libunicode.c dtoa.c \
  quickjs-libc.c qjs.c gen/repl.c gen/standalone.c -lm -lpthread -ldl -o "$out/qjs")
echo "built $out/qjs"
