// The compiler-collectives Gloo adapter: a plain C ABI over Debian's libgloo.
// See ccol_gloo.h. Every entry point catches every exception.

#include "ccol_gloo.h"
#include "ccol_entry.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

namespace {

struct StoreHandle {
    std::shared_ptr<gloo::rendezvous::Store> store;
    // A prefix store refers to its parent by reference: keep it alive.
    std::shared_ptr<StoreHandle> parent;
};

struct ContextHandle {
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<gloo::rendezvous::Context> context;
};

struct BufferHandle {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

void set_error(ccol_gloo_error* err, int32_t status, const char* what) {
    if (err == nullptr) {
        return;
    }
    err->status = status;
    std::snprintf(err->message, sizeof(err->message), "%s", what == nullptr ? "" : what);
}

void clear_error(ccol_gloo_error* err) {
    if (err != nullptr) {
        err->status = CCOL_GLOO_OK;
        err->message[0] = '\0';
    }
}

// Maps the exception in flight to a status code and message.
int32_t report(ccol_gloo_error* err) {
    try {
        throw;
    } catch (const gloo::IoException& e) {
        const char* what = e.what();
        // Gloo says "Timed out waiting ..." (buffers) or "Wait timeout for key(s)" (stores).
        std::string lower(what);
        for (auto& c : lower) {
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        }
        bool timeout = lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
        int32_t status = timeout ? CCOL_GLOO_TIMEOUT : CCOL_GLOO_IO;
        set_error(err, status, what);
        return status;
    } catch (const gloo::EnforceNotMet& e) {
        set_error(err, CCOL_GLOO_INVALID, e.what());
        return CCOL_GLOO_INVALID;
    } catch (const std::invalid_argument& e) {
        set_error(err, CCOL_GLOO_INVALID, e.what());
        return CCOL_GLOO_INVALID;
    } catch (const std::exception& e) {
        set_error(err, CCOL_GLOO_OTHER, e.what());
        return CCOL_GLOO_OTHER;
    } catch (...) {
        set_error(err, CCOL_GLOO_OTHER, "unknown C++ exception");
        return CCOL_GLOO_OTHER;
    }
}

std::chrono::milliseconds millis(int64_t ms) {
    return std::chrono::milliseconds(ms < 0 ? 0 : ms);
}

using Entry = ccol::Entry<ccol_gloo_error, clear_error, report>;
using ccol::quietly;

// The buffer behind a handle (throws for NULL).
gloo::transport::UnboundBuffer& buffer_of(void* buffer) {
    if (buffer == nullptr) {
        throw std::invalid_argument("null buffer");
    }
    return *static_cast<BufferHandle*>(buffer)->buffer;
}

// Waits for one completion of a buffer through `wait` (the buffer's waitRecv
// or waitSend, given the peer's slot and the timeout); CCOL_GLOO_ABORTED with
// `interrupted` as the message when abort_wait ended it, else the peer in
// `rank` (when not NULL).
template <typename Wait>
int32_t wait_one(int64_t timeout_ms, int32_t* rank, ccol_gloo_error* err, const char* interrupted, Wait wait) {
    int r = -1;
    if (!wait(&r, millis(timeout_ms))) {
        set_error(err, CCOL_GLOO_ABORTED, interrupted);
        return CCOL_GLOO_ABORTED;
    }
    if (rank != nullptr) {
        *rank = r;
    }
    return CCOL_GLOO_OK;
}

void append_to_vector(void* out, const uint8_t* data, size_t len) {
    auto* v = static_cast<std::vector<char>*>(out);
    v->insert(v->end(), reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + len);
}

// Throws the exception that matches a callback's status.
[[noreturn]] void throw_callback_error(int32_t status, const ccol_gloo_error& err) {
    std::string msg(err.message);
    if (status == CCOL_GLOO_TIMEOUT) {
        throw gloo::IoException("Timed out in store callback: " + msg);
    }
    throw gloo::IoException("store callback failed: " + msg);
}

// A gloo store whose operations are implemented by the caller (e.g. in Rust).
class CallbackStore : public gloo::rendezvous::Store {
  public:
    CallbackStore(ccol_gloo_store_vtable vt, int64_t timeout_ms) : vt_(vt), timeout_ms_(timeout_ms) {}

    ~CallbackStore() override {
        if (vt_.drop != nullptr) {
            vt_.drop(vt_.ctx);
        }
    }

    void set(const std::string& key, const std::vector<char>& data) override {
        ccol_gloo_error err{};
        int32_t s = vt_.set(vt_.ctx, key.c_str(), reinterpret_cast<const uint8_t*>(data.data()), data.size(), &err);
        if (s != CCOL_GLOO_OK) {
            throw_callback_error(s, err);
        }
    }

    std::vector<char> get(const std::string& key) override {
        std::vector<char> out;
        ccol_gloo_error err{};
        int32_t s = vt_.get(vt_.ctx, key.c_str(), timeout_ms_, &out, append_to_vector, &err);
        if (s != CCOL_GLOO_OK) {
            throw_callback_error(s, err);
        }
        return out;
    }

    void wait(const std::vector<std::string>& keys) override {
        wait(keys, std::chrono::milliseconds(timeout_ms_));
    }

    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        std::vector<const char*> ptrs;
        ptrs.reserve(keys.size());
        for (const auto& k : keys) {
            ptrs.push_back(k.c_str());
        }
        ccol_gloo_error err{};
        int32_t s = vt_.wait(vt_.ctx, ptrs.data(), ptrs.size(), timeout.count(), &err);
        if (s != CCOL_GLOO_OK) {
            throw_callback_error(s, err);
        }
    }

  private:
    ccol_gloo_store_vtable vt_;
    int64_t timeout_ms_;
};

// Gives every wait of a store the rendezvous deadline: some Gloo stores fall
// back to their own 30 s default when a caller passes no timeout.
class DeadlineStore : public gloo::rendezvous::Store {
  public:
    DeadlineStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
        : inner_(inner), timeout_(timeout) {}

    void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }

    std::vector<char> get(const std::string& key) override {
        inner_.wait({key}, timeout_);
        return inner_.get(key);
    }

    void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }

    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
        inner_.wait(keys, timeout);
    }

  private:
    gloo::rendezvous::Store& inner_;
    std::chrono::milliseconds timeout_;
};

}  // namespace

extern "C" {

uint32_t ccol_gloo_abi_version(void) { return CCOL_GLOO_ABI_VERSION; }

void* ccol_gloo_store_file(const char* path, ccol_gloo_error* err) {
    return Entry::handle(err, [&] {
        if (path == nullptr) {
            throw std::invalid_argument("null path");
        }
        return new StoreHandle{std::make_shared<gloo::rendezvous::FileStore>(path), nullptr};
    });
}

void* ccol_gloo_store_hash(ccol_gloo_error* err) {
    return Entry::handle(err, [] { return new StoreHandle{std::make_shared<gloo::rendezvous::HashStore>(), nullptr}; });
}

void* ccol_gloo_store_redis(const char* host, int32_t port, ccol_gloo_error* err) {
    return Entry::handle(err, [&] {
        if (host == nullptr) {
            throw std::invalid_argument("null host");
        }
        return new StoreHandle{std::make_shared<gloo::rendezvous::RedisStore>(host, port), nullptr};
    });
}

void* ccol_gloo_store_prefix(void* store, const char* prefix, ccol_gloo_error* err) {
    return Entry::handle(err, [&] {
        if (store == nullptr || prefix == nullptr) {
            throw std::invalid_argument("null store or prefix");
        }
        auto* parent = static_cast<StoreHandle*>(store);
        // Share ownership of the parent with the caller's handle.
        auto keep = std::make_shared<StoreHandle>(*parent);
        auto prefixed = std::make_shared<gloo::rendezvous::PrefixStore>(prefix, *keep->store);
        return new StoreHandle{prefixed, keep};
    });
}

void* ccol_gloo_store_callbacks(ccol_gloo_store_vtable vtable, int64_t timeout_ms, ccol_gloo_error* err) {
    // Outside the body: once the CallbackStore exists it owns the context and
    // drops it itself (when `store` goes out of scope if the handle fails).
    std::shared_ptr<CallbackStore> store;
    return Entry::guarded<void*>(
        err,
        [&] {
            if (vtable.set == nullptr || vtable.get == nullptr || vtable.wait == nullptr) {
                throw std::invalid_argument("store vtable has a null function");
            }
            store = std::make_shared<CallbackStore>(vtable, timeout_ms);
            return new StoreHandle{store, nullptr};
        },
        [&](int32_t) -> void* {
            // The store was not created, so its context is still the caller's
            // to drop; dropping it here too would free it twice.
            if (store == nullptr && vtable.drop != nullptr) {
                vtable.drop(vtable.ctx);
            }
            return nullptr;
        });
}

int32_t ccol_gloo_store_set(void* store, const char* key, const uint8_t* data, size_t len, ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        if (store == nullptr || key == nullptr || (data == nullptr && len > 0)) {
            throw std::invalid_argument("null argument");
        }
        std::vector<char> value(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + len);
        static_cast<StoreHandle*>(store)->store->set(key, value);
        return CCOL_GLOO_OK;
    });
}

int32_t ccol_gloo_store_get(void* store, const char* key, int64_t timeout_ms, void* out, ccol_gloo_append_fn append,
                            ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        if (store == nullptr || key == nullptr || append == nullptr) {
            throw std::invalid_argument("null argument");
        }
        auto& s = *static_cast<StoreHandle*>(store)->store;
        s.wait({std::string(key)}, millis(timeout_ms));
        auto value = s.get(key);
        append(out, reinterpret_cast<const uint8_t*>(value.data()), value.size());
        return CCOL_GLOO_OK;
    });
}

int32_t ccol_gloo_store_wait(void* store, const char* const* keys, size_t n, int64_t timeout_ms,
                             ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        if (store == nullptr || (keys == nullptr && n > 0)) {
            throw std::invalid_argument("null argument");
        }
        std::vector<std::string> ks;
        for (size_t i = 0; i < n; i++) {
            ks.emplace_back(keys[i]);
        }
        static_cast<StoreHandle*>(store)->store->wait(ks, millis(timeout_ms));
        return CCOL_GLOO_OK;
    });
}

void ccol_gloo_store_free(void* store) {
    quietly([&] { delete static_cast<StoreHandle*>(store); });
}

void* ccol_gloo_context_new(void* store, int32_t rank, int32_t size, const char* hostname, int64_t timeout_ms,
                            ccol_gloo_error* err) {
    return Entry::handle(err, [&] {
        if (store == nullptr || hostname == nullptr) {
            throw std::invalid_argument("null store or hostname");
        }
        if (size < 1 || rank < 0 || rank >= size) {
            throw std::invalid_argument("rank out of range");
        }
        gloo::transport::tcp::attr attr;
        attr.hostname = hostname;
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(millis(timeout_ms));
        DeadlineStore bounded(*static_cast<StoreHandle*>(store)->store, millis(timeout_ms));
        context->connectFullMesh(bounded, device);
        return new ContextHandle{device, context};
    });
}

void ccol_gloo_context_close(void* context) {
    quietly([&] {
        if (context != nullptr) {
            static_cast<ContextHandle*>(context)->context->closeConnections();
        }
    });
}

void ccol_gloo_context_free(void* context) {
    quietly([&] { delete static_cast<ContextHandle*>(context); });
}

void* ccol_gloo_buffer_new(void* context, void* ptr, size_t len, ccol_gloo_error* err) {
    return Entry::handle(err, [&] {
        if (context == nullptr) {
            throw std::invalid_argument("null context");
        }
        auto buf = static_cast<ContextHandle*>(context)->context->createUnboundBuffer(ptr, len);
        return new BufferHandle{std::move(buf)};
    });
}

int32_t ccol_gloo_buffer_send(void* buffer, int32_t dst, uint64_t slot, size_t offset, size_t nbytes,
                              ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        buffer_of(buffer).send(dst, slot, offset, nbytes);
        return CCOL_GLOO_OK;
    });
}

int32_t ccol_gloo_buffer_recv(void* buffer, int32_t src, uint64_t slot, size_t offset, size_t nbytes,
                              ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        buffer_of(buffer).recv(src, slot, offset, nbytes);
        return CCOL_GLOO_OK;
    });
}

int32_t ccol_gloo_buffer_wait_recv(void* buffer, int64_t timeout_ms, int32_t* rank, ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        auto& b = buffer_of(buffer);
        return wait_one(timeout_ms, rank, err, "receive interrupted at the deadline",
                        [&](int* r, std::chrono::milliseconds t) { return b.waitRecv(r, t); });
    });
}

int32_t ccol_gloo_buffer_wait_send(void* buffer, int64_t timeout_ms, int32_t* rank, ccol_gloo_error* err) {
    return Entry::status(err, [&] {
        auto& b = buffer_of(buffer);
        return wait_one(timeout_ms, rank, err, "send interrupted at the deadline",
                        [&](int* r, std::chrono::milliseconds t) { return b.waitSend(r, t); });
    });
}

void ccol_gloo_buffer_abort_wait(void* buffer, int32_t recv) {
    quietly([&] {
        if (buffer == nullptr) {
            return;
        }
        auto& b = *static_cast<BufferHandle*>(buffer)->buffer;
        if (recv != 0) {
            b.abortWaitRecv();
        } else {
            b.abortWaitSend();
        }
    });
}

void ccol_gloo_buffer_free(void* buffer) {
    quietly([&] { delete static_cast<BufferHandle*>(buffer); });
}

}  // extern "C"
