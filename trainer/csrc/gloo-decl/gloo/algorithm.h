// agl's own opaque stand-in for gloo's header (the torch wheel ships
// ProcessGroupGloo.hpp but not gloo's headers): just enough for it to parse.
// See ../README.md.
#pragma once
#include "context.h"
