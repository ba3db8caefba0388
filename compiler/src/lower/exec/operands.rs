//! A transfer statement's operands for one iteration: ranks inside `0..p`, chunk ranges inside their buffers, and the
//! checked `ir::Transfer` they make.

use super::{Exec, Result};
use crate::diag::Error;
use crate::ir::{Buf, Loc, Transfer, TransferKind};
use crate::lower::resolve::{RBufRef, RExpr, RTransfer};

impl Exec<'_> {
    fn rank(&mut self, value: i64, expr: &RExpr, what: &str) -> Option<u32> {
        if (0..self.n_ranks as i64).contains(&value) {
            return Some(value as u32);
        }
        let span = expr.span();
        let n = self.n_ranks;
        self.report(
            "rank",
            Error::new(
                "collc::lower::bounds",
                format!("{what} rank {value} is outside 0..{n}"),
                "rank expressions usually need `% p`",
            )
            .at(span, format!("evaluates to {value}")),
        );
        None
    }

    pub(super) fn buf_name(&self, buf: Buf) -> &str {
        match buf {
            Buf::In => "in",
            Buf::Out => "out",
            Buf::Scratch(i) => &self.scratch_names[i as usize],
        }
    }

    fn buf_size(&self, buf: Buf) -> u32 {
        match buf {
            Buf::In => self.buffer_sizes[0],
            Buf::Out => self.buffer_sizes[1],
            Buf::Scratch(i) => self.buffer_sizes[2 + i as usize],
        }
    }

    /// Evaluates `buf[a]` or `buf[a..b]` to a location and a count, checking bounds.
    fn chunk_range(&mut self, r: &RBufRef, frame: &[i64]) -> Result<Option<(Loc, u32)>> {
        let start = self.machine.eval(&r.start, frame)?;
        let end = match &r.end {
            Some(e) => self.machine.eval(e, frame)?,
            None => start.saturating_add(1),
        };
        Ok(self.check_range(r, start, end))
    }

    /// `buf[start..end]` as a location and a count, if it lies inside the buffer (else reported).
    pub(super) fn check_range(&mut self, r: &RBufRef, start: i64, end: i64) -> Option<(Loc, u32)> {
        let size = self.buf_size(r.buf);
        if start < 0 || end > size as i64 || start >= end {
            let name = self.buf_name(r.buf).to_string();
            let what = if start >= end {
                format!("the chunk range {start}..{end} of `{name}` is empty")
            } else {
                format!("chunks {start}..{end} are outside `{name}`, which has {size} chunks")
            };
            let help = format!(
                "`{name}` holds chunks 0..{size} here (chunks = {}); index expressions usually need `% {size}`",
                self.chunks
            );
            self.report(
                "chunk",
                Error::new("collc::lower::bounds", what, help).at(r.span, format!("{name}[{start}..{end}]")),
            );
            return None;
        }
        Some((Loc { buf: r.buf, index: start as u32 }, (end - start) as u32))
    }

    pub(super) fn transfer(&mut self, t: &RTransfer, frame: &[i64]) -> Result<Option<Transfer>> {
        let from = self.machine.eval(&t.from, frame)?;
        let to = self.machine.eval(&t.to, frame)?;
        let channel = match &t.channel {
            Some(c) => self.machine.eval(c, frame)?,
            None => 0,
        };
        let (from, to) = self.check_ranks(t, from, to);
        let src = self.chunk_range(&t.src, frame)?;
        let dst = match &t.dst {
            Some(d) => self.chunk_range(d, frame)?,
            None => src,
        };
        Ok(self.finish_transfer(t, from, to, channel, src, dst))
    }

    /// The transfer's two ranks, if inside 0..p (else reported).
    pub(super) fn check_ranks(&mut self, t: &RTransfer, from: i64, to: i64) -> (Option<u32>, Option<u32>) {
        let is_send = matches!(t.kind, TransferKind::Send { .. });
        (self.rank(from, &t.from, if is_send { "source" } else { "the" }), self.rank(to, &t.to, "destination"))
    }

    /// The checks of a transfer whose ranks and ranges are known (each `None` was reported), and the transfer.
    #[inline(always)]
    pub(super) fn finish_transfer(
        &mut self,
        t: &RTransfer,
        from: Option<u32>,
        to: Option<u32>,
        channel: i64,
        src: Option<(Loc, u32)>,
        dst: Option<(Loc, u32)>,
    ) -> Option<Transfer> {
        let is_send = matches!(t.kind, TransferKind::Send { .. });
        let (Some(from), Some(to), Some((src, count)), Some((dst, dst_count))) = (from, to, src, dst) else {
            return None;
        };
        if !(0..self.limits.max_channels as i64).contains(&channel) {
            self.report(
                "channel",
                Error::new(
                    "collc::lower::bounds",
                    format!("channel {channel} is outside 0..{}", self.limits.max_channels),
                    "use a channel number from 0 to 31",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if count != dst_count {
            self.report(
                "count",
                Error::new(
                    "collc::lower::count",
                    format!("sends {count} chunks into {dst_count}"),
                    "source and destination ranges must have the same length",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if src.index != dst.index && src.index % self.chunks != dst.index % self.chunks {
            let (a, b) = (src.index % self.chunks, dst.index % self.chunks);
            self.report(
                "position",
                Error::new(
                    "collc::lower::position",
                    format!("moves chunk position {a} of a block into position {b} ({} chunks per block)", self.chunks),
                    format!(
                        "a chunk keeps its position in its block everywhere it goes, since chunk sizes differ by one \
                         element when the count does not divide evenly; index every buffer (in, out, scratch) so \
                         that chunk c lands at a multiple of {} plus c",
                        self.chunks
                    ),
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        if is_send && from == to {
            self.report(
                "self",
                Error::new(
                    "collc::lower::self_send",
                    format!("rank {from} sends to itself"),
                    "use `copy SRC to DST on RANK` for a local move",
                )
                .at(t.span, "this send"),
            );
            return None;
        }
        if !is_send && src.buf == dst.buf && src.index < dst.index + count && dst.index < src.index + count {
            self.report(
                "overlap",
                Error::new(
                    "collc::lower::overlap",
                    "source and destination overlap",
                    "a local copy or reduce needs disjoint chunk ranges",
                )
                .at(t.span, "this transfer"),
            );
            return None;
        }
        Some(Transfer {
            kind: t.kind,
            src,
            dst,
            count,
            from,
            to,
            channel: channel as u8,
            step: self.step,
            // `lower` stopped before running a program of more than `MAX_SPANS` transfer statements.
            span: t.span_id as u16,
        })
    }
}
