//! The buffers of one operation, freed only when it completed.

use crate::sys::Buffer;

/// Buffers of one operation. Unless [`Pool::release`] is called (the
/// operation completed), dropping the pool leaks every buffer and its memory:
/// after an error Gloo may still touch them.
#[derive(Default)]
pub(super) struct Pool {
    bufs: Vec<Buffer>,
    done: bool,
}

impl Pool {
    pub(super) fn add(&mut self, b: Buffer) -> usize {
        self.bufs.push(b);
        self.bufs.len() - 1
    }

    pub(super) fn get(&self, i: usize) -> &Buffer {
        &self.bufs[i]
    }

    pub(super) fn get_mut(&mut self, i: usize) -> &mut Buffer {
        &mut self.bufs[i]
    }

    /// Every buffer, in the order added.
    pub(super) fn buffers(&self) -> &[Buffer] {
        &self.bufs
    }

    pub(super) fn release(mut self) {
        self.done = true;
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.done {
            for b in self.bufs.drain(..) {
                b.leak();
            }
        }
    }
}
