// A minimal use of libtorch's c10d ProcessGroupGloo: `world` ranks as threads
// of this process, rendezvous through a c10d HashStore, one allreduce(sum).
// Every exception is caught; nothing unwinds into Rust.

#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

extern "C" int ccol_c10d_gloo_allreduce(int world, double* sums, char* err, size_t err_len) {
    try {
        auto store = c10::make_intrusive<c10d::HashStore>();
        std::vector<std::string> errors(world);
        std::vector<std::thread> threads;
        for (int r = 0; r < world; r++) {
            threads.emplace_back([&, r] {
                try {
                    auto opts = c10d::ProcessGroupGloo::Options::create();
                    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
                    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, world, opts);
                    std::vector<at::Tensor> t = {at::ones({4}, at::kDouble) * (r + 1)};
                    pg->allreduce(t)->wait();
                    sums[r] = t[0].sum().item<double>();
                } catch (const std::exception& e) {
                    errors[r] = e.what();
                } catch (...) {
                    errors[r] = "unknown C++ exception";
                }
            });
        }
        for (auto& t : threads) {
            t.join();
        }
        for (int r = 0; r < world; r++) {
            if (!errors[r].empty()) {
                std::snprintf(err, err_len, "rank %d: %s", r, errors[r].c_str());
                return 1;
            }
        }
        return 0;
    } catch (const std::exception& e) {
        std::snprintf(err, err_len, "%s", e.what());
        return 1;
    } catch (...) {
        std::snprintf(err, err_len, "unknown C++ exception");
        return 1;
    }
}
