//! `byom demo`: placeholder, filled in below.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {}
pub async fn run(_a: DemoArgs) -> anyhow::Result<i32> {
    Ok(0)
}
