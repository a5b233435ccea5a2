#!/bin/sh
# byom's one-line installer. A byom server serves this file at /install.sh
# with its own address, its key pin and the SHA-256 of its release manifest
# filled in, and `byom token create` prints the line that runs it:
#
#   curl -fsSL --pinnedpubkey 'sha256//…' -k https://HOST:PORT/install.sh | sh -s -- byom1-…
#
# Nothing is taken on trust: the line pins the server's key; this script
# checks the CA it fetches against the SHA-256 inside the token, talks to
# the server through that CA only from then on, checks the manifest against
# the hash the server signed it with, and the binary against the manifest.
# Then it installs byomd to ~/.local/bin (/usr/local/bin as root), pairs,
# starts the user service (or, without one, a background daemon) and shows
# `byomd status`. Running it again is safe; `--uninstall` undoes it all.
#
# Options (after `sh -s --`): TOKEN, --name NAME, --replace MACHINE,
# --no-service, --uninstall.
# Environment: BYOM_BIN_DIR (where byomd goes), BYOMD_CONFIG_DIR.
set -eu

BASE='@BYOM_BASE_URL@'
HOSTPORT='@BYOM_HOSTPORT@'
PIN='@BYOM_PIN@'
NAME='@BYOM_SERVER_NAME@'
VERSION='@BYOM_VERSION@'
MANIFEST_SHA256='@BYOM_MANIFEST_SHA256@'

say() { printf 'byom: %s\n' "$*" >&2; }
die() {
  say "$*"
  exit 1
}

case $BASE in
@*) die "this is the template: run the line \`byom token create\` prints (installers/install-local.sh installs from a build tree)" ;;
esac

token=
name=
replace=
uninstall=0
service=auto
while [ $# -gt 0 ]; do
  case $1 in
  --uninstall) uninstall=1 ;;
  --no-service) service=no ;;
  --name) shift; name=${1:-} ;;
  --name=*) name=${1#--name=} ;;
  --replace) shift; replace=${1:-} ;;
  byom1-*) token=$1 ;;
  *) die "unknown argument: $1 (use: sh -s -- TOKEN [--name NAME] [--replace M] [--no-service] | --uninstall)" ;;
  esac
  shift
done

if [ "$(id -u)" = 0 ]; then
  bindir=${BYOM_BIN_DIR:-/usr/local/bin}
else
  bindir=${BYOM_BIN_DIR:-$HOME/.local/bin}
fi
byomd=$bindir/byomd
confdir=${BYOMD_CONFIG_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/byomd}
pidfile=$confdir/byomd.pid
os=$(uname -s | tr '[:upper:]' '[:lower:]')
arch=$(uname -m)
case $arch in
amd64 | x86_64) arch=x86_64 ;;
arm64 | aarch64) arch=aarch64 ;;
esac

# A service manager this user can drive; without one, byomd runs in the
# background until the next reboot (containers, CI, a bare VM).
can_service() {
  [ "$service" = auto ] || return 1
  case $os in
  linux) command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1 ;;
  darwin) command -v launchctl >/dev/null 2>&1 ;;
  *) return 1 ;;
  esac
}

stop_background() {
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      i=0
      while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
      done
    fi
    rm -f "$pidfile"
  fi
}

if [ "$uninstall" = 1 ]; then
  [ -x "$byomd" ] || die "no byomd in $bindir: nothing to uninstall"
  if can_service; then "$byomd" service uninstall >/dev/null 2>&1 || true; fi
  stop_background
  if [ -f "$confdir/identity.json" ]; then
    "$byomd" unpair --force || say "could not unpair (see above); the identity in $confdir is kept"
  fi
  rm -f "$byomd"
  say "uninstalled byomd from $bindir"
  exit 0
fi

[ -n "$token" ] || die "give the pairing token: curl … | sh -s -- byom1-… (from \`byom token create\`)"
command -v curl >/dev/null 2>&1 || die "curl is needed"
if command -v sha256sum >/dev/null 2>&1; then
  sha256() { sha256sum | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  sha256() { shasum -a 256 | cut -d' ' -f1; }
else
  die "sha256sum or shasum is needed to check what is downloaded"
fi
if printf 'YQ==' | base64 -d >/dev/null 2>&1; then
  b64d() { base64 -d; }
else
  b64d() { base64 -D; }
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# The token is byom1- + base64url([CA SHA-256][secret][address]).
b64=$(printf '%s' "${token#byom1-}" | tr '_-' '/+')
case $((${#b64} % 4)) in
2) b64="$b64==" ;;
3) b64="$b64=" ;;
esac
want_ca=$(printf '%s' "$b64" | b64d | od -An -v -tx1 -N32 | tr -d ' \n')
[ ${#want_ca} = 64 ] || die "the pairing token is damaged: copy it again from \`byom token create\`"

curl -fsS --proto '=https' --pinnedpubkey "$PIN" -k "$BASE/ca.pem" -o "$tmp/ca.pem" ||
  die "cannot fetch the CA from $BASE"
got_ca=$(sed '/-----/d' "$tmp/ca.pem" | tr -d '\r\n' | b64d | sha256)
[ "$got_ca" = "$want_ca" ] ||
  die "refusing to install: the server's CA has SHA-256 $got_ca but the token pins $want_ca (a token for another server?)"

# From here on only the pinned CA is trusted, under the name it certified.
fetch() {
  curl -fsS --proto '=https' --cacert "$tmp/ca.pem" --connect-to "$NAME:443:$HOSTPORT" \
    "https://$NAME/$1" -o "$2" || die "cannot fetch $1 from $BASE"
}
fetch manifest "$tmp/manifest"
got=$(sha256 <"$tmp/manifest")
[ "$got" = "$MANIFEST_SHA256" ] ||
  die "refusing to install: the manifest has SHA-256 $got, not $MANIFEST_SHA256 which the server checked and signed (it changed after the server started)"
line=$(awk -v os="$os" -v arch="$arch" '$1 == "artifact" && $3 == "byomd" && $4 == os && $5 == arch && $6 == "bin" { print; exit }' "$tmp/manifest")
[ -n "$line" ] ||
  die "the server ships no byomd for $os/$arch (see $BASE/manifest): build it from source (README, \"Install\")"
# shellcheck disable=SC2086
set -- $line
file=$2
sha=$8
fetch "dist/$file" "$tmp/byomd"
got=$(sha256 <"$tmp/byomd")
[ "$got" = "$sha" ] ||
  die "refusing to install: $file has SHA-256 $got but the signed manifest says $sha"
chmod 755 "$tmp/byomd"
"$tmp/byomd" --version >/dev/null 2>&1 || die "the downloaded byomd does not run on this machine"

# Swap the binary in atomically; a running daemon keeps its old file.
if can_service; then "$byomd" service stop >/dev/null 2>&1 || true; fi
stop_background
mkdir -p "$bindir"
cp "$tmp/byomd" "$bindir/.byomd.new"
mv -f "$bindir/.byomd.new" "$byomd"
say "installed byomd $VERSION to $byomd"

if [ -f "$confdir/identity.json" ]; then
  say "already paired (identity in $confdir): not pairing again"
else
  set -- pair "$token"
  [ -z "$name" ] || set -- "$@" --name "$name"
  [ -z "$replace" ] || set -- "$@" --replace "$replace"
  "$byomd" "$@"
fi

if can_service && "$byomd" service install; then
  :
else
  mkdir -p "$confdir"
  nohup "$byomd" run >>"$confdir/byomd.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  say "started byomd in the background (pid $!, log $confdir/byomd.log): no user service manager here, so it will not start again after a reboot"
fi

i=0
while [ $i -lt 100 ]; do
  if "$byomd" status 2>/dev/null | grep -q 'connection: *connected'; then break; fi
  sleep 0.1
  i=$((i + 1))
done
"$byomd" status
case ":$PATH:" in
*":$bindir:"*) ;;
*) say "add $bindir to your PATH to use byomd by name" ;;
esac
