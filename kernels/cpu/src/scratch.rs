//! Per-thread scratch memory and a writer for disjoint strided rows, so kernels that run once
//! per (batch, head) neither allocate (and page-fault) fresh buffers on every call nor gather
//! their results through a temporary copy.

use std::cell::RefCell;
use std::marker::PhantomData;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `n` floats of this thread's scratch memory, returned to the thread when dropped (contents
/// unspecified: callers initialise what they read). A guard rather than a closure, so that
/// kernel code using it stays inside the caller's `#[target_feature]` function.
pub(crate) struct Scratch {
    buf: Vec<f32>,
    n: usize,
}

impl Scratch {
    pub(crate) fn get(n: usize) -> Scratch {
        // A nested `get` on the same thread finds the slot empty and allocates its own.
        let mut buf = SCRATCH.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
        if buf.len() < n {
            buf.resize(n, 0.0);
        }
        Scratch { buf, n }
    }

    pub(crate) fn as_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.n]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        SCRATCH.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.len() < buf.len() {
                *slot = buf;
            }
        });
    }
}

/// Splits the first `n` elements off `rest`.
pub(crate) fn take<'a>(rest: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let (head, tail) = std::mem::take(rest).split_at_mut(n);
    *rest = tail;
    head
}

/// Splits the first `n` elements off `rest` as `u32` (bf16 pair buffers share the f32 scratch).
pub(crate) fn take_u32<'a>(rest: &mut &'a mut [f32], n: usize) -> &'a mut [u32] {
    let head = take(rest, n);
    // SAFETY: f32 and u32 have the same size and alignment and every bit pattern is valid for
    // both; the slice covers the same bytes under the same exclusive borrow.
    unsafe { std::slice::from_raw_parts_mut(head.as_mut_ptr() as *mut u32, n) }
}

/// Shared handle for writing rows of one output tensor from several threads, where each
/// thread owns a disjoint set of rows (e.g. one attention head's columns of `(B, T, C)`).
pub(crate) struct RowWriter<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the writer is only a pointer to a mutable borrow held for 'a; `row`'s contract makes
// concurrent writers touch disjoint elements.
unsafe impl<T: Send> Send for RowWriter<'_, T> {}
unsafe impl<T: Send> Sync for RowWriter<'_, T> {}

impl<'a, T: Copy> RowWriter<'a, T> {
    pub(crate) fn new(data: &'a mut [T]) -> RowWriter<'a, T> {
        RowWriter { ptr: data.as_mut_ptr(), len: data.len(), _borrow: PhantomData }
    }

    /// Copies `src` to elements `[off, off + src.len())`.
    ///
    /// # Safety
    /// No other thread may write or read that range while the writer lives.
    pub(crate) unsafe fn write(&self, off: usize, src: &[T]) {
        assert!(off + src.len() <= self.len, "RowWriter: row out of bounds");
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len());
    }

    /// Elements `[off, off + len)` as a mutable slice (for writers that convert in place).
    ///
    /// # Safety
    /// As [`RowWriter::write`]: no other thread may touch that range while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn row_mut(&self, off: usize, len: usize) -> &mut [T] {
        assert!(off + len <= self.len, "RowWriter: row out of bounds");
        std::slice::from_raw_parts_mut(self.ptr.add(off), len)
    }
}
