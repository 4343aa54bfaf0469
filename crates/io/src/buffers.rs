//! Reusable receive buffers.
//!
//! A freshly allocated 16 MiB buffer costs a page fault per 4 KiB the first
//! time the kernel writes into it — on a fast link that is a large share of
//! the CPU per byte (AnyBlob keeps its buffers for the same reason). The
//! pool hands out buffers by power-of-two size class and takes them back
//! when the last `Bytes` pointing into them is dropped, up to a cap on the
//! bytes it retains.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Smallest class: below it, allocation is cheap and pooling not worth it.
const MIN_CLASS: u32 = 16; // 64 KiB
const CLASSES: usize = 16; // up to 2^31

/// Buffers kept for reuse, by size class.
#[derive(Debug)]
pub struct BufferPool {
    inner: Mutex<PoolInner>,
    /// Bytes of idle buffers kept at most.
    retain: usize,
}

#[derive(Debug, Default)]
struct PoolInner {
    free: [Vec<Vec<u8>>; CLASSES],
    retained: usize,
}

impl BufferPool {
    /// A pool keeping at most `retain` bytes of idle buffers.
    pub fn new(retain: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool { inner: Mutex::new(PoolInner::default()), retain })
    }

    fn class(size: usize) -> Option<usize> {
        let bits = size.max(1).next_power_of_two().trailing_zeros().max(MIN_CLASS);
        let c = (bits - MIN_CLASS) as usize;
        (c < CLASSES).then_some(c)
    }

    /// An empty buffer with capacity for at least `size` bytes.
    pub fn take(&self, size: usize) -> Vec<u8> {
        let Some(c) = Self::class(size) else { return Vec::with_capacity(size) };
        let mut inner = self.inner.lock().expect("not poisoned");
        match inner.free[c].pop() {
            Some(mut v) => {
                inner.retained -= v.capacity();
                v.clear();
                v
            }
            None => Vec::with_capacity(1 << (c as u32 + MIN_CLASS)),
        }
    }

    /// Returns a buffer for reuse (dropped if the pool is full or the
    /// buffer's capacity is not a class size).
    pub fn give(&self, v: Vec<u8>) {
        let cap = v.capacity();
        if !cap.is_power_of_two() {
            return;
        }
        let Some(c) = Self::class(cap) else { return };
        let mut inner = self.inner.lock().expect("not poisoned");
        if inner.retained + cap <= self.retain {
            inner.retained += cap;
            inner.free[c].push(v);
        }
    }

    /// Wraps a filled buffer as `Bytes` that returns it to the pool when
    /// the last reference is dropped.
    pub fn freeze(self: &Arc<Self>, v: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled { buf: Some(v), pool: self.clone() })
    }

    /// Bytes of idle buffers held now.
    pub fn retained(&self) -> usize {
        self.inner.lock().expect("not poisoned").retained
    }
}

struct Pooled {
    buf: Option<Vec<u8>>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_deref().expect("present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(v) = self.buf.take() {
            self.pool.give(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_the_last_bytes_is_dropped() {
        let pool = BufferPool::new(64 << 20);
        let mut v = pool.take(3 << 20);
        assert_eq!(v.capacity(), 4 << 20);
        v.extend_from_slice(&[7u8; 1000]);
        let ptr = v.as_ptr();
        let b = pool.freeze(v);
        let slice = b.slice(10..20);
        drop(b);
        assert_eq!(pool.retained(), 0, "a slice still holds the buffer");
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        assert_eq!(pool.retained(), 4 << 20);
        let again = pool.take(4 << 20);
        assert_eq!(again.as_ptr(), ptr, "the same memory is reused");
        assert!(again.is_empty());
    }

    #[test]
    fn the_pool_keeps_at_most_its_cap() {
        let pool = BufferPool::new(5 << 20);
        let a = pool.take(4 << 20);
        let b = pool.take(4 << 20);
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.retained(), 4 << 20);
        // Odd capacities are not pooled.
        pool.give(Vec::with_capacity(3_000_000));
        assert_eq!(pool.retained(), 4 << 20);
    }
}
