//! How a call's `count` elements are cut into a schedule's chunks: C chunks per block of `count` elements, the
//! remainder spread over the first chunks, so any count (0, 1, primes, count < C) is valid.

/// Element offsets of every chunk of a buffer made of `blocks` blocks of `count` elements, C chunks each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLayout {
    count: usize,
    chunks: usize,
}

impl ChunkLayout {
    pub fn new(count: usize, chunks: u32) -> Self {
        ChunkLayout { count, chunks: chunks.max(1) as usize }
    }

    /// First element of chunk `c` inside its block.
    fn offset_in_block(&self, c: usize) -> usize {
        let (base, extra) = (self.count / self.chunks, self.count % self.chunks);
        c * base + c.min(extra)
    }

    /// Element range of chunks `index..index + n` of a buffer (which may span several blocks).
    pub fn elements(&self, index: u32, n: u32) -> std::ops::Range<usize> {
        let position = |chunk: usize| (chunk / self.chunks) * self.count + self.offset_in_block(chunk % self.chunks);
        let (first, last) = (index as usize, (index + n) as usize);
        let end = if last % self.chunks == 0 { (last / self.chunks) * self.count } else { position(last) };
        position(first)..end
    }
}

#[cfg(test)]
mod tests {
    use super::ChunkLayout;

    #[test]
    fn remainders_go_to_the_first_chunks() {
        let layout = ChunkLayout::new(10, 4);
        let sizes: Vec<usize> = (0..4).map(|c| layout.elements(c, 1).len()).collect();
        assert_eq!(sizes, [3, 3, 2, 2]);
        assert_eq!(layout.elements(0, 4), 0..10);
        assert_eq!(layout.elements(4, 1), 10..13);
        assert_eq!(layout.elements(3, 2), 8..13);
    }

    #[test]
    fn fewer_elements_than_chunks_leaves_empty_chunks() {
        let layout = ChunkLayout::new(1, 3);
        let sizes: Vec<usize> = (0..3).map(|c| layout.elements(c, 1).len()).collect();
        assert_eq!(sizes, [1, 0, 0]);
        assert_eq!(ChunkLayout::new(0, 3).elements(0, 3), 0..0);
    }
}
