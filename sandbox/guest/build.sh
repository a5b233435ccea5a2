#!/usr/bin/env bash
# Builds sandbox/guest/quickjs.wasm, the sandbox's guest: quickjs-ng (from the
# crates.io crate rquickjs-sys 0.14.0, fetched by cargo; no third-party C is
# kept in this repo) plus shim.c, compiled to a WASI reactor with Debian's
# clang-19. The output is reproducible: same inputs, same bytes; CI rebuilds
# it and compares with quickjs.wasm.sha256.
#
# Needs: clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32 (Debian).
# Usage: sandbox/guest/build.sh [OUT.wasm]   (default: sandbox/guest/quickjs.wasm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$here/quickjs.wasm"}

src=$(cargo metadata --quiet --format-version 1 --manifest-path "$here/fetch/Cargo.toml" \
  | python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(p["manifest_path"] for p in m["packages"] if p["name"]=="rquickjs-sys"))')
qjs=$(dirname "$src")/quickjs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$qjs"/*.c "$qjs"/*.h "$work"/

cp "$here/shim.c" "$work/shim.c"
cd "$work"
clang-19 --target=wasm32-wasi -mexec-model=reactor --sysroot=/usr \
  -isystem /usr/include/wasm32-wasi -L/usr/lib/wasm32-wasi \
  -O2 -std=gnu11 -ffile-prefix-map="$work"=. -fno-ident \
  -D_WASI_EMULATED_PROCESS_CLOCKS -D_WASI_EMULATED_SIGNAL -D_GNU_SOURCE \
  -DCONFIG_VERSION='"byom"' -Wno-everything \
  quickjs.c libregexp.c libunicode.c dtoa.c shim.c \
  -lwasi-emulated-process-clocks -lwasi-emulated-signal \
  -Wl,--export=__stack_pointer -Wl,--stack-first -Wl,-z,stack-size=4194304 \
  -Wl,--strip-all -Wl,--export=_initialize \
  -o "$out.tmp"
mv "$out.tmp" "$out"
sha256sum "$out" | awk '{print $1}' > "$out.sha256"
echo "built $out ($(wc -c < "$out") bytes, sha256 $(cat "$out.sha256"))"
