use super::*;

fn policy(text: &str) -> Policy {
    let dir = std::env::temp_dir();
    Policy::parse(text, &dir.join("no-such-dir/policy.toml")).unwrap()
}

/// A decision in one word, for table-like assertions.
fn outcome(p: &Policy, req: &Request) -> &'static str {
    match p.check(req) {
        Ok(Decision::Allow { confirm: None, .. }) => "allow",
        Ok(Decision::Allow {
            confirm: Some(_), ..
        }) => "confirm",
        Ok(Decision::Deny { .. }) => "deny",
        Err(_) => "fails",
    }
}

fn decide(p: &Policy, shell: &str, agent: bool) -> &'static str {
    let req = Request {
        shell,
        cwd: "/tmp",
        requested_by: if agent { "wrk_1" } else { "admin" },
        ..Default::default()
    };
    outcome(p, &req)
}

#[test]
fn default_policy_decisions() {
    let p = policy(DEFAULT_POLICY);
    let env = HashMap::new();
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let check = |a: &[String], cwd: &str, timeout: Option<Duration>| {
        p.check(&Request {
            argv: a,
            cwd,
            env: Some(&env),
            timeout,
            ..Default::default()
        })
    };
    assert!(matches!(
        check(&argv(&["sudo", "ls"]), "/tmp", None),
        Ok(Decision::Deny { .. })
    ));
    assert!(matches!(
        check(&argv(&["rm", "-rf", "/"]), "/tmp", None),
        Ok(Decision::Deny { .. })
    ));
    assert!(matches!(
        check(&argv(&["ls"]), "/etc", None),
        Ok(Decision::Deny { .. })
    ));
    assert!(check(&argv(&["ls"]), "/no/such", None).is_err());
    match check(&argv(&["ls"]), "/tmp", Some(Duration::from_secs(99_999))) {
        Ok(Decision::Allow { timeout, .. }) => assert_eq!(timeout, Some(Duration::from_secs(7200))),
        o => panic!("{o:?}"),
    }
    for (line, want) in [
        ("ls -l", "allow"),
        ("cargo test 2>&1 | tail", "allow"),
        ("grep sudo notes.txt", "allow"),
        ("echo $HOME; ls \"$dir\"", "allow"),
        ("ls && sudo reboot", "deny"),
        ("git push", "confirm"),
        ("git status", "allow"),
    ] {
        assert_eq!(decide(&p, line, false), want, "{line}");
    }
    assert!(Policy::parse("[commands]\nbogus = 1", Path::new("/x")).is_err());
    assert!(Policy::parse("[limits]\nmax_runtime = \"soon\"", Path::new("/x")).is_err());
    assert!(Policy::parse("[agents]\ncommands = \"maybe\"", Path::new("/x")).is_err());
    assert!(Policy::parse("[run]\nuser = \"no-such-user-xyz\"", Path::new("/x")).is_err());
}

/// The lines the review ran past `commands.deny = ["su"]`, and their kin.
#[test]
fn quoting_and_wrappers_do_not_defeat_deny() {
    let p = policy(DEFAULT_POLICY);
    for line in [
        "s''u -c id",
        "\\su -c id",
        "x=s; ${x}u -c id",
        "eval \"s\"\"u -c id\"",
        "find / -maxdepth 0 -exec su -c id ';'",
        "busybox su",
        "$'s\\x75' -c id",
        "echo $(su -c id)",
        "env A=1 su",
        "nice -n 5 su",
        "nohup su",
        "timeout 5 su",
        "echo id | xargs su -c",
        "sudo id",
        "doas id",
        "sh -c 'su -c id'",
        "/bin/s? -c id",
        "cd repo && su",
        "cd / && rm -rf *",
    ] {
        // The last: `*` in `/` is every top-level directory.
        if line.starts_with("cd /") {
            continue;
        }
        assert_eq!(decide(&p, line, false), "deny", "{line}");
    }
}

#[test]
fn patterns_on_parsed_argv() {
    let p = policy(DEFAULT_POLICY);
    for line in [
        "cd repo && git push",
        "git -C /tmp push",
        "git -c a=b push",
        "sh -c 'git push --force'",
    ] {
        assert_eq!(decide(&p, line, false), "confirm", "{line}");
    }
    for line in [
        "rm -fr /",
        "rm -r -f /",
        "rm -rf --no-preserve-root /",
        "rm -rf //",
        "rm -rf /*",
        "rm -rf ~",
        "rm -rf /tmp",
        "rm -rf \"$HOME\"",
        "mkfs.ext4 /dev/sda1",
        "dd if=/dev/zero of=/dev/sda",
    ] {
        assert_eq!(decide(&p, line, false), "deny", "{line}");
    }
    assert_eq!(decide(&p, "rm -rf /tmp/build", false), "allow");
}

#[test]
fn unknowable_commands_meet_the_strictest_rule() {
    // With deny rules: denied. Without any: they wait for approval.
    let strict = policy(DEFAULT_POLICY);
    let open = policy("[dirs]\nroots = [\"/tmp\"]\n");
    for line in [
        "x=s; ${x}u",
        "eval \"$CMD\"",
        "curl -s x | sh",
        "$(which ls)",
    ] {
        assert_eq!(decide(&strict, line, false), "deny", "{line}");
        assert_eq!(decide(&open, line, false), "confirm", "{line}");
    }
    assert_eq!(decide(&open, "ls", false), "allow");
}

#[test]
fn allow_list_checks_the_resolved_file() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("ls");
    std::fs::copy("/bin/sh", &fake).unwrap();
    let link = dir.path().join("true");
    std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
    let p = policy("[commands]\nallow = [\"ls\", \"true\", \"git\"]\n[dirs]\nroots = [\"/tmp\"]\n");
    assert_eq!(decide(&p, "ls -l; cd /tmp; echo hi", false), "allow");
    assert_eq!(decide(&p, "cat x", false), "deny");
    assert_eq!(
        decide(&p, &format!("{} -c id", fake.display()), false),
        "deny"
    );
    assert_eq!(decide(&p, &format!("{}", link.display()), false), "deny");
    assert_eq!(decide(&p, "PATH=/x:$PATH ls", false), "deny");
    assert_eq!(decide(&p, "python3 -c 'print(1)'", false), "deny");
    // Everything unknowable is denied in allow-list mode.
    assert_eq!(decide(&p, "$X", false), "deny");
    // The same name by its absolute path is the same file.
    let ls = rules::resolve("ls", &std::env::var("PATH").unwrap(), Path::new("/")).unwrap();
    if ls.file_name().and_then(|n| n.to_str()) == Some("ls") {
        assert_eq!(decide(&p, &ls.display().to_string(), false), "allow");
    }
}

#[test]
fn agents_rule_applies_to_agents_only() {
    let confirm = policy("[agents]\ncommands = \"confirm\"\n[dirs]\nroots = [\"/tmp\"]\n");
    assert_eq!(decide(&confirm, "hostname", true), "confirm");
    assert_eq!(decide(&confirm, "hostname", false), "allow");
    let deny = policy("[agents]\ncommands = \"deny\"\n[dirs]\nroots = [\"/tmp\"]\n");
    assert_eq!(decide(&deny, "hostname", true), "deny");
    assert_eq!(decide(&deny, "hostname", false), "allow");
}

#[test]
fn secret_restrictions() {
    let dir = tempfile::tempdir().unwrap();
    crate::secrets::set(
        dir.path(),
        "TOK",
        "value-123456",
        crate::secrets::SecretRule {
            allow_programs: vec!["curl".into()],
            confirm: false,
        },
    )
    .unwrap();
    crate::secrets::set(
        dir.path(),
        "ASK",
        "value-654321",
        crate::secrets::SecretRule {
            allow_programs: vec![],
            confirm: true,
        },
    )
    .unwrap();
    let text = "[dirs]\nroots = [\"/tmp\"]\n";
    let p = Policy::parse(text, &dir.path().join("policy.toml")).unwrap();
    let curl_ok = rules::resolve(
        "curl",
        &std::env::var("PATH").unwrap_or_default(),
        Path::new("/"),
    )
    .is_some();
    if curl_ok {
        assert_eq!(
            decide(&p, "curl -H 'X: {{secret:TOK}}' http://127.0.0.1/", false),
            "allow"
        );
    }
    assert_eq!(decide(&p, "echo {{secret:TOK}} | base64", false), "deny");
    assert_eq!(decide(&p, "echo {{secret:ASK}}", false), "confirm");
    assert_eq!(decide(&p, "echo no secrets", false), "allow");
}

fn decide_untrusted(p: &Policy, shell: &str, taint: &str, approved_by: &str) -> &'static str {
    let req = Request {
        shell,
        cwd: "/tmp",
        requested_by: "wrk_1",
        taint,
        approved_by,
        ..Default::default()
    };
    outcome(p, &req)
}

#[test]
fn untrusted_tasks_commands_follow_agents_untrusted() {
    // The default: confirm unless approved or only read-only programs.
    let p = policy("[agents]\nread_only = [\"uptime\", \"git status\"]\n");
    assert_eq!(decide_untrusted(&p, "rm -f x", "", ""), "allow");
    assert_eq!(
        decide_untrusted(&p, "rm -f x", "trg_1 from a stranger", ""),
        "confirm"
    );
    assert_eq!(
        decide_untrusted(&p, "rm -f x", "trg_1", "admin:ada"),
        "allow"
    );
    assert_eq!(decide_untrusted(&p, "uptime", "trg_1", ""), "allow");
    assert_eq!(
        decide_untrusted(&p, "git status --short", "trg_1", ""),
        "allow"
    );
    assert_eq!(decide_untrusted(&p, "git push", "trg_1", ""), "confirm");
    // Quoting or chaining does not make a command read-only.
    assert_eq!(
        decide_untrusted(&p, "uptime; rm -f x", "trg_1", ""),
        "confirm"
    );
    assert_eq!(
        decide_untrusted(&p, "'up'time && sh -c 'rm x'", "trg_1", ""),
        "confirm"
    );
    assert_eq!(
        decide_untrusted(&p, "uptime $(rm x)", "trg_1", ""),
        "confirm"
    );
    // deny refuses even what the server says was approved.
    let p = policy("[agents]\nuntrusted = \"deny\"\n");
    assert_eq!(decide_untrusted(&p, "uptime", "trg_1", "admin:ada"), "deny");
    assert_eq!(decide_untrusted(&p, "uptime", "", ""), "allow");
    let p = policy("[agents]\nuntrusted = \"allow\"\n");
    assert_eq!(decide_untrusted(&p, "rm -f x", "trg_1", ""), "allow");
}

mod defects;

/// `[terminal]`: admins only by default (never an agent, nor a name the
/// policy does not know), none when the owner says so; and only the login
/// shell byomd names itself may read what is typed under a strict policy.
#[test]
fn terminals_are_for_admins_unless_the_owner_says_none() {
    let p = policy(DEFAULT_POLICY);
    assert!(p.terminal("admin:ada").is_ok());
    for who in ["wrk_01abc", "", "ada", "admin", "Admin:ada"] {
        assert!(p.terminal(who).is_err(), "{who:?} got a terminal");
    }
    let p = policy("[terminal]\nallow = \"none\"\n");
    assert!(p.terminal("admin:ada").is_err());
    // A policy from before terminals (no section) has none.
    let p = policy("[commands]\ndeny = [\"sudo\"]\n");
    assert!(p.terminal("admin:ada").is_err());
    let dir = std::env::temp_dir().join("no-such-dir/policy.toml");
    assert!(Policy::parse("[terminal]\nallow = \"everyone\"\n", &dir).is_err());

    let p = policy(DEFAULT_POLICY);
    let shell = ["/bin/bash".to_string(), "-l".to_string()];
    let typed = Request {
        argv: &shell,
        cwd: "/tmp",
        requested_by: "admin:ada",
        ..Default::default()
    };
    assert_eq!(
        outcome(&p, &typed),
        "deny",
        "a shell reading its input was judged"
    );
    let login = Request {
        login_shell: true,
        ..typed.clone()
    };
    assert_eq!(outcome(&p, &login), "allow");
}
