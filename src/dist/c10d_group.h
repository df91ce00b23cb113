// Inside src/dist only (world.cpp, gradient_averager.cpp, sharded_gather.cpp):
// which c10d backends this build has, the joined process group, and
// collective(), which turns a broken group into a message. The including file
// defines ORCHARD_C10D_COMPAT and includes core/torch_compat.h first, and is
// built without the precompiled header (CMakeLists.txt), so that
// torch_compat.h's c10d section is seen.
#pragma once

#include "core/torch_compat.h"

#include <exception>
#include <functional>
#include <string>

// Gloo: where libtorch was built with it and its headers are installed
// (Debian: libgloo-dev; PyTorch 2.x's wheel defines USE_C10D_GLOO but ships
// no Gloo headers). NCCL: CUDA builds of libtorch.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#define ORCHARD_HAVE_GLOO 1
#endif
#if defined(ORCHARD_HAVE_GLOO) || defined(USE_C10D_NCCL)
#define ORCHARD_HAVE_C10D 1
#endif

namespace orchard::dist::detail {

// Runs a collective; a broken group (a rank died, the network failed)
// becomes a UserError naming `what` and saying that checkpoints are intact.
void collective(const std::string& what, const std::function<void()>& fn);

// An exception's first line, without c10's backtrace.
std::string why_of(const std::exception& e);

#if defined(ORCHARD_HAVE_C10D)
// The group init() joined (call only while dist::active()).
compat::CollectiveGroup& group();
// The rendezvous store the group was made from.
c10::intrusive_ptr<c10d::Store> store();
#endif

} // namespace orchard::dist::detail
