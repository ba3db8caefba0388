//! Per-slot access history of one rank: the last writer and the readers since, as hazard analysis and the race
//! check need them. Most slots have at most two readers between writes, so two are kept inline.

use crate::fxhash::FxBuildHasher;
use std::collections::HashMap;

pub(crate) const NONE: u32 = u32::MAX;

pub(crate) struct SlotHistory {
    last_writer: Vec<u32>,
    readers: Vec<[u32; 2]>,
    more_readers: HashMap<u32, Vec<u32>, FxBuildHasher>,
    touched: Vec<u32>,
}

impl SlotHistory {
    pub fn new(slots: usize) -> Self {
        SlotHistory {
            last_writer: vec![NONE; slots],
            readers: vec![[NONE; 2]; slots],
            more_readers: HashMap::default(),
            touched: Vec::new(),
        }
    }

    pub fn last_writer(&self, slot: usize) -> u32 {
        self.last_writer[slot]
    }

    /// The readers of `slot` since its last write.
    pub fn readers(&self, slot: usize) -> impl Iterator<Item = u32> + '_ {
        let inline = self.readers[slot];
        // Only a slot whose two inline places are taken can have more: look those up, and no other.
        let more = if inline[1] == NONE { None } else { self.more_readers.get(&(slot as u32)) };
        inline.into_iter().filter(|&r| r != NONE).chain(more.into_iter().flatten().copied())
    }

    pub fn read(&mut self, slot: usize, instr: u32) {
        let inline = &mut self.readers[slot];
        if inline[0] == NONE {
            inline[0] = instr;
            self.touched.push(slot as u32);
        } else if inline[1] == NONE {
            inline[1] = instr;
        } else {
            self.more_readers.entry(slot as u32).or_default().push(instr);
        }
    }

    pub fn write(&mut self, slot: usize, instr: u32) {
        if self.readers[slot][1] != NONE {
            self.more_readers.remove(&(slot as u32));
        }
        self.readers[slot] = [NONE; 2];
        self.last_writer[slot] = instr;
        self.touched.push(slot as u32);
    }

    /// Forgets everything, in time proportional to what was touched.
    pub fn reset(&mut self) {
        for &slot in &self.touched {
            self.last_writer[slot as usize] = NONE;
            self.readers[slot as usize] = [NONE; 2];
        }
        self.more_readers.clear();
        self.touched.clear();
    }
}
