#pragma once
// Names that reach the file system or a URL: repository ids, revisions, file paths inside a
// repository and etags. Each is validated before use, so that nothing a server or a user
// sends can make a path leave the cache folder.
#include <string>
#include <string_view>

namespace tessera::hf::hub {

enum class RepoType { Model, Dataset };

const char* repo_type_name(RepoType type);  // "model" / "dataset"

// "org/name" or "name": letters, digits, '-', '_', '.'; no "--" or ".." (the cache folder name
// joins the parts with "--"). Throws tessera::Error (InvalidInput) naming the id.
void validate_repo_id(std::string_view repo_id);

// A branch, tag, "refs/pr/N", "refs/convert/parquet" or a commit: '/'-separated segments, none
// empty, "." or "..". Throws InvalidInput.
void validate_revision(std::string_view revision);

// A relative path inside a repository ("config.json", "data/train.parquet"): no leading '/',
// no "." / ".." / empty segment, no backslash or control character. `source` says who named
// it (for the message: "the file list of org/name"). Throws InvalidInput.
void validate_repo_path(std::string_view path, std::string_view source);

// The etag a blob is named by: the server's ETag without W/ and quotes; only [0-9A-Za-z_-].
// Returns the normalized etag; throws InvalidInput naming the URL otherwise.
std::string normalize_etag(std::string_view etag, std::string_view url);

bool is_commit_hash(std::string_view revision);  // 40 lower-case hex digits
bool is_sha256_hex(std::string_view text);       // 64 lower-case hex digits

// "models--org--name" / "datasets--org--name": the repository's folder in the cache.
std::string repo_folder_name(std::string_view repo_id, RepoType type);

// Percent-encodes `text` for a URL; '/' is kept when `keep_slash` (file paths), encoded
// otherwise (revisions: "refs/pr/1" → "refs%2Fpr%2F1").
std::string url_encode(std::string_view text, bool keep_slash);

}  // namespace tessera::hf::hub
