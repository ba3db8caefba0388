//! What the network transports share (tcp, and ib next): a link's ring, which the executor fills and drains
//! without a lock (`ring.rs`); the network proxy that moves the rings' messages over a `Carrier` (`proxy.rs`); the
//! host executor's end of a link over it (`link.rs`); the frame header every message carries (`frame.rs`); and a
//! device's connection record carried by a ring (`record.rs`, GPU ranks on other hosts).

pub(crate) mod frame;
pub(crate) mod link;
pub(crate) mod proxy;
pub(crate) mod record;
pub(crate) mod ring;
