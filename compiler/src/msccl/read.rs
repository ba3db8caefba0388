//! MSCCL XML text -> `Algo`, the file as written (both dialects), every element and attribute checked and bounded,
//! each with its byte range for diagnostics. Meaning (placement, chunks, dependencies) is `lower.rs`'s.

use super::model::{Algo, BufName, Gpu, Step, StepKind, Tb};
use crate::diag::Error;
use collc_grammar::ast::Span;
use roxmltree::{Document, Node, ParsingOptions};

/// The largest file read: the biggest real schedule (RCCL's 64-thread-block allpairs) is 1.3 MB.
pub const MAX_BYTES: usize = 64 << 20;
/// XML nodes (elements, attributes' owners, text, comments) in one file: about 12 per `<step>` line at most.
const MAX_NODES: u32 = 8 << 20;
/// Attributes on one element: a `<step>` has 11.
const MAX_ATTRIBUTES: usize = 32;
/// Elements inside each other: an MSCCL file has four levels; roxmltree recurses when it drops a deep tree.
const MAX_DEPTH: usize = 64;
/// Thread blocks per GPU (MSCCL's runtimes allow 32 per channel, and channels fit in a byte).
const MAX_TBS: usize = 32 * 256;

const HELP: &str = "MSCCL XML: <algo name proto nchannels nchunksperloop ngpus coll inplace [outofplace minBytes \
maxBytes]> holding <gpu id i_chunks o_chunks s_chunks>, each holding <tb id send recv chan>, each holding <step s type \
srcbuf srcoff dstbuf dstoff cnt depid deps hasdep/> (REFERENCE: msccl-tools' ir.py, msccl-executor-nccl's parser)";

fn span(range: std::ops::Range<usize>) -> Span {
    Span { start: range.start as u32, end: range.end as u32 }
}

/// The start tag of an element: what a diagnostic points at (the whole element of a `<gpu>` is thousands of lines).
fn tag_span(node: Node) -> Span {
    let range = node.range();
    let text = node.document().input_text();
    let end = text[range.clone()].find('>').map_or(range.end, |i| range.start + i + 1);
    span(range.start..end)
}

fn error(node: Node, message: impl Into<String>) -> Error {
    Error::new("collc::msccl::format", message, HELP).at(tag_span(node), "in this element")
}

/// Reads and bounds-checks an MSCCL XML file. `max_ranks` bounds `ngpus`.
pub fn read(text: &str, max_ranks: u32) -> Result<Algo, Error> {
    if text.len() > MAX_BYTES {
        return Err(Error::new(
            "collc::msccl::format",
            format!("the file is {} bytes; MSCCL XML files are read up to {} MiB", text.len(), MAX_BYTES >> 20),
            HELP,
        ));
    }
    if let Some(at) = too_deep(text) {
        return Err(Error::new(
            "collc::msccl::format",
            format!("elements nest more than {MAX_DEPTH} deep; an MSCCL file has four levels (algo, gpu, tb, step)"),
            HELP,
        )
        .at(Span { start: at as u32, end: at as u32 }, "here"));
    }
    let options = ParsingOptions { allow_dtd: false, nodes_limit: MAX_NODES };
    let doc = Document::parse_with_options(text, options).map_err(|e| {
        let pos = e.pos();
        let offset = offset_of(text, pos.row as usize, pos.col as usize);
        Error::new("collc::msccl::xml", format!("not well-formed XML: {e}"), HELP)
            .at(Span { start: offset as u32, end: offset as u32 }, "here")
    })?;
    let root = doc.root_element();
    if !root.has_tag_name("algo") {
        return Err(error(
            root,
            format!("the root element is <{}>; an MSCCL file's is <algo>", root.tag_name().name()),
        ));
    }
    read_algo(root, max_ranks)
}

/// Where elements first nest deeper than `MAX_DEPTH`, counting start and end tags (a `>` inside an attribute value
/// may miscount, which only matters for files far from MSCCL's shape).
fn too_deep(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'<') {
        let at = i + offset;
        let end = bytes[at..].iter().position(|&b| b == b'>').map_or(bytes.len(), |e| at + e);
        match bytes.get(at + 1) {
            Some(b'/') => depth = depth.saturating_sub(1),
            Some(b'!' | b'?') => {}
            _ if end > 0 && bytes.get(end - 1) == Some(&b'/') => {}
            _ => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(at);
                }
            }
        }
        i = end.max(at + 1).min(bytes.len());
    }
    None
}

/// The byte offset of a 1-based row and column (in characters).
fn offset_of(text: &str, row: usize, col: usize) -> usize {
    let line_start = text.split_inclusive('\n').take(row.saturating_sub(1)).map(str::len).sum::<usize>();
    let line = text[line_start.min(text.len())..].lines().next().unwrap_or("");
    line_start + line.char_indices().nth(col.saturating_sub(1)).map_or(line.len(), |(i, _)| i)
}

/// The attributes of an element, read by name with their spans; every lookup checks presence and type.
struct Attrs<'a, 'input> {
    node: Node<'a, 'input>,
}

impl<'a, 'input> Attrs<'a, 'input> {
    fn of(node: Node<'a, 'input>) -> Result<Self, Error> {
        let n = node.attributes().len();
        if n > MAX_ATTRIBUTES {
            return Err(error(
                node,
                format!("<{}> has {n} attributes; at most {MAX_ATTRIBUTES}", node.tag_name().name()),
            ));
        }
        Ok(Attrs { node })
    }

    fn raw(&self, name: &str) -> Result<(&'a str, Span), Error> {
        match self.node.attribute_node(name) {
            Some(a) => Ok((a.value(), span(a.range()))),
            None => Err(error(self.node, format!("<{}> lacks the attribute `{name}`", self.node.tag_name().name()))),
        }
    }

    fn optional(&self, name: &str) -> Option<(&'a str, Span)> {
        self.node.attribute_node(name).map(|a| (a.value(), span(a.range())))
    }

    fn int(&self, name: &str, min: i64, max: i64) -> Result<i64, Error> {
        let (value, at) = self.raw(name)?;
        parse_int(value, at, name, min, max)
    }

    fn flag(&self, name: &str) -> Result<Option<bool>, Error> {
        match self.optional(name) {
            None => Ok(None),
            Some((value, at)) => parse_int(value, at, name, 0, 1).map(|v| Some(v == 1)),
        }
    }
}

fn parse_int(value: &str, at: Span, name: &str, min: i64, max: i64) -> Result<i64, Error> {
    let bad = |what: String| {
        Error::new("collc::msccl::format", format!("`{name}=\"{value}\"`: {what}"), HELP).at(at, "this attribute")
    };
    let v: i64 = value.trim().parse().map_err(|_| bad("expected an integer".into()))?;
    if v < min || v > max {
        return Err(bad(format!("expected {min}..={max}")));
    }
    Ok(v)
}

/// The element children of a node, each required to be `<tag>`; text other than whitespace and comments is refused.
fn children<'a, 'input>(node: Node<'a, 'input>, tag: &str) -> Result<Vec<Node<'a, 'input>>, Error> {
    let mut out = Vec::new();
    for child in node.children() {
        if child.is_element() {
            if !child.has_tag_name(tag) {
                return Err(error(
                    child,
                    format!("<{}> inside <{}>: expected <{tag}>", child.tag_name().name(), node.tag_name().name()),
                ));
            }
            out.push(child);
        } else if child.is_text() && !child.text().unwrap_or("").trim().is_empty() {
            return Err(error(
                node,
                format!("text inside <{}>: expected only <{tag}> elements", node.tag_name().name()),
            ));
        }
    }
    Ok(out)
}

const I32: i64 = i32::MAX as i64;

fn read_algo(node: Node, max_ranks: u32) -> Result<Algo, Error> {
    let a = Attrs::of(node)?;
    let (name, _) = a.raw("name")?;
    let proto = a.optional("proto").map_or("Simple", |(p, _)| p).to_string();
    let (coll, coll_span) = a.raw("coll")?;
    let n_gpus = a.int("ngpus", 1, max_ranks as i64)? as u32;
    let mut algo = Algo {
        name: name.to_string(),
        proto,
        n_channels: a.int("nchannels", 1, 256)? as u32,
        chunks_per_loop: a.int("nchunksperloop", 1, I32)? as u32,
        n_gpus,
        coll: coll.to_string(),
        coll_span,
        in_place: a.flag("inplace")?.unwrap_or(false),
        out_of_place: a.flag("outofplace")?,
        min_bytes: a.optional("minBytes").map(|(v, at)| parse_int(v, at, "minBytes", 0, i64::MAX)).transpose()?,
        max_bytes: a.optional("maxBytes").map(|(v, at)| parse_int(v, at, "maxBytes", 0, i64::MAX)).transpose()?,
        span: tag_span(node),
        gpus: Vec::new(),
    };
    let gpus = children(node, "gpu")?;
    if gpus.len() != n_gpus as usize {
        return Err(error(node, format!("ngpus=\"{n_gpus}\" but the file has {} <gpu> elements", gpus.len())));
    }
    let mut seen = vec![false; n_gpus as usize];
    for gpu in gpus {
        let gpu = read_gpu(gpu, n_gpus, algo.n_channels)?;
        if std::mem::replace(&mut seen[gpu.id as usize], true) {
            return Err(Error::new("collc::msccl::format", format!("two <gpu id=\"{}\"> elements", gpu.id), HELP)
                .at(gpu.span, "the second"));
        }
        algo.gpus.push(gpu);
    }
    algo.gpus.sort_by_key(|g| g.id);
    Ok(algo)
}

fn read_gpu(node: Node, n_gpus: u32, n_channels: u32) -> Result<Gpu, Error> {
    let a = Attrs::of(node)?;
    let id = a.int("id", 0, n_gpus as i64 - 1)? as u32;
    let mut gpu = Gpu {
        id,
        i_chunks: a.int("i_chunks", 0, I32)? as u32,
        o_chunks: a.int("o_chunks", 0, I32)? as u32,
        s_chunks: a.int("s_chunks", 0, I32)? as u32,
        span: tag_span(node),
        tbs: Vec::new(),
    };
    let tbs = children(node, "tb")?;
    if tbs.len() > MAX_TBS {
        return Err(error(node, format!("{} thread blocks; at most {MAX_TBS} per GPU", tbs.len())));
    }
    for tb in tbs {
        gpu.tbs.push(read_tb(tb, n_gpus, n_channels)?);
    }
    // Thread block ids are dense from 0 (dependencies name them): sorted, each must be its index.
    gpu.tbs.sort_by_key(|tb| tb.id);
    for (i, tb) in gpu.tbs.iter().enumerate() {
        if tb.id != i as u32 {
            return Err(Error::new(
                "collc::msccl::format",
                format!(
                    "gpu {id}: thread block ids must be 0..{} without gaps or repeats; found id {}",
                    gpu.tbs.len(),
                    tb.id
                ),
                HELP,
            )
            .at(tb.span, "this thread block"));
        }
    }
    Ok(gpu)
}

fn read_tb(node: Node, n_gpus: u32, n_channels: u32) -> Result<Tb, Error> {
    let a = Attrs::of(node)?;
    let peer = |name: &str| -> Result<Option<u32>, Error> {
        let v = a.int(name, -1, n_gpus as i64 - 1)?;
        Ok((v >= 0).then_some(v as u32))
    };
    let mut tb = Tb {
        id: a.int("id", 0, I32)? as u32,
        send: peer("send")?,
        recv: peer("recv")?,
        channel: a.int("chan", 0, n_channels as i64 - 1)? as u32,
        span: tag_span(node),
        steps: Vec::new(),
    };
    for (i, step) in children(node, "step")?.into_iter().enumerate() {
        let step = read_step(step)?;
        if step.s != i as u32 {
            return Err(Error::new(
                "collc::msccl::format",
                format!(
                    "thread block {}: step s=\"{}\" is its step number {i}; steps are numbered 0, 1, ... in order",
                    tb.id, step.s
                ),
                HELP,
            )
            .at(step.span, "this step"));
        }
        tb.steps.push(step);
    }
    Ok(tb)
}

fn read_step(node: Node) -> Result<Step, Error> {
    let a = Attrs::of(node)?;
    let (kind, kind_span) = a.raw("type")?;
    let kind = StepKind::from_name(kind).ok_or_else(|| {
        Error::new(
            "collc::msccl::format",
            format!("unknown step type `{kind}`"),
            "MSCCL's step types: s, r, rcs, rrs, rrc, rrcs, cpy, re, nop",
        )
        .at(kind_span, "this type")
    })?;
    let buf = |name: &str| -> Result<Option<(BufName, Span)>, Error> {
        let Some((value, at)) = a.optional(name) else { return Ok(None) };
        match BufName::from_name(value) {
            Some(b) => Ok(Some((b, at))),
            None if kind == StepKind::Nop || value.is_empty() => Ok(None),
            None => Err(Error::new("collc::msccl::format", format!("`{name}=\"{value}\"`: expected i, o or s"), HELP)
                .at(at, "this buffer")),
        }
    };
    let opt_int = |name: &str, min: i64| -> Result<i64, Error> {
        match a.optional(name) {
            Some((value, at)) => parse_int(value, at, name, min, I32),
            None => Ok(-1),
        }
    };
    Ok(Step {
        s: a.int("s", 0, I32)? as u32,
        kind,
        src: buf("srcbuf")?.map(|(b, at)| opt_int("srcoff", -1).map(|o| (b, o, at))).transpose()?,
        dst: buf("dstbuf")?.map(|(b, at)| opt_int("dstoff", -1).map(|o| (b, o, at))).transpose()?,
        count: match kind {
            StepKind::Nop => opt_int("cnt", 0)?.max(0) as u32,
            _ => a.int("cnt", 1, I32)? as u32,
        },
        dep_tb: opt_int("depid", -1)?,
        dep_step: opt_int("deps", -1)?,
        has_dep: a.flag("hasdep")?.unwrap_or(false),
        span: tag_span(node),
    })
}
