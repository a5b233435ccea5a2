//! `byom completions SHELL` and `byom man [--dir DIR]`: shell completion
//! scripts and man pages made from the same clap definitions the command
//! line parses with, so they never fall behind it. Packages ship what
//! these print (installers/release.sh).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write byom.1 and a page per subcommand (byom-token-create.1, …)
    /// into DIR, which is made if missing; without it, byom.1 goes to
    /// stdout (`byom man | man -l -`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The script goes to stdout (`byom completions bash > /etc/bash_completion.d/byom`).
pub fn completions(a: CompletionsArgs) -> anyhow::Result<i32> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "byom", &mut std::io::stdout());
    Ok(0)
}

pub fn man(a: ManArgs) -> anyhow::Result<i32> {
    let cmd = super::Cli::command();
    match a.dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot make {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
            println!("wrote the man pages of byom into {}", dir.display());
        }
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
    }
    Ok(0)
}
