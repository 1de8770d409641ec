#pragma once
// Text of a growing token sequence, released in pieces that never change afterwards, so that
// the pieces joined equal Tokenizer::decode(all ids, skip_special_tokens=true) — what
// transformers' tokenizer.decode gives — however the ids arrive. A piece is never part of a
// character: text is held back
//   - while it ends in U+FFFD, which a lossy decode writes for an incomplete UTF-8 sequence
//     that the next byte-level token may complete;
//   - while the last tokens are byte-fallback tokens (<0xE4>…): the ByteFallback decoder turns
//     the whole run into characters or, when the run is not valid UTF-8, into one U+FFFD per
//     byte, so a run is decided only when a token of another kind follows it.
// Each step decodes the ids so far (transformers' TextStreamer does the same).
#include <cstdint>
#include <string>
#include <vector>

#include "hf/tokenizer/tokenizer.h"

namespace tessera::hf {

class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer& tokenizer);

  // Adds a token; returns the text it makes final (often "", never a partial character).
  std::string add(std::int32_t id);
  // The rest once no token follows: together with everything add() returned, the decode of
  // all ids. Should a decoder have rewritten text already released (none of the supported
  // ones does when the rules above hold), the difference cannot be taken back: text() says
  // what the whole decode is.
  std::string finish();

  const std::vector<std::int32_t>& ids() const { return ids_; }
  const std::string& released() const { return released_; }
  std::string text() const;  // the decode of all ids so far

 private:
  std::string release_up_to(const std::string& text);
  bool is_byte_token(std::int32_t id) const;
  bool is_skipped(std::int32_t id) const;  // a special token: decode leaves it out

  const Tokenizer& tokenizer_;
  std::vector<std::string> special_tokens_;  // sorted
  std::vector<std::int32_t> ids_;
  std::string released_;
};

}  // namespace tessera::hf
