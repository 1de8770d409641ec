#pragma once
// Text for messages.
#include <cctype>
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

// ASCII lower case (file extensions, format and type names; not for user text).
inline std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace tessera::core
