use clap::Parser;

fn main() {
    let cli = byom_control_plane::cli::Cli::parse();
    let code = match byom_control_plane::cli::main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("byom: {}", byom_control_plane::cli::describe(&e));
            1
        }
    };
    std::process::exit(code);
}
