#pragma once
// Error handling. PENTAD_CHECK guards internal invariants (a bug in pentad if it fires);
// pentad::Error carries messages for users (bad recipe, bad data file, bad layout).
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace pentad {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* expr, const char* file, int line,
                               const std::string& msg);

// Deliberate bugs for the tests that must catch them (the layout equivalence test proves
// it fails on a broken layout): true when `name` is in the comma-separated environment
// variable PENTAD_INJECT_BUG. Read once. Never set outside those tests.
bool bug_injected(std::string_view name);

}  // namespace pentad

#define PENTAD_CHECK(cond, ...)                                                                  \
  do {                                                                                           \
    if (!(cond)) ::pentad::check_failed(#cond, __FILE__, __LINE__, fmt::format("" __VA_ARGS__)); \
  } while (0)
