#!/usr/bin/env sh
# Installs byom and byomd into ~/.local/bin (or $PREFIX/bin) from a build
# tree, and the byomd user service on Linux (systemd) or macOS (launchd).
# Usage: installers/install.sh [TARGET_DIR]   (default: target/release)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-"$here/../target/release"}
prefix=${PREFIX:-"$HOME/.local"}
[ -x "$src/byomd" ] || { echo "no byomd in $src: run cargo build --release first" >&2; exit 1; }
install -d "$prefix/bin"
install -m755 "$src/byomd" "$prefix/bin/byomd"
[ -x "$src/byom" ] && install -m755 "$src/byom" "$prefix/bin/byom"
case "$(uname -s)" in
  Linux)
    unit="$HOME/.config/systemd/user/byomd.service"
    install -Dm644 "$here/systemd/byomd.service" "$unit"
    sed -i "s#%h/.local/bin/byomd#$prefix/bin/byomd#" "$unit"
    echo "installed $unit"
    echo "pair, then: systemctl --user daemon-reload && systemctl --user enable --now byomd"
    echo "to keep it running after logout: loginctl enable-linger $USER"
    ;;
  Darwin)
    plist="$HOME/Library/LaunchAgents/dev.byom.byomd.plist"
    install -d "$(dirname "$plist")"
    sed "s#/usr/local/bin/byomd#$prefix/bin/byomd#" "$here/launchd/dev.byom.byomd.plist" > "$plist"
    echo "installed $plist"
    echo "pair, then: launchctl bootstrap gui/$(id -u) $plist"
    ;;
esac
echo "next: byomd pair <TOKEN from 'byom token create'>"
