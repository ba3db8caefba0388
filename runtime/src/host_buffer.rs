//! Host buffers a communicator hands out (`Communicator::alloc`, as NCCL's `ncclMemAlloc`): where its transport lets
//! peers read them in place they come from there (rank processes over shm: the process's arena), so a message whose
//! source stays in one goes by reference (single copy); elsewhere from the heap. Either way zeroed and 64-byte
//! aligned.

use crate::transport::shm::ArenaBuf;

/// A zeroed, 64-byte aligned host buffer; read and written as a byte slice.
pub struct HostBuffer {
    ptr: *mut u8,
    len: usize,
    owner: Owner,
}

enum Owner {
    /// Cut from the process's arena: peers read it in place.
    Arena(#[allow(dead_code)] ArenaBuf),
    Heap(std::alloc::Layout),
}

unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    pub(crate) fn arena(buf: ArenaBuf) -> HostBuffer {
        HostBuffer { ptr: buf.as_mut_ptr(), len: buf.len(), owner: Owner::Arena(buf) }
    }

    pub(crate) fn heap(len: usize) -> HostBuffer {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), 64).expect("a buffer smaller than the address space");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        HostBuffer { ptr, len, owner: Owner::Heap(layout) }
    }

    /// Whether peers of this rank read it in place (single copy) rather than through the FIFOs.
    pub fn shared(&self) -> bool {
        matches!(self.owner, Owner::Arena(_))
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes this buffer owns.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Owner::Heap(layout) = self.owner {
            // SAFETY: allocated with this layout in `heap`.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}
