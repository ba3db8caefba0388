//! `ir::Program`: an algorithm lowered for one binding of its parameters: chunk-level transfers grouped in steps.

use crate::collective::Collective;
use collc_grammar::ast::Span;
use std::fmt;

/// A buffer as the algorithm names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    In,
    Out,
    /// Lowering allows at most 252 scratch declarations (`collc::lower::scratch`), as a schedule's `BufId` does.
    Scratch(u8),
}

/// A run of `count` chunks starting at `index` of one buffer (on a rank the transfer names). Packed (6 bytes), as
/// programs of thousands of ranks hold tens of millions of transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed)]
pub struct Loc {
    pub buf: Buf,
    pub index: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferKind {
    /// `send src from r to q as dst [reduce]`
    Send { reduce: bool },
    /// `copy src to dst on r`
    Copy,
    /// `reduce src into dst on r`: dst = dst + src
    Reduce,
}

/// One chunk-level transfer. For `Copy` and `Reduce`, `from == to` is the rank it runs on. 32 bytes (asserted): the
/// word fields first, then the packed locations and the bytes.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Transfer {
    pub count: u32,
    pub from: u32,
    pub to: u32,
    pub step: u32,
    pub src: Loc,
    pub dst: Loc,
    pub kind: TransferKind,
    pub channel: u8,
    /// Index into `Program::spans`: the statement that emitted this transfer (at most `sched::MAX_SPANS`).
    pub span: u16,
}

const _: () = assert!(std::mem::size_of::<Transfer>() == 32);

#[derive(Clone, Debug)]
pub struct ScratchBuf {
    pub name: String,
    pub chunks: u32,
}

/// A lowered algorithm. Transfers are in program order; `step` numbers never decrease.
#[derive(Clone, Debug)]
pub struct Program {
    pub name: String,
    pub collective: Collective,
    pub n_ranks: u32,
    /// C: chunks per rank block (the contract's unit).
    pub chunks: u32,
    /// The algorithm's declared default for the pipelining pass (`pipeline K`; 1 when it declares none).
    pub pipeline: u32,
    pub root: u32,
    pub peer: u32,
    /// Every parameter with the value it was bound to, in declaration order.
    pub params: Vec<(String, i64)>,
    pub scratch: Vec<ScratchBuf>,
    pub transfers: Vec<Transfer>,
    /// The largest `count` of any transfer (0 when there are none): whether any transfer can be cut, known without
    /// a pass over millions of them.
    pub max_count: u32,
    pub n_steps: u32,
    /// Source spans of the transfer statements; `spans[0]` is the algorithm's name (for compiler-made transfers).
    pub spans: Vec<Span>,
}

impl Program {
    pub fn buffer_chunks(&self) -> (u32, u32) {
        self.collective.buffer_chunks(self.n_ranks, self.chunks)
    }

    pub fn buf_name(&self, buf: Buf) -> &str {
        match buf {
            Buf::In => "in",
            Buf::Out => "out",
            Buf::Scratch(i) => &self.scratch[i as usize].name,
        }
    }

    fn fmt_loc(&self, f: &mut fmt::Formatter<'_>, loc: Loc, count: u32) -> fmt::Result {
        let index = loc.index;
        write!(f, "{}[{index}", self.buf_name(loc.buf))?;
        if count != 1 {
            write!(f, "..{}", index + count)?;
        }
        f.write_str("]")
    }
}

/// The canonical text of the IR (`collc build --emit ir`).
impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "program {}/{} ranks {} chunks {} root {} peer {}",
            self.collective, self.name, self.n_ranks, self.chunks, self.root, self.peer
        )?;
        for (name, value) in &self.params {
            write!(f, " {name}={value}")?;
        }
        writeln!(f)?;
        for s in &self.scratch {
            writeln!(f, "scratch {}[{}]", s.name, s.chunks)?;
        }
        let mut step = u32::MAX;
        for t in &self.transfers {
            if t.step != step {
                step = t.step;
                writeln!(f, "step {step}")?;
            }
            f.write_str("  ")?;
            match t.kind {
                TransferKind::Send { reduce } => {
                    f.write_str("send ")?;
                    self.fmt_loc(f, t.src, t.count)?;
                    write!(f, " from {} to {} as ", t.from, t.to)?;
                    self.fmt_loc(f, t.dst, t.count)?;
                    if reduce {
                        f.write_str(" reduce")?;
                    }
                    if t.channel != 0 {
                        write!(f, " channel {}", t.channel)?;
                    }
                }
                TransferKind::Copy | TransferKind::Reduce => {
                    let (verb, link) = if t.kind == TransferKind::Copy { ("copy", "to") } else { ("reduce", "into") };
                    write!(f, "{verb} ")?;
                    self.fmt_loc(f, t.src, t.count)?;
                    write!(f, " {link} ")?;
                    self.fmt_loc(f, t.dst, t.count)?;
                    write!(f, " on {}", t.from)?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
