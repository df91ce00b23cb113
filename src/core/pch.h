// Precompiled header: torch/torch.h costs ~20 s per translation unit on two
// cores; compiled once here, it costs ~4 s to load. Only files that reach torch
// through their includes take it (cmake/torch_pch.cmake marks the others
// SKIP_PRECOMPILE_HEADERS).
#pragma once

#include <torch/torch.h>
