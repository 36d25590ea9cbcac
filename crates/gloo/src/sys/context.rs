//! [`Context`]: a Gloo TCP full-mesh context, made by a rendezvous.

use super::{free_on_drop, made, timeout_ms, Api, StoreHandle};
use crate::GlooError;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::time::Duration;

/// An adapter context handle: a Gloo TCP full-mesh context and its device.
/// Freed once, by Drop (buffers made from it keep Gloo's transport context
/// alive on their own).
#[derive(Debug)]
pub(crate) struct Context {
    pub(super) api: &'static Api,
    pub(super) ptr: NonNull<c_void>,
}

// SAFETY: the handle owns its heap object outright; Gloo's context is not
// tied to the thread that made it (its event loop runs on its own thread).
unsafe impl Send for Context {}
// SAFETY: `&Context` allows only `Buffer::new` (createUnboundBuffer reads
// only state fixed at connect) and `close` (closeConnections closes each pair
// under that pair's own mutex), both safe to call concurrently in Gloo's TCP
// transport; GlooTransport also serialises them.
unsafe impl Sync for Context {}

// SAFETY (`free_on_drop!`'s contract): `ptr` came from
// ccol_gloo_context_new (in `connect`) and is freed once, by this Drop;
// every use of it borrowed `self`. ccol_gloo_context_free catches exceptions.
free_on_drop!(Context, context_free);

impl Context {
    /// A full-mesh TCP context of `size` ranks, rendezvousing through `store`
    /// (used only during the call); `hostname` is the address peers connect
    /// to for this rank.
    pub(crate) fn connect(
        store: &StoreHandle,
        rank: i32,
        size: i32,
        hostname: &CStr,
        timeout: Duration,
    ) -> Result<Self, GlooError> {
        let _serial = store.lock();
        let ptr = made("rendezvous", |err| {
            // SAFETY: `store.ptr` is live (borrowed) and used only during the
            // call; `hostname` is NUL-terminated and alive for the call (Gloo
            // copies it); `err` is writable.
            unsafe {
                (store.api.context_new)(
                    store.ptr.as_ptr(),
                    rank,
                    size,
                    hostname.as_ptr(),
                    timeout_ms(timeout),
                    err,
                )
            }
        })?;
        Ok(Context {
            api: store.api,
            ptr,
        })
    }

    /// Closes every connection (peers waiting on this rank see the close).
    pub(crate) fn close(&self) {
        // SAFETY: `ptr` is live (borrowed); closing is idempotent and
        // ccol_gloo_context_close catches exceptions.
        unsafe { (self.api.context_close)(self.ptr.as_ptr()) };
    }
}
