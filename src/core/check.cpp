#include "core/check.h"

namespace pentad {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("internal check failed: {} at {}:{}{}{}", expr, file, line,
                                     msg.empty() ? "" : ": ", msg));
}

}  // namespace pentad
