// Constructs libtorch's NCCL backend (the `nccl` cargo feature compiles this
// file with USE_C10D_NCCL against the wheel's NCCL and CUDA headers);
// without it, asking for NCCL is an error.
#include "c10d.h"

#ifdef AGL_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace agl {
c10::intrusive_ptr<c10d::Backend> new_nccl(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
#ifdef AGL_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size,
                                                     options);
#else
  (void)store;
  (void)rank;
  (void)size;
  (void)timeout;
  throw std::runtime_error(
      "this agl was built without NCCL (cargo feature `nccl`)");
#endif
}
}  // namespace agl
