#include "hf/tokenizer/text_streamer.h"

#include <algorithm>
#include <cctype>

namespace tessera::hf {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

TextStreamer::TextStreamer(const Tokenizer& tokenizer)
    : tokenizer_(tokenizer), special_tokens_(tokenizer.special_tokens()) {
  std::sort(special_tokens_.begin(), special_tokens_.end());
}

std::string TextStreamer::add(std::int32_t id) {
  ids_.push_back(id);
  // The ids up to the trailing run of byte-fallback tokens (special tokens inside a run do not
  // end it: decode drops them before the decoder sees the run).
  std::size_t settled = ids_.size();
  while (settled > 0 && (is_byte_token(ids_[settled - 1]) || is_skipped(ids_[settled - 1])))
    --settled;
  if (settled == 0) return {};
  const std::string text = tokenizer_.decode(std::span<const std::int32_t>(ids_.data(), settled),
                                             /*skip_special_tokens=*/true);
  if (text.ends_with(kReplacement)) return {};
  return release_up_to(text);
}

std::string TextStreamer::finish() {
  return release_up_to(text());
}

std::string TextStreamer::text() const {
  return tokenizer_.decode(ids_, /*skip_special_tokens=*/true);
}

std::string TextStreamer::release_up_to(const std::string& text) {
  if (text.size() <= released_.size() || !text.starts_with(released_)) return {};
  std::string piece = text.substr(released_.size());
  released_ = text;
  return piece;
}

bool TextStreamer::is_byte_token(std::int32_t id) const {
  const std::optional<std::string> token = tokenizer_.id_to_token(id);
  if (!token || token->size() != 6 || !token->starts_with("<0x") || token->back() != '>')
    return false;
  return std::all_of(token->begin() + 3, token->begin() + 5,
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

bool TextStreamer::is_skipped(std::int32_t id) const {
  const std::optional<std::string> token = tokenizer_.id_to_token(id);
  if (!token) return true;  // decode drops unknown ids
  return std::binary_search(special_tokens_.begin(), special_tokens_.end(), *token);
}

}  // namespace tessera::hf
