#pragma once
// Text for messages.
#include <string>
#include <vector>

namespace tessera::core {

// The choices a message or hint names: "a", "a or b", "a, b or c" ("" for none).
inline std::string alternatives(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

}  // namespace tessera::core
