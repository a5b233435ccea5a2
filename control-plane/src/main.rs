//! `byom`: the command line (one verb per file under [`cli`]), `byom demo`
//! and `byom js`. It speaks to servers through `byom-api` only; `byom
//! server` runs `byom_server::run` in this process.

mod cli;
mod js;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let code = match cli::main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("byom: {}", cli::describe(&e));
            1
        }
    };
    std::process::exit(code);
}
