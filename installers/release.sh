#!/usr/bin/env bash
# Builds byom's release into a directory a server hands out with
# `byom server --dist DIR`: byomd and byom for each target (cross-compiled
# with Debian's cross gcc and a rustup target), a .deb and an .rpm of each,
# byomd.exe for Windows when the MinGW toolchain builds it, the Homebrew
# formula template, `manifest` (what the server checks and signs) and
# SHA256SUMS.
#
# Usage: installers/release.sh [--out DIR] [--profile dist|release|dev]
#          [--targets "TRIPLE…"|native] [--programs "byomd byom"]
#          [--no-build] [--version V]
#
#   installers/release.sh                  # the real thing (slow: LTO, 3 targets)
#   installers/release.sh --profile dev --targets native --no-build
#                                          # CI's check: package what `cargo build` made
#
# Needs: rustup targets aarch64-unknown-linux-gnu and x86_64-pc-windows-gnu,
# Debian packages gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# gcc-mingw-w64-x86-64, dpkg-dev (dpkg-deb) and rpm (rpmbuild).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

out=$root/target/dist
profile=dist
targets="x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu x86_64-pc-windows-gnu"
build=1
programs="byomd byom"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)
while [ $# -gt 0 ]; do
  case $1 in
  --out) out=$2; shift ;;
  --profile) profile=$2; shift ;;
  --targets) targets=$2; shift ;;
  --no-build) build=0 ;;
  --programs) programs=$2; shift ;;
  --version) version=$2; shift ;;
  -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
  *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# A dev build is for checks: compress fast.
compress=xz
[ "$profile" = dev ] && compress=gzip
host=$(rustc -vV | sed -n 's/^host: //p')
[ "$targets" = native ] && targets=$host
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { printf 'release: %s\n' "$*" >&2; }

profile_dir() { case $profile in dev) echo debug ;; *) echo "$profile" ;; esac; }

# The environment a cross build needs: linker and C compiler (ring, zstd).
cross_env() {
  case $1 in
  aarch64-unknown-linux-gnu)
    echo CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    ;;
  x86_64-pc-windows-gnu)
    echo CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc \
      CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc AR_x86_64_pc_windows_gnu=x86_64-w64-mingw32-ar
    ;;
  esac
}

# Debian and RPM names for an architecture.
deb_arch() { case $1 in x86_64) echo amd64 ;; aarch64) echo arm64 ;; esac; }

make_deb() { # PROGRAM ARCH BINARY
  local prog=$1 arch=$2 bin=$3 d=$work/deb-$1-$2
  rm -rf "$d"
  mkdir -p "$d/DEBIAN" "$d/usr/bin"
  install -m755 "$bin" "$d/usr/bin/$prog"
  local desc="byom command line: pair, list and manage machines, run commands, watch tasks; also runs the server"
  if [ "$prog" = byomd ]; then
    desc="byom endpoint daemon: runs the byom agent's commands on this machine"
    mkdir -p "$d/usr/lib/systemd/user"
    # shellcheck disable=SC2016 # the backquotes are the unit's text
    sed 's|{{EXEC}}|/usr/bin/byomd run|; s|written by `byomd service install`|shipped by the byomd package|' \
      "$here/systemd/byomd.service" >"$d/usr/lib/systemd/user/byomd.service"
  fi
  cat >"$d/DEBIAN/control" <<EOF
Package: $prog
Version: $version
Architecture: $(deb_arch "$arch")
Maintainer: byom developers <dev@byom.invalid>
Section: admin
Priority: optional
Installed-Size: $(du -k -s "$d/usr" | cut -f1)
Description: ${desc%%:*}
 ${desc#*: }.
EOF
  dpkg-deb --root-owner-group "-Z$compress" --build "$d" "$out/${prog}_${version}_$(deb_arch "$arch").deb" >/dev/null
}

make_rpm() { # PROGRAM ARCH BINARY
  local prog=$1 arch=$2 bin=$3 top=$work/rpm-$1-$2
  command -v rpmbuild >/dev/null || { log "no rpmbuild (Debian package rpm): skipping the .rpm of $prog"; return 0; }
  mkdir -p "$top/SOURCES"
  cp "$bin" "$top/SOURCES/$prog"
  local unit_install="" unit_file=""
  if [ "$prog" = byomd ]; then
    sed 's|{{EXEC}}|/usr/bin/byomd run|' "$here/systemd/byomd.service" >"$top/SOURCES/byomd.service"
    unit_install='install -D -m644 %{_sourcedir}/byomd.service %{buildroot}/usr/lib/systemd/user/byomd.service'
    unit_file=/usr/lib/systemd/user/byomd.service
  fi
  cat >"$top/$prog.spec" <<EOF
Name: $prog
Version: ${version//-/_}
Release: 1
Summary: byom $prog
License: Apache-2.0
%global __os_install_post %{nil}
%global debug_package %{nil}
%global _build_id_links none
%description
byom $prog, prebuilt by installers/release.sh.
%install
install -D -m755 %{_sourcedir}/$prog %{buildroot}/usr/bin/$prog
$unit_install
%files
/usr/bin/$prog
$unit_file
EOF
  local payload=w9.xzdio
  [ "$compress" = gzip ] && payload=w1.gzdio
  rpmbuild -bb --quiet --define "_binary_payload $payload" --target "$arch-linux" --define "_topdir $top" --define "_rpmdir $top/RPMS" \
    "$top/$prog.spec" >"$work/rpmbuild.log" 2>&1 || { cat "$work/rpmbuild.log" >&2; return 1; }
  find "$top/RPMS" -name '*.rpm' -exec cp {} "$out/" \;
}

for t in $targets; do
  arch=${t%%-*}
  case $t in
  *-linux-*) os=linux exe="" ;;
  *-windows-*) os=windows exe=.exe ;;
  *-apple-*) os=darwin exe="" ;;
  *) log "unknown target $t"; exit 2 ;;
  esac
  progs=$programs
  # On Windows only the daemon is shipped (the server and CLI run elsewhere).
  [ "$os" = windows ] && progs=byomd
  if [ "$t" = "$host" ] && [ "$profile" = dev ]; then
    dir=$root/target/debug
    target_flag=()
  else
    dir=$root/target/$t/$(profile_dir)
    target_flag=(--target "$t")
  fi
  if [ "$build" = 1 ]; then
    pkgs=()
    for p in $progs; do
      case $p in byomd) pkgs+=(-p byom-daemon) ;; byom) pkgs+=(-p byom-control-plane) ;; esac
    done
    log "building $progs for $t ($profile)"
    start=$(date +%s)
    # shellcheck disable=SC2046
    if ! env $(cross_env "$t") cargo build --locked --profile "$profile" "${target_flag[@]}" "${pkgs[@]}" --bins; then
      if [ "$os" = windows ]; then
        log "byomd does not build for $t: no Windows artifact"
        continue
      fi
      exit 1
    fi
    log "built for $t in $(($(date +%s) - start)) s"
  fi
  for p in $progs; do
    bin=$dir/$p$exe
    [ -x "$bin" ] || { log "no $bin: build first (or drop --no-build)"; exit 1; }
    name=$p-$version-$os-$arch$exe
    cp "$bin" "$out/$name"
    chmod 755 "$out/$name"
    if [ "$os" = linux ]; then
      make_deb "$p" "$arch" "$bin"
      make_rpm "$p" "$arch" "$bin"
    fi
  done
done

# The Homebrew formula (macOS builds from source: see README).
sed "s|@VERSION@|$version|g" "$here/homebrew/byomd.rb" >"$out/byomd.rb"

# The manifest: what the server checks, signs and serves.
(
  cd "$out"
  echo "byom-manifest 1"
  echo "version $version"
  for f in *; do
    case $f in manifest | SHA256SUMS | *.rb) continue ;; esac
    size=$(stat -c %s "$f")
    sha=$(sha256sum "$f" | cut -d' ' -f1)
    case $f in
    *.deb) kind=deb prog=${f%%_*} os=linux arch=${f##*_}; arch=${arch%.deb}
      case $arch in amd64) arch=x86_64 ;; arm64) arch=aarch64 ;; esac ;;
    *.rpm) kind=rpm prog=${f%%-[0-9]*} os=linux arch=${f%.rpm}; arch=${arch##*.} ;;
    *.exe) kind=exe; IFS=- read -r prog _ os arch <<<"${f%.exe}" ;;
    *) kind=bin; IFS=- read -r prog _ os arch <<<"$f" ;;
    esac
    echo "artifact $f $prog $os $arch $kind $size $sha"
  done
) >"$work/manifest"
mv "$work/manifest" "$out/manifest"
(
  cd "$out"
  files=()
  for f in *; do [ "$f" = SHA256SUMS ] || files+=("$f"); done
  sha256sum -- "${files[@]}" >SHA256SUMS
)
log "release $version in $out:"
(cd "$out" && for f in *; do printf '  %10d  %s\n' "$(stat -c %s "$f")" "$f"; done) >&2
