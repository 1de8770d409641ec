#pragma once
// Typed reads of config.json's fields for the config mapping (hf/config.cpp and each family's
// entry in hf/families.cpp).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::hf {

// config.json's fields, read typed, naming the file and the field on any fault.
class ConfigFields {
 public:
  ConfigFields(const nlohmann::json& doc, std::string source)
      : doc_(doc), source_(std::move(source)) {}

  const nlohmann::json& doc() const { return doc_; }
  const std::string& source() const { return source_; }
  bool has(const char* key) const { return doc_.contains(key) && !doc_.at(key).is_null(); }
  // Missing: `fallback`, or an error without one. Below `min_value`: an error.
  std::int64_t int_field(const char* key, std::optional<std::int64_t> fallback = std::nullopt,
                         std::int64_t min_value = 1) const;
  double number_field(const char* key, double fallback) const;
  bool bool_field(const char* key, bool fallback) const;
  std::string string_field(const char* key, const std::string& fallback) const;
  // An id, or the first of a list of ids (some configs list several).
  std::optional<std::int64_t> optional_token_id(const char* key) const;
  std::vector<std::int64_t> token_id_list(const char* key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what,
                         std::string hint = {}) const;
  // "FILE: KEY VALUE WHAT": a fault of a field's value, which the message shows as written.
  [[noreturn]] void fail_value(const std::string& key, std::int64_t value, const std::string& what,
                               std::string hint = {}) const;

 private:
  const nlohmann::json& doc_;
  std::string source_;
};

}  // namespace tessera::hf
