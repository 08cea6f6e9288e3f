// agl's opaque stand-in for gloo's header: ProcessGroupGloo.hpp only holds
// these behind shared_ptr / unique_ptr. See ../../README.md.
#pragma once

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
