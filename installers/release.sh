#!/usr/bin/env bash
# Builds byom's release into a directory a server hands out with
# `byom server --dist DIR`: byomd and byom for each target (cross-compiled
# with Debian's cross gcc and a rustup target), a .deb and an .rpm of each,
# byomd.exe for Windows when the MinGW toolchain builds it, a .tar.gz of
# each Linux program laid out as a prefix (bin/, share/man/man1/, shell
# completions under share/), the Homebrew formula template, `manifest`
# (what the server checks and signs) and SHA256SUMS. The packages carry
# the man pages and the bash, zsh and fish completions the programs
# print (`byomd man --dir`, `byomd completions SHELL`).
#
# Usage: installers/release.sh [--out DIR] [--profile dist|release|dev]
#          [--targets "TRIPLE…"|native] [--programs "byomd byom"]
#          [--no-build] [--from DIR] [--compress xz|gzip] [--version V]
#
#   installers/release.sh                  # the real thing (slow: LTO, 3 targets)
#   installers/release.sh --profile release --targets native --no-build
#                                          # what `cargo build --release` made
#   installers/release.sh --from target/debug --compress gzip
#                                          # package the binaries in a directory
#                                          # (this machine's platform, or --targets T)
#
# Binaries are looked for where cargo puts them: target/TRIPLE/PROFILE,
# and for this machine's own platform target/PROFILE too (a build without
# --target); CARGO_TARGET_DIR moves `target`. Dev builds compress with
# gzip, others with xz, unless --compress says.
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
targets_given=0
build=1
from=""
compress=""
programs="byomd byom"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)
while [ $# -gt 0 ]; do
  case $1 in
  --out) out=$2; shift ;;
  --profile) profile=$2; shift ;;
  --targets) targets=$2; targets_given=1; shift ;;
  --no-build) build=0 ;;
  --from) from=$2; build=0; shift ;;
  --compress) compress=$2; shift ;;
  --programs) programs=$2; shift ;;
  --version) version=$2; shift ;;
  -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
  *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# A dev build is for checks: compress fast.
if [ -z "$compress" ]; then
  compress=xz
  [ "$profile" = dev ] && compress=gzip
fi
case $compress in xz | gzip) ;; *) echo "release.sh: --compress xz or gzip, not $compress" >&2; exit 2 ;; esac
host=$(rustc -vV | sed -n 's/^host: //p')
if [ -n "$from" ]; then
  # Prebuilt binaries are for one platform: this one unless --targets says.
  [ "$targets_given" = 1 ] || targets=native
  [ -d "$from" ] || { echo "release.sh: --from $from is not a directory" >&2; exit 2; }
  from=$(cd "$from" && pwd)
fi
[ "$targets" = native ] && targets=$host
if [ -n "$from" ] && [ "$(echo "$targets" | wc -w)" != 1 ]; then
  echo "release.sh: --from packages one target's binaries; give one with --targets" >&2
  exit 2
fi
tdir=${CARGO_TARGET_DIR:-$root/target}
case $tdir in /*) ;; *) tdir=$root/$tdir ;; esac
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { printf 'release: %s\n' "$*" >&2; }

profile_dir() { case $profile in dev) echo debug ;; *) echo "$profile" ;; esac; }

# The man pages and completions of PROG, made once by running BINARY (or,
# for a binary this machine cannot run, the same program built for this
# machine) into $work/docs/PROG: man1/*.1, and bash, zsh and fish scripts.
docs_dir() { # PROG BINARY -> prints the dir, or nothing when none could be made
  local prog=$1 bin=$2 d=$work/docs/$1 runner=""
  [ -d "$d.none" ] && return 0
  if [ ! -d "$d" ]; then
    for b in "$bin" "$tdir/$host/$(profile_dir)/$prog" "$tdir/$(profile_dir)/$prog"; do
      if [ -x "$b" ] && "$b" --version >/dev/null 2>&1; then runner=$b; break; fi
    done
    if [ -z "$runner" ]; then
      log "no $prog that runs here: its packages go without man pages and completions"
      mkdir -p "$d.none"
      return 0
    fi
    mkdir -p "$d/man1" "$d/completions"
    "$runner" man --dir "$d/man1" >/dev/null
    for sh in bash zsh fish; do
      "$runner" completions "$sh" >"$d/completions/$sh"
    done
  fi
  echo "$d"
}

# Lays the man pages and completions of PROG out under a prefix (DEST/usr,
# or a tarball's root): man pages gzipped unless told not to, completions
# where each shell looks for them (zsh's dir differs between Debian and
# the others, so it is an argument).
install_docs() { # PROG DOCS DEST ZSH_DIR GZIP(1|0)
  local prog=$1 docs=$2 dest=$3 zsh_dir=$4 gz=$5
  [ -n "$docs" ] || return 0
  mkdir -p "$dest/share/man/man1" "$dest/share/bash-completion/completions" "$dest/$zsh_dir" \
    "$dest/share/fish/vendor_completions.d"
  for m in "$docs"/man1/*.1; do
    if [ "$gz" = 1 ]; then
      gzip -9n <"$m" >"$dest/share/man/man1/$(basename "$m").gz"
    else
      install -m644 "$m" "$dest/share/man/man1/"
    fi
  done
  install -m644 "$docs/completions/bash" "$dest/share/bash-completion/completions/$prog"
  install -m644 "$docs/completions/zsh" "$dest/$zsh_dir/_$prog"
  install -m644 "$docs/completions/fish" "$dest/share/fish/vendor_completions.d/$prog.fish"
}

# PROG-VERSION-OS-ARCH.tar.gz: one directory of that name holding bin/PROG
# and share/ (man pages, completions), to unpack under a prefix.
make_tarball() { # PROGRAM OS ARCH BINARY DOCS
  local prog=$1 os=$2 arch=$3 bin=$4 docs=$5 name=$1-$version-$2-$3
  local d=$work/tar/$name
  rm -rf "$d"
  mkdir -p "$d/bin"
  install -m755 "$bin" "$d/bin/$prog"
  install_docs "$prog" "$docs" "$d" share/zsh/site-functions 0
  local z=-1
  [ "$compress" = xz ] && z=-9
  tar -C "$work/tar" --owner=0 --group=0 --numeric-owner --sort=name -cf - "$name" | gzip -n "$z" >"$out/$name.tar.gz"
}

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

make_deb() { # PROGRAM ARCH BINARY DOCS
  local prog=$1 arch=$2 bin=$3 docs=$4 d=$work/deb-$1-$2
  rm -rf "$d"
  mkdir -p "$d/DEBIAN" "$d/usr/bin"
  install -m755 "$bin" "$d/usr/bin/$prog"
  install_docs "$prog" "$docs" "$d/usr" share/zsh/vendor-completions 1
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
  # gzip is for checks: its fastest level.
  local level=()
  [ "$compress" = gzip ] && level=(-z1)
  dpkg-deb --root-owner-group "-Z$compress" "${level[@]}" --build "$d" "$out/${prog}_${version}_$(deb_arch "$arch").deb" >/dev/null
}

make_rpm() { # PROGRAM ARCH BINARY DOCS
  local prog=$1 arch=$2 bin=$3 docs=$4 top=$work/rpm-$1-$2
  command -v rpmbuild >/dev/null || { log "no rpmbuild (Debian package rpm): skipping the .rpm of $prog"; return 0; }
  mkdir -p "$top/SOURCES"
  cp "$bin" "$top/SOURCES/$prog"
  # The man pages and completions, laid out as they install (gzipped
  # here: the spec turns off rpm's own post-install compression).
  local share_install="" share_files=""
  if [ -n "$docs" ]; then
    install_docs "$prog" "$docs" "$top/SOURCES/share-root/usr" share/zsh/site-functions 1
    share_install='cp -a %{_sourcedir}/share-root/usr %{buildroot}/'
    share_files="/usr/share/man/man1/$prog*.1.gz
/usr/share/bash-completion/completions/$prog
/usr/share/zsh/site-functions/_$prog
/usr/share/fish/vendor_completions.d/$prog.fish"
  fi
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
$share_install
%files
/usr/bin/$prog
$unit_file
$share_files
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
  if [ -n "$from" ]; then
    dir=$from
    target_flag=()
  elif [ "$t" = "$host" ] && [ "$profile" = dev ]; then
    dir=$tdir/debug
    target_flag=()
  else
    dir=$tdir/$t/$(profile_dir)
    target_flag=(--target "$t")
    # A build for this machine without --target (`cargo build --release`)
    # is in target/PROFILE: package that when there is no other.
    if [ "$build" = 0 ] && [ "$t" = "$host" ]; then
      found=1
      for p in $progs; do [ -x "$dir/$p$exe" ] || found=0; done
      [ "$found" = 1 ] || dir=$tdir/$(profile_dir)
    fi
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
    if [ ! -x "$bin" ]; then
      if [ -n "$from" ]; then
        log "no $bin (--from $from)"
      else
        log "no $bin: build first (or drop --no-build, or give --from DIR)"
      fi
      exit 1
    fi
    name=$p-$version-$os-$arch$exe
    cp "$bin" "$out/$name"
    chmod 755 "$out/$name"
    if [ "$os" = linux ]; then
      docs=$(docs_dir "$p" "$bin")
      make_deb "$p" "$arch" "$bin" "$docs"
      make_rpm "$p" "$arch" "$bin" "$docs"
      make_tarball "$p" "$os" "$arch" "$bin" "$docs"
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
    *.tar.gz) kind=tar.gz; IFS=- read -r prog _ os arch <<<"${f%.tar.gz}" ;;
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
