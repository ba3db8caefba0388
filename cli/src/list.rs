//! `collc list`: the library (embedded, then users' own algorithms, each with its file) with each algorithm's
//! collective, name, determinism (what `collc_compiler::replicas` finds at `LIBRARY_RANKS`), cost formula and doc
//! line.

use clap::Args;
use collc_compiler::replicas::{self, Replicas, LIBRARY_RANKS};
use collc_compiler::{Collective, Limits};

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

/// The determinism of a library algorithm over every binding at `LIBRARY_RANKS` (both placements, every root, every
/// node split): `strict` (replicas agree and results are chunk-independent), `replicas` (replicas agree), `none`,
/// or `?` if it does not compile there. A collective that does not reduce only copies: `strict`.
fn determinism(collective: &str, source: &str) -> (&'static str, Option<Replicas>) {
    if !collective.parse::<Collective>().is_ok_and(Collective::reduces) {
        return ("strict", Some(Replicas::default()));
    }
    match replicas::of_algorithm(source, LIBRARY_RANKS, &Limits::default()) {
        Ok(Some(found)) if found.agree() && found.chunk_independent() => ("strict", Some(found)),
        Ok(Some(found)) if found.agree() => ("replicas", Some(found)),
        Ok(Some(found)) => ("none", Some(found)),
        Ok(None) | Err(_) => ("?", None),
    }
}

/// One algorithm as listed.
struct Row<'a> {
    collective: &'a str,
    algo: &'a str,
    /// The file of a user's algorithm.
    file: Option<&'a str>,
    determinism: &'static str,
    replicas: Option<Replicas>,
    cost: String,
    doc: String,
}

pub fn run(args: ListArgs) -> u8 {
    let rows: Vec<Row> = crate::library::library()
        .entries()
        .iter()
        .map(|entry| {
            let (collective, algo) = entry.name.split_once('/').unwrap_or(("", &entry.name));
            let (doc, cost) = describe(&entry.source);
            let (determinism, replicas) = determinism(collective, &entry.source);
            Row { collective, algo, file: entry.file.as_deref(), determinism, replicas, cost, doc }
        })
        .collect();
    let ranks = format!("{}..={}", LIBRARY_RANKS.start(), LIBRARY_RANKS.end());
    if args.format == "json" {
        let item = |r: &Row| {
            serde_json::json!({
                "collective": r.collective, "name": format!("{}/{}", r.collective, r.algo), "cost": r.cost, "doc": r.doc,
                "determinism": r.determinism, "replicas_agree": r.replicas.map(|f| f.agree()),
                "chunk_independent": r.replicas.map(|f| f.chunk_independent()), "determinism_ranks": ranks,
                "file": r.file,
            })
        };
        let items: Vec<_> = rows.iter().map(item).collect();
        println!("{}", serde_json::to_string_pretty(&items).expect("JSON of strings"));
        return 0;
    }
    let width = rows.iter().map(|r| r.collective.len() + r.algo.len() + 1).max().unwrap_or(4);
    let cost_width = rows.iter().map(|r| r.cost.chars().count()).max().unwrap_or(4).min(COST_COLUMN);
    println!("{:<14} {:<width$}  {:<11}  {:<cost_width$}  DOC", "COLLECTIVE", "NAME", "DETERMINISM", "COST");
    let mut cut = false;
    for Row { collective, algo, file, determinism, cost, doc, .. } in &rows {
        let shown = shortened(cost, COST_COLUMN);
        cut |= shown != *cost;
        let doc = match file {
            Some(file) => format!("[{file}] {doc}"),
            None => doc.clone(),
        };
        println!(
            "{collective:<14} {:<width$}  {determinism:<11}  {shown:<cost_width$}  {doc}",
            format!("{collective}/{algo}")
        );
    }
    println!(
        "# DETERMINISM at p = {ranks} (every root and node split, both placements): replicas = every rank's result is \
         bitwise identical (collc run --deterministic), strict = also the same bits whatever the message size \
         (--deterministic=strict), none = ranks reduce in different orders; a collective that does not reduce is strict"
    );
    if rows.iter().any(|r| r.file.is_some()) {
        println!("# [FILE]: your algorithms (--library, COLLC_ALGO_PATH), each named by its header");
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
