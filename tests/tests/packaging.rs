//! What packages ship beside the binaries, made by the real binaries:
//! shell completions (`byom completions SHELL`, `byomd completions SHELL`)
//! that a real bash completes with, man pages (`byom man --dir`) that
//! groff reads without a warning, one per subcommand; and the release
//! directory installers/release.sh makes from binaries already built
//! (`--from DIR`, or a native `--profile release --no-build`), laid out as
//! `byom server --dist` serves it, with those pages and scripts inside
//! the .deb, the .rpm and the .tar.gz.

use std::path::Path;
use std::process::{Command, Output};

use byom_tests::{bin, stderr, stdout, Server};

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("run");
    assert!(o.status.success(), "{cmd:?}: {}{}", stdout(&o), stderr(&o));
    o
}

/// The subcommands `PROG ARGS --help` lists (its "Commands:" section).
fn subcommands(prog: &str, args: &[&str]) -> Vec<String> {
    let o = run(Command::new(bin(prog)).args(args).arg("--help"));
    stdout(&o)
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn completion_scripts_for_every_shell_name_the_real_subcommands() {
    for (prog, names) in [
        ("byom", ["machines", "token", "webhook"]),
        ("byomd", ["pair", "unpair", "service"]),
    ] {
        for shell in ["bash", "zsh", "fish", "powershell"] {
            let o = run(Command::new(bin(prog)).args(["completions", shell]));
            let script = stdout(&o);
            assert!(script.len() > 1000, "{prog} {shell}: {script}");
            for n in names {
                assert!(script.contains(n), "{prog} {shell} lacks {n}");
            }
        }
    }
    let o = Command::new(bin("byom"))
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bash"), "{}", stderr(&o));
}

/// What bash offers for `LINE<TAB>` with `PROG`'s completion script
/// loaded, as bash's programmable completion calls it.
fn bash_completes(dir: &Path, prog: &str, words: &[&str]) -> Vec<String> {
    let script = dir.join(format!("{prog}.bash"));
    let o = run(Command::new(bin(prog)).args(["completions", "bash"]));
    std::fs::write(&script, &o.stdout).unwrap();
    // The function is whatever `complete -p` says handles PROG; bounded
    // by timeout(1) like every process a test waits on.
    let sim = r#"
        source "$1"; shift
        spec=$(complete -p "$1") || exit 3
        fn=${spec#*-F }; fn=${fn%% *}
        COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
        COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
        "$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
        printf '%s\n' "${COMPREPLY[@]}"
    "#;
    let o = run(Command::new("timeout")
        .args(["20", "bash", "--norc", "--noprofile", "-c", sim, "sim"])
        .arg(&script)
        .args(words));
    stdout(&o)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completes_subcommands_with_the_script_byom_prints() {
    let dir = tempfile::tempdir().unwrap();
    let got = bash_completes(dir.path(), "byom", &["byom", "ma"]);
    assert!(got.contains(&"machines".to_string()), "{got:?}");
    assert!(got.iter().all(|w| w.starts_with("ma")), "{got:?}");
    assert_eq!(
        bash_completes(dir.path(), "byom", &["byom", "machi"]),
        ["machines"]
    );
    assert_eq!(
        bash_completes(dir.path(), "byom", &["byom", "machines", "rev"]),
        ["revoke"]
    );
    assert_eq!(
        bash_completes(dir.path(), "byomd", &["byomd", "unp"]),
        ["unpair"]
    );
}

/// Reads a man page as `man` does (preconv for UTF-8, the man macros),
/// with every warning on: none may come.
fn check_roff(page: &Path) {
    let text = std::fs::read_to_string(page).unwrap();
    assert!(
        text.starts_with(".ie") || text.starts_with(".TH"),
        "{}",
        page.display()
    );
    assert!(text.contains(".TH ") && text.contains(".SH NAME"), "{text}");
    let o = run(Command::new("groff")
        .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
        .arg(page));
    assert!(
        o.stderr.is_empty(),
        "groff on {}: {}",
        page.display(),
        stderr(&o)
    );
}

#[test]
fn man_pages_are_valid_roff_one_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    for prog in ["byom", "byomd"] {
        let out = dir.path().join(prog);
        run(Command::new(bin(prog)).args(["man", "--dir"]).arg(&out));
        let pages: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        // Two levels deep, as the CLI's --help lists them.
        let mut want = vec![format!("{prog}.1")];
        for sub in subcommands(prog, &[]) {
            want.push(format!("{prog}-{sub}.1"));
            for leaf in subcommands(prog, &[&sub]) {
                want.push(format!("{prog}-{sub}-{leaf}.1"));
            }
        }
        assert!(want.len() > 20, "{want:?}");
        for w in &want {
            assert!(pages.contains(w), "{prog}: no {w} in {pages:?}");
        }
        for p in &pages {
            assert!(p.ends_with(".1"), "{p}");
            check_roff(&out.join(p));
        }
        // Without --dir, the top page on stdout.
        let o = run(Command::new(bin(prog)).arg("man"));
        assert!(stdout(&o).contains(".TH"), "{}", stdout(&o));
    }
    let text = std::fs::read_to_string(dir.path().join("byomd/byomd-unpair.1")).unwrap();
    assert!(text.contains("\\-\\-force"), "{text}");
}

/// installers/release.sh with `args`; its output on failure.
fn release(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut c = Command::new("bash");
    c.arg(root.join("installers/release.sh"))
        .args(args)
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run release.sh")
}

fn list(cmd: &mut Command) -> Vec<String> {
    stdout(&run(cmd)).lines().map(str::to_string).collect()
}

#[test]
fn release_packages_built_binaries_with_man_pages_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let (os, arch) = byom_protocol::manifest::this_platform();
    let v = byom_protocol::VERSION;

    // `cargo build --release` puts this machine's binaries in
    // target/release, not target/TRIPLE/release: a native release
    // without a build packages those. (A target dir of the test's own,
    // holding the debug byomd under that name.)
    let target = dir.path().join("target");
    std::fs::create_dir_all(target.join("release")).unwrap();
    std::os::unix::fs::symlink(bin("byomd"), target.join("release/byomd")).unwrap();
    let out = dir.path().join("native");
    let o = release(
        &[
            "--profile",
            "release",
            "--targets",
            "native",
            "--no-build",
            "--programs",
            "byomd",
            "--compress",
            "gzip",
            "--out",
        ]
        .iter()
        .copied()
        .chain([out.to_str().unwrap()])
        .collect::<Vec<_>>(),
        &[("CARGO_TARGET_DIR", &target)],
    );
    assert!(
        o.status.success(),
        "release.sh: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(out.join(format!("byomd-{v}-{os}-{arch}")).exists());

    // --from: whatever directory holds the binaries (here the tests' own).
    let out = dir.path().join("dist");
    let from = bin("byomd").parent().unwrap().to_path_buf();
    let o = release(
        &[
            "--from",
            from.to_str().unwrap(),
            "--compress",
            "gzip",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        o.status.success(),
        "release.sh: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let manifest = std::fs::read(out.join("manifest")).unwrap();
    let m = byom_protocol::manifest::Manifest::parse(&manifest).expect("the manifest parses");
    assert_eq!(m.version, v);
    for prog in ["byom", "byomd"] {
        for kind in ["bin", "deb", "rpm", "tar.gz"] {
            assert!(
                m.artifacts
                    .iter()
                    .any(|a| a.program == prog && a.kind == kind && a.os == os && a.arch == arch),
                "no {kind} of {prog} in {}",
                String::from_utf8_lossy(&manifest)
            );
        }
        let file = |kind: &str| {
            let a = m
                .artifacts
                .iter()
                .find(|a| a.program == prog && a.kind == kind);
            out.join(&a.unwrap().file)
        };
        // The tarball: a prefix to unpack.
        let top = format!("{prog}-{v}-{os}-{arch}");
        let tar = list(Command::new("tar").arg("tzf").arg(file("tar.gz")));
        for want in [
            format!("{top}/bin/{prog}"),
            format!("{top}/share/man/man1/{prog}.1"),
            format!("{top}/share/bash-completion/completions/{prog}"),
            format!("{top}/share/zsh/site-functions/_{prog}"),
            format!("{top}/share/fish/vendor_completions.d/{prog}.fish"),
        ] {
            assert!(tar.contains(&want), "no {want} in {tar:?}");
        }
        // The packages: where Debian and RPM systems look.
        let deb = list(Command::new("dpkg-deb").arg("-c").arg(file("deb")));
        let rpm = list(
            Command::new("rpm")
                .args(["-qlp", "--nosignature"])
                .arg(file("rpm")),
        );
        let paths = |zsh: &str| {
            [
                format!("/usr/bin/{prog}"),
                format!("/usr/share/man/man1/{prog}.1.gz"),
                format!("/usr/share/bash-completion/completions/{prog}"),
                format!("{zsh}/_{prog}"),
                format!("/usr/share/fish/vendor_completions.d/{prog}.fish"),
            ]
        };
        for p in paths("/usr/share/zsh/vendor-completions") {
            assert!(
                deb.iter().any(|l| l.ends_with(&format!(".{p}"))),
                "deb lacks {p}: {deb:?}"
            );
        }
        for p in paths("/usr/share/zsh/site-functions") {
            assert!(rpm.contains(&p), "rpm lacks {p}: {rpm:?}");
        }
        let subpages = tar
            .iter()
            .filter(|f| f.contains(&format!("/man1/{prog}-")))
            .count();
        assert!(subpages > 10, "{tar:?}");
    }
    // The man page in the tarball reads as the one the binary makes.
    let x = dir.path().join("x");
    std::fs::create_dir_all(&x).unwrap();
    run(Command::new("tar")
        .arg("xzf")
        .arg(out.join(format!("byomd-{v}-{os}-{arch}.tar.gz")))
        .arg("-C")
        .arg(&x));
    let page = x.join(format!(
        "byomd-{v}-{os}-{arch}/share/man/man1/byomd-service-install.1"
    ));
    check_roff(&page);
    assert!(std::fs::read_to_string(&page).unwrap().contains("system"));

    // And a server ships exactly this directory.
    let server = Server::start_with(&dir.path().join("srv"), &["--dist", out.to_str().unwrap()]);
    let t = server.json(&["token", "create"]);
    assert!(t["install_command"].is_string(), "{t}");
}
