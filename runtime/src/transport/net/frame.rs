//! What travels on a data connection: frames of a fixed 64-byte header, then (for data) the message. The header
//! carries the call's fingerprint (job, sequence, schedule hash, collective, dtype, op, placement, count, root), so a
//! receiver that is in another call says which two calls met, and the link key (channel, slot size and lane: a
//! device rank runs each channel's tiles over several lanes, each with its connection record), so the message's
//! length is checked against the plan's slot before a byte of it is read.
//!
//! Decoding is total: any 64 bytes give a header or a `FrameError` saying what is wrong with them.

use crate::transport::{CallInfo, Stamp};

pub const HEADER: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"CLLF");
/// The largest slot any plan makes (`COLLC_SLOT_BYTES` allows up to 2^30).
pub const MAX_SLOT: u32 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A message for the link `(channel, slot_bytes)`: `len` bytes follow.
    Data,
    /// The receiver of link `(channel, slot_bytes)` has consumed `consumed` messages of it: room for more.
    Credit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub channel: u8,
    /// The lane of a device rank's channel (0 for host ranks).
    pub lane: u16,
    pub slot_bytes: u32,
    pub len: u32,
    /// Data: the call's sequence number; credit: messages consumed.
    pub seq: u64,
    pub fingerprint: u64,
    pub job: u64,
    pub call: CallInfo,
    /// Data: 1 + the messages the sender has consumed of the link the other way with the same channel and slot
    /// size (a credit riding on the message), 0 for none.
    pub credit: u64,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:#010x}: not a collc frame")]
    Magic(u32),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("slot size {0} is not a power of two up to 2^30")]
    SlotBytes(u32),
    #[error("a message of {len} bytes does not fit the link's slots of {slot_bytes}")]
    TooLong { len: u32, slot_bytes: u32 },
    #[error("a credit frame carries {0} bytes")]
    CreditLength(u32),
}

impl Frame {
    /// A message of `call` (whose sequence number and fingerprint the header carries as the stamp's).
    pub fn data(key: (u8, u16), slot_bytes: u32, len: u32, stamp: Stamp, job: u64, call: CallInfo) -> Frame {
        let ((channel, lane), (seq, fingerprint)) = (key, (stamp.seq, stamp.fingerprint));
        let call = CallInfo { seq, fingerprint, ..call };
        Frame { kind: Kind::Data, channel, lane, slot_bytes, len, seq, fingerprint, job, call, credit: 0 }
    }

    pub fn credit(key: (u8, u16), slot_bytes: u32, consumed: u64, job: u64) -> Frame {
        let (channel, lane) = key;
        let call = CallInfo { seq: consumed, ..CallInfo::NONE };
        let fingerprint = 0;
        Frame {
            kind: Kind::Credit,
            channel,
            lane,
            slot_bytes,
            len: 0,
            seq: consumed,
            fingerprint,
            job,
            call,
            credit: 0,
        }
    }

    pub fn stamp(&self) -> Stamp {
        Stamp { seq: self.seq, fingerprint: self.fingerprint }
    }

    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = match self.kind {
            Kind::Data => 1,
            Kind::Credit => 2,
        };
        b[5] = self.channel;
        b[6..8].copy_from_slice(&self.lane.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot_bytes.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[32..40].copy_from_slice(&self.job.to_le_bytes());
        b[40..44].copy_from_slice(&self.call.kind.to_le_bytes());
        b[44..48].copy_from_slice(&self.call.root.to_le_bytes());
        b[48..56].copy_from_slice(&self.call.count.to_le_bytes());
        b[56..64].copy_from_slice(&self.credit.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER]) -> Result<Frame, FrameError> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return Err(FrameError::Magic(u32_at(0)));
        }
        let kind = match b[4] {
            1 => Kind::Data,
            2 => Kind::Credit,
            other => return Err(FrameError::Kind(other)),
        };
        let (slot_bytes, len) = (u32_at(8), u32_at(12));
        if !slot_bytes.is_power_of_two() || slot_bytes > MAX_SLOT {
            return Err(FrameError::SlotBytes(slot_bytes));
        }
        match kind {
            Kind::Data if len > slot_bytes => return Err(FrameError::TooLong { len, slot_bytes }),
            Kind::Credit if len != 0 => return Err(FrameError::CreditLength(len)),
            _ => {}
        }
        let (seq, fingerprint) = (u64_at(16), u64_at(24));
        let call = CallInfo { seq, count: u64_at(48), kind: u32_at(40), root: u32_at(44), fingerprint };
        let credit = u64_at(56);
        if kind == Kind::Credit && credit != 0 {
            return Err(FrameError::Reserved);
        }
        let lane = u16::from_le_bytes([b[6], b[7]]);
        Ok(Frame { kind, channel: b[5], lane, slot_bytes, len, seq, fingerprint, job: u64_at(32), call, credit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn call() -> CallInfo {
        CallInfo { seq: 7, count: 1000, kind: 0x0007_0000, root: 0, fingerprint: 0xfeed }
    }

    #[test]
    fn a_frame_round_trips_and_a_long_message_is_refused() {
        let frame = Frame::data((3, 2), 1 << 16, 4096, Stamp { seq: 7, fingerprint: 0xfeed }, 42, call());
        assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
        let mut long = frame.encode();
        long[12..16].copy_from_slice(&((1u32 << 16) + 1).to_le_bytes());
        assert_eq!(Frame::decode(&long), Err(FrameError::TooLong { len: (1 << 16) + 1, slot_bytes: 1 << 16 }));
        let mut garbage = [0xffu8; HEADER];
        assert!(matches!(Frame::decode(&garbage), Err(FrameError::Magic(_))));
        garbage[..4].copy_from_slice(b"CLLF");
        assert_eq!(Frame::decode(&garbage), Err(FrameError::Kind(0xff)));
    }

    proptest! {
        /// Any 64 bytes decode to a frame whose message fits its slot, or to an error: never a panic, and never a
        /// length larger than the slot it claims.
        #[test]
        fn decoding_any_bytes_is_total(bytes in proptest::collection::vec(any::<u8>(), HEADER), magic in any::<bool>()) {
            let mut b: [u8; HEADER] = bytes.try_into().unwrap();
            if magic {
                b[..4].copy_from_slice(b"CLLF");
            }
            if let Ok(frame) = Frame::decode(&b) {
                prop_assert!(frame.len <= frame.slot_bytes && frame.slot_bytes <= MAX_SLOT);
                prop_assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
            }
        }

        #[test]
        fn every_encoded_frame_decodes_to_itself(
            channel in any::<u8>(), lane in any::<u16>(), shift in 0u32..=30, len in any::<u32>(), seq in any::<u64>(),
            fingerprint in any::<u64>(), job in any::<u64>(), count in any::<u64>(), kind in any::<u32>(),
        ) {
            let slot_bytes = 1u32 << shift;
            let call = CallInfo { seq, count, kind, root: 3, fingerprint };
            let mut frame = Frame::data((channel, lane), slot_bytes, len % (slot_bytes + 1), Stamp { seq, fingerprint }, job, call);
            frame.credit = count ^ job;
            prop_assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
        }
    }
}
