// Shared policy of the fuzz harnesses: a parser fed arbitrary bytes may
// either succeed or throw g3::InputError. Anything else (another exception,
// a crash, a sanitizer report, an allocation the input cannot justify) is a
// bug, so the harness aborts and libFuzzer or the replay runner reports it.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "generator/errors.h"

namespace g3fuzz {

[[noreturn]] inline void bug(const char* harness, const std::string& what) {
  std::fprintf(stderr, "fuzz_%s: BUG: %s\n", harness, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs `body`, accepting success or InputError. The message of an
// InputError must be one line: the command prints it as its only line on
// stderr, so a newline smuggled in from the input would break that promise.
template <class F>
void expect_ok_or_input_error(const char* harness, F&& body) {
  try {
    body();
  } catch (const g3::InputError& e) {
    std::string m = e.what();
    if (m.empty()) bug(harness, "InputError with an empty message");
    if (m.find('\n') != std::string::npos || m.find('\r') != std::string::npos)
      bug(harness, "InputError message spans several lines: " + m);
    // A message quoting megabytes of input is not "one clear line".
    if (m.size() > 4096) bug(harness, "InputError message is " + std::to_string(m.size()) + " bytes long");
  } catch (const std::bad_alloc&) {
    bug(harness, "std::bad_alloc (the input made the parser allocate absurd memory)");
  } catch (const std::exception& e) {
    bug(harness, std::string("unexpected exception: ") + e.what());
  } catch (...) {
    bug(harness, "unexpected non-std exception");
  }
}

}  // namespace g3fuzz
