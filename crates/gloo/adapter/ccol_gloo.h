/*
 * C ABI of the compiler-collectives Gloo adapter.
 *
 * The adapter is a shared object that links Debian's libgloo and is loaded at
 * run time with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND), so its Gloo
 * symbols never meet the Gloo copy inside libtorch. Every entry point catches
 * every C++ exception and reports it through a ccol_gloo_error; nothing
 * unwinds across this boundary.
 */
#ifndef CCOL_GLOO_H
#define CCOL_GLOO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CCOL_GLOO_ABI_VERSION 2u

/* Status codes. */
#define CCOL_GLOO_OK 0
#define CCOL_GLOO_TIMEOUT 1   /* a deadline passed (gloo::IoException "Timed out ...") */
#define CCOL_GLOO_IO 2        /* any other gloo::IoException (peer closed, socket error) */
#define CCOL_GLOO_INVALID 3   /* gloo::EnforceNotMet or a bad argument */
#define CCOL_GLOO_OTHER 4     /* any other exception */
#define CCOL_GLOO_ABORTED 5   /* a wait was interrupted by ccol_gloo_buffer_abort_wait */

typedef struct ccol_gloo_error {
    int32_t status;
    char message[1024];
} ccol_gloo_error;

/* Appends bytes to a caller-owned output (used to return variable-length values). */
typedef void (*ccol_gloo_append_fn)(void* out, const uint8_t* data, size_t len);

/* A store implemented by the caller. Each function returns a status code and
 * fills `err` on failure. `drop` is called once when the store is freed. */
typedef struct ccol_gloo_store_vtable {
    void* ctx;
    int32_t (*set)(void* ctx, const char* key, const uint8_t* data, size_t len, ccol_gloo_error* err);
    int32_t (*get)(void* ctx, const char* key, int64_t timeout_ms, void* out, ccol_gloo_append_fn append,
                   ccol_gloo_error* err);
    int32_t (*wait)(void* ctx, const char* const* keys, size_t n, int64_t timeout_ms, ccol_gloo_error* err);
    void (*drop)(void* ctx);
} ccol_gloo_store_vtable;

uint32_t ccol_gloo_abi_version(void);

/* Stores. Each returns a handle or NULL with `err` filled. */
void* ccol_gloo_store_file(const char* path, ccol_gloo_error* err);
void* ccol_gloo_store_hash(ccol_gloo_error* err);
void* ccol_gloo_store_redis(const char* host, int32_t port, ccol_gloo_error* err);
void* ccol_gloo_store_prefix(void* store, const char* prefix, ccol_gloo_error* err);
void* ccol_gloo_store_callbacks(ccol_gloo_store_vtable vtable, int64_t timeout_ms, ccol_gloo_error* err);
int32_t ccol_gloo_store_set(void* store, const char* key, const uint8_t* data, size_t len, ccol_gloo_error* err);
int32_t ccol_gloo_store_get(void* store, const char* key, int64_t timeout_ms, void* out, ccol_gloo_append_fn append,
                            ccol_gloo_error* err);
int32_t ccol_gloo_store_wait(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                             ccol_gloo_error* err);
void ccol_gloo_store_free(void* store);

/* A full-mesh TCP context of `size` ranks, rendezvous through `store`.
 * `hostname` is the address peers connect to (e.g. "127.0.0.1"). */
void* ccol_gloo_context_new(void* store, int32_t rank, int32_t size, const char* hostname, int64_t timeout_ms,
                            ccol_gloo_error* err);
/* Closes every connection (peers waiting on this rank see the close). */
void ccol_gloo_context_close(void* context);
void ccol_gloo_context_free(void* context);

/* Unbound buffers over caller memory that must outlive the buffer. */
void* ccol_gloo_buffer_new(void* context, void* ptr, size_t len, ccol_gloo_error* err);
int32_t ccol_gloo_buffer_send(void* buffer, int32_t dst, uint64_t slot, size_t offset, size_t nbytes,
                              ccol_gloo_error* err);
int32_t ccol_gloo_buffer_recv(void* buffer, int32_t src, uint64_t slot, size_t offset, size_t nbytes,
                              ccol_gloo_error* err);
/* Waits for one completion; `rank` receives the peer. */
int32_t ccol_gloo_buffer_wait_recv(void* buffer, int64_t timeout_ms, int32_t* rank, ccol_gloo_error* err);
int32_t ccol_gloo_buffer_wait_send(void* buffer, int64_t timeout_ms, int32_t* rank, ccol_gloo_error* err);
/* Interrupts a wait in progress (or the next one) on `buffer` from another
 * thread; the wait returns CCOL_GLOO_ABORTED. Unlike a Gloo timeout, this
 * closes no connection. */
void ccol_gloo_buffer_abort_wait(void* buffer, int32_t recv);
void ccol_gloo_buffer_free(void* buffer);

#ifdef __cplusplus
}
#endif

#endif
