//! The option syntax of programs that run their arguments as a command:
//! which options take a value, which end in a command line, which change
//! its environment or directory ([`Spec`]); and the programs whose command
//! no table can find ([`OPAQUE`]).

/// How a wrapper's options read, and what they do.
pub(super) struct Spec {
    /// Short options that take a value.
    pub(super) short_values: &'static str,
    /// Short options that do not.
    pub(super) short_flags: &'static str,
    pub(super) long_values: &'static [&'static str],
    pub(super) long_flags: &'static [&'static str],
    /// Any `--long[=value]` option is a flag (valgrind).
    pub(super) any_long: bool,
    /// Words between the options and the command (timeout's DURATION).
    pub(super) positionals: usize,
    /// `NAME=value` words before the command set its environment.
    pub(super) assignments: bool,
    /// `-5`-style numeric options (nice).
    pub(super) digits: bool,
    /// Options whose value is a shell line it runs (`flock -c`).
    pub(super) scripts: &'static [&'static str],
    /// Options whose value is `NAME=value` for the command's environment.
    pub(super) env: &'static [&'static str],
    /// Options after which it runs no command (`command -v`).
    pub(super) stops: &'static [&'static str],
    /// Options that make what it runs unknowable (`systemd-run -p`).
    pub(super) unknowable: &'static [&'static str],
    /// Options that change the directory the command runs in.
    pub(super) chdir: &'static [&'static str],
    /// With no command it starts a shell, which reads its input.
    pub(super) shell_if_empty: bool,
    /// The command's name may find another file than byomd's PATH does (a
    /// new root, a project's own bin directories).
    pub(super) relocates: bool,
    /// It runs a command only after one of these subcommands (`npm exec`).
    pub(super) subcommands: &'static [&'static str],
    /// The words after the options are not a command (`script FILE`).
    pub(super) no_command: bool,
}

pub(super) const NONE: Spec = Spec {
    short_values: "",
    short_flags: "",
    long_values: &[],
    long_flags: &[],
    any_long: false,
    positionals: 0,
    assignments: false,
    digits: false,
    scripts: &[],
    env: &[],
    stops: &[],
    unknowable: &[],
    chdir: &[],
    shell_if_empty: false,
    relocates: false,
    subcommands: &[],
    no_command: false,
};

/// Runs a project's programs (`npx`, `uv run`): options are its own.
pub(super) const RUNNER: Spec = Spec {
    relocates: true,
    ..NONE
};

/// Programs that run commands in ways no table here says (several values
/// per option, commands typed into terminals, jobs run later): what they
/// run is unknowable.
pub(super) const OPAQUE: &[&str] = &[
    "parallel",
    "sem",
    "screen",
    "dtach",
    "abduco",
    "at",
    "batch",
    "lldb",
    "bwrap",
    "firejail",
    "minijail0",
    "proot",
    "systemd-nspawn",
    "chpst",
    "start-stop-daemon",
    "envdir",
    "newgrp",
    "hyperfine",
    "watchexec",
    "nodemon",
    "mise",
    "rtx",
    "devbox",
    "nix-shell",
    "expect",
    "machinectl",
];

/// tmux commands that run nothing and read no file.
pub(super) const TMUX_SAFE: &[&str] = &[
    "ls",
    "list-sessions",
    "list-windows",
    "lsw",
    "list-panes",
    "lsp",
    "list-clients",
    "lsc",
    "list-buffers",
    "lsb",
    "show-buffer",
    "showb",
    "kill-session",
    "kill-server",
    "kill-window",
    "killw",
    "kill-pane",
    "killp",
    "has-session",
    "has",
    "capture-pane",
    "capturep",
    "select-window",
    "selectw",
    "select-pane",
    "selectp",
    "rename-session",
    "rename",
    "rename-window",
    "renamew",
];

/// The options of `npm exec`/`npx` that take a value.
const NPM_EXEC_VALUES: &[&str] = &[
    "package",
    "call",
    "prefix",
    "workspace",
    "registry",
    "cache",
];

pub(super) fn spec(name: &str) -> Option<Spec> {
    Some(match name {
        "env" => Spec {
            short_values: "uCS",
            short_flags: "i0v",
            long_values: &["unset", "chdir", "split-string"],
            long_flags: &[
                "ignore-environment",
                "null",
                "debug",
                "list-signal-handling",
                "default-signal",
                "ignore-signal",
                "block-signal",
            ],
            assignments: true,
            unknowable: &["S", "split-string"],
            chdir: &["C", "chdir"],
            ..NONE
        },
        "nice" => Spec {
            short_values: "n",
            long_values: &["adjustment"],
            digits: true,
            ..NONE
        },
        "nohup" | "builtin" | "eatmydata" | "catchsegv" | "nocache" => NONE,
        "timeout" => Spec {
            short_values: "sk",
            short_flags: "fv",
            long_values: &["signal", "kill-after"],
            long_flags: &["preserve-status", "foreground", "verbose"],
            positionals: 1,
            ..NONE
        },
        "stdbuf" => Spec {
            short_values: "ioe",
            long_values: &["input", "output", "error"],
            ..NONE
        },
        "setsid" => Spec {
            short_flags: "cfw",
            long_flags: &["ctty", "fork", "wait"],
            ..NONE
        },
        "ionice" => Spec {
            short_values: "cnpPu",
            short_flags: "t",
            long_values: &["class", "classdata", "pid", "pgid", "uid"],
            long_flags: &["ignore"],
            stops: &["p", "P", "u", "pid", "pgid", "uid"],
            ..NONE
        },
        "taskset" => Spec {
            short_flags: "acp",
            long_flags: &["all-tasks", "cpu-list", "pid"],
            positionals: 1,
            stops: &["p", "pid"],
            ..NONE
        },
        "chrt" => Spec {
            short_values: "TPD",
            short_flags: "bdfioramRpv",
            long_values: &["sched-runtime", "sched-period", "sched-deadline"],
            long_flags: &[
                "batch",
                "deadline",
                "fifo",
                "idle",
                "other",
                "rr",
                "all-tasks",
                "max",
                "pid",
                "reset-on-fork",
                "verbose",
            ],
            positionals: 1,
            stops: &["p", "pid", "m", "max"],
            ..NONE
        },
        "time" => Spec {
            short_values: "fo",
            short_flags: "pavq",
            long_values: &["format", "output"],
            long_flags: &["portability", "append", "verbose", "quiet"],
            ..NONE
        },
        "exec" => Spec {
            short_values: "a",
            short_flags: "cl",
            ..NONE
        },
        "command" => Spec {
            short_flags: "pvV",
            stops: &["v", "V"],
            ..NONE
        },
        "chroot" => Spec {
            long_values: &["userspec", "groups"],
            long_flags: &["skip-chdir"],
            positionals: 1,
            shell_if_empty: true,
            relocates: true,
            ..NONE
        },
        "sudo" => Spec {
            short_values: "ugCDprtTUR",
            short_flags: "AbEeHiKklnPSsVvBN",
            long_values: &[
                "user",
                "group",
                "close-from",
                "chdir",
                "prompt",
                "role",
                "type",
                "command-timeout",
                "other-user",
                "chroot",
                "host",
            ],
            long_flags: &[
                "askpass",
                "background",
                "preserve-env",
                "edit",
                "set-home",
                "login",
                "reset-timestamp",
                "remove-timestamp",
                "list",
                "non-interactive",
                "preserve-groups",
                "stdin",
                "shell",
                "validate",
                "bell",
                "no-update",
            ],
            assignments: true,
            stops: &["e", "edit", "l", "list", "v", "validate", "V", "k", "K"],
            chdir: &["D", "chdir"],
            ..NONE
        },
        "doas" => Spec {
            short_values: "uC",
            short_flags: "nsL",
            stops: &["C", "L"],
            ..NONE
        },
        "pkexec" => Spec {
            long_values: &["user"],
            long_flags: &["disable-internal-agent", "keep-cwd"],
            ..NONE
        },
        "xargs" => Spec {
            short_values: "adEILnPs",
            short_flags: "0rtpxoeil",
            long_values: &[
                "arg-file",
                "delimiter",
                "eof",
                "max-lines",
                "max-args",
                "max-procs",
                "max-chars",
                "process-slot-var",
            ],
            long_flags: &[
                "null",
                "no-run-if-empty",
                "verbose",
                "interactive",
                "exit",
                "open-tty",
                "show-limits",
                "replace",
            ],
            ..NONE
        },
        "watch" => Spec {
            short_values: "nq",
            short_flags: "bcdegptwxr",
            long_values: &["interval", "equexit"],
            long_flags: &[
                "beep",
                "color",
                "no-color",
                "differences",
                "errexit",
                "chgexit",
                "precise",
                "no-title",
                "no-wrap",
                "exec",
                "no-rerun",
            ],
            ..NONE
        },
        // `flock [options] FILE -c LINE` or `flock [options] FILE CMD…`
        // (options stop at FILE; `-c` before it is an error).
        "flock" => Spec {
            short_values: "wE",
            short_flags: "sxeunoFv",
            long_values: &["timeout", "wait", "conflict-exit-code"],
            long_flags: &[
                "shared",
                "exclusive",
                "unlock",
                "nonblock",
                "nb",
                "close",
                "no-fork",
                "verbose",
            ],
            positionals: 1,
            ..NONE
        },
        "unshare" => Spec {
            short_values: "RwSG",
            short_flags: "muinpUCTfrc",
            long_values: &[
                "propagation",
                "setgroups",
                "root",
                "wd",
                "setuid",
                "setgid",
                "monotonic",
                "boottime",
                "map-user",
                "map-group",
                "map-users",
                "map-groups",
            ],
            long_flags: &[
                "mount",
                "uts",
                "ipc",
                "net",
                "pid",
                "user",
                "cgroup",
                "time",
                "fork",
                "kill-child",
                "mount-proc",
                "map-root-user",
                "map-current-user",
                "map-auto",
                "keep-caps",
            ],
            chdir: &["w", "wd"],
            shell_if_empty: true,
            relocates: true,
            ..NONE
        },
        "nsenter" => Spec {
            short_values: "tSGW",
            short_flags: "amuinpUCTrwFZec",
            long_values: &["target", "setuid", "setgid", "wdns"],
            long_flags: &[
                "all",
                "mount",
                "uts",
                "ipc",
                "net",
                "pid",
                "user",
                "cgroup",
                "time",
                "root",
                "wd",
                "preserve-credentials",
                "no-fork",
                "follow-context",
                "env",
                "join-cgroup",
            ],
            shell_if_empty: true,
            relocates: true,
            ..NONE
        },
        "systemd-run" => Spec {
            short_values: "upEMH",
            short_flags: "tPqGSrd",
            long_values: &[
                "unit",
                "property",
                "description",
                "slice",
                "setenv",
                "uid",
                "gid",
                "nice",
                "working-directory",
                "host",
                "machine",
                "service-type",
                "on-active",
                "on-boot",
                "on-startup",
                "on-unit-active",
                "on-unit-inactive",
                "on-calendar",
                "timer-property",
                "path-property",
                "socket-property",
            ],
            long_flags: &[
                "user",
                "system",
                "scope",
                "pty",
                "pipe",
                "quiet",
                "collect",
                "shell",
                "wait",
                "remain-after-exit",
                "no-block",
                "same-dir",
                "no-ask-password",
                "send-sighup",
                "on-clock-change",
                "on-timezone-change",
            ],
            env: &["E", "setenv"],
            // Unit properties can start other programs (ExecStartPre=).
            unknowable: &[
                "p",
                "property",
                "S",
                "shell",
                "timer-property",
                "path-property",
                "socket-property",
            ],
            relocates: true,
            ..NONE
        },
        "setpriv" => Spec {
            short_flags: "d",
            long_values: &[
                "reuid",
                "regid",
                "ruid",
                "euid",
                "rgid",
                "egid",
                "groups",
                "inh-caps",
                "ambient-caps",
                "bounding-set",
                "securebits",
                "pdeathsig",
                "selinux-label",
                "apparmor-profile",
                "landlock-access",
                "landlock-rule",
                "seccomp-filter",
            ],
            long_flags: &[
                "clear-groups",
                "keep-groups",
                "init-groups",
                "nnp",
                "no-new-privs",
                "reset-env",
                "dump",
            ],
            stops: &["d", "dump"],
            ..NONE
        },
        "script" => Spec {
            short_values: "cEBIOTmo",
            short_flags: "aefqt",
            long_values: &[
                "command",
                "echo",
                "log-io",
                "log-in",
                "log-out",
                "log-timing",
                "logging-format",
                "output-limit",
            ],
            long_flags: &["append", "return", "flush", "force", "quiet", "timing"],
            scripts: &["c", "command"],
            positionals: 1,
            shell_if_empty: true,
            no_command: true,
            ..NONE
        },
        "sshpass" => Spec {
            short_values: "pfdP",
            short_flags: "ev",
            ..NONE
        },
        "strace" => Spec {
            short_values: "abeEIoOpPsSuUX",
            short_flags: "cCdDfFhiknqrtTvVwxyYzZ",
            long_values: &[
                "output",
                "attach",
                "trace",
                "signal",
                "status",
                "user",
                "env",
                "string-limit",
                "columns",
                "trace-path",
            ],
            long_flags: &[
                "follow-forks",
                "output-separately",
                "summary-only",
                "summary",
                "no-abbrev",
                "verbose",
                "quiet",
                "instruction-pointer",
                "stack-trace",
                "timestamps",
                "relative-timestamps",
                "syscall-times",
                "decode-fds",
            ],
            env: &["E", "env"],
            stops: &["p", "attach"],
            ..NONE
        },
        "ltrace" => Spec {
            short_values: "aAeFlnopsuwxD",
            short_flags: "bcCfhiLrStTV",
            stops: &["p"],
            ..NONE
        },
        "valgrind" => Spec {
            short_flags: "qvhd",
            any_long: true,
            ..NONE
        },
        "fakeroot" => Spec {
            short_values: "sib",
            short_flags: "uh",
            long_values: &["lib", "faked"],
            long_flags: &["unknown-is-real"],
            unknowable: &["lib", "faked"],
            shell_if_empty: true,
            ..NONE
        },
        "unbuffer" => Spec {
            short_flags: "p",
            ..NONE
        },
        "chronic" => Spec {
            short_flags: "ev",
            ..NONE
        },
        "ifne" => Spec {
            short_flags: "n",
            ..NONE
        },
        "torsocks" => Spec {
            short_values: "upaP",
            short_flags: "idq",
            ..NONE
        },
        "proxychains" | "proxychains4" => Spec {
            short_values: "f",
            short_flags: "q",
            ..NONE
        },
        "caffeinate" => Spec {
            short_values: "tw",
            short_flags: "dimsu",
            ..NONE
        },
        "ssh-agent" => Spec {
            short_values: "aEOPt",
            short_flags: "cdDsk",
            stops: &["k"],
            ..NONE
        },
        "tini" => Spec {
            short_values: "pe",
            short_flags: "hsvwgl",
            ..NONE
        },
        "dumb-init" => Spec {
            short_values: "r",
            short_flags: "cvV",
            long_values: &["rewrite"],
            long_flags: &["single-child", "verbose", "version"],
            ..NONE
        },
        "numactl" => Spec {
            short_values: "ipmNCwP",
            short_flags: "albsH",
            long_values: &[
                "interleave",
                "preferred",
                "membind",
                "cpunodebind",
                "physcpubind",
                "weighted-interleave",
                "preferred-many",
            ],
            long_flags: &["all", "localalloc", "balancing", "show", "hardware"],
            ..NONE
        },
        "cgexec" => Spec {
            short_values: "g",
            long_flags: &["sticky"],
            ..NONE
        },
        "dbus-run-session" => Spec {
            long_values: &["config-file", "dbus-daemon"],
            unknowable: &["dbus-daemon"],
            ..NONE
        },
        "daemonize" => Spec {
            short_values: "ceopluE",
            short_flags: "av",
            env: &["E"],
            chdir: &["c"],
            ..NONE
        },
        "su-exec" | "gosu" | "setuidgid" => Spec {
            positionals: 1,
            ..NONE
        },
        "entr" => Spec {
            short_flags: "acdnprz",
            // `entr -s LINE` runs the line with $SHELL.
            unknowable: &["s"],
            ..NONE
        },
        "npx" | "bunx" => Spec {
            short_values: "pc",
            short_flags: "yq",
            long_values: NPM_EXEC_VALUES,
            long_flags: &["yes", "no", "quiet", "bun", "silent"],
            scripts: &["c", "call"],
            ..RUNNER
        },
        "npm" => Spec {
            short_values: "pcw",
            short_flags: "yq",
            long_values: NPM_EXEC_VALUES,
            long_flags: &["yes", "no", "quiet", "workspaces", "include-workspace-root"],
            scripts: &["c", "call"],
            subcommands: &["exec", "x"],
            ..RUNNER
        },
        "pnpm" => Spec {
            short_flags: "r",
            long_values: &["filter", "resume-from", "package", "workspace-concurrency"],
            long_flags: &["recursive", "parallel", "silent", "report-summary"],
            subcommands: &["exec", "dlx"],
            ..RUNNER
        },
        "yarn" => Spec {
            long_values: &["package"],
            long_flags: &["quiet"],
            subcommands: &["exec", "dlx"],
            ..RUNNER
        },
        "bun" => Spec {
            long_flags: &["bun", "silent"],
            subcommands: &["x"],
            ..RUNNER
        },
        "uvx" | "uv" => Spec {
            short_values: "pf",
            short_flags: "qvnU",
            long_values: &[
                "from",
                "with",
                "with-editable",
                "with-requirements",
                "python",
                "index",
                "default-index",
                "index-url",
                "extra-index-url",
                "find-links",
                "directory",
                "project",
                "package",
                "group",
                "extra",
                "cache-dir",
                "color",
                "python-preference",
            ],
            long_flags: &[
                "quiet",
                "verbose",
                "no-cache",
                "isolated",
                "offline",
                "native-tls",
                "no-config",
                "no-progress",
                "no-python-downloads",
                "refresh",
                "no-index",
                "upgrade",
                "no-sync",
                "locked",
                "frozen",
                "all-extras",
                "no-dev",
                "dev",
                "active",
                "no-project",
                "no-env-file",
                "all-packages",
                "all-groups",
                "exact",
                "managed-python",
                "no-managed-python",
            ],
            // `--env-file` sets variables nobody sees; `-m` runs a module.
            stops: &["m", "module", "script"],
            unknowable: &["env-file"],
            chdir: &["directory"],
            subcommands: if name == "uv" { &["run"] } else { &[] },
            ..RUNNER
        },
        "pipx" => Spec {
            long_values: &["spec", "python", "pip-args", "index-url"],
            long_flags: &["no-cache", "verbose", "quiet", "editable"],
            subcommands: &["run"],
            ..RUNNER
        },
        "poetry" | "pipenv" | "pdm" | "hatch" | "rye" => Spec {
            subcommands: &["run"],
            ..RUNNER
        },
        "conda" | "mamba" | "micromamba" => Spec {
            short_values: "np",
            short_flags: "v",
            long_values: &["name", "prefix", "cwd"],
            long_flags: &["no-capture-output", "live-stream", "debug", "dev"],
            chdir: &["cwd"],
            subcommands: &["run"],
            ..RUNNER
        },
        "bundle" | "bundler" => Spec {
            long_values: &["gemfile"],
            long_flags: &["keep-file-descriptors"],
            subcommands: &["exec"],
            ..RUNNER
        },
        "rbenv" | "pyenv" | "nodenv" | "goenv" | "jenv" | "asdf" => Spec {
            subcommands: &["exec"],
            ..RUNNER
        },
        "rustup" => Spec {
            long_flags: &["install"],
            positionals: 1,
            subcommands: &["run"],
            ..RUNNER
        },
        "direnv" => Spec {
            positionals: 1,
            subcommands: &["exec"],
            ..RUNNER
        },
        "xcrun" => Spec {
            long_values: &["sdk", "toolchain"],
            long_flags: &["log", "no-cache", "kill-cache", "verbose", "run"],
            short_flags: "lnkvr",
            stops: &["f", "find"],
            ..RUNNER
        },
        _ => return None,
    })
}
