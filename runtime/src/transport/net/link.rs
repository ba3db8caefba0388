//! One end of a link as the host executor drives it over a network transport (tcp, ib): the executor's link
//! operations are a few atomic operations on the link's ring (`ring.rs`); the proxy (`proxy.rs`) moves the
//! messages, on its thread or, inline, when the executor posts, waits or releases.

use super::proxy::{Carrier, Shared};
use super::ring::{Meta, Ring};
use crate::transport::{CallInfo, Link, LinkFault, Stamp};
use std::sync::Arc;

/// One end of a link over a network: its ring, which the proxy carries, and the call its messages belong to.
pub(crate) struct RingLink<C: Carrier> {
    ring: Arc<Ring>,
    proxy: Arc<Shared<C>>,
    call: CallInfo,
}

impl<C: Carrier> RingLink<C> {
    pub fn new(ring: Arc<Ring>, proxy: Arc<Shared<C>>) -> RingLink<C> {
        RingLink { ring, proxy, call: CallInfo::NONE }
    }
}

impl<C: Carrier> Link for RingLink<C> {
    fn reserve(&mut self) -> Option<*mut u8> {
        self.ring.reserve().or_else(|| {
            // Credits come with the peer's frames: inline, read them.
            self.proxy.missed(&self.ring);
            self.ring.reserve()
        })
    }

    fn post(&mut self, stamp: Stamp, len: usize) {
        self.ring.post(Meta { stamp, len, call: self.call });
        self.proxy.posted(&self.ring);
    }

    fn peek(&mut self) -> Option<(Stamp, *const u8)> {
        let arrived = self.ring.peek().or_else(|| {
            self.proxy.missed(&self.ring);
            self.ring.peek()
        });
        arrived.map(|(frame, slot)| (frame.stamp(), slot))
    }

    fn release(&mut self) {
        self.ring.release();
        self.proxy.released();
    }

    fn sender_call(&self) -> Option<CallInfo> {
        self.ring.peek().map(|(frame, _)| frame.call)
    }

    fn start(links: &mut [Self], call: &CallInfo) {
        for link in links {
            link.call = *call;
        }
    }

    fn progress(links: &mut [Self], ours: Stamp, block: bool) -> Result<(), LinkFault> {
        let Some(link) = links.first() else { return Ok(()) };
        link.proxy.progress(block);
        if let Some((peer, how)) = link.proxy.fault() {
            return Err(LinkFault::Peer(peer, how));
        }
        // A peer's frame waiting for a link this rank has not opened, from the same call: the calls differ.
        if let Some((peer, frame)) = link.proxy.parked_in(ours.seq) {
            return Err(LinkFault::Mismatch { peer, theirs: frame.stamp(), call: Some(frame.call) });
        }
        Ok(())
    }

    fn flushed(links: &mut [Self]) -> bool {
        let flushed = links.iter().all(|link| link.ring.flushed());
        if !flushed {
            if let Some(link) = links.first() {
                link.proxy.progress(false);
            }
        }
        flushed
    }
}
