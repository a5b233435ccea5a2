//! `byomd sandbox check -- CMD`: what a command would be allowed to touch
//! here, computed exactly as `byomd run` computes it; with `--run`, the
//! command runs in that sandbox on this terminal, so an owner can trial a
//! rule before an agent meets it.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::host::{Host, Request};
use crate::policy::sandbox::Origin;
use crate::policy::{Decision, Policy};

pub struct Options {
    pub cwd: String,
    pub shell: Option<String>,
    pub argv: Vec<String>,
    pub origin: Origin,
    pub run: bool,
    /// Print the macOS Seatbelt profile of the same rules.
    pub profile: bool,
}

fn list(title: &str, paths: &[PathBuf]) {
    if paths.is_empty() {
        println!("{title}: none");
        return;
    }
    println!("{title}:");
    for p in paths {
        println!("  {}", p.display().to_string().escape_debug());
    }
}

/// Removes the check's temp dirs however it ends.
struct Forget<'a>(&'a Host);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.forget_tmp();
    }
}

pub fn check(dir: &Path, o: Options) -> anyhow::Result<i32> {
    let policy = Policy::load(dir)?;
    let rules = &policy.file.sandbox;
    let shell = o.shell.clone().unwrap_or_default();
    if shell.is_empty() && o.argv.is_empty() {
        anyhow::bail!("give a command: byomd sandbox check -- CMD ARGS (or --sh 'LINE')");
    }
    let req = crate::policy::Request {
        argv: &o.argv,
        shell: &shell,
        cwd: &o.cwd,
        requested_by: if o.origin == Origin::Admin {
            ""
        } else {
            "wrk_sandbox_check"
        },
        taint: if o.origin == Origin::Untrusted {
            "byomd sandbox check --untrusted"
        } else {
            ""
        },
        ..Default::default()
    };
    let (cwd, run_as) = match policy.check(&req) {
        Ok(Decision::Allow { cwd, run_as, .. }) => (cwd, run_as),
        Ok(Decision::Deny { rule }) => {
            println!("the command policy denies it before any sandbox: {rule}");
            return Ok(2);
        }
        Err(e) => {
            println!("it cannot run: {e}");
            return Ok(2);
        }
    };
    let host = Host::for_check(super::default_helper());
    let _forget = Forget(&host);
    let level = host.level(rules);
    println!("sandbox here: {level}");
    if !host.support.errors.is_empty() {
        println!("  the kernel said: {}", host.support.errors.join("; "));
    }
    if !rules.enabled {
        println!("the command would run with no sandbox (sandbox.enabled = false)");
        return Ok(0);
    }
    if rules.required && !level.is_full() {
        println!("byomd refuses it: sandbox.required = true and the sandbox here is not whole");
        return Ok(2);
    }
    let id = format!("check-{}", std::process::id());
    let spec = host.plan(&Request {
        rules,
        origin: o.origin,
        roots: &policy.file.dirs.roots,
        cwd: &cwd,
        config_dir: dir,
        run_as: run_as.as_ref(),
        command_id: &id,
    });
    let mut spec = match spec {
        Ok(s) => s,
        Err(e) => {
            println!("byomd refuses it: {e}");
            return Ok(2);
        }
    };
    let net = rules.network(o.origin);
    println!(
        "as {} command, in {}",
        match o.origin {
            Origin::Admin => "an admin's",
            Origin::Agent => "an agent task's",
            Origin::Untrusted => "an untrusted agent task's",
        },
        cwd.display()
    );
    list("may write beneath", &spec.write);
    if spec.read == [PathBuf::from("/")] {
        println!("may read: everything else but what is hidden");
    } else {
        list("may read beneath", &spec.read);
        list("may only list", &spec.list);
    }
    list("hidden (neither read nor written)", &spec.hide);
    list("read-only", &spec.read_only);
    list("kept as mount points (cannot be renamed away)", &spec.pin);
    println!(
        "network: {}",
        if spec.deny_sockets {
            "denied (no IP sockets)".to_string()
        } else if spec.net_ns {
            "denied (a loopback of its own)".to_string()
        } else {
            net.describe()
        }
    );
    println!(
        "processes: {}",
        if spec.pid_ns {
            "its own PID namespace: everything it starts ends with it"
        } else {
            "not contained: background processes can outlive it"
        }
    );
    if o.profile {
        println!("--- the macOS Seatbelt profile of these rules:");
        print!("{}", super::seatbelt::profile(&spec, net));
    }
    if !o.run {
        return Ok(0);
    }
    let argv = if shell.is_empty() {
        o.argv.clone()
    } else {
        vec!["sh".into(), "-c".into(), shell]
    };
    let env = std::collections::HashMap::new();
    host.finish(&mut spec, argv, &env, &[], run_as.as_ref(), &cwd)
        .context("cannot make the command's temp dir")?;
    println!(
        "--- running it in that sandbox (the command policy's confirmations are not asked here):"
    );
    let code = run_here(&host, &spec);
    host.clean(&spec);
    code
}

#[cfg(target_os = "linux")]
fn run_here(host: &Host, spec: &super::Spec) -> anyhow::Result<i32> {
    let mut p = super::prepare(&host.helper, spec).context("cannot prepare the sandbox")?;
    let mut child = p.cmd.spawn().context("cannot start the sandbox helper")?;
    drop(p.keep);
    let _alive = p.alive;
    if let Some(r) = super::read_report(p.report) {
        if !r.ok {
            let _ = child.wait();
            anyhow::bail!("{}", r.error);
        }
        eprintln!("(sandbox set up in {} µs)", r.setup_us);
    }
    let st = child.wait()?;
    use std::os::unix::process::ExitStatusExt;
    Ok(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)))
}

#[cfg(not(target_os = "linux"))]
fn run_here(_host: &Host, _spec: &super::Spec) -> anyhow::Result<i32> {
    anyhow::bail!("byomd runs commands in a sandbox on Linux only so far")
}
