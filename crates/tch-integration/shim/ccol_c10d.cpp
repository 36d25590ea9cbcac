// The compiler-collectives c10d shim: a plain C ABI over libtorch's c10d
// (TCPStore, PrefixStore, ProcessGroupGloo). Every entry catches every C++
// exception (c10::DistError included) and reports it through ccol_c10d_error;
// nothing unwinds into Rust.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "ccol_c10d.h"
#include "ccol_entry.hpp"

namespace {

struct StoreHandle {
    c10::intrusive_ptr<c10d::Store> store;
};

struct GroupHandle {
    c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
};

// An operation in flight, with the tensors it reads kept alive.
struct WorkHandle {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> tensors;
};

void set_error(ccol_c10d_error* err, int32_t status, const std::string& what) {
    if (err == nullptr) {
        return;
    }
    err->status = status;
    std::snprintf(err->message, sizeof(err->message), "%s", what.c_str());
}

void clear_error(ccol_c10d_error* err) {
    if (err != nullptr) {
        err->status = CCOL_C10D_OK;
        err->message[0] = '\0';
    }
}

bool mentions_network(const std::string& what) {
    return what.find("Connection reset") != std::string::npos || what.find("Connection closed") != std::string::npos ||
           what.find("Read error") != std::string::npos || what.find("Write error") != std::string::npos ||
           what.find("Socket closed") != std::string::npos || what.find("Broken pipe") != std::string::npos;
}

bool mentions_timeout(const std::string& what) {
    std::string lower(what);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

// Maps the exception in flight to a status and message (without C++ stack traces).
int32_t report(ccol_c10d_error* err) {
    try {
        throw;
    } catch (const c10::DistNetworkError& e) {
        std::string m = e.what_without_backtrace();
        int32_t s = mentions_timeout(m) ? CCOL_C10D_TIMEOUT : CCOL_C10D_NETWORK;
        set_error(err, s, m);
        return s;
    } catch (const c10::DistError& e) {
        std::string m = e.what_without_backtrace();
        int32_t s = mentions_timeout(m) ? CCOL_C10D_TIMEOUT : mentions_network(m) ? CCOL_C10D_NETWORK : CCOL_C10D_DIST;
        set_error(err, s, m);
        return s;
    } catch (const c10::Error& e) {
        std::string m = e.what_without_backtrace();
        int32_t s = mentions_timeout(m) ? CCOL_C10D_TIMEOUT : mentions_network(m) ? CCOL_C10D_NETWORK : CCOL_C10D_OTHER;
        set_error(err, s, m);
        return s;
    } catch (const std::invalid_argument& e) {
        set_error(err, CCOL_C10D_INVALID, e.what());
        return CCOL_C10D_INVALID;
    } catch (const std::exception& e) {
        std::string m = e.what();
        int32_t s = mentions_timeout(m) ? CCOL_C10D_TIMEOUT : mentions_network(m) ? CCOL_C10D_NETWORK : CCOL_C10D_OTHER;
        set_error(err, s, m);
        return s;
    } catch (...) {
        set_error(err, CCOL_C10D_OTHER, "unknown C++ exception");
        return CCOL_C10D_OTHER;
    }
}

// At least 1 ms; at most ten years (so that now + timeout cannot overflow).
std::chrono::milliseconds millis(int64_t ms) {
    constexpr int64_t most = 10LL * 365 * 24 * 3600 * 1000;
    return std::chrono::milliseconds(ms < 1 ? 1 : ms > most ? most : ms);
}

c10d::Store& store_of(void* h) {
    if (h == nullptr) {
        throw std::invalid_argument("null store");
    }
    return *static_cast<StoreHandle*>(h)->store;
}

c10::intrusive_ptr<c10d::Store> store_ptr(void* h) {
    if (h == nullptr) {
        throw std::invalid_argument("null store");
    }
    return static_cast<StoreHandle*>(h)->store;
}

// What a bounded store call left for its caller.
struct Outcome {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    int32_t status = CCOL_C10D_OK;
    std::string message;
    int64_t value = 0;
};

// Runs `op` (returning an int64_t) on a thread of its own and waits at most
// `timeout_ms` for it. libtorch's TCPStore client sends set/add/delete/check
// on a blocking socket with no receive or send timeout and waits for the
// server's answer without a bound, so this is the only bound the caller gets.
// On time: the op's status and value. Late: CCOL_C10D_TIMEOUT; the thread
// keeps the store alive (`op` owns what it uses) and finishes, or stays
// blocked, on its own, touching nothing of the caller's.
template <typename Op>
int32_t run_bounded(const char* what, int64_t timeout_ms, int64_t* value, ccol_c10d_error* err, Op op) {
    auto outcome = std::make_shared<Outcome>();
    std::thread([outcome, op = std::move(op)]() mutable {
        int64_t v = 0;
        ccol_c10d_error e;
        clear_error(&e);
        int32_t status = CCOL_C10D_OK;
        try {
            v = op();
        } catch (...) {
            status = report(&e);
        }
        std::string message;
        try {
            message = e.message;
        } catch (...) {
            // bad_alloc: the status alone.
        }
        try {
            std::lock_guard<std::mutex> guard(outcome->mutex);
            outcome->done = true;
            outcome->status = status;
            outcome->message = std::move(message);
            outcome->value = v;
        } catch (...) {
            // The lock failed: the caller reports a timeout.
            return;
        }
        outcome->done_cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(outcome->mutex);
    if (!outcome->done_cv.wait_for(lock, millis(timeout_ms), [&] { return outcome->done; })) {
        set_error(err, CCOL_C10D_TIMEOUT,
                  std::string("store ") + what + ": no answer from the store within " + std::to_string(timeout_ms) +
                      " ms (the call may still take effect)");
        return CCOL_C10D_TIMEOUT;
    }
    if (outcome->status != CCOL_C10D_OK) {
        set_error(err, outcome->status, outcome->message);
        return outcome->status;
    }
    if (value != nullptr) {
        *value = outcome->value;
    }
    return CCOL_C10D_OK;
}

c10d::ProcessGroupGloo& pg_of(void* h) {
    if (h == nullptr) {
        throw std::invalid_argument("null process group");
    }
    return *static_cast<GroupHandle*>(h)->pg;
}

at::Tensor& tensor_of(void* t) {
    if (t == nullptr) {
        throw std::invalid_argument("null tensor");
    }
    return *static_cast<at::Tensor*>(t);
}

// The `n` keys at `keys` (each checked non-null).
std::vector<std::string> keys_of(const char* const* keys, size_t n) {
    if (keys == nullptr && n > 0) {
        throw std::invalid_argument("null keys");
    }
    std::vector<std::string> ks;
    for (size_t i = 0; i < n; i++) {
        if (keys[i] == nullptr) {
            throw std::invalid_argument("null key");
        }
        ks.emplace_back(keys[i]);
    }
    return ks;
}

using Entry = ccol::Entry<ccol_c10d_error, clear_error, report>;

// Deletes a handle of type `Handle` (a `_free` entry): swallows every exception.
template <typename Handle>
void free_handle(void* h) {
    try {
        delete static_cast<Handle*>(h);
    } catch (...) {
    }
}

// Waits for a collective's work at most `timeout_ms`, with the same bound in
// its options; CCOL_C10D_OK when it finished.
template <typename Options, typename Start>
int32_t run_collective(int64_t timeout_ms, Options opts, Start start) {
    opts.timeout = millis(timeout_ms);
    start(opts)->wait(millis(timeout_ms));
    return CCOL_C10D_OK;
}

}  // namespace

extern "C" {

uint32_t ccol_c10d_abi_version(void) { return 2; }

void* ccol_c10d_tcpstore_new(const char* host, uint16_t port, int32_t world_size, int32_t is_server,
                             int32_t wait_workers, int64_t timeout_ms, ccol_c10d_error* err) {
    return Entry::handle(err, [&] {
        if (host == nullptr) {
            throw std::invalid_argument("null host");
        }
        c10d::TCPStoreOptions opts;
        opts.port = port;
        opts.isServer = is_server != 0;
        if (world_size > 0) {
            opts.numWorkers = static_cast<std::size_t>(world_size);
        }
        opts.waitWorkers = wait_workers != 0;
        opts.timeout = millis(timeout_ms);
        auto store = c10::make_intrusive<c10d::TCPStore>(host, opts);
        return new StoreHandle{store};
    });
}

// The port a TCPStore listens on or connects to (the bound one for a server
// asked for port 0); -CCOL_C10D_INVALID for a store that is not a TCPStore.
int32_t ccol_c10d_tcpstore_port(void* store, ccol_c10d_error* err) {
    return Entry::guarded<int32_t>(
        err,
        [&] {
            auto* tcp = dynamic_cast<c10d::TCPStore*>(&store_of(store));
            if (tcp == nullptr) {
                throw std::invalid_argument("not a TCPStore (a PrefixStore has no port of its own)");
            }
            return static_cast<int32_t>(tcp->getPort());
        },
        [](int32_t status) { return -status; });
}

void* ccol_c10d_prefixstore_new(const char* prefix, void* store, ccol_c10d_error* err) {
    return Entry::handle(err, [&] {
        if (prefix == nullptr || store == nullptr) {
            throw std::invalid_argument("null prefix or store");
        }
        auto inner = static_cast<StoreHandle*>(store)->store;
        return new StoreHandle{c10::make_intrusive<c10d::PrefixStore>(prefix, inner)};
    });
}

int32_t ccol_c10d_store_set(void* store, const char* key, const uint8_t* data, size_t len, int64_t timeout_ms,
                            ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        if (key == nullptr || (data == nullptr && len > 0)) {
            throw std::invalid_argument("null key or data");
        }
        auto s = store_ptr(store);
        std::string k(key);
        std::vector<uint8_t> v(data, data + len);
        return run_bounded("set", timeout_ms, nullptr, err, [s, k, v]() -> int64_t {
            s->set(k, v);
            return 0;
        });
    });
}

int32_t ccol_c10d_store_get(void* store, const char* key, int64_t timeout_ms, void* out, ccol_c10d_append_fn append,
                            ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        if (key == nullptr || append == nullptr) {
            throw std::invalid_argument("null key or sink");
        }
        auto& s = store_of(store);
        s.wait({std::string(key)}, millis(timeout_ms));
        auto v = s.get(key);
        append(out, v.data(), v.size());
        return CCOL_C10D_OK;
    });
}

int32_t ccol_c10d_store_add(void* store, const char* key, int64_t delta, int64_t timeout_ms, int64_t* result,
                            ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        if (key == nullptr || result == nullptr) {
            throw std::invalid_argument("null key or result");
        }
        auto s = store_ptr(store);
        std::string k(key);
        return run_bounded("add", timeout_ms, result, err, [s, k, delta]() -> int64_t { return s->add(k, delta); });
    });
}

int32_t ccol_c10d_store_wait(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                             ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        auto ks = keys_of(keys, n);
        store_of(store).wait(ks, millis(timeout_ms));
        return CCOL_C10D_OK;
    });
}

int32_t ccol_c10d_store_check(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                              ccol_c10d_error* err) {
    return Entry::guarded<int32_t>(
        err,
        [&] {
            auto ks = keys_of(keys, n);
            auto s = store_ptr(store);
            int64_t set = 0;
            int32_t status =
                run_bounded("check", timeout_ms, &set, err, [s, ks]() -> int64_t { return s->check(ks) ? 1 : 0; });
            return status == CCOL_C10D_OK ? static_cast<int32_t>(set) : -1;
        },
        [](int32_t) { return -1; });
}

int32_t ccol_c10d_store_delete(void* store, const char* key, int64_t timeout_ms, int32_t* existed,
                               ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        if (key == nullptr || existed == nullptr) {
            throw std::invalid_argument("null key or result");
        }
        auto s = store_ptr(store);
        std::string k(key);
        int64_t deleted = 0;
        int32_t status =
            run_bounded("delete", timeout_ms, &deleted, err, [s, k]() -> int64_t { return s->deleteKey(k) ? 1 : 0; });
        *existed = deleted != 0 ? 1 : 0;
        return status;
    });
}

void ccol_c10d_store_free(void* store) { free_handle<StoreHandle>(store); }

void* ccol_c10d_pg_gloo_new(void* store, int32_t rank, int32_t size, const char* hostname, int64_t timeout_ms,
                            ccol_c10d_error* err) {
    return Entry::handle(err, [&] {
        if (store == nullptr || hostname == nullptr) {
            throw std::invalid_argument("null store or hostname");
        }
        if (size < 1 || rank < 0 || rank >= size) {
            throw std::invalid_argument("rank out of range");
        }
        auto opts = c10d::ProcessGroupGloo::Options::create(millis(timeout_ms));
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
        auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(static_cast<StoreHandle*>(store)->store, rank, size,
                                                              opts);
        return new GroupHandle{pg};
    });
}

void ccol_c10d_pg_free(void* pg) { free_handle<GroupHandle>(pg); }

// all_gather of equal-sized tensors (see the header).
int32_t ccol_c10d_pg_allgather(void* pg, void* input, int64_t timeout_ms, void** outputs, ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        auto& g = pg_of(pg);
        auto& t = tensor_of(input);
        std::vector<std::vector<at::Tensor>> out(1);
        for (int r = 0; r < g.getSize(); r++) {
            out[0].push_back(at::empty_like(t));
        }
        std::vector<at::Tensor> in{t};
        run_collective(timeout_ms, c10d::AllgatherOptions(),
                       [&](const c10d::AllgatherOptions& opts) { return g.allgather(out, in, opts); });
        for (int r = 0; r < g.getSize(); r++) {
            outputs[r] = new at::Tensor(out[0][r]);
        }
        return CCOL_C10D_OK;
    });
}

// op: 0 sum, 1 product, 2 min, 3 max.
int32_t ccol_c10d_pg_allreduce(void* pg, void* tensor, int32_t op, int64_t timeout_ms, ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        auto& g = pg_of(pg);
        std::vector<at::Tensor> ts{tensor_of(tensor)};
        c10d::AllreduceOptions opts;
        switch (op) {
            case 0: opts.reduceOp = c10d::ReduceOp::SUM; break;
            case 1: opts.reduceOp = c10d::ReduceOp::PRODUCT; break;
            case 2: opts.reduceOp = c10d::ReduceOp::MIN; break;
            case 3: opts.reduceOp = c10d::ReduceOp::MAX; break;
            default: throw std::invalid_argument("unknown reduce op");
        }
        return run_collective(timeout_ms, opts,
                              [&](const c10d::AllreduceOptions& o) { return g.allreduce(ts, o); });
    });
}

int32_t ccol_c10d_pg_broadcast(void* pg, void* tensor, int32_t root, int64_t timeout_ms, ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        auto& g = pg_of(pg);
        std::vector<at::Tensor> ts{tensor_of(tensor)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        return run_collective(timeout_ms, opts,
                              [&](const c10d::BroadcastOptions& o) { return g.broadcast(ts, o); });
    });
}

int32_t ccol_c10d_pg_barrier(void* pg, int64_t timeout_ms, ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        auto& g = pg_of(pg);
        return run_collective(timeout_ms, c10d::BarrierOptions(),
                              [&](const c10d::BarrierOptions& o) { return g.barrier(o); });
    });
}

// Point-to-point over the group: send/recv of a tensor with a tag.
int32_t ccol_c10d_pg_send(void* pg, void* tensor, int32_t dst, int32_t tag, int64_t timeout_ms,
                          ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        std::vector<at::Tensor> ts{tensor_of(tensor)};
        pg_of(pg).send(ts, dst, tag)->wait(millis(timeout_ms));
        return CCOL_C10D_OK;
    });
}

int32_t ccol_c10d_pg_recv(void* pg, void* tensor, int32_t src, int32_t tag, int64_t timeout_ms,
                          ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        std::vector<at::Tensor> ts{tensor_of(tensor)};
        pg_of(pg).recv(ts, src, tag)->wait(millis(timeout_ms));
        return CCOL_C10D_OK;
    });
}

// Starts a send and returns its work handle (NULL on error): the caller polls
// it with ccol_c10d_work_done, or waits with ccol_c10d_work_wait, then frees it.
void* ccol_c10d_pg_isend(void* pg, void* tensor, int32_t dst, int32_t tag, ccol_c10d_error* err) {
    return Entry::handle(err, [&] {
        std::vector<at::Tensor> ts{tensor_of(tensor).contiguous()};
        auto work = pg_of(pg).send(ts, dst, tag);
        return new WorkHandle{work, ts};
    });
}

// 1 when finished, 0 when still running, -1 when it failed (never blocks).
int32_t ccol_c10d_work_done(void* work) {
    try {
        auto& w = *static_cast<WorkHandle*>(work)->work;
        if (!w.isCompleted()) {
            return 0;
        }
        return w.isSuccess() ? 1 : -1;
    } catch (...) {
        return -1;
    }
}

int32_t ccol_c10d_work_wait(void* work, int64_t timeout_ms, ccol_c10d_error* err) {
    return Entry::status(err, [&] {
        if (work == nullptr) {
            throw std::invalid_argument("null work");
        }
        static_cast<WorkHandle*>(work)->work->wait(millis(timeout_ms));
        return CCOL_C10D_OK;
    });
}

void ccol_c10d_work_free(void* work) { free_handle<WorkHandle>(work); }

int32_t ccol_c10d_pg_rank(void* pg) { return pg == nullptr ? -1 : static_cast<GroupHandle*>(pg)->pg->getRank(); }
int32_t ccol_c10d_pg_size(void* pg) { return pg == nullptr ? -1 : static_cast<GroupHandle*>(pg)->pg->getSize(); }

}  // extern "C"
