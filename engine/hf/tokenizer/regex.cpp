#define PCRE2_CODE_UNIT_WIDTH 8
#include "hf/tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace tessera::hf {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {

// One match-data block per thread, big enough for any of our patterns (we only read group 0).
struct ThreadMatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(data); }
};

pcre2_match_data* thread_match_data() {
  thread_local ThreadMatchData md;
  return md.data;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where)
    : code_(std::make_shared<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw_invalid(where + ": cannot compile regex /" + pattern + "/ at offset " +
                      std::to_string(offset) + ": " + reinterpret_cast<const char*>(message),
                  "use a pattern in the Oniguruma/PCRE syntax that the tokenizers library accepts");
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

void Regex::find_all(std::string_view text,
                     std::vector<std::pair<std::size_t, std::size_t>>& out) const {
  pcre2_match_data* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start < text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), start, 0, md, nullptr)
                        : pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                      md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // deep backtracking: the interpreter uses the heap
      rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) return;
      throw Error(ErrorKind::Internal,
                  "regex match failed (PCRE2 error " + std::to_string(rc) + ")");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    std::size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one character so the scan always advances.
      start =
          b + (b < text.size()
                   ? static_cast<std::size_t>(1 + (static_cast<unsigned char>(text[b]) >= 0xC0) +
                                              (static_cast<unsigned char>(text[b]) >= 0xE0) +
                                              (static_cast<unsigned char>(text[b]) >= 0xF0))
                   : 1);
    }
  }
}

}  // namespace tessera::hf
