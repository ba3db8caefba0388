//! An MSCCL XML file as written: `<algo>`, its `<gpu>`s, their thread blocks (`<tb>`) and steps, each with where it
//! stands in the text. `read.rs` makes one from text, `write.rs` prints one, `lower.rs` gives it meaning.

use collc_grammar::ast::Span;

/// The two dialects of MSCCL XML: the NCCL fork's interpreter (msccl-tools' output, no placement or size range on
/// `<algo>`) and msccl-executor-nccl / RCCL's, which requires `outofplace`, `minBytes` and `maxBytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Legacy,
    Executor,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Legacy => "msccl-legacy",
            Dialect::Executor => "msccl-executor",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Algo {
    pub name: String,
    pub proto: String,
    pub n_channels: u32,
    pub chunks_per_loop: u32,
    pub n_gpus: u32,
    pub coll: String,
    pub coll_span: Span,
    pub in_place: bool,
    /// Only the executor dialect writes it.
    pub out_of_place: Option<bool>,
    pub min_bytes: Option<i64>,
    pub max_bytes: Option<i64>,
    /// The `<algo ...>` start tag.
    pub span: Span,
    /// Sorted by id, one per rank.
    pub gpus: Vec<Gpu>,
}

impl Algo {
    pub fn dialect(&self) -> Dialect {
        match self.out_of_place.is_some() || self.min_bytes.is_some() || self.max_bytes.is_some() {
            true => Dialect::Executor,
            false => Dialect::Legacy,
        }
    }

    pub fn n_steps(&self) -> usize {
        self.gpus.iter().flat_map(|g| &g.tbs).map(|tb| tb.steps.len()).sum()
    }
}

#[derive(Clone, Debug)]
pub struct Gpu {
    pub id: u32,
    pub i_chunks: u32,
    pub o_chunks: u32,
    pub s_chunks: u32,
    pub span: Span,
    /// Sorted by id; ids are dense from 0.
    pub tbs: Vec<Tb>,
}

/// A thread block: one send peer and one receive peer on one channel, running its steps in order.
#[derive(Clone, Debug)]
pub struct Tb {
    pub id: u32,
    pub send: Option<u32>,
    pub recv: Option<u32>,
    pub channel: u32,
    pub span: Span,
    pub steps: Vec<Step>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Send,
    Recv,
    RecvCopySend,
    RecvReduceSend,
    RecvReduceCopy,
    RecvReduceCopySend,
    Copy,
    Reduce,
    Nop,
}

impl StepKind {
    const NAMES: [(StepKind, &'static str); 9] = [
        (StepKind::Send, "s"),
        (StepKind::Recv, "r"),
        (StepKind::RecvCopySend, "rcs"),
        (StepKind::RecvReduceSend, "rrs"),
        (StepKind::RecvReduceCopy, "rrc"),
        (StepKind::RecvReduceCopySend, "rrcs"),
        (StepKind::Copy, "cpy"),
        (StepKind::Reduce, "re"),
        (StepKind::Nop, "nop"),
    ];

    pub fn from_name(name: &str) -> Option<StepKind> {
        Self::NAMES.iter().find(|(_, n)| *n == name).map(|(k, _)| *k)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(k, _)| *k == self).map_or("nop", |(_, n)| n)
    }
}

/// MSCCL's three buffers: input, output, scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufName {
    Input,
    Output,
    Scratch,
}

impl BufName {
    pub fn from_name(name: &str) -> Option<BufName> {
        match name {
            "i" => Some(BufName::Input),
            "o" => Some(BufName::Output),
            "s" => Some(BufName::Scratch),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BufName::Input => "i",
            BufName::Output => "o",
            BufName::Scratch => "s",
        }
    }
}

/// A buffer and a chunk offset (-1 where the writer left it unset), with the attribute's span.
pub type StepOperand = (BufName, i64, Span);

#[derive(Clone, Debug)]
pub struct Step {
    pub s: u32,
    pub kind: StepKind,
    pub src: Option<StepOperand>,
    pub dst: Option<StepOperand>,
    pub count: u32,
    /// The thread block (of this GPU) and step this one waits for; -1 for none.
    pub dep_tb: i64,
    pub dep_step: i64,
    /// Whether the step publishes its completion for other thread blocks to wait on.
    pub has_dep: bool,
    pub span: Span,
}
