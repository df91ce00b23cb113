// The files under web/ (the chat page), compiled into the binary by
// cmake/embed_web.cmake.
#pragma once

#include <string>

namespace orchard::serve {

// The file's text, or nullptr when web/ has no such file.
const std::string* web_asset(const std::string& name);

} // namespace orchard::serve
