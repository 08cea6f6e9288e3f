// Constructs libtorch's Gloo backend. The only file compiled against the
// opaque gloo declarations in gloo-decl/ (see its README): it calls
// libtorch's exported constructors and nothing else of ProcessGroupGloo.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d.h"

namespace agl {
c10::intrusive_ptr<c10d::Backend> new_gloo(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  // libtorch's default device: GLOO_SOCKET_IFNAME's interface when set,
  // else this host's name when it resolves to a usable address, else
  // loopback. (Building the device list here would instantiate std
  // templates over gloo types, which the build's symbol check forbids.)
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size,
                                                     options);
}
}  // namespace agl
