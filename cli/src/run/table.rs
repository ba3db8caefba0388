//! `collc run`'s output: nccl-tests' table (same columns, same algbw/busbw definitions, same footer) or JSON.

use super::sweep::{Cell, Row};
use super::{Format, Job};
use serde_json::json;

fn bandwidths(job: &Job, bytes: usize, cell: &Cell) -> (f64, f64) {
    if cell.seconds <= 0.0 {
        return (0.0, 0.0);
    }
    let algbw = bytes as f64 / cell.seconds / 1e9;
    (algbw, algbw * job.collective.bus_factor(job.n_ranks))
}

/// What ran, for the header: algorithm, transport, executor.
pub struct Header {
    pub algorithm: String,
    pub transport: &'static str,
    pub executor: String,
}

/// What the header says ran: the algorithm, or that the cost model selected one per size (named per row).
fn algorithm_label<'a>(job: &Job, header: &'a Header) -> &'a str {
    if !job.algorithms.compared.is_empty() {
        "every candidate at every size (--compare)"
    } else if job.algorithms.selected {
        "selected per size"
    } else {
        &header.algorithm
    }
}

/// What rank 0 prints as the run goes: the header at once, each row as soon as it is measured (stdout writes each
/// line as it ends, piped or not), the footer at the end, or on an interrupt what has been measured, closed
/// properly (the table's footer; for JSON the document's end, with the signal).
pub struct Report {
    job: Job,
    /// On a terminal's stderr only (indicatif hides it elsewhere): rows done of the sweep's, and the last one's size.
    progress: indicatif::ProgressBar,
    rows: Vec<Row>,
    busbw_sum: f64,
    cells: usize,
    wrong_total: u64,
    finished: bool,
    /// When the report last printed (the header, a row, a stage line).
    quiet_since: std::time::Instant,
}

/// How a run ended, as its footer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Done,
    /// Cut short by this signal.
    Interrupted(i32),
    /// A rank stopped with an error (each says which on stderr).
    Failed,
}

impl Report {
    /// Prints the header (JSON: the document up to its rows).
    pub fn start(job: &Job, header: &Header) -> Report {
        match job.format {
            Format::Table => print_header(job, header),
            Format::Json => {
                let head = json!({
                    "algorithm": algorithm_label(job, header),
                    "collective": job.collective.name(), "ranks": job.n_ranks,
                    "transport": header.transport, "executor": header.executor,
                    "iters": job.iters, "warmup": job.warmup, "check": job.check, "topology": job.algorithms.topology,
                    "parameters": job.algorithms.parameters,
                });
                let head = serde_json::to_string(&head).expect("JSON values serialise");
                println!("{},\"rows\":[", head.trim_end_matches('}'));
            }
        }
        let ops = if job.collective.reduces() { job.ops.len() } else { 1 };
        let per_size = job.algorithms.compared.len().max(1);
        let total = (job.sizes.len() * job.dtypes.len() * ops * per_size) as u64;
        let progress = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template("# {bar:30} {pos}/{len} rows, {msg} [{elapsed}]") {
            progress.set_style(style);
        }
        let (job, rows) = (job.clone(), Vec::new());
        let quiet_since = std::time::Instant::now();
        Report { job, progress, rows, busbw_sum: 0.0, cells: 0, wrong_total: 0, finished: false, quiet_since }
    }

    pub fn row(&mut self, row: Row) {
        let job = &self.job;
        let mut line = format!(
            "{:>12} {:>13} {:>9} {:>7} {:>7}",
            row.bytes,
            row.count,
            row.dtype.to_string(),
            // nccl-tests' column names premulsum `mulsum` (its factor is in the header).
            row.op.map_or("none".to_string(), |o| match o.factor() {
                Some(_) => "mulsum".to_string(),
                None => o.to_string(),
            }),
            row.root.map_or(-1, i64::from)
        );
        for cell in [&row.out_of_place, &row.in_place] {
            let Some(cell) = cell else {
                line += &format!(" {:>8} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A");
                continue;
            };
            let (algbw, busbw) = bandwidths(job, row.bytes, cell);
            self.busbw_sum += busbw;
            self.cells += 1;
            self.wrong_total += cell.wrong.unwrap_or(0);
            let wrong = cell.wrong.map_or("N/A".to_string(), |w| w.to_string());
            line += &format!(" {:>8.2} {:>7.2} {:>7.2} {:>6}", cell.seconds * 1e6, algbw, busbw, wrong);
        }
        // The bar steps aside while the row prints, so a terminal shows rows above one bar line.
        self.progress.suspend(|| match job.format {
            Format::Table if job.algorithms.compared.is_empty() => println!("{line}"),
            Format::Table => println!("{line}  {}", row.algorithm),
            Format::Json => {
                let comma = if self.rows.is_empty() { "" } else { "," };
                println!("{comma}{}", row_json(job, &row));
            }
        });
        self.progress.set_message(format!("last {} B {}", row.bytes, row.dtype));
        self.progress.inc(1);
        self.quiet_since = std::time::Instant::now();
        self.rows.push(row);
    }

    /// What the sweep is doing before its next row (a long warm-up, the buffers being set up): the bar's message
    /// on a terminal; elsewhere a `#` line on stderr, when the stage is `slow` (large buffers to set up) or nothing
    /// has been printed for a second.
    pub fn stage(&mut self, what: &str, slow: bool) {
        self.progress.set_message(what.to_string());
        self.progress.tick();
        let quiet = self.quiet_since.elapsed() > std::time::Duration::from_secs(1);
        if self.progress.is_hidden() && (slow || quiet) {
            eprintln!("# {what}");
            self.quiet_since = std::time::Instant::now();
        }
    }

    /// The footer (once), saying how the run ended.
    pub fn finish(&mut self, ending: Ending) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.progress.finish_and_clear();
        let interrupted = match ending {
            Ending::Interrupted(signal) => Some(signal),
            _ => None,
        };
        match self.job.format {
            Format::Table => {
                if let Some(signal) = interrupted {
                    println!("# interrupted by signal {signal} after {} rows", self.rows.len());
                }
                let verdict = match ending {
                    Ending::Failed => format!("FAILED (the run stopped with an error after {} rows)", self.rows.len()),
                    _ if self.wrong_total == 0 => "OK".to_string(),
                    _ => "FAILED".to_string(),
                };
                println!("# Out of bounds values : {} {verdict}", self.wrong_total);
                println!("# Avg bus bandwidth    : {:.3}", self.busbw_sum / self.cells.max(1) as f64);
                println!("#");
                if !self.job.algorithms.compared.is_empty() && interrupted.is_none() {
                    print_comparison(&self.job, &self.rows);
                }
            }
            Format::Json => println!(
                "],\"interrupted\":{},\"failed\":{}}}",
                interrupted.map_or("null".to_string(), |s| s.to_string()),
                ending == Ending::Failed
            ),
        }
        if !self.job.algorithms.compared.is_empty() && ending == Ending::Done && self.wrong_total == 0 {
            let said = learn(&self.job, &self.rows);
            if let Some(line) = said.filter(|_| self.job.format == Format::Table) {
                println!("{line}");
            }
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }

    /// Whether a checked cell found a wrong element: `collc run` then exits non-zero, as nccl-tests does.
    pub fn any_wrong(&self) -> bool {
        self.wrong_total > 0
    }
}

/// nccl-tests' header: what ran (and, for a selection, what the cost model chose on which topology), the sweep,
/// and the column titles.
fn print_header(job: &Job, header: &Header) {
    println!(
        "# collc run: algorithm {} ({}), {} ranks, transport {}, executor {}",
        algorithm_label(job, header),
        job.collective,
        job.n_ranks,
        header.transport,
        header.executor
    );
    let mut from = job.sizes.first().copied().unwrap_or(0);
    for choice in job.algorithms.choices.iter().filter(|_| job.algorithms.selected) {
        let by = if choice.measured { "measured fastest on this host" } else { "predicted fastest" };
        println!("#   sizes {from}..={}: {} ({by})", choice.max_bytes, choice.name);
        from = job.sizes.iter().copied().find(|&s| s > choice.max_bytes).unwrap_or(choice.max_bytes);
    }
    for (name, why) in &job.algorithms.not_admitted {
        println!("#   not a candidate: {}/{name} ({why})", job.collective);
    }
    if let Some(parameters) = &job.algorithms.parameters {
        println!("#   parameters: {parameters}");
    }
    if let Some(topology) = &job.algorithms.topology {
        println!("#   cost model on {topology}");
    }
    for factor in job.ops.iter().filter_map(|op| op.factor()) {
        println!("#   redop mulsum: premulsum:{factor}, every rank's input multiplied by {factor}, then summed");
    }
    for op in job.ops.iter().filter_map(|op| match op {
        collc_kernels::ReduceOp::User(user) => Some(*user),
        _ => None,
    }) {
        println!("#   redop {}: {}", op.name(), describe_operator(op, &job.dtypes));
    }
    println!(
        "# minBytes {} maxBytes {} warmup iters: {} iters: {} validation: {}",
        job.byte_range.0,
        job.byte_range.1,
        job.warmup,
        job.iters,
        u8::from(job.check)
    );
    println!("#");
    println!("#{:>77}{:>35}", "out-of-place", "in-place");
    // The five columns of the call, then the four of each placement (as the rows print them).
    let titles = [
        (["size", "count", "type", "redop", "root"], ["time", "algbw", "busbw", "#wrong"]),
        (["(B)", "(elements)", "", "", ""], ["(us)", "(GB/s)", "(GB/s)", ""]),
    ];
    for (call, cell) in titles {
        let cell = format!(" {:>8} {:>7} {:>7} {:>6}", cell[0], cell[1], cell[2], cell[3]);
        println!("#{:>11} {:>13} {:>9} {:>7} {:>7}{cell}{cell}", call[0], call[1], call[2], call[3], call[4]);
    }
}

fn row_json(job: &Job, r: &Row) -> serde_json::Value {
    let measured = |bytes: usize, cell: &Cell| {
        let (algbw, busbw) = bandwidths(job, bytes, cell);
        json!({ "time_us": cell.seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": cell.wrong })
    };
    let cell = |bytes: usize, cell: &Option<Cell>| match cell {
        Some(cell) => measured(bytes, cell),
        None => serde_json::Value::Null,
    };
    json!({
        "size": r.bytes, "count": r.count, "type": r.dtype.to_string(),
        "redop": r.op.map(|o| o.to_string()), "root": r.root, "algorithm": r.algorithm,
        "predicted": r.predicted,
        "out_of_place": cell(r.bytes, &r.out_of_place), "in_place": cell(r.bytes, &r.in_place),
    })
}

/// `--compare`'s rows of one size, data type and op: each candidate once, in a row.
fn comparisons<'r>(job: &Job, rows: &'r [Row]) -> impl Iterator<Item = &'r [Row]> {
    rows.chunks(job.algorithms.compared.len().max(1))
}

/// After a `--compare` run on this host (not over sockets): merges each candidate's out-of-place time per size (of
/// the first data type and op) into this host's timings (`select::Measured`), which later selections of the
/// collective on as many ranks over the transport choose by, and says so.
fn learn(job: &Job, rows: &[Row]) -> Option<String> {
    use collc_runtime::select::{Measured, Point};
    if !job.one_host || job.transport.backend().sockets() {
        return None;
    }
    let first = |r: &&Row| r.dtype == job.dtypes[0] && r.op.is_none_or(|op| op == job.ops[0]);
    let points: Vec<Point> = rows
        .iter()
        .filter(first)
        .filter_map(|r| Some(Point::new(&r.algorithm, r.bytes as u64, r.out_of_place?.seconds)))
        .collect();
    let count = points.len();
    Some(match Measured::keep(job.collective.name(), job.n_ranks, job.transport.name(), points) {
        Ok(path) => format!(
            "# merged {count} timings into {}: {} on {} ranks over {} chooses by them from now on (sizes {}..={})",
            path.display(),
            job.collective,
            job.n_ranks,
            job.transport,
            job.sizes.first().unwrap_or(&0),
            job.sizes.last().unwrap_or(&0)
        ),
        Err(e) => format!("# the timings were not kept: {e}"),
    })
}

/// Under a `--compare` table: per size, the measured fastest (out of place) and the choice beside it (the cost
/// model's, or where this host's timings cover the size, theirs).
fn print_comparison(job: &Job, rows: &[Row]) {
    println!("# compared out of place: the measured fastest, and the choice (the cost model's, or earlier timings')");
    let (mut close, mut total) = (0, 0);
    for group in comparisons(job, rows) {
        let time = |row: &Row| row.out_of_place.map_or(f64::INFINITY, |c| c.seconds);
        let Some(fastest) = group.iter().min_by(|a, b| time(a).total_cmp(&time(b))) else { continue };
        let Some(chosen) = group.iter().find(|r| r.predicted == Some(true)) else { continue };
        let ratio = time(chosen) / time(fastest).max(f64::MIN_POSITIVE);
        close += usize::from(ratio <= 1.10);
        total += 1;
        let op = fastest.op.map_or(String::new(), |op| format!(" {op}"));
        println!(
            "#   {:>12} B {}{op}  fastest {} {:.2} us, chosen {} {:.2} us ({ratio:.2}x)",
            fastest.bytes,
            fastest.dtype,
            fastest.algorithm,
            time(fastest) * 1e6,
            chosen.algorithm,
            time(chosen) * 1e6
        );
    }
    println!("# the choice is within 10% of the measured fastest at {close} of {total} sizes");
}

/// How a user's operator runs on the run's data types: its body, and per type the loop cranelift made of it.
fn describe_operator(op: collc_kernels::operator::UserOp, dtypes: &[collc_kernels::DataType]) -> String {
    let loops: Vec<String> = dtypes
        .iter()
        .filter_map(|&dtype| {
            let prepared = op.prepare(dtype).ok()?;
            Some(match &prepared.native {
                Err(_) => format!("{dtype} evaluated (cranelift could not compile it)"),
                Ok(native) if native.lanes > 1 => format!("{dtype} vectors of {}", native.lanes),
                Ok(_) => format!("{dtype} one element at a time"),
            })
        })
        .collect();
    format!("a user's operator, {} = {}, compiled with cranelift: {}", op.name(), op.operator().body, loops.join(", "))
}
