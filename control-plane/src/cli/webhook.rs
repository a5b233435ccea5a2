//! `byom webhook sign`: the headers the generic webhook (`POST
//! /hooks/SOURCE`) wants for a body, signed as the server checks them
//! (`byom_wire::webhook`), so a sender never has to get an `openssl`
//! pipeline right to find out why it gets 401.

use std::io::Read as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum WebhookCmd {
    /// Print the X-Byom-Timestamp and X-Byom-Signature headers for a body
    /// (`curl -H @<(byom webhook sign body.json) --data-binary @body.json
    /// http://127.0.0.1:7445/hooks/ci`).
    Sign(SignArgs),
}

#[derive(Args, Debug)]
pub struct SignArgs {
    /// The body to sign, exactly as it will be sent; `-` (the default)
    /// reads stdin.
    #[arg(default_value = "-", value_name = "BODY_FILE")]
    body: PathBuf,
    /// The webhook key file (default: <data-dir>/webhook.key, the data dir
    /// being $BYOM_DATA_DIR or ~/.local/share/byom).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Sign as of this Unix time in seconds instead of now (the server
    /// accepts five minutes either way).
    #[arg(long, value_name = "UNIX_SECONDS")]
    timestamp: Option<u64>,
    /// Print only the signature header's value (`sha256=HEX`); use it
    /// with --timestamp, which it was made for.
    #[arg(long, requires = "timestamp")]
    value: bool,
}

/// Largest body read: what the server accepts, and a little more so that
/// a body over it is told rather than cut.
const MAX_BODY: u64 = 1 << 20;

pub fn run(cmd: WebhookCmd) -> anyhow::Result<i32> {
    let WebhookCmd::Sign(a) = cmd;
    let key_path = a
        .key
        .unwrap_or_else(|| byom_api::default_data_dir().join("webhook.key"));
    let key = std::fs::read(&key_path).with_context(|| {
        format!(
            "cannot read the webhook key {} (the server writes it to <data-dir>/webhook.key; --key FILE)",
            key_path.display()
        )
    })?;
    if key.trim_ascii_end().is_empty() {
        anyhow::bail!("the webhook key {} is empty", key_path.display());
    }
    let mut body = Vec::new();
    let src: Box<dyn std::io::Read> = if a.body.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(&a.body)
                .with_context(|| format!("cannot read {}", a.body.display()))?,
        )
    };
    src.take(MAX_BODY + 1).read_to_end(&mut body)?;
    if body.len() as u64 > MAX_BODY {
        anyhow::bail!("the body is over {MAX_BODY} bytes, which the server refuses (413)");
    }
    let ts = match a.timestamp {
        Some(t) => t,
        None => byom_wire::now_ms() / 1000,
    };
    let sig = byom_wire::webhook::sign(&key, ts, &body);
    if a.value {
        println!("{sig}");
    } else {
        println!("{}: {ts}", byom_wire::webhook::TIMESTAMP_HEADER);
        println!("{}: {sig}", byom_wire::webhook::SIGNATURE_HEADER);
    }
    Ok(0)
}
