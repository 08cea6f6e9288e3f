// The backends agl builds: each constructed in its own file (the only place
// that includes its ProcessGroup header), used everywhere else through
// c10d::Backend.
#pragma once
#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace agl {
// Gloo over TCP on libtorch's default device (honours GLOO_SOCKET_IFNAME).
c10::intrusive_ptr<c10d::Backend> new_gloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// NCCL on the current CUDA device; throws when agl was built without the
// `nccl` feature.
c10::intrusive_ptr<c10d::Backend> new_nccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);
}  // namespace agl
