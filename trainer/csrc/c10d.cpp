// The c10d process group agl's data-parallel trainer uses: a TCPStore
// rendezvous, one backend (Gloo or NCCL), and the collectives it needs,
// all through c10d::Backend. Every entry point catches C++ exceptions and
// copies the message into `err` (returning nonzero / null): nothing throws
// across the FFI boundary.
#include <exception>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "c10d.h"
#include "shim_error.h"

struct AglGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

namespace {
c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 1:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case 2:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
    default:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}
}  // namespace

extern "C" {

// backend: 0 = Gloo, 1 = NCCL. `timeout_ms`: each collective;
// `rendezvous_ms`: waiting for every rank at the store.
AglGroup* agl_c10d_new(const char* host, int port, int rank, int size,
                       int64_t timeout_ms, int64_t rendezvous_ms, int backend,
                       char* err, size_t err_len) {
  try {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = rank == 0;
    opts.numWorkers = static_cast<std::size_t>(size);
    opts.waitWorkers = true;
    opts.timeout = std::chrono::milliseconds(rendezvous_ms);
    auto group = new AglGroup();
    try {
      group->store = c10::make_intrusive<c10d::TCPStore>(host, opts);
      group->backend =
          backend == 1 ? agl::new_nccl(group->store, rank, size, timeout)
                       : agl::new_gloo(group->store, rank, size, timeout);
    } catch (...) {
      delete group;
      throw;
    }
    return group;
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return nullptr;
  }
}

void agl_c10d_free(AglGroup* group) { delete group; }

// op: 0 = sum, 1 = max, 2 = min. In place.
int agl_c10d_all_reduce(AglGroup* group, at::Tensor* tensor, int op,
                        char* err, size_t err_len) {
  try {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    group->backend->allreduce(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return 1;
  }
}

// In place: every rank ends with `root`'s tensor.
int agl_c10d_broadcast(AglGroup* group, at::Tensor* tensor, int root,
                       char* err, size_t err_len) {
  try {
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    group->backend->broadcast(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return 1;
  }
}

int agl_c10d_barrier(AglGroup* group, char* err, size_t err_len) {
  try {
    group->backend->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    agl_shim::report(e, err, err_len);
    return 1;
  }
}

}  // extern "C"
