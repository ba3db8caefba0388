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
        let item = |(c, a, cost, doc): &(&str, &str, String, String)| serde_json::json!({"collective": c, "name": format!("{c}/{a}"), "cost": cost, "doc": doc});
        let items: Vec<_> = rows.iter().map(item).collect();
        println!("{}", serde_json::to_string_pretty(&items).expect("JSON of strings"));
        return 0;
    }
    let width = rows.iter().map(|r| r.0.len() + r.1.len() + 1).max().unwrap_or(4);
    let cost_width = rows.iter().map(|r| r.2.chars().count()).max().unwrap_or(4).min(COST_COLUMN);
    println!("{:<14} {:<width$}  {:<cost_width$}  DOC", "COLLECTIVE", "NAME", "COST");
    let mut cut = false;
    for (collective, algo, cost, doc) in rows {
        let shown = shortened(&cost, COST_COLUMN);
        cut |= shown != cost;
        println!("{collective:<14} {:<width$}  {shown:<cost_width$}  {doc}", format!("{collective}/{algo}"));
    }
    if cut {
        println!(
            "# cost formulas cut at {COST_COLUMN} characters end in `...`: `collc list --format json` has them whole"
        );
    }
    0
}

/// The widest COST column of the table: a few formulas carry their cases for other p (recursive halving's is 272
/// characters), which would push every DOC off the screen.
const COST_COLUMN: usize = 64;

/// `text` itself if it has at most `max` characters, else as many of its words as fit in `max - 4` characters and
/// ` ...` (a first word longer than that is cut inside).
fn shortened(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let room = max.saturating_sub(4);
    let mut kept = String::new();
    for word in text.split(' ') {
        let needed = kept.chars().count() + usize::from(!kept.is_empty()) + word.chars().count();
        if needed > room {
            break;
        }
        if !kept.is_empty() {
            kept.push(' ');
        }
        kept.push_str(word);
    }
    if kept.is_empty() {
        kept = text.chars().take(room).collect();
    }
    kept + " ..."
}

#[cfg(test)]
mod tests {
    use super::shortened;

    #[test]
    fn shortened_keeps_short_texts_and_cuts_long_ones_at_a_word() {
        assert_eq!(shortened("a + n b", 64), "a + n b");
        assert_eq!(shortened("log2(p) a + (p-1)/p n b (p a power of two)", 24), "log2(p) a + (p-1)/p ...");
        assert_eq!(shortened("ceil(log2(p))(a+nb)+more words", 12), "ceil(log ...");
        assert!(shortened("x y z", 2).ends_with(" ..."));
    }
}
