#include "hf/hub/names.h"

#include <cctype>
#include <vector>

#include "core/error.h"

namespace tessera::hf::hub {
namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.';
}

bool is_lower_hex(std::string_view text, std::size_t length) {
  if (text.size() != length) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Checks the '/'-separated segments of a path-like name; returns the fault or "".
std::string segment_fault(std::string_view text) {
  if (text.empty()) return "is empty";
  if (text.front() == '/') return "starts with '/'";
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('/', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view segment = text.substr(start, end - start);
    if (segment.empty()) return "has an empty path segment";
    if (segment == "." || segment == "..") return "has a '" + std::string(segment) + "' segment";
    start = end + 1;
  }
  for (char c : text) {
    if (c == '\\') return "contains a backslash";
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "contains a control character";
  }
  return {};
}

}  // namespace

const char* repo_type_name(RepoType type) {
  return type == RepoType::Dataset ? "dataset" : "model";
}

void validate_repo_id(std::string_view repo_id) {
  const std::string shown = "repository id \"" + std::string(repo_id) + "\"";
  const char* hint = "a repository id is \"org/name\" or \"name\": letters, digits, '-', '_', '.'";
  if (repo_id.empty() || repo_id.size() > 96) throw_invalid(shown + " is empty or too long", hint);
  const std::size_t slash = repo_id.find('/');
  if (slash != std::string_view::npos && repo_id.find('/', slash + 1) != std::string_view::npos)
    throw_invalid(shown + " has more than one '/'", hint);
  std::vector<std::string_view> parts{repo_id.substr(0, slash)};
  if (slash != std::string_view::npos) parts.push_back(repo_id.substr(slash + 1));
  for (std::string_view part : parts) {
    if (part.empty()) throw_invalid(shown + " has an empty part", hint);
    for (char c : part)
      if (!is_name_char(c)) throw_invalid(shown + " contains '" + std::string(1, c) + "'", hint);
    if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.')
      throw_invalid(shown + " starts or ends with '-' or '.'", hint);
  }
  if (repo_id.find("--") != std::string_view::npos || repo_id.find("..") != std::string_view::npos)
    throw_invalid(shown + " contains \"--\" or \"..\"", hint);
}

void validate_revision(std::string_view revision) {
  const std::string fault = segment_fault(revision);
  if (!fault.empty() || revision.size() > 256)
    throw_invalid("revision \"" + std::string(revision) + "\" " +
                      (fault.empty() ? std::string("is too long") : fault),
                  "give a branch, a tag, refs/pr/N or a 40-digit commit hash");
}

void validate_repo_path(std::string_view path, std::string_view source) {
  const std::string fault = segment_fault(path);
  if (!fault.empty() || path.size() > 1024)
    throw_invalid(std::string(source) + " names the file \"" + std::string(path) + "\", which " +
                      (fault.empty() ? std::string("is too long") : fault) +
                      ": refused, since it could leave the cache folder",
                  "nothing was downloaded; report the repository to its owner");
}

std::string normalize_etag(std::string_view etag, std::string_view url) {
  if (etag.starts_with("W/")) etag.remove_prefix(2);
  while (!etag.empty() && etag.front() == '"') etag.remove_prefix(1);
  while (!etag.empty() && etag.back() == '"') etag.remove_suffix(1);
  bool ok = !etag.empty() && etag.size() <= 128;
  for (char c : etag)
    if (!(std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_')) ok = false;
  if (!ok)
    throw_invalid(std::string(url) + ": the server's etag \"" + std::string(etag) +
                      "\" cannot name a cache file",
                  "is HF_ENDPOINT a Hub-compatible server?");
  return std::string(etag);
}

bool is_commit_hash(std::string_view revision) {
  return is_lower_hex(revision, 40);
}
bool is_sha256_hex(std::string_view text) {
  return is_lower_hex(text, 64);
}

std::string repo_folder_name(std::string_view repo_id, RepoType type) {
  std::string name = type == RepoType::Dataset ? "datasets--" : "models--";
  for (char c : repo_id) {
    if (c == '/')
      name += "--";
    else
      name += c;
  }
  return name;
}

std::string url_encode(std::string_view text, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return out;
}

}  // namespace tessera::hf::hub
