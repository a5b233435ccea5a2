//! `byom console`: a single-use link that signs you in to the server's
//! web console, as the admin whose certificate asks (valid 5 minutes,
//! opened once; the session it makes acts as you, or only looks with
//! `--read-only`).

use byom_api::Client;
use byom_protocol::pb;
use clap::Args;
use serde_json::json;

use super::output::print_json;

#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// The session may look but not act (no approve or deny).
    #[arg(long)]
    pub read_only: bool,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(c: &mut Client, a: ConsoleArgs) -> anyhow::Result<i32> {
    let r = c
        .admins()
        .console_link(pb::ConsoleLinkRequest {
            read_only: a.read_only,
        })
        .await?
        .into_inner();
    if a.json {
        print_json(&json!({
            "url": r.url,
            "expires_at": byom_protocol::time::rfc3339(r.expires_at_ms),
            "admin": r.admin,
            "read_only": r.read_only,
        }));
        return Ok(0);
    }
    println!("{}", r.url);
    eprintln!(
        "Open it within 5 minutes; it signs in once, as {}{}. The console's certificate is signed by the server's CA (ca.pem with your admin credentials).",
        r.admin,
        if r.read_only { " (read-only)" } else { "" }
    );
    Ok(0)
}
