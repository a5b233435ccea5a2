//! Planning a command: the local policy's verdict (re-read if its file
//! changed), the OS sandbox it gets, and its `{{secret:NAME}}` handles
//! replaced by values. A [`Plan`] is all [`super::process`] needs to start
//! it; a refusal becomes the command's exit record without a process.

use std::collections::HashMap;
use std::time::Duration;

use byom_protocol::pb::{self, CommandState};

use super::{Plan, Runner};
use crate::policy::Decision;

#[cfg(target_os = "linux")]
type SandboxSpec = crate::sandbox::Spec;
#[cfg(not(target_os = "linux"))]
type SandboxSpec = ();

impl Runner {
    /// Asks the policy (re-read if the file changed) about a command, then
    /// puts secret values in place of their handles.
    /// `login_shell`: byomd named the program (a terminal's login shell).
    pub(super) fn plan(
        &self,
        req: &pb::ExecRequest,
        login_shell: bool,
    ) -> Result<Plan, (CommandState, String)> {
        let timeout = (req.timeout_ms > 0).then(|| Duration::from_millis(req.timeout_ms));
        let (cwd, timeout, scrub, confirm, run_as, sandbox_rules) = {
            let Ok(mut guard) = self.policy.lock() else {
                return Err((CommandState::Failed, "daemon policy state poisoned".into()));
            };
            match guard.as_mut() {
                None => (
                    (!req.cwd.is_empty()).then(|| std::path::PathBuf::from(&req.cwd)),
                    timeout,
                    Vec::new(),
                    None,
                    None,
                    None,
                ),
                Some(policy) => {
                    if let Some(e) = policy.reload_if_changed() {
                        tracing::error!(
                            "policy change ignored, keeping the previous policy: {e:#}"
                        );
                    }
                    if req.tty {
                        policy.terminal(&req.requested_by).map_err(|why| {
                            (
                                CommandState::Denied,
                                format!("denied by local policy: {why}"),
                            )
                        })?;
                    }
                    let r = crate::policy::Request {
                        argv: &req.argv,
                        shell: &req.shell,
                        cwd: &req.cwd,
                        env: Some(&req.env),
                        stdin: &req.stdin,
                        timeout,
                        requested_by: &req.requested_by,
                        taint: match (req.tainted, req.taint.is_empty()) {
                            (false, _) => "",
                            (true, true) => "no reason given",
                            (true, false) => &req.taint,
                        },
                        approved_by: &req.approved_by,
                        login_shell: login_shell && req.tty,
                    };
                    match policy.check(&r) {
                        Ok(Decision::Allow {
                            cwd,
                            timeout,
                            scrub,
                            confirm,
                            run_as,
                        }) => (
                            Some(cwd),
                            timeout,
                            scrub,
                            confirm,
                            run_as,
                            Some((
                                policy.file.sandbox.clone(),
                                policy.file.dirs.roots.clone(),
                                policy.path.display().to_string(),
                            )),
                        ),
                        Ok(Decision::Deny { rule }) => {
                            return Err((
                                CommandState::Denied,
                                format!("denied by local policy: {rule}"),
                            ))
                        }
                        Err(msg) => return Err((CommandState::Failed, msg)),
                    }
                }
            }
        };
        let origin = match (req.requested_by.starts_with("wrk_"), req.tainted) {
            (false, _) => crate::sandbox::Origin::Admin,
            // A person approved this very command: it gets what a trusted
            // task's would (the approval is the Rule of Two's way out).
            (true, true) if req.approved_by.is_empty() => crate::sandbox::Origin::Untrusted,
            (true, _) => crate::sandbox::Origin::Agent,
        };
        let (sandbox, network, sandbox_level) = match (&sandbox_rules, &cwd) {
            (Some((rules, roots, file)), Some(cwd)) => self.sandbox_for(
                rules,
                roots,
                file,
                origin,
                cwd,
                run_as.as_ref(),
                &req.command_id,
            )?,
            _ => (None, true, "none (no local policy)".to_string()),
        };
        #[cfg(not(target_os = "linux"))]
        let _ = sandbox;
        let uses_secrets = |s: &str| s.contains("{{secret:");
        let any = req.argv.iter().any(|a| uses_secrets(a))
            || uses_secrets(&req.shell)
            || req.env.values().any(|v| uses_secrets(v))
            || String::from_utf8_lossy(&req.stdin).contains("{{secret:");
        let secrets = match &self.config_dir {
            Some(d) => crate::secrets::load_values(d)
                .map_err(|e| (CommandState::Failed, format!("cannot read secrets: {e:#}")))?,
            None => Default::default(),
        };
        let sub = |s: &str| {
            crate::secrets::substitute(s, &secrets).map_err(|e| (CommandState::Failed, e))
        };
        let (argv, shell, env, stdin) = if any {
            let argv = req
                .argv
                .iter()
                .map(|a| sub(a))
                .collect::<Result<Vec<_>, _>>()?;
            let shell = sub(&req.shell)?;
            let env = req
                .env
                .iter()
                .map(|(k, v)| Ok((k.clone(), sub(v)?)))
                .collect::<Result<HashMap<_, _>, (CommandState, String)>>()?;
            let stdin = match std::str::from_utf8(&req.stdin) {
                Ok(t) if t.contains("{{secret:") => sub(t)?.into_bytes(),
                _ => req.stdin.clone(),
            };
            (argv, shell, env, stdin)
        } else {
            (
                req.argv.clone(),
                req.shell.clone(),
                req.env.clone(),
                req.stdin.clone(),
            )
        };
        Ok(Plan {
            cwd,
            timeout,
            scrub,
            argv,
            shell,
            env,
            stdin,
            secrets,
            confirm,
            run_as,
            config_dir: self.config_dir.clone(),
            #[cfg(target_os = "linux")]
            sandbox,
            network,
            sandbox_level,
        })
    }

    /// The sandbox a command gets: (its spec, whether it could reach the
    /// network, the level as shown). Err when the owner's rules refuse it.
    #[allow(clippy::too_many_arguments)]
    fn sandbox_for(
        &self,
        rules: &crate::sandbox::SandboxRules,
        roots: &[String],
        file: &str,
        origin: crate::sandbox::Origin,
        cwd: &std::path::Path,
        run_as: Option<&crate::policy::RunAs>,
        id: &str,
    ) -> Result<(Option<SandboxSpec>, bool, String), (CommandState, String)> {
        #[cfg(target_os = "linux")]
        let host = match &self.sandbox {
            Some(h) => h,
            None => return Ok((None, true, "none (run without a sandbox helper)".into())),
        };
        #[cfg(target_os = "linux")]
        let level = host.level(rules);
        #[cfg(not(target_os = "linux"))]
        let level = crate::sandbox::Support::default().level(rules);
        if rules.required && !level.is_full() {
            return Err((
                CommandState::Denied,
                format!("denied by local policy: sandbox.required = true, but the sandbox here is {level} ({file})"),
            ));
        }
        if matches!(level, crate::sandbox::Level::None(_)) {
            return Ok((None, true, level.to_string()));
        }
        #[cfg(target_os = "linux")]
        {
            let spec = host
                .plan(&crate::sandbox::host::Request {
                    rules,
                    origin,
                    roots,
                    cwd,
                    config_dir: self
                        .config_dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new("/nonexistent")),
                    run_as,
                    command_id: id,
                })
                .map_err(|e| {
                    (
                        CommandState::Denied,
                        format!("denied by local policy: {e} ({file})"),
                    )
                })?;
            let network = !(spec.net_ns || spec.deny_sockets);
            let mut spec = spec;
            spec.observe_net = network && spec.seccomp;
            Ok((Some(spec), network, level.to_string()))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (roots, origin, cwd, run_as, id);
            Ok((None, true, level.to_string()))
        }
    }
}
