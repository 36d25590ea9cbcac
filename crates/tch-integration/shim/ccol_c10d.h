/* The C ABI of the compiler-collectives c10d shim (ccol_c10d.cpp), the one
 * description of it: the shim includes this header, and the crate's build.rs
 * reads the status codes below and generates the Rust `Status` enum from them
 * ($OUT_DIR/status.rs), so Rust cannot drift from the shim.
 *
 * Rules for build.rs: every line `#define CCOL_C10D_<NAME> <number>` is a
 * status code (unique, non-negative, OK = 0); `#define` nothing else with the
 * CCOL_C10D_ prefix and a value. Adding a code here fails the Rust build until
 * the crate maps it to an error (an exhaustive match in src/error.rs).
 *
 * Every entry catches every C++ exception and reports it through `err`
 * (status and libtorch's text without its C++ backtrace); nothing unwinds out
 * of the shim. Handles are opaque (`void*`) and freed by their `_free` entry.
 * Timeouts are in milliseconds; values below 1 count as 1. */

#ifndef CCOL_C10D_SHIM_H_
#define CCOL_C10D_SHIM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
#define CCOL_C10D_OK 0
/* libtorch reported a timeout, or a bounded store call got no answer in time. */
#define CCOL_C10D_TIMEOUT 1
/* Another c10::DistError. */
#define CCOL_C10D_DIST 2
/* An argument was rejected (std::invalid_argument). */
#define CCOL_C10D_INVALID 3
/* Any other exception. */
#define CCOL_C10D_OTHER 4
/* The operation is not built into this shim. */
#define CCOL_C10D_UNSUPPORTED 5
/* A connection broke (c10::DistNetworkError, or libtorch's text says so). */
#define CCOL_C10D_NETWORK 6

/* The error every fallible entry fills: a status and a NUL-terminated text. */
typedef struct ccol_c10d_error {
    int32_t status;
    char message[2048];
} ccol_c10d_error;

/* Receives a store value: called once, with `len` readable bytes at `data`. */
typedef void (*ccol_c10d_append_fn)(void* out, const uint8_t* data, size_t len);

/* 2: set/add/delete/check take a timeout; no ProcessGroupNCCL entry. */
uint32_t ccol_c10d_abi_version(void);

/* Stores. A handle shares ownership of the c10d store; the PrefixStore keeps
 * its parent alive. */
void* ccol_c10d_tcpstore_new(const char* host, uint16_t port, int32_t world_size, int32_t is_server,
                             int32_t wait_workers, int64_t timeout_ms, ccol_c10d_error* err);
/* The port a TCPStore listens on or connects to; -CCOL_C10D_INVALID (and err)
 * for a store that is not a TCPStore. */
int32_t ccol_c10d_tcpstore_port(void* store, ccol_c10d_error* err);
void* ccol_c10d_prefixstore_new(const char* prefix, void* store, ccol_c10d_error* err);
/* set, add, delete and check run on a thread of their own and are waited for
 * at most `timeout_ms` (libtorch's TCPStore gives them no timeout): after
 * that they return CCOL_C10D_TIMEOUT, and the call, if it ever gets its
 * answer, completes in the background (its effect on the store is unknown). */
int32_t ccol_c10d_store_set(void* store, const char* key, const uint8_t* data, size_t len, int64_t timeout_ms,
                            ccol_c10d_error* err);
int32_t ccol_c10d_store_get(void* store, const char* key, int64_t timeout_ms, void* out, ccol_c10d_append_fn append,
                            ccol_c10d_error* err);
int32_t ccol_c10d_store_add(void* store, const char* key, int64_t delta, int64_t timeout_ms, int64_t* result,
                            ccol_c10d_error* err);
int32_t ccol_c10d_store_wait(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                             ccol_c10d_error* err);
/* 1 when every key is set, 0 when not (does not wait for keys), -1 on error. */
int32_t ccol_c10d_store_check(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                              ccol_c10d_error* err);
int32_t ccol_c10d_store_delete(void* store, const char* key, int64_t timeout_ms, int32_t* existed,
                               ccol_c10d_error* err);
void ccol_c10d_store_free(void* store);

/* ProcessGroupGloo. Tensors are `at::Tensor*` (tch's C_tensor). */
void* ccol_c10d_pg_gloo_new(void* store, int32_t rank, int32_t size, const char* hostname, int64_t timeout_ms,
                            ccol_c10d_error* err);
void ccol_c10d_pg_free(void* pg);
/* all_gather of equal-sized tensors: `outputs` (room for the group's size)
 * receives that many new tensors, owned by the caller. */
int32_t ccol_c10d_pg_allgather(void* pg, void* input, int64_t timeout_ms, void** outputs, ccol_c10d_error* err);
/* op: 0 sum, 1 product, 2 min, 3 max. In place. */
int32_t ccol_c10d_pg_allreduce(void* pg, void* tensor, int32_t op, int64_t timeout_ms, ccol_c10d_error* err);
int32_t ccol_c10d_pg_broadcast(void* pg, void* tensor, int32_t root, int64_t timeout_ms, ccol_c10d_error* err);
int32_t ccol_c10d_pg_barrier(void* pg, int64_t timeout_ms, ccol_c10d_error* err);
int32_t ccol_c10d_pg_send(void* pg, void* tensor, int32_t dst, int32_t tag, int64_t timeout_ms,
                          ccol_c10d_error* err);
int32_t ccol_c10d_pg_recv(void* pg, void* tensor, int32_t src, int32_t tag, int64_t timeout_ms,
                          ccol_c10d_error* err);
/* Starts a send (of a contiguous copy it keeps alive) and returns its work
 * handle, NULL on error: poll with ccol_c10d_work_done or wait with
 * ccol_c10d_work_wait, then free. */
void* ccol_c10d_pg_isend(void* pg, void* tensor, int32_t dst, int32_t tag, ccol_c10d_error* err);
/* 1 when finished, 0 when still running, -1 when it failed (never blocks). */
int32_t ccol_c10d_work_done(void* work);
int32_t ccol_c10d_work_wait(void* work, int64_t timeout_ms, ccol_c10d_error* err);
void ccol_c10d_work_free(void* work);
/* -1 for a null handle. */
int32_t ccol_c10d_pg_rank(void* pg);
int32_t ccol_c10d_pg_size(void* pg);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CCOL_C10D_SHIM_H_ */
