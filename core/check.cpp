#include "core/check.h"

#include <cstdlib>

namespace pentad {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("internal check failed: {} at {}:{}{}{}", expr, file, line,
                                     msg.empty() ? "" : ": ", msg));
}

bool bug_injected(std::string_view name) {
  static const char* const bugs = std::getenv("PENTAD_INJECT_BUG");
  if (bugs == nullptr) return false;
  std::string_view rest(bugs);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == name) return true;
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return false;
}

}  // namespace pentad
