//! The owner's `[sandbox]` section of `policy.toml`: what a command may
//! touch. The server can neither read nor widen it; byomd turns it into a
//! `crate::sandbox::Spec` per command.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Paths no command may read (or write), whatever the write roots say.
/// `~` is the home directory, `{runtime}` the user's runtime directory
/// (`$XDG_RUNTIME_DIR`, else `/run/user/UID`): it holds the session bus
/// (through which `systemd-run --user` starts programs outside any
/// sandbox), the keyring and the agents' sockets. A `*` in the last part
/// matches names there when the command starts.
pub const DEFAULT_DENY_READ: &[&str] = &[
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.config/gh",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/Library/Keychains",
    "~/.mozilla",
    "~/.config/google-chrome",
    "~/.config/chromium",
    "~/.config/BraveSoftware",
    "~/Library/Application Support/Google/Chrome",
    "~/Library/Application Support/Firefox",
    "~/snap/firefox",
    "{runtime}",
    // Programs that run what whoever reaches their socket asks, outside
    // any sandbox: the session and system buses (systemd-run), systemd's
    // own socket, terminal multiplexers (send-keys), an editor's server,
    // container and VM engines, snapd; and the X11, SSH and GPG agents.
    "/run/user",
    "/run/dbus",
    "/run/systemd/private",
    "/tmp/tmux-*",
    "/tmp/vscode-*",
    "/tmp/kitty-*",
    "/tmp/nvim*",
    "~/.config/byomd*",
    "~/.cache/git/credential",
    "~/.colima",
    "~/.lima",
    "~/.rd",
    "/run/screen",
    "/tmp/screens",
    "/tmp/emacs*",
    "/tmp/.X11-unix",
    "/tmp/.ICE-unix",
    "/tmp/ssh-*",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd",
    "/run/podman",
    "/run/libvirt",
    "/run/snapd.socket",
    "/run/snapd-snap.socket",
    "/var/snap/lxd/common/lxd",
];

/// Directories of the lists above that byomd makes (empty, 0700, with
/// their parents) when they are missing, so that they are covered
/// from the first command on: a path that does not exist cannot be
/// covered, and whatever a command then created there (an ssh config, a
/// user service, an environment for the next login) would be read or run
/// outside the sandbox. `{uid}` is the user's id (tmux's socket dir).
pub const MADE_IF_MISSING: &[&str] = &[
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.config/gh",
    "~/.config/autostart",
    "~/.config/environment.d",
    "~/.config/systemd",
    "~/.config/git",
    "~/.config/fish",
    "~/.local/share/systemd",
    "~/.local/share/applications",
    "/tmp/tmux-{uid}",
];

/// Paths commands may read but never change, even under a write root:
/// files that run code outside the sandbox later (your shell's startup
/// files, user services, git's configuration). byomd's own binary is
/// always among them.
pub const DEFAULT_READ_ONLY: &[&str] = &[
    "~/.bashrc",
    "~/.bash_aliases",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.bash_logout",
    "~/.profile",
    "~/.zshrc",
    "~/.zshenv",
    "~/.zprofile",
    "~/.zlogin",
    "~/.config/fish",
    "~/.pam_environment",
    "~/.xprofile",
    "~/.xsession",
    "~/.xinitrc",
    "~/.config/autostart",
    "~/.config/environment.d",
    "~/.config/systemd",
    "~/.local/share/systemd",
    "~/Library/LaunchAgents",
    "~/.local/share/applications",
    "~/.gitconfig",
    "~/.config/git",
];

/// The network a command gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Net {
    /// Whatever the machine can reach.
    Allow,
    /// Nothing: its own network namespace with only a loopback of its own.
    Deny,
    /// TCP connections to these ports only (Landlock); UDP is not limited.
    Ports(Vec<u16>),
}

impl Net {
    /// Whether a command with this network could reach another machine.
    pub fn reaches_network(&self) -> bool {
        !matches!(self, Net::Deny)
    }

    pub fn describe(&self) -> String {
        match self {
            Net::Allow => "allowed".into(),
            Net::Deny => "denied (a loopback of its own)".into(),
            Net::Ports(p) => format!(
                "TCP to ports {} only",
                p.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
            ),
        }
    }
}

impl Serialize for Net {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Net::Allow => s.serialize_str("allow"),
            Net::Deny => s.serialize_str("deny"),
            Net::Ports(p) => p.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Net {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            Ports(Vec<u16>),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected \"allow\", \"deny\" or a list of TCP ports such as [443, 22]",
            )
        })? {
            Raw::Word(w) if w == "allow" => Ok(Net::Allow),
            Raw::Word(w) if w == "deny" => Ok(Net::Deny),
            Raw::Word(w) => Err(serde::de::Error::custom(format!(
                "{w:?}: expected \"allow\", \"deny\" or a list of TCP ports such as [443, 22]"
            ))),
            Raw::Ports(p) if p.is_empty() => Err(serde::de::Error::custom(
                "an empty list of ports: write \"deny\" for no network",
            )),
            Raw::Ports(p) if p.contains(&0) => {
                Err(serde::de::Error::custom("port 0 is not a port"))
            }
            Raw::Ports(p) => Ok(Net::Ports(p)),
        }
    }
}

/// The network per origin of a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkRules {
    /// Commands an admin runs (`byom exec`).
    pub admin: Net,
    /// Commands of agent tasks that read nothing untrusted.
    pub agent: Net,
    /// Commands of agent tasks that read untrusted text.
    pub untrusted: Net,
}

impl Default for NetworkRules {
    fn default() -> Self {
        NetworkRules {
            admin: Net::Allow,
            agent: Net::Allow,
            untrusted: Net::Deny,
        }
    }
}

/// Who a command comes from, as far as the sandbox cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Admin,
    Agent,
    Untrusted,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::Admin => "admin",
            Origin::Agent => "agent",
            Origin::Untrusted => "untrusted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxRules {
    /// Run every command in the sandbox. Off only if you must: then the
    /// command policy is the only thing between the server and this
    /// machine.
    pub enabled: bool,
    /// Refuse to run commands when the kernel cannot give the whole
    /// sandbox (`byomd doctor` says what is missing).
    pub required: bool,
    /// Where commands may write. Unset: the policy's `dirs.roots`, the
    /// command's working directory and a private temp dir. Entries may use
    /// `~`, `{roots}`, `{cwd}`.
    pub write: Option<Vec<String>>,
    pub deny_read: Vec<String>,
    pub read_only: Vec<String>,
    pub network: NetworkRules,
}

impl Default for SandboxRules {
    fn default() -> Self {
        SandboxRules {
            enabled: true,
            required: false,
            write: None,
            deny_read: DEFAULT_DENY_READ.iter().map(|s| s.to_string()).collect(),
            read_only: DEFAULT_READ_ONLY.iter().map(|s| s.to_string()).collect(),
            network: NetworkRules::default(),
        }
    }
}

impl SandboxRules {
    pub fn network(&self, origin: Origin) -> &Net {
        match origin {
            Origin::Admin => &self.network.admin,
            Origin::Agent => &self.network.agent,
            Origin::Untrusted => &self.network.untrusted,
        }
    }

    /// Checks what parsing cannot: paths are absolute or start with `~` or
    /// a known `{…}` token.
    pub fn validate(&self) -> Result<(), String> {
        let lists = [
            ("sandbox.write", self.write.as_deref().unwrap_or(&[])),
            ("sandbox.deny_read", &self.deny_read[..]),
            ("sandbox.read_only", &self.read_only[..]),
        ];
        for (key, list) in lists {
            for p in list {
                let ok = p.starts_with('/')
                    || p == "~"
                    || p.starts_with("~/")
                    || ["{roots}", "{cwd}", "{runtime}"]
                        .iter()
                        .any(|t| p == t || p.starts_with(&format!("{t}/")));
                if !ok {
                    return Err(format!(
                        "{key} {p:?}: paths must be absolute, or start with ~, {{roots}}, {{cwd}} or {{runtime}}"
                    ));
                }
                if p.split('/').any(|c| c == "..") {
                    return Err(format!("{key} {p:?}: no `..` in sandbox paths"));
                }
            }
        }
        Ok(())
    }

    /// One line for the policy summary.
    pub fn summary(&self) -> String {
        if !self.enabled {
            return "sandbox off".into();
        }
        let mut s = String::from("sandboxed");
        if self.required {
            s.push_str(" (required)");
        }
        if self.network.untrusted == Net::Deny {
            s.push_str(", no network for untrusted tasks");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Wrap {
        sandbox: SandboxRules,
    }

    fn parse(t: &str) -> Result<SandboxRules, String> {
        toml::from_str::<Wrap>(t)
            .map(|w| w.sandbox)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn network_takes_words_or_ports() {
        let r = parse(
            "[sandbox.network]\nadmin = \"deny\"\nagent = [443, 22]\nuntrusted = \"allow\"\n",
        )
        .unwrap();
        assert_eq!(r.network.admin, Net::Deny);
        assert_eq!(r.network.agent, Net::Ports(vec![443, 22]));
        assert_eq!(r.network.untrusted, Net::Allow);
        assert!(parse("[sandbox.network]\nadmin = \"maybe\"\n")
            .unwrap_err()
            .contains("expected"));
        assert!(parse("[sandbox.network]\nadmin = []\n")
            .unwrap_err()
            .contains("deny"));
        assert!(parse("[sandbox.network]\nadmin = [70000]\n").is_err());
    }

    #[test]
    fn defaults_hide_keys_and_keep_untrusted_offline() {
        let r = parse("[sandbox]\n").unwrap();
        assert!(r.enabled && !r.required);
        assert!(r.deny_read.iter().any(|p| p == "~/.ssh"));
        assert_eq!(r.network(Origin::Untrusted), &Net::Deny);
        assert_eq!(r.network(Origin::Admin), &Net::Allow);
        // A round trip through the file format keeps the meaning.
        let text = toml::to_string(&r).unwrap();
        let back: SandboxRules = toml::from_str(&text).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn relative_paths_are_refused() {
        let r = parse("[sandbox]\nwrite = [\"src\"]\n").unwrap();
        assert!(r.validate().unwrap_err().contains("absolute"));
        let r = parse("[sandbox]\ndeny_read = [\"~/../etc\"]\n").unwrap();
        assert!(r.validate().is_err());
        let r = parse("[sandbox]\nwrite = [\"{roots}\", \"{cwd}\", \"/srv\"]\n").unwrap();
        assert!(r.validate().is_ok());
    }
}
