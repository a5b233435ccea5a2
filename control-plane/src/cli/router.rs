//! `byom router`: the Router's figures.

use byom_api::Client;

use super::output::print_json;

pub async fn run(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let v = super::agent::router(c).await?;
    if json {
        print_json(&v);
        return Ok(0);
    }
    let st = &v["stats"];
    println!("router");
    if let Some(m) = v["model"].as_str().filter(|m| !m.is_empty()) {
        println!("  model:          {m}");
    }
    println!("  turns:          {}", st["turns"]);
    println!("  model calls:    {}", st["model_calls"]);
    println!("  decisions:      {}", st["decisions"]);
    println!(
        "  events:         {} ({} passed through to workers)",
        st["events"], st["passed_through"]
    );
    println!("  replies:        {}", st["replies"]);
    println!("  queued now:     {}", v["queued"]);
    let u = &st["usage"];
    println!(
        "  tokens:         {} input ({} cached), {} output",
        u["input_tokens"], u["cache_read_tokens"], u["output_tokens"]
    );
    Ok(0)
}
