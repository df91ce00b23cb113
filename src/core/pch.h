// Precompiled header: torch/torch.h costs ~20 s per translation unit on two
// cores; compiled once here, it costs ~4 s to load. Only files that use torch
// take it (CMakeLists.txt marks the others SKIP_PRECOMPILE_HEADERS).
#pragma once

#include <torch/torch.h>
