// agl's opaque stand-in for gloo's header. ProcessGroupGloo.hpp only holds
// `std::shared_ptr<gloo::Context>`; `setTimeout` is declared for its inline
// code and never defined here (libtorch exports torch's own). See ../README.md.
#pragma once
#include <chrono>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
