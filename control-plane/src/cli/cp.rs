//! `byom cp [-r] SRC DST`: files both ways, one side `MACHINE:PATH`.
//!
//! A copy is a command like any other, so the machine's policy and
//! sandbox decide whether it may read or write there (the owner can
//! forbid it), and both audit logs show it. Its script comes from here,
//! its paths go in as arguments (never into the script's text), and it
//! is streamed through `exec`'s flow-controlled streams:
//! - up: the bytes (a file, or a tar of a directory made by the local
//!   `tar`) go in as stdin to a temporary name beside the destination,
//!   hashed as they are written (tee to a FIFO: no second read); the
//!   machine checks their SHA-256 against the one computed here, sets the
//!   mode, and renames (a directory is unpacked under a temporary name
//!   and renamed);
//! - down: the machine sends the file's bytes (a directory: a tar it
//!   made), hashing them as they go, then says its mode and SHA-256 on
//!   stderr; they go to a temporary name here, are checked, and renamed.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use byom_api::{Client, Seen, WatchOptions};
use byom_protocol::pb::{self, CommandState};
use clap::Args;

/// Reconnects of a copy's watch while the server restarts.
const CP_RECONNECTS: u32 = 120;
/// Exit status of the machine's script when the bytes it got differ.
const EXIT_MISMATCH: i32 = 65;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// Copy a directory and everything in it.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Kill the copy after this long (e.g. 10m; at most 7d).
    #[arg(long, value_parser = super::parse_timeout)]
    pub timeout: Option<std::time::Duration>,
    /// What to copy: a local path, or MACHINE:PATH.
    pub src: String,
    /// Where: MACHINE:PATH, or a local path (an existing directory gets
    /// the source inside it, as cp does).
    pub dst: String,
}

/// `MACHINE:PATH` (the machine part has no `/`, as scp reads it), or a
/// local path (`./a:b` is local).
fn remote(s: &str) -> Option<(&str, &str)> {
    let (m, p) = s.split_once(':')?;
    (!m.is_empty() && !m.contains('/') && !m.contains('\\')).then_some((m, p))
}

/// The script the machine runs to receive; `$1` destination, `$2` mode,
/// `$3` SHA-256, `$4` the source's name, `$5` "dir" for a directory.
const RECEIVE: &str = r#"set -e
dst=$1
if [ -d "$dst" ]; then dst="${dst%/}/$4"; fi
parent=$(dirname -- "$dst")
[ -d "$parent" ] || { echo "byom cp: no directory $parent on this machine" >&2; exit 66; }
w=$(mktemp -d "$parent/.byom-cp.XXXXXX")
trap 'rm -f -- "$w/data" "$w/fifo" "$w/sum"; rmdir -- "$w" 2>/dev/null || true' EXIT
mkfifo -m 600 "$w/fifo"
{ sha256sum 2>/dev/null || shasum -a 256; } < "$w/fifo" > "$w/sum" &
tee -- "$w/fifo" > "$w/data"
wait
sum=$(cut -d' ' -f1 < "$w/sum")
if [ "$sum" != "$3" ]; then echo "byom cp: the bytes that arrived differ (sha256 $sum, sent $3)" >&2; exit 65; fi
if [ "$5" = dir ]; then
  [ ! -e "$dst" ] || { echo "byom cp: $dst exists on this machine" >&2; exit 73; }
  mkdir -- "$w/d"
  tar xf "$w/data" -C "$w/d" || { echo "byom cp: unpacking failed; what was unpacked is in $w/d" >&2; exit 74; }
  mv -- "$w/d/$4" "$dst"
  rmdir -- "$w/d"
else
  chmod "$2" "$w/data"
  mv -f -- "$w/data" "$dst"
fi
echo "$dst"
"#;

/// The script the machine runs to send `$1` (with `$2` "dir" for a
/// directory): a header line on stderr, then the bytes on stdout.
const SEND: &str = r#"set -e
src=$1
w=$(mktemp -d)
trap 'rm -f -- "$w/tar" "$w/fifo" "$w/sum"; rmdir -- "$w" 2>/dev/null || true' EXIT
if [ "$2" = dir ]; then
  [ -d "$src" ] || { echo "byom cp: $src is not a directory on this machine" >&2; exit 66; }
  tar cf "$w/tar" -C "$(dirname -- "$src")" -- "$(basename -- "$src")"
  src=$w/tar
  mode=755
else
  if [ -d "$src" ]; then echo "byom cp: $src is a directory on this machine (use -r)" >&2; exit 66; fi
  [ -f "$src" ] || { echo "byom cp: no file $src on this machine" >&2; exit 66; }
  mode=$(stat -c %a -- "$src" 2>/dev/null || stat -f %Lp -- "$src")
fi
mkfifo -m 600 "$w/fifo"
{ sha256sum 2>/dev/null || shasum -a 256; } < "$w/fifo" > "$w/sum" &
tee -- "$w/fifo" < "$src"
wait
printf 'byom-cp %s %s\n' "$mode" "$(cut -d' ' -f1 < "$w/sum")" >&2
"#;

pub async fn run(c: &mut Client, a: CpArgs) -> anyhow::Result<i32> {
    match (remote(&a.src), remote(&a.dst)) {
        (None, Some((m, p))) => up(c, &a, Path::new(&a.src), m, p).await,
        (Some((m, p)), None) => down(c, &a, m, p, Path::new(&a.dst)).await,
        (Some(_), Some(_)) => bail!(
            "both sides are machines: copy down, then up (byom cp M1:PATH local; byom cp local M2:PATH)"
        ),
        (None, None) => bail!("neither side is a machine: one of them is MACHINE:PATH"),
    }
}

/// This process's umask: from /proc where Linux says it, else read by
/// setting it and setting it back.
#[cfg(unix)]
fn umask() -> u32 {
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        if let Some(m) = s
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        {
            return m;
        }
    }
    // SAFETY: umask only swaps the process's mask.
    let m = unsafe { libc::umask(0o077) };
    unsafe { libc::umask(m) };
    m as u32
}

fn sha256_file(p: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(p).with_context(|| format!("reading {}", p.display()))?;
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(byom_protocol::hex(h.finish().as_ref()))
}

fn name_of(p: &Path) -> anyhow::Result<String> {
    let p = std::fs::canonicalize(p).with_context(|| format!("{}", p.display()))?;
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("the source has no name to copy under")
}

fn request(machine: &str, script: &str, args: &[&str], a: &CpArgs) -> pb::CreateCommandRequest {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        script.into(),
        "byom-cp".into(),
    ];
    argv.extend(args.iter().map(|s| s.to_string()));
    pb::CreateCommandRequest {
        machine: machine.into(),
        argv,
        timeout_ms: a.timeout.map(|d| d.as_millis() as u64).unwrap_or(0),
        idempotency_key: byom_api::new_key(),
        ..Default::default()
    }
}

/// The bytes of a file, in chunks, for a command's stdin stream.
fn file_chunks(path: PathBuf) -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        let Ok(mut f) = std::fs::File::open(&path) else {
            return;
        };
        loop {
            let mut buf = vec![0u8; byom_protocol::limits::MAX_OUTPUT_CHUNK_BYTES];
            match std::io::Read::read(&mut f, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(buf).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// Follows a copy's command to its end; stdout goes to `out`, stderr is
/// collected. The terminal record, or why not.
async fn follow(
    c: &mut Client,
    run: byom_api::Run,
    mut out: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> anyhow::Result<(pb::Command, Vec<u8>, u64)> {
    let mut err = Vec::new();
    let mut write_err = None;
    let mut lost = 0u64;
    let mut at = [0u64; 2];
    let opts = WatchOptions {
        idle: None,
        reconnects: CP_RECONNECTS,
    };
    let id = run.command.id.clone();
    let end = run
        .to_end(c, opts, |seen| {
            if let Seen::Output(o) = seen {
                let i = usize::from(o.stream == pb::OutputStream::Stderr as i32);
                lost += o.offset.saturating_sub(at[i]);
                at[i] = o.offset + o.data.len() as u64;
                if i == 1 {
                    if err.len() < 64 * 1024 {
                        err.extend_from_slice(&o.data);
                    }
                } else if write_err.is_none() {
                    if let Err(e) = out(&o.data) {
                        write_err = Some(e);
                    }
                }
            }
        })
        .await
        .map_err(super::watch_err)?;
    if let Some(e) = write_err {
        return Err(e).context("writing the copy here");
    }
    let Some(cmd) = end else {
        bail!("lost the server while copying; see `byom commands show {id}`");
    };
    Ok((cmd, err, lost))
}

/// Why a copy's command did not succeed, for people.
fn failure(cmd: &pb::Command, err: &[u8]) -> anyhow::Error {
    let said = String::from_utf8_lossy(err);
    let said = said
        .lines()
        .filter(|l| !l.starts_with("byom-cp "))
        .collect::<Vec<_>>()
        .join("\n");
    let state = match cmd.state() {
        CommandState::Exited if cmd.exit_code == Some(EXIT_MISMATCH) => {
            "the bytes changed on the way".to_string()
        }
        CommandState::Exited => format!("exit {}", cmd.exit_code.unwrap_or(-1)),
        s => format!("{}{}", s.name(), super::output::reason(cmd)),
    };
    if said.trim().is_empty() {
        anyhow::anyhow!(
            "copy failed on the machine ({state}; see `byom commands show {}`)",
            cmd.id
        )
    } else {
        anyhow::anyhow!("{} ({state}; {})", said.trim(), cmd.id)
    }
}

async fn up(
    c: &mut Client,
    a: &CpArgs,
    src: &Path,
    machine: &str,
    dst: &str,
) -> anyhow::Result<i32> {
    let meta = std::fs::metadata(src).with_context(|| format!("{}", src.display()))?;
    let name = name_of(src)?;
    let dst = if dst.is_empty() { "." } else { dst };
    // A directory goes as a tar the local `tar` makes, hashed first.
    let tmp = tempfile::Builder::new().prefix(".byom-cp").tempfile()?;
    let (data, mode, kind) = if meta.is_dir() {
        if !a.recursive {
            bail!("{} is a directory (use -r)", src.display());
        }
        let parent = std::fs::canonicalize(src)?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let st = std::process::Command::new("tar")
            .arg("cf")
            .arg(tmp.path())
            .arg("-C")
            .arg(&parent)
            // A name that starts with `-` is a name, not an option.
            .arg("--")
            .arg(&name)
            .status()
            .context("running the local tar")?;
        if !st.success() {
            bail!("the local tar failed ({st}) packing {}", src.display());
        }
        (tmp.path().to_path_buf(), "755".to_string(), "dir")
    } else {
        #[cfg(unix)]
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            // Permission bits only: no setuid or setgid bits go across.
            format!("{:o}", meta.permissions().mode() & 0o777)
        };
        #[cfg(not(unix))]
        let mode = "644".to_string();
        (src.to_path_buf(), mode, "file")
    };
    let sum = sha256_file(&data)?;
    let req = request(machine, RECEIVE, &[dst, &mode, &sum, &name, kind], a);
    let run = byom_api::exec(c, req, file_chunks(data)).await?;
    let (cmd, err, _) = follow(c, run, |_| Ok(())).await?;
    drop(tmp);
    if cmd.state() == CommandState::Exited && cmd.exit_code == Some(0) && !cmd.stdin_cut {
        return Ok(0);
    }
    Err(failure(&cmd, &err))
}

async fn down(
    c: &mut Client,
    a: &CpArgs,
    machine: &str,
    src: &str,
    dst: &Path,
) -> anyhow::Result<i32> {
    let name = Path::new(src)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("name a file on the machine: MACHINE:PATH")?;
    // An existing directory gets the source inside it, as cp does.
    let dst = if dst.is_dir() {
        dst.join(&name)
    } else {
        dst.to_path_buf()
    };
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if a.recursive && dst.exists() {
        bail!("{} exists", dst.display());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".byom-cp")
        .tempfile_in(&parent)
        .with_context(|| format!("writing in {}", parent.display()))?;
    let kind = if a.recursive { "dir" } else { "file" };
    let req = request(machine, SEND, &[src, kind], a);
    let run = byom_api::run_command(c, req).await?;
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let file = tmp.as_file_mut();
    let (cmd, err, lost) = follow(c, run, |b| {
        h.update(b);
        file.write_all(b)
    })
    .await?;
    if cmd.state() != CommandState::Exited || cmd.exit_code != Some(0) {
        return Err(failure(&cmd, &err));
    }
    let header = String::from_utf8_lossy(&err);
    let Some((mode, sum)) = header
        .lines()
        .find_map(|l| l.strip_prefix("byom-cp "))
        .and_then(|l| l.split_once(' '))
    else {
        bail!("the machine did not say what it sent ({})", cmd.id);
    };
    let got = byom_protocol::hex(h.finish().as_ref());
    if lost > 0 || got != sum.trim() {
        bail!(
            "the bytes that arrived differ from {machine}:{src} (sha256 {got}, sent {}): it may have changed while copying; nothing was written",
            sum.trim()
        );
    }
    tmp.as_file().sync_all()?;
    if a.recursive {
        let unpack = tempfile::Builder::new()
            .prefix(".byom-cp")
            .tempdir_in(&parent)?;
        // Owners and special bits as this user makes files, whatever the
        // machine's tar says (GNU and BSD tar take these).
        let st = std::process::Command::new("tar")
            .arg("xf")
            .arg(tmp.path())
            .args(["--no-same-owner", "--no-same-permissions"])
            .arg("-C")
            .arg(unpack.path())
            .status()
            .context("running the local tar")?;
        if !st.success() {
            bail!("the local tar failed ({st}) unpacking {machine}:{src}");
        }
        std::fs::rename(unpack.path().join(&name), &dst)
            .with_context(|| format!("moving it to {}", dst.display()))?;
        return Ok(0);
    }
    // The machine says the mode: as cp and scp do without -p, only its
    // permission bits, under this user's umask; never setuid or setgid
    // bits a machine chose for a file here.
    #[cfg(unix)]
    if let Ok(m) = u32::from_str_radix(mode.trim(), 8) {
        use std::os::unix::fs::PermissionsExt;
        let m = m & 0o777 & !umask();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(m))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    tmp.persist(&dst)
        .with_context(|| format!("moving it to {}", dst.display()))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::remote;

    #[test]
    fn a_machine_side_reads_as_scp_does() {
        assert_eq!(remote("lap:/tmp/x"), Some(("lap", "/tmp/x")));
        assert_eq!(remote("lap:"), Some(("lap", "")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/abs/a:b"), None);
        assert_eq!(remote("plain"), None);
        assert_eq!(remote(":x"), None);
    }
}
