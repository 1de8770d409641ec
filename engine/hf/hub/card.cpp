// card_configs: the `configs:` a dataset card's YAML header declares (datasets.h), read with
// libyaml. Line numbers in errors are README.md's, so the owner can find the fault.
#include <yaml.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string_view>

#include "core/error.h"
#include "hf/hub/datasets.h"

namespace tessera::hf::hub {
namespace {

// The YAML header: the lines between a first line "---" and the next line "---", as the Hub's
// `datasets` library cuts it. Returns false when the card has none.
bool yaml_header(const std::string& markdown, std::string& yaml, int& first_line) {
  std::vector<std::string_view> lines;
  std::string_view text = markdown;
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (line.ends_with('\r')) line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  if (lines.empty() || lines.front() != "---") return false;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (lines[i] != "---") continue;
    yaml.clear();
    for (std::size_t k = 1; k < i; ++k) (yaml += lines[k]) += '\n';
    first_line = 2;  // README.md's line of the header's first line
    return true;
  }
  return false;
}

struct ParserDeleter {
  void operator()(yaml_parser_t* p) const {
    yaml_parser_delete(p);
    delete p;
  }
};
struct DocumentDeleter {
  void operator()(yaml_document_t* d) const {
    yaml_document_delete(d);
    delete d;
  }
};

// A parsed header and where its lines are in README.md, for messages.
class Header {
 public:
  Header(const std::string& repo_id, int first_line) : repo_(repo_id), first_line_(first_line) {}

  void load(const std::string& yaml) {
    std::unique_ptr<yaml_parser_t, ParserDeleter> parser(new yaml_parser_t{});
    if (yaml_parser_initialize(parser.get()) == 0)
      throw Error(ErrorKind::Internal, "libyaml could not start a parser");
    yaml_parser_set_input_string(parser.get(), reinterpret_cast<const unsigned char*>(yaml.data()),
                                 yaml.size());
    auto* document = new yaml_document_t{};
    if (yaml_parser_load(parser.get(), document) == 0) {
      delete document;
      const yaml_parser_t& p = *parser;
      std::string problem = p.problem != nullptr ? p.problem : "cannot be parsed";
      if (p.context != nullptr) problem = std::string(p.context) + ": " + problem;
      fail(static_cast<int>(p.problem_mark.line), "the YAML header is malformed (" + problem + ")");
    }
    document_.reset(document);
  }

  yaml_node_t* root() { return yaml_document_get_root_node(document_.get()); }
  yaml_node_t* node(int index) { return yaml_document_get_node(document_.get(), index); }

  [[noreturn]] void fail(int yaml_line, const std::string& what) const {
    throw_invalid("dataset " + repo_ + ": README.md line " +
                      std::to_string(first_line_ + yaml_line) + ": " + what,
                  "fix the dataset card's YAML header (between the --- lines), or tell the "
                  "dataset's owner; a job can still name the files with dataset.train");
  }
  [[noreturn]] void fail(const yaml_node_t* at, const std::string& what) const {
    fail(static_cast<int>(at->start_mark.line), what);
  }

 private:
  std::string repo_;
  int first_line_;
  std::unique_ptr<yaml_document_t, DocumentDeleter> document_;
};

std::string scalar(const yaml_node_t* n) {
  return {reinterpret_cast<const char*>(n->data.scalar.value), n->data.scalar.length};
}

bool is_scalar(const yaml_node_t* n) {
  return n != nullptr && n->type == YAML_SCALAR_NODE;
}

// The value of `key` in a mapping node (nullptr when absent).
yaml_node_t* member(Header& h, yaml_node_t* mapping, std::string_view key) {
  for (auto* pair = mapping->data.mapping.pairs.start; pair < mapping->data.mapping.pairs.top;
       ++pair) {
    const yaml_node_t* k = h.node(pair->key);
    if (is_scalar(k) && scalar(k) == key) return h.node(pair->value);
  }
  return nullptr;
}

std::vector<yaml_node_t*> items(Header& h, yaml_node_t* sequence) {
  std::vector<yaml_node_t*> out;
  for (auto* item = sequence->data.sequence.items.start; item < sequence->data.sequence.items.top;
       ++item)
    out.push_back(h.node(*item));
  return out;
}

// Python's truth of the YAML value, as the Hub's loader tests `default:` (YAML 1.1 booleans).
bool truthy(const yaml_node_t* n) {
  if (n == nullptr) return false;
  if (n->type == YAML_SEQUENCE_NODE)
    return n->data.sequence.items.top != n->data.sequence.items.start;
  if (n->type == YAML_MAPPING_NODE) return n->data.mapping.pairs.top != n->data.mapping.pairs.start;
  const std::string v = scalar(n);
  if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return !v.empty();
  for (const char* falsy : {"", "~", "null", "Null", "NULL", "false", "False", "FALSE", "no", "No",
                            "NO", "off", "Off", "OFF", "0", "0.0"})
    if (v == falsy) return false;
  return true;
}

// A glob, or a list of globs, as a list; anything else fails naming `field`.
std::vector<std::string> globs(Header& h, yaml_node_t* n, const std::string& field) {
  if (is_scalar(n)) return {scalar(n)};
  if (n != nullptr && n->type == YAML_SEQUENCE_NODE) {
    std::vector<std::string> out;
    for (yaml_node_t* item : items(h, n)) {
      if (!is_scalar(item)) h.fail(item, field + ": expected a file pattern (a string)");
      out.push_back(scalar(item));
    }
    return out;
  }
  h.fail(n, field + ": expected a file pattern or a list of them");
}

struct SplitPatterns {
  std::string split;
  std::vector<std::string> patterns;
};

// data_files: "x.csv" | ["a/*", "b/*"] (both the train split) | [{split, path}, ...].
std::vector<SplitPatterns> data_files(Header& h, yaml_node_t* n, const std::string& field) {
  const char* expected =
      ": expected a file pattern, a list of them, or a list of {split: NAME, path: PATTERN(S)}";
  if (is_scalar(n)) return {{"train", {scalar(n)}}};
  if (n->type != YAML_SEQUENCE_NODE) h.fail(n, field + expected);
  const std::vector<yaml_node_t*> list = items(h, n);
  const bool by_split = std::any_of(list.begin(), list.end(), [](const yaml_node_t* item) {
    return item->type == YAML_MAPPING_NODE;
  });
  if (!by_split) return {{"train", globs(h, n, field)}};
  std::vector<SplitPatterns> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    yaml_node_t* item = list[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (item->type != YAML_MAPPING_NODE)
      h.fail(item, at + ": expected {split: NAME, path: PATTERN(S)} like the other entries");
    const auto pairs = item->data.mapping.pairs.top - item->data.mapping.pairs.start;
    yaml_node_t* split = member(h, item, "split");
    yaml_node_t* path = member(h, item, "path");
    if (pairs != 2 || !is_scalar(split) || path == nullptr)
      h.fail(item,
             at + ": expected exactly the keys split (a name) and path (a pattern or a list)");
    SplitPatterns entry{scalar(split), globs(h, path, at + ".path")};
    for (const SplitPatterns& seen : out)
      if (seen.split == entry.split) h.fail(item, at + ": split \"" + entry.split + "\" twice");
    out.push_back(std::move(entry));
  }
  return out;
}

std::string join_path(const std::string& dir, const std::string& pattern) {
  std::string d = dir;
  while (!d.empty() && d.back() == '/') d.pop_back();
  return d.empty() ? pattern : d + "/" + pattern;
}

}  // namespace

std::vector<DatasetConfig> card_configs(const std::string& card_markdown,
                                        const std::vector<std::string>& repo_paths,
                                        const std::string& repo_id) {
  std::string yaml;
  int first_line = 0;
  if (!yaml_header(card_markdown, yaml, first_line)) return {};
  Header h(repo_id, first_line);
  h.load(yaml);
  yaml_node_t* root = h.root();
  if (root == nullptr || root->type != YAML_MAPPING_NODE) return {};
  yaml_node_t* configs = member(h, root, "configs");
  if (configs == nullptr || (is_scalar(configs) && !truthy(configs))) return {};
  if (configs->type != YAML_SEQUENCE_NODE)
    h.fail(configs, "configs: expected a list of {config_name: NAME, data_files: …}");

  std::vector<DatasetConfig> out;
  std::set<std::string> names;
  const yaml_node_t* default_at = nullptr;
  for (yaml_node_t* entry : items(h, configs)) {
    const std::string field = "configs[" + std::to_string(out.size()) + "]";
    if (entry->type != YAML_MAPPING_NODE)
      h.fail(entry, field + ": expected {config_name: NAME, data_files: …}");
    yaml_node_t* name = member(h, entry, "config_name");
    if (!is_scalar(name) || scalar(name).empty())
      h.fail(entry, field + ": every config needs a config_name");
    DatasetConfig config;
    config.name = scalar(name);
    if (!names.insert(config.name).second)
      h.fail(name, field + ": config_name \"" + config.name + "\" is used twice");
    config.is_default = config.name == "default" || truthy(member(h, entry, "default"));
    if (config.is_default) {
      if (default_at != nullptr)
        h.fail(entry, field + ": a second default config (\"" + out.front().name +
                          "\" is one; only one may be)");
      default_at = entry;
    }
    std::string data_dir;
    if (yaml_node_t* dir = member(h, entry, "data_dir")) {
      if (!is_scalar(dir)) h.fail(dir, field + ".data_dir: expected a folder name");
      data_dir = scalar(dir);
    }
    yaml_node_t* files = member(h, entry, "data_files");
    if (files != nullptr && !(is_scalar(files) && !truthy(files))) {
      for (const SplitPatterns& sp : data_files(h, files, field + ".data_files")) {
        DatasetSplit split;
        split.name = sp.split;
        std::set<std::string> seen;
        for (const std::string& pattern : sp.patterns)
          for (std::string& path : resolve_data_files(join_path(data_dir, pattern), repo_paths))
            if (seen.insert(path).second) split.files.push_back(std::move(path));
        split.sizes.assign(split.files.size(), -1);
        config.splits.push_back(std::move(split));
      }
    } else {  // no data_files: the splits the file names give, inside data_dir when set
      const std::string prefix = data_dir.empty() ? "" : join_path(data_dir, "");
      std::vector<std::string> inside;
      for (const std::string& path : repo_paths)
        if (path.starts_with(prefix)) inside.push_back(path.substr(prefix.size()));
      config.splits = dataset_split_files(inside);
      for (DatasetSplit& split : config.splits)
        for (std::string& file : split.files) file = prefix + file;
    }
    if (config.is_default)
      out.insert(out.begin(), std::move(config));
    else
      out.push_back(std::move(config));
  }
  if (out.size() == 1) out.front().is_default = true;  // the one config is used unnamed
  return out;
}

}  // namespace tessera::hf::hub
