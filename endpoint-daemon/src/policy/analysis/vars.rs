//! Environment variables that change what a command runs. Three kinds:
//! those that make a shell, the loader or git run code the command does
//! not show (unknowable under any policy); those whose value is a command
//! some program runs (`GIT_PAGER`, `EDITOR`: analysed as a shell line);
//! and those that change which file a name runs or what an interpreter
//! loads (`PATH`, `LD_LIBRARY_PATH`, `NODE_OPTIONS`: only an allow-list,
//! which vouches for files, is defeated by them).

/// Whether setting variable `name` can make a shell, the loader or git run
/// code the command line does not show.
pub fn hijacks(name: &str) -> bool {
    HIJACKING.contains(&name)
        || name.starts_with("BASH_FUNC_")
        || name.starts_with("GIT_CONFIG_KEY_")
        || name.starts_with("GIT_CONFIG_VALUE_")
}

const HIJACKING: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "ZDOTDIR",
    "LD_PRELOAD",
    "LD_AUDIT",
    "DYLD_INSERT_LIBRARIES",
    "GCONV_PATH",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "BASH_LOADABLES_PATH",
    "BASH_CMDS",
    "BASH_ALIASES",
    // git's own configuration and programs: aliases, pagers, hooks.
    "GIT_EXEC_PATH",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    // less runs `|cmd` filters; tar and zip take options that run commands.
    "LESSOPEN",
    "LESSCLOSE",
    "TAR_OPTIONS",
    "ZIPOPT",
];

/// Whether the value of `name` is a shell command some program runs (git,
/// a pager, an editor, ssh): it is analysed as a line of its own.
pub fn runs_value(name: &str) -> bool {
    RUN_VALUE.contains(&name)
}

const RUN_VALUE: &[&str] = &[
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_ASKPASS",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "PAGER",
    "MANPAGER",
    "SYSTEMD_PAGER",
    "PERLDOC_PAGER",
    "EDITOR",
    "VISUAL",
    "FCEDIT",
    "BROWSER",
    "RSYNC_RSH",
    "CVS_RSH",
];

/// Whether setting `name` can change which file a program name runs, or
/// make an allowed program load code nobody listed.
pub fn relocates(name: &str) -> bool {
    RELOCATING.contains(&name)
        || hijacks(name)
        || runs_value(name)
        || name.starts_with("LD_")
        || name.starts_with("DYLD_")
}

const RELOCATING: &[&str] = &[
    "PATH",
    "HOME",
    "CDPATH",
    "IFS",
    "EXECIGNORE",
    "SHELL",
    "FPATH",
    "GLIBC_TUNABLES",
    "PERLLIB",
    "PERL5LIB",
    "PERL5OPT",
    "PERL5DB",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "PYTHONEXECUTABLE",
    "PYTHONPLATLIBDIR",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_TEMPLATE_DIR",
    "GIT_CEILING_DIRECTORIES",
    "NODE_OPTIONS",
    "NODE_PATH",
    "RUBYOPT",
    "RUBYLIB",
    "LUA_INIT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "XDG_CONFIG_HOME",
    "XDG_DATA_DIRS",
    "LOCPATH",
];
