//! `byom trust`: who is trusted and who may approve (the Rule of Two's
//! people side). Edits read the configuration, change it and write it back;
//! the server checks that whoever edits is an approver for every machine.

use byom_api::Client;
use clap::Subcommand;
use serde_json::{json, Value};

use super::agent::{self, s};
use super::output::print_json;

#[derive(Subcommand, Debug)]
pub enum TrustCmd {
    /// Show who is trusted and who may approve.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Trust a principal or pattern (`github:octocat`, `matrix:@ada:example.org`,
    /// `slack:T123/U456`, `webhook:ci/*`, `admin:*`).
    Add { principal: String },
    /// Stop trusting a principal or pattern.
    Rm { principal: String },
    /// Trust by what a channel vouches for.
    Set {
        /// GitHub `author_association` values that are trusted, comma-separated
        /// (default OWNER,MEMBER,COLLABORATOR; empty for none).
        #[arg(long)]
        github: Option<String>,
        /// Members (not guests) of a connected Slack workspace are trusted.
        #[arg(long)]
        slack_members: Option<bool>,
        /// Matrix homeservers whose users are trusted, comma-separated.
        #[arg(long)]
        matrix_homeservers: Option<String>,
    },
    /// Who may approve what untrusted input asks for.
    #[command(subcommand)]
    Approvers(ApproversCmd),
    /// How a principal is judged: trusted or not, and whether they may approve.
    Check {
        principal: String,
        /// What the channel vouches for (GitHub's author_association, or
        /// `member`/`guest` for Slack).
        #[arg(long, default_value = "")]
        association: String,
        /// For machines with this label (`k=v`).
        #[arg(long)]
        label: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ApproversCmd {
    /// Let a principal or pattern approve, for every machine or only for
    /// machines with `--label k=v`.
    Add {
        principal: String,
        #[arg(long)]
        label: Option<String>,
    },
    /// Take an approver away (with the same `--label` it was added with).
    Rm {
        principal: String,
        #[arg(long)]
        label: Option<String>,
    },
}

fn list(v: &Value, k: &str) -> Vec<String> {
    v[k].as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn csv(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

fn show(v: &Value) {
    let or_none = |l: Vec<String>| {
        if l.is_empty() {
            "(none)".to_string()
        } else {
            l.join(", ")
        }
    };
    println!("trusted:            {}", or_none(list(v, "trusted")));
    println!(
        "github:             {}",
        or_none(list(v, "github_associations"))
    );
    println!(
        "slack members:      {}",
        if v["slack_members"].as_bool() == Some(true) {
            "trusted"
        } else {
            "not trusted"
        }
    );
    println!(
        "matrix homeservers: {}",
        or_none(list(v, "matrix_homeservers"))
    );
    println!("approvers:");
    let approvers = v["approvers"].as_array().cloned().unwrap_or_default();
    if approvers.is_empty() {
        println!("  (none)");
    }
    for a in approvers {
        match a["label"].as_str() {
            Some(l) => println!("  {} (machines labelled {l})", s(&a, "principal")),
            None => println!("  {} (every machine)", s(&a, "principal")),
        }
    }
    println!("everyone else is untrusted: what they ask for that would reach a sensitive machine and change something waits for an approver");
}

pub async fn run(c: &mut Client, cmd: TrustCmd) -> anyhow::Result<i32> {
    if let TrustCmd::Check {
        principal,
        association,
        label,
    } = &cmd
    {
        let v =
            agent::check_trust(c, principal, association, label.as_deref().unwrap_or("")).await?;
        println!("{}", s(&v, "why"));
        println!(
            "{} {} approve",
            principal,
            if v["may_approve"].as_bool() == Some(true) {
                "may"
            } else {
                "may not"
            }
        );
        return Ok(0);
    }
    let mut v = agent::trust(c).await?;
    match cmd {
        TrustCmd::Ls { json } => {
            if json {
                print_json(&v);
            } else {
                show(&v);
            }
            return Ok(0);
        }
        TrustCmd::Check { .. } => return Ok(0),
        TrustCmd::Add { principal } => {
            let mut l = list(&v, "trusted");
            if !l.contains(&principal) {
                l.push(principal);
            }
            v["trusted"] = json!(l);
        }
        TrustCmd::Rm { principal } => {
            let mut l = list(&v, "trusted");
            let before = l.len();
            l.retain(|p| *p != principal);
            if l.len() == before {
                anyhow::bail!("{principal} is not in the trusted list (see `byom trust ls`)");
            }
            v["trusted"] = json!(l);
        }
        TrustCmd::Set {
            github,
            slack_members,
            matrix_homeservers,
        } => {
            if let Some(g) = github {
                let l: Vec<String> = csv(&g).into_iter().map(|x| x.to_uppercase()).collect();
                v["github_associations"] = json!(l);
            }
            if let Some(b) = slack_members {
                v["slack_members"] = json!(b);
            }
            if let Some(m) = matrix_homeservers {
                v["matrix_homeservers"] = json!(csv(&m));
            }
        }
        TrustCmd::Approvers(ApproversCmd::Add { principal, label }) => {
            let mut a = v["approvers"].as_array().cloned().unwrap_or_default();
            let entry = match &label {
                Some(l) => json!({"principal": principal, "label": l}),
                None => json!({"principal": principal}),
            };
            if !a.contains(&entry) {
                a.push(entry);
            }
            v["approvers"] = Value::Array(a);
        }
        TrustCmd::Approvers(ApproversCmd::Rm { principal, label }) => {
            let mut a = v["approvers"].as_array().cloned().unwrap_or_default();
            let before = a.len();
            a.retain(|x| {
                !(s(x, "principal") == principal && x["label"].as_str() == label.as_deref())
            });
            if a.len() == before {
                anyhow::bail!("{principal} is not an approver like that (see `byom trust ls`)");
            }
            v["approvers"] = Value::Array(a);
        }
    }
    let v = agent::set_trust(c, &v).await?;
    show(&v);
    Ok(0)
}
