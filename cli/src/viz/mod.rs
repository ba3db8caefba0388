//! `collc viz`: draw one verified schedule, ranks as lanes and steps as columns, as an SVG picture or an HTML page
//! that steps through it showing every rank's buffers.

mod contents;
mod html;
mod layout;
mod svg;

use crate::args::CompileArgs;
use crate::library;
use crate::report;
use clap::Args;
use collc_compiler::{Placement, VerifiedSchedule};
use std::path::{Path, PathBuf};

/// More lanes than this would not be legible; the page's tables grow with ranks x chunks x steps.
const MAX_LANES: u32 = 64;
const MAX_MESSAGES: usize = 20_000;
/// Cells the page embeds (chunk slots x (steps + 1)) at most.
const MAX_PAGE_CELLS: u64 = 500_000;

#[derive(Args)]
pub struct VizArgs {
    /// A library name such as `allreduce/ring`, a `.coll` file, or a schedule file (drawn as it stands).
    pub algorithm: String,
    // The binding, placement and fusion `collc build` takes (a schedule file's --ranks, if given, must agree).
    #[command(flatten)]
    pub compile: CompileArgs,
    /// Where to write: `FILE.svg` (the picture) or `FILE.html` (a page stepping through it).
    #[arg(long, value_name = "FILE.svg|FILE.html")]
    pub output: PathBuf,
}

/// What `--output`'s extension asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Svg,
    Html,
}

fn format_of(path: &Path) -> Result<Format, String> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("html" | "htm") => Ok(Format::Html),
        _ => Err(format!("--output {}: write a .svg picture or an .html page", path.display())),
    }
}

pub fn run(args: VizArgs) -> u8 {
    let format = match format_of(&args.output) {
        Ok(format) => format,
        Err(message) => return usage(&message),
    };
    let source = match library::resolve(&args.algorithm) {
        Ok(source) => source,
        Err(message) => return usage(&message),
    };
    let verified = match verified(&args, &source) {
        Ok(verified) => verified,
        Err(code) => return code,
    };
    if let Err(message) = drawable(&verified) {
        return usage(&message);
    }
    let picture = match draw(&verified, format) {
        Ok(picture) => picture,
        Err((code, message)) => {
            eprintln!("error: {message}");
            return code;
        }
    };
    match std::fs::write(&args.output, picture) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", args.output.display());
            1
        }
    }
}

fn usage(message: &str) -> u8 {
    eprintln!("error: {message}");
    2
}

/// The schedule to draw: a schedule file verified as it stands, else the algorithm compiled for the binding (as
/// `collc build` does). Diagnostics are printed here; the error is the exit status.
fn verified(args: &VizArgs, source: &library::Source) -> Result<VerifiedSchedule, u8> {
    let ranks = args.compile.ranks;
    let n_ranks = match (library::is_schedule(source), ranks) {
        (true, _) => 0,
        (false, Some(n)) => {
            crate::args::check_rank_count(n, args.compile.limits.max_ranks).map_err(|message| usage(&message))?;
            if n > MAX_LANES {
                return Err(usage(&format!("--ranks {n}: collc viz draws at most {MAX_LANES} ranks legibly")));
            }
            n
        }
        (false, None) => return Err(usage(&format!("{}: say how many ranks to draw with --ranks N", source.name))),
    };
    let verified = args.compile.verified(source, n_ranks).map_err(|errors| {
        report::print_all(&errors, &source.name, &source.text);
        1
    })?;
    match ranks {
        Some(n) if n != verified.n_ranks => {
            Err(usage(&format!("--ranks {n}: {} is a schedule of {} ranks", source.name, verified.n_ranks)))
        }
        _ => Ok(verified),
    }
}

/// A usage error for a schedule too large to draw (a schedule file's ranks are known only once it is read).
fn drawable(verified: &VerifiedSchedule) -> Result<(), String> {
    let messages = verified.ranks.iter().flat_map(|p| &p.instrs).filter(|i| i.op.receives()).count();
    if verified.n_ranks > MAX_LANES {
        return Err(format!("a schedule of {} ranks: collc viz draws at most {MAX_LANES}", verified.n_ranks));
    }
    if messages > MAX_MESSAGES {
        return Err(format!("{messages} messages: collc viz draws at most {MAX_MESSAGES}; choose fewer ranks"));
    }
    Ok(())
}

/// The picture or the page, as text; or the exit status and what went wrong (a page too large is a usage error).
fn draw(verified: &VerifiedSchedule, format: Format) -> Result<String, (u8, String)> {
    let layout = layout::lay_out(verified).map_err(|message| (1, message))?;
    let placement = match verified.placement {
        Placement::InPlace => ", in place",
        Placement::OutOfPlace => "",
    };
    let title = format!("{}/{} at {} ranks{placement}", verified.collective, verified.algorithm, verified.n_ranks);
    if format == Format::Svg {
        return Ok(svg::render(verified, &layout, &title, None));
    }
    let slots: u64 = verified.buffers.iter().map(|b| b.chunks as u64).sum::<u64>() * verified.n_ranks as u64;
    let cells = slots * (layout.n_steps as u64 + 1);
    if cells > MAX_PAGE_CELLS {
        let message = format!(
            "the page would hold {cells} buffer cells (at most {MAX_PAGE_CELLS}); draw an .svg, or choose fewer ranks"
        );
        return Err((2, message));
    }
    let contents = contents::simulate(verified, &layout);
    let messages: Vec<String> = (0..layout.arrows.len()).map(|i| contents.message_text(i)).collect();
    let picture = svg::render(verified, &layout, &title, Some(&messages));
    Ok(html::render(verified, &layout, &contents, &title, &picture))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_extension_chooses_the_format() {
        assert!(format_of(Path::new("ring.svg")) == Ok(Format::Svg));
        assert!(format_of(Path::new("a/b/ring.HTML")) == Ok(Format::Html));
        let error = format_of(Path::new("ring.png")).err().expect("png is refused");
        assert!(error.contains(".svg") && error.contains(".html"), "{error}");
        assert!(format_of(Path::new("ring")).is_err());
    }
}
