// The guards every C entry point of a compiler-collectives shim runs its body
// in: nothing unwinds into Rust, and an exception becomes the shim's status
// and text. A shim instantiates `ccol::Entry` with its error struct and its
// two functions on it:
//   void clear(Err*);       the entry starts with no error
//   int32_t report(Err*);   fills Err from the exception in flight and
//                           returns its status
// e.g. `using Entry = ccol::Entry<ccol_gloo_error, clear_error, report>;`.
#pragma once

#include <cstdint>

namespace ccol {

template <typename Err, void (*Clear)(Err*), int32_t (*Report)(Err*)>
struct Entry {
    // Clears `err`, then returns what `body` returns, or, when it throws,
    // fills `err` from the exception (Report) and returns `on_error(status)`.
    template <typename R, typename Body, typename OnError>
    static R guarded(Err* err, Body body, OnError on_error) {
        Clear(err);
        try {
            return body();
        } catch (...) {
            return on_error(Report(err));
        }
    }

    // For an entry returning a status: the status of the exception.
    template <typename Body>
    static int32_t status(Err* err, Body body) {
        return guarded<int32_t>(err, body, [](int32_t status) { return status; });
    }

    // For an entry returning a new handle: NULL on an exception.
    template <typename Body>
    static void* handle(Err* err, Body body) {
        return guarded<void*>(err, body, [](int32_t) -> void* { return nullptr; });
    }
};

// Runs an entry that reports nothing (close, abort, free): swallows every
// exception.
template <typename Body>
void quietly(Body body) {
    try {
        body();
    } catch (...) {
    }
}

}  // namespace ccol
