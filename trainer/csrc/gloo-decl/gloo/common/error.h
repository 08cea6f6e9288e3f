// agl's opaque stand-in for gloo's header: ProcessGroupGloo.hpp needs nothing
// from it. See ../../README.md.
#pragma once
