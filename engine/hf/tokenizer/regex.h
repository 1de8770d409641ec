#pragma once
// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the Split pre-tokenizer and the
// Replace normalizer/decoder. Thread-safe: match data is per thread.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::hf {

class Regex {
 public:
  // Throws tessera::Error (InvalidInput) with `where` and PCRE2's message on a bad pattern.
  Regex(const std::string& pattern, const std::string& where);
  // Non-overlapping matches, left to right, as byte ranges [begin, end). Empty matches are
  // skipped. `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& out) const;

 private:
  struct Code;
  std::shared_ptr<Code> code_;
};

}  // namespace tessera::hf
