// agl's opaque stand-in for gloo's header: the base ProcessGroupGloo::GlooStore
// derives from, with exactly the virtuals it overrides (without
// GLOO_STORE_HAS_STORE_V2). Only libtorch ever constructs a GlooStore, so this
// declaration never emits its vtable. See ../../README.md.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;

 protected:
  Store() = default;
};
}  // namespace rendezvous
}  // namespace gloo
