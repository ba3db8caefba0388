//! The canonical `.sched` text form. `write_sched` prints a schedule; `parse_sched` reads it back into an
//! unverified `Schedule` (run it through `verify` before use). print -> parse -> print is the identity.

use crate::collective::Collective;
use crate::diag::Error;
use crate::sched::{BufId, BufferDecl, Instr, Op, Operand, Placement, RankProgram, Schedule, MAX_SPANS, NO_RANK};
use collc_grammar::ast::Span;
use std::fmt::Write;

const MAGIC: &str = "collc-schedule 1";

/// Prints a schedule. `source` (may be empty) adds the line number of each span as a comment.
pub fn write_sched(sched: &Schedule, source: &str) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "{MAGIC}");
    let _ = writeln!(w, "algorithm {} for {}", sched.algorithm, sched.collective);
    let _ = writeln!(w, "placement {}", sched.placement);
    let _ = writeln!(w, "ranks {} chunks {} root {} peer {}", sched.n_ranks, sched.chunks, sched.root, sched.peer);
    for (name, value) in &sched.params {
        let _ = writeln!(w, "param {name} {value}");
    }
    for b in &sched.buffers {
        let _ = writeln!(w, "buffer {} {}", b.name, b.chunks);
    }
    for (i, span) in sched.spans.iter().enumerate() {
        let _ = write!(w, "span {i} {}..{}", span.start, span.end);
        if !source.is_empty() {
            let _ = write!(w, " # line {}", sched.line_of(source, i));
        }
        let _ = writeln!(w);
    }
    for (rank, program) in sched.ranks.iter().enumerate() {
        let _ = writeln!(w, "rank {rank}");
        for (i, instr) in program.instrs.iter().enumerate() {
            write_instr(w, sched, i, instr, program.deps_of(i));
        }
    }
    out
}

fn write_instr(w: &mut String, sched: &Schedule, i: usize, instr: &Instr, deps: &[u32]) {
    let _ = write!(w, "  #{i} {}", instr.op.name());
    for (key, op) in [("src", instr.src), ("acc", instr.acc), ("dst", instr.dst)] {
        if let Some(op) = op.get() {
            let _ = write!(w, " {key}={}[{}]", sched.buffer(op.buf).name, { op.index });
        }
    }
    if instr.count != 1 {
        let _ = write!(w, " n={}", instr.count);
    }
    if let Some(peer) = instr.recv_peer() {
        let _ = write!(w, " recv={peer}");
    }
    if let Some(peer) = instr.send_peer() {
        let _ = write!(w, " send={peer}");
    }
    if instr.channel != 0 {
        let _ = write!(w, " ch={}", instr.channel);
    }
    if !deps.is_empty() {
        let list: Vec<String> = deps.iter().map(u32::to_string).collect();
        let _ = write!(w, " deps={}", list.join(","));
    }
    let _ = writeln!(w, " @{}", instr.span);
}

fn parse_error(line_no: usize, message: impl Into<String>) -> Error {
    Error::new(
        "collc::sched::parse",
        format!("line {line_no}: {}", message.into()),
        "a .sched file is written by `collc build --emit sched`; see docs/language.md",
    )
}

fn num<T: std::str::FromStr>(line_no: usize, text: &str, what: &str) -> Result<T, Error> {
    text.parse().map_err(|_| parse_error(line_no, format!("expected {what}, found `{text}`")))
}

/// Reads a `.sched` text back into a schedule.
pub fn parse_sched(text: &str) -> Result<Schedule, Error> {
    parse_sched_located(text).map(|(sched, _)| sched)
}

/// Where each instruction of a schedule read from text stands in that text, for diagnostics that name the
/// `.sched` line and column: per rank, per instruction, its line number and the byte range of its line from its `#`.
#[derive(Clone, Debug, Default)]
pub struct SchedLines {
    pub ranks: Vec<Vec<InstrLine>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstrLine {
    pub line: u32,
    pub start: u32,
    pub end: u32,
}

impl SchedLines {
    fn get(&self, rank: u32, index: usize) -> InstrLine {
        self.ranks.get(rank as usize).and_then(|r| r.get(index)).copied().unwrap_or_default()
    }

    pub fn span(&self, rank: u32, index: usize) -> Span {
        let at = self.get(rank, index);
        Span { start: at.start, end: at.end }
    }

    /// The 1-based line of an instruction.
    pub fn line(&self, rank: u32, index: usize) -> u32 {
        self.get(rank, index).line
    }

    /// `line 12:3`: the line and column of an instruction in `text`.
    pub fn location(&self, text: &str, rank: u32, index: usize) -> String {
        let at = self.get(rank, index);
        let start = (at.start as usize).min(text.len());
        let line_start = text.as_bytes()[..start].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        format!("line {}:{}", at.line, start - line_start + 1)
    }
}

/// `parse_sched`, and where each instruction's line is in `text`.
pub fn parse_sched_located(text: &str) -> Result<(Schedule, SchedLines), Error> {
    const MAX_BYTES: usize = 1 << 30;
    if text.len() > MAX_BYTES {
        return Err(parse_error(
            1,
            format!("the text is {} bytes; schedules over {MAX_BYTES} bytes are not read", text.len()),
        ));
    }
    if text.lines().next().is_none_or(|l| l.trim() != MAGIC) {
        return Err(parse_error(1, format!("expected `{MAGIC}`")));
    }
    let mut sched = Schedule {
        algorithm: String::new(),
        collective: Collective::AllReduce,
        placement: Placement::OutOfPlace,
        n_ranks: 0,
        chunks: 1,
        root: 0,
        peer: 0,
        params: Vec::new(),
        buffers: Vec::new(),
        ranks: Vec::new(),
        spans: Vec::new(),
    };
    let mut lines = SchedLines::default();
    let mut offset = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let (line_no, line_start) = (i + 1, offset);
        offset += line.len();
        let raw = line.trim();
        if line_no == 1 {
            continue;
        }
        if raw.starts_with('#') && raw[1..].starts_with(|c: char| c.is_ascii_digit()) {
            let program =
                sched.ranks.last_mut().ok_or_else(|| parse_error(line_no, "an instruction before any `rank` line"))?;
            let words: Vec<&str> = raw.split_whitespace().collect();
            let (instr, deps) = parse_instr(line_no, &words, &sched.buffers, program.len())?;
            program.push(instr, &deps);
            let start = line_start + line.find('#').unwrap_or(0);
            let end = line_start + line.trim_end().len();
            let at = InstrLine { line: line_no as u32, start: start as u32, end: end as u32 };
            match lines.ranks.last_mut() {
                Some(rank) => rank.push(at),
                None => lines.ranks.push(vec![at]),
            }
            continue;
        }
        let words: Vec<&str> = raw.split('#').next().unwrap_or("").split_whitespace().collect();
        if !words.is_empty() {
            parse_header(line_no, &words, &mut sched)?;
            if words[0] == "rank" {
                lines.ranks.resize(sched.ranks.len(), Vec::new());
            }
        }
    }
    Ok((sched, lines))
}

fn parse_header(line_no: usize, words: &[&str], sched: &mut Schedule) -> Result<(), Error> {
    match words {
        ["algorithm", name, "for", coll] => {
            sched.algorithm = name.to_string();
            sched.collective = coll.parse().map_err(|e: String| parse_error(line_no, e))?;
        }
        ["placement", "in-place"] => sched.placement = Placement::InPlace,
        ["placement", "out-of-place"] => sched.placement = Placement::OutOfPlace,
        ["ranks", p, "chunks", c, "root", r, "peer", q] => {
            sched.n_ranks = num(line_no, p, "a rank count")?;
            sched.chunks = num(line_no, c, "a chunk count")?;
            sched.root = num(line_no, r, "a root rank")?;
            sched.peer = num(line_no, q, "a peer rank")?;
        }
        ["param", name, value] => sched.params.push((name.to_string(), num(line_no, value, "an integer")?)),
        ["buffer", name, chunks] => {
            if sched.buffers.len() >= BufId::MAX_BUFFERS {
                return Err(parse_error(line_no, format!("more than {} buffers", BufId::MAX_BUFFERS)));
            }
            sched.buffers.push(BufferDecl { name: name.to_string(), chunks: num(line_no, chunks, "a chunk count")? })
        }
        ["span", id, range] => {
            if num::<usize>(line_no, id, "a span number")? != sched.spans.len() {
                return Err(parse_error(line_no, "spans must be numbered 0, 1, 2, ... in order"));
            }
            if sched.spans.len() >= MAX_SPANS {
                return Err(parse_error(line_no, format!("more than {MAX_SPANS} spans")));
            }
            let (start, end) = range.split_once("..").ok_or_else(|| parse_error(line_no, "expected START..END"))?;
            sched
                .spans
                .push(Span { start: num(line_no, start, "a byte offset")?, end: num(line_no, end, "a byte offset")? });
        }
        ["rank", r] => {
            if num::<usize>(line_no, r, "a rank")? != sched.ranks.len() {
                return Err(parse_error(line_no, "ranks must be listed 0, 1, 2, ... in order"));
            }
            sched.ranks.push(RankProgram::default());
        }
        _ => return Err(parse_error(line_no, format!("unrecognised line `{}`", words.join(" ")))),
    }
    Ok(())
}

fn parse_operand(line_no: usize, text: &str, buffers: &[BufferDecl]) -> Result<Operand, Error> {
    let (name, rest) =
        text.split_once('[').ok_or_else(|| parse_error(line_no, format!("expected BUF[INDEX], found `{text}`")))?;
    let index = rest.strip_suffix(']').ok_or_else(|| parse_error(line_no, format!("missing `]` in `{text}`")))?;
    let buf = buffers
        .iter()
        .position(|b| b.name == name)
        .ok_or_else(|| parse_error(line_no, format!("unknown buffer `{name}`")))?;
    // The header admits at most `BufId::MAX_BUFFERS` buffers.
    Ok(Operand::new(BufId(buf as u8), num(line_no, index, "a chunk index")?))
}

fn parse_instr(
    line_no: usize,
    words: &[&str],
    buffers: &[BufferDecl],
    expected_index: usize,
) -> Result<(Instr, Vec<u32>), Error> {
    let [index, op, rest @ ..] = words else { return Err(parse_error(line_no, "expected `#N Op ...`")) };
    if num::<usize>(line_no, &index[1..], "an instruction number")? != expected_index {
        return Err(parse_error(
            line_no,
            format!("instructions must be numbered in order; expected #{expected_index}"),
        ));
    }
    let op = Op::from_name(op).ok_or_else(|| parse_error(line_no, format!("unknown instruction `{op}`")))?;
    let mut instr = Instr {
        op,
        channel: 0,
        count: 1,
        src: Operand::NONE,
        acc: Operand::NONE,
        dst: Operand::NONE,
        send_peer: NO_RANK,
        recv_peer: NO_RANK,
        span: 0,
    };
    let mut deps = Vec::new();
    for word in rest {
        if let Some(span) = word.strip_prefix('@') {
            instr.span = num(line_no, span, "a span number")?;
            continue;
        }
        let (key, value) =
            word.split_once('=').ok_or_else(|| parse_error(line_no, format!("expected KEY=VALUE, found `{word}`")))?;
        match key {
            "src" => instr.src = parse_operand(line_no, value, buffers)?,
            "acc" => instr.acc = parse_operand(line_no, value, buffers)?,
            "dst" => instr.dst = parse_operand(line_no, value, buffers)?,
            "n" => instr.count = num(line_no, value, "a chunk count")?,
            "recv" => instr.recv_peer = num(line_no, value, "a rank")?,
            "send" => instr.send_peer = num(line_no, value, "a rank")?,
            "ch" => instr.channel = num(line_no, value, "a channel")?,
            "deps" => {
                deps = value.split(',').map(|d| num(line_no, d, "an instruction number")).collect::<Result<_, _>>()?
            }
            _ => return Err(parse_error(line_no, format!("unknown key `{key}`"))),
        }
    }
    Ok((instr, deps))
}
