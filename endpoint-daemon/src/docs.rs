//! `byomd completions SHELL` and `byomd man [--dir DIR]`: shell completion
//! scripts and man pages made from the clap definitions byomd parses its
//! command line with, so they never fall behind it. Packages ship what
//! these print (installers/release.sh).

use std::path::Path;

use anyhow::Context as _;

/// The completion script for `shell`, on stdout.
pub fn completions(mut cmd: clap::Command, name: &str, shell: clap_complete::Shell) {
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
}

/// Every page (`NAME.1`, `NAME-SUB.1`, …) into `dir`, or the top page to
/// stdout.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> anyhow::Result<i32> {
    match dir {
        Some(dir) => {
            let name = cmd.get_name().to_string();
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot make {}", dir.display()))?;
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            println!("wrote the man pages of {name} into {}", dir.display());
        }
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
    }
    Ok(0)
}
