#!/usr/bin/env sh
# Installs byom and byomd into ~/.local/bin (or $PREFIX/bin) from a build
# tree, then the byomd user service (systemd on Linux, launchd on macOS)
# through `byomd service install`, which renders installers/ templates.
# Usage: installers/install-local.sh [TARGET_DIR]   (default: target/release)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-"$here/../target/release"}
prefix=${PREFIX:-"$HOME/.local"}
[ -x "$src/byomd" ] || { echo "no byomd in $src: run cargo build --release first" >&2; exit 1; }
install -d "$prefix/bin"
install -m755 "$src/byomd" "$prefix/bin/byomd"
[ -x "$src/byom" ] && install -m755 "$src/byom" "$prefix/bin/byom"
echo "installed $prefix/bin/byomd"
"$prefix/bin/byomd" service install --no-start
echo "next: byomd pair <TOKEN from 'byom token create'>, then: byomd service start"
