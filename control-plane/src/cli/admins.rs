//! `byom admins`: personal admin certificates. The key is made here and
//! never leaves this machine until you hand the bundle to its person; the
//! server signs a request for it and pins its public key, so each person
//! shows up by name in the audit log, approvals and cancels, and one
//! person's certificate is revoked without touching anyone else's.

use std::path::{Path, PathBuf};

use anyhow::Context;
use byom_protocol::pb;
use clap::Subcommand;
use serde_json::json;

use super::agent::{self, s};
use super::output::print_json;
use super::Global;

#[derive(Subcommand, Debug)]
pub enum AdminsCmd {
    /// Issue NAME a personal admin certificate bundle (ca.pem, admin.pem,
    /// admin.key, api.json) for them to use with `BYOM_CREDS=DIR byom …`.
    /// Issuing again for a name retires its earlier certificate.
    Add {
        name: String,
        /// Where to write the bundle (default ./byom-admin-NAME); must not
        /// exist yet.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Every admin: who issued them and whether they are revoked.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Revoke NAME's certificate: their next call is refused, open
    /// connections included. The bootstrap `admin` can be revoked too,
    /// once people have their own.
    Revoke { name: String },
}

pub async fn run(g: &Global, cmd: AdminsCmd) -> anyhow::Result<i32> {
    let creds = byom_api::load_creds(g.creds.as_deref(), g.api.as_deref())?;
    let c = byom_api::connect(&creds).await?;
    match cmd {
        AdminsCmd::Ls { json } => {
            let v = agent::admins(&c).await?;
            if json {
                print_json(&v);
                return Ok(0);
            }
            println!("{:<24} {:<10} {:<26} ISSUED BY", "NAME", "STATE", "SINCE");
            for a in v.as_array().cloned().unwrap_or_default() {
                let revoked = a["revoked"].as_bool() == Some(true);
                let (state, since, by) = if revoked {
                    (
                        "revoked",
                        s(&a, "revoked_at"),
                        format!("revoked by {}", s(&a, "revoked_by")),
                    )
                } else {
                    (
                        "active",
                        s(&a, "created_at"),
                        s(&a, "created_by").to_string(),
                    )
                };
                let name = if a["you"].as_bool() == Some(true) {
                    format!("{} (you)", s(&a, "name"))
                } else {
                    s(&a, "name").to_string()
                };
                let since = if since.is_empty() { "-" } else { since };
                println!("{name:<24} {state:<10} {since:<26} {by}");
            }
            Ok(0)
        }
        AdminsCmd::Revoke { name } => {
            let r = agent::revoke_admin(&c, &name).await?;
            println!(
                "revoked {name} (by {}, {}): the server refuses their certificate from now on",
                s(&r, "revoked_by"),
                s(&r, "revoked_at")
            );
            Ok(0)
        }
        AdminsCmd::Add { name, out } => {
            let dir = out.unwrap_or_else(|| PathBuf::from(format!("byom-admin-{name}")));
            if dir.exists() {
                anyhow::bail!(
                    "{} already exists: choose another --out, or remove it first",
                    dir.display()
                );
            }
            let key = rcgen::KeyPair::generate().context("cannot generate a key")?;
            let csr = rcgen::CertificateParams::default()
                .serialize_request(&key)
                .and_then(|r| r.pem())
                .context("cannot make a certificate request")?;
            let v = agent::add_admin(&c, &name, &csr).await?;
            write_bundle(&dir, &v, &key.serialize_pem(), &creds.api_addr)?;
            println!(
                "issued a personal admin certificate for {name} in {}",
                dir.display()
            );
            println!("hand that directory to {name} over a private channel; they run:");
            println!("  export BYOM_CREDS={}", dir.display());
            println!("  byom admins ls");
            println!("revoke it with `byom admins revoke {name}`");
            Ok(0)
        }
    }
}

fn write_bundle(
    dir: &Path,
    v: &pb::AddAdminResponse,
    key_pem: &str,
    api_addr: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let files = [
        ("ca.pem", v.ca_pem.clone(), 0o644),
        ("admin.pem", v.cert_pem.clone(), 0o644),
        ("admin.key", key_pem.to_string(), 0o600),
        (
            "api.json",
            json!({ "api_addr": api_addr }).to_string(),
            0o644,
        ),
    ];
    for (name, text, mode) in files {
        let p = dir.join(name);
        byom_wire::write_atomic(&p, text.as_bytes(), mode)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}
