// How a shim's entry point reports a C++ exception to Rust: the message,
// NUL-terminated and cut to the caller's buffer (`src/model/shim.rs` and
// `src/dist.rs` read it). Nothing throws across the FFI boundary.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>

namespace agl_shim {

inline void report(const std::exception& e, char* err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  std::strncpy(err, e.what(), err_len - 1);
  err[err_len - 1] = '\0';
}

}  // namespace agl_shim
