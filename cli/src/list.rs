//! `collc list`: the embedded library with each algorithm's collective, name, cost formula and doc line.

use crate::library::LIBRARY;
use clap::Args;

#[derive(Args)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long, value_parser = ["table", "json"], default_value = "table")]
    pub format: String,
}

/// The doc line and the `Cost:` line of an algorithm's `##` comments.
fn describe(source: &str) -> (String, String) {
    let docs = collc_grammar::parse(source, &collc_grammar::Limits::default()).map(|f| f.doc).unwrap_or_default();
    let cost = docs.iter().find_map(|d| d.strip_prefix("Cost:")).map(|c| c.trim().to_string()).unwrap_or_default();
    let doc = docs.iter().find(|d| !d.starts_with("Cost:")).cloned().unwrap_or_default();
    (doc, cost)
}

pub fn run(args: ListArgs) -> u8 {
    let rows: Vec<(&str, &str, String, String)> = LIBRARY
        .iter()
        .map(|(name, source)| {
            let (collective, algo) = name.split_once('/').unwrap_or(("", name));
            let (doc, cost) = describe(source);
            (collective, algo, cost, doc)
        })
        .collect();
    if args.format == "json" {
        let items: Vec<_> = rows.iter().map(|(c, a, cost, doc)| serde_json::json!({"collective": c, "name": format!("{c}/{a}"), "cost": cost, "doc": doc})).collect();
        println!("{}", serde_json::to_string_pretty(&items).expect("JSON of strings"));
        return 0;
    }
    let width = rows.iter().map(|r| r.0.len() + r.1.len() + 1).max().unwrap_or(4);
    let cost_width = rows.iter().map(|r| r.2.len()).max().unwrap_or(4);
    println!("{:<14} {:<width$}  {:<cost_width$}  DOC", "COLLECTIVE", "NAME", "COST");
    for (collective, algo, cost, doc) in rows {
        println!("{collective:<14} {:<width$}  {cost:<cost_width$}  {doc}", format!("{collective}/{algo}"));
    }
    0
}
