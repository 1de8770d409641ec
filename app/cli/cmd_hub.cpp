// tessera-cli hub: search the Hub, show a repository, download into the cache huggingface_hub
// uses, and keep the token (login / logout). Environment: see engine/hf/hub/settings.h.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "command.h"
#include "core/error.h"
#include "core/exit_codes.h"
#include "core/files.h"
#include "hf/hub/client.h"
#include "hf/hub/datasets.h"
#include "hub_model.h"
#include "job/events.h"

namespace tessera::cli {
namespace {

// As the Hub writes it: false for an open repository, else "auto" or "manual".
nlohmann::json gated_json(const std::string& gated) {
  return gated.empty() ? nlohmann::json(false) : nlohmann::json(gated);
}

namespace hub = hf::hub;

const char* kUsage =
    "hub search QUERY [--dataset] [--json] [--limit N] [--sort downloads|likes|recent] "
    "[--task T] [--library L] [--license L] [--filter TAG]... | hub info REPO [--revision R] "
    "[--dataset] [--json] [--card] | hub preview REPO [--config C] [--split S] [--rows N] "
    "[--revision R] [--json] | hub download REPO "
    "[--revision R] [--include PATTERN]... [--dataset] [--events PATH] | hub login [--token T] "
    "| hub logout";

// Takes every "--name VALUE" out of `args` (Args keeps only the last of a repeated option).
std::vector<std::string> take_repeated(std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> values;
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      if (i + 1 >= args.size()) throw UsageError{name + " needs a value"};
      values.push_back(args[++i]);
    } else {
      rest.push_back(args[i]);
    }
  }
  args = std::move(rest);
  return values;
}

const std::string& one_positional(const Args& args, const char* what) {
  if (args.positionals().size() != 1) throw UsageError{std::string("give exactly one ") + what};
  return args.positionals().front();
}

void flush_stdout() {
  std::cout.flush();
  if (!std::cout) throw_io("cannot write to standard output");
}

int run_search(std::vector<std::string> raw) {
  hub::SearchQuery query;
  query.filters = take_repeated(raw, "--filter");
  Args args(raw, {"--dataset", "--json"},
            {"--limit", "--sort", "--task", "--library", "--license"});
  // The Hub filters by tags: a task is its pipeline tag, a library its name, a license
  // "license:ID".
  if (const std::string* task = args.option("--task")) query.filters.push_back(*task);
  if (const std::string* library = args.option("--library")) query.filters.push_back(*library);
  if (const std::string* license = args.option("--license"))
    query.filters.push_back("license:" + *license);
  query.text = one_positional(args, "QUERY");
  query.type = args.flag("--dataset") ? hub::RepoType::Dataset : hub::RepoType::Model;
  if (args.option("--limit"))
    query.limit =
        static_cast<int>(args.integer("--limit", query.limit, 1, std::numeric_limits<int>::max()));
  if (const std::string* sort = args.option("--sort")) {
    if (*sort != "downloads" && *sort != "likes" && *sort != "recent")
      throw UsageError{"--sort is one of downloads, likes, recent"};
    query.sort = *sort;
  }
  hub::Client client(hub_settings());
  const hub::SearchPage page = client.search(query);
  if (args.flag("--json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& h : page.hits)
      out.push_back({{"id", h.id},
                     {"downloads", h.downloads},
                     {"likes", h.likes},
                     {"last_modified", h.last_modified},
                     {"pipeline_tag", h.pipeline_tag},
                     {"library", h.library},
                     {"private", h.is_private},
                     {"gated", gated_json(h.gated)},
                     {"tags", h.tags}});
    std::cout << out.dump() << "\n";
  } else if (page.hits.empty()) {
    std::cout << "no " << (query.type == hub::RepoType::Dataset ? "datasets" : "models")
              << " match \"" << query.text << "\"\n";
  } else {
    std::printf("%-50s %12s %8s  %s\n", "id", "downloads", "likes", "task");
    for (const auto& h : page.hits)
      std::printf("%-50s %12lld %8lld  %s%s\n", h.id.c_str(), static_cast<long long>(h.downloads),
                  static_cast<long long>(h.likes), h.pipeline_tag.c_str(),
                  h.gated.empty() ? "" : " (gated)");
  }
  flush_stdout();
  return 0;
}

std::string size_text(std::int64_t bytes) {
  return bytes < 0 ? "?" : core::human_bytes(static_cast<std::uint64_t>(bytes));
}

// A dataset's configs and splits (hub info --dataset): JSON, or indented lines.
nlohmann::json layout_json(const hub::DatasetLayout& layout) {
  nlohmann::json configs = nlohmann::json::array();
  for (const hub::DatasetConfig& c : layout.configs) {
    nlohmann::json splits = nlohmann::json::array();
    for (const hub::DatasetSplit& s : c.splits) {
      nlohmann::json files = nlohmann::json::array();
      for (std::size_t i = 0; i < s.files.size(); ++i)
        files.push_back({{"path", s.files[i]}, {"size", s.sizes[i]}});
      splits.push_back({{"name", s.name}, {"files", files}});
    }
    configs.push_back({{"name", c.name},
                       {"default", c.is_default},
                       {"revision", c.revision},
                       {"splits", splits}});
  }
  return {{"source", layout.source}, {"commit", layout.commit}, {"configs", configs}};
}

void print_layout(const hub::DatasetLayout& layout) {
  std::cout << "configs (from its " << layout.source << "):\n";
  for (const hub::DatasetConfig& c : layout.configs) {
    std::cout << "  " << c.name << (c.is_default ? " (default)" : "") << ", at " << c.revision
              << "\n";
    for (const hub::DatasetSplit& s : c.splits) {
      std::int64_t total = 0;
      for (std::int64_t size : s.sizes) total = size < 0 || total < 0 ? -1 : total + size;
      std::cout << "    " << s.name << ": " << s.files.size()
                << (s.files.size() == 1 ? " file, " : " files, ") << size_text(total) << "\n";
      for (std::size_t i = 0; i < s.files.size(); ++i)
        std::printf("      %-58s %12s\n", s.files[i].c_str(), size_text(s.sizes[i]).c_str());
    }
  }
}

int run_info(std::vector<std::string> raw) {
  Args args(raw, {"--dataset", "--json", "--card"}, {"--revision"});
  const std::string& repo = one_positional(args, "REPO");
  const hub::RepoType type = args.flag("--dataset") ? hub::RepoType::Dataset : hub::RepoType::Model;
  const std::string revision = args.option("--revision") ? *args.option("--revision") : "main";
  hub::Client client(hub_settings());
  // A dataset's configs and splits; a card that cannot be read is shown as such, not fatal.
  std::optional<hub::DatasetLayout> layout;
  std::optional<Error> layout_error;
  if (type == hub::RepoType::Dataset) {
    try {
      layout = client.dataset_layout(repo, revision);
    } catch (const Error& e) {
      if (client.settings().offline) throw;
      layout_error = e;
    }
  }
  if (client.settings().offline && layout) {  // offline: what the cache says
    if (args.flag("--json"))
      std::cout << nlohmann::json{{"id", repo},
                                  {"revision", revision},
                                  {"dataset", layout_json(*layout)}}
                       .dump()
                << "\n";
    else
      print_layout(*layout);
    flush_stdout();
    return 0;
  }
  const hub::RepoInfo info = client.info(repo, type, revision);
  const hub::Selection selection = hub::select_files(repo, type, info.files, {});
  std::optional<std::string> card;
  if (args.flag("--card")) card = client.card(repo, type, info.sha);
  std::int64_t total = 0;
  std::int64_t selected = 0;
  for (const auto& f : info.files) total += std::max<std::int64_t>(0, f.size);
  for (const auto& f : selection.files) selected += std::max<std::int64_t>(0, f.size);
  if (args.flag("--json")) {
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : info.files) {
      const bool fetched = std::any_of(selection.files.begin(), selection.files.end(),
                                       [&](const hub::RepoFile& s) { return s.path == f.path; });
      files.push_back({{"path", f.path},
                       {"size", f.size},
                       {"lfs", !f.lfs_sha256.empty()},
                       {"fetched", fetched}});
    }
    nlohmann::json out{{"id", info.id},
                       {"type", hub::repo_type_name(type)},
                       {"revision", revision},
                       {"sha", info.sha},
                       {"private", info.is_private},
                       {"gated", gated_json(info.gated)},
                       {"license", info.license},
                       {"downloads", info.downloads},
                       {"likes", info.likes},
                       {"pipeline_tag", info.pipeline_tag},
                       {"library", info.library},
                       {"files", files},
                       {"total_bytes", total},
                       {"download_bytes", selected},
                       {"refusal", selection.refusal}};
    if (args.flag("--card")) out["card"] = card ? nlohmann::json(*card) : nlohmann::json();
    if (layout) out["dataset"] = layout_json(*layout);
    if (layout_error)
      out["dataset_error"] = {{"message", layout_error->what()}, {"hint", layout_error->hint()}};
    std::cout << out.dump() << "\n";
  } else {
    std::cout << hub::repo_type_name(type) << " " << info.id << " at " << revision << " (commit "
              << info.sha << ")\n";
    if (!info.license.empty()) std::cout << "license: " << info.license << "\n";
    if (!info.gated.empty())
      std::cout << "gated: " << info.gated << " (accept the license on its page)\n";
    if (info.is_private) std::cout << "private\n";
    std::cout << "files: " << info.files.size() << ", "
              << core::human_bytes(static_cast<std::uint64_t>(total)) << "\n";
    for (const auto& f : info.files) {
      const bool fetched = std::any_of(selection.files.begin(), selection.files.end(),
                                       [&](const hub::RepoFile& s) { return s.path == f.path; });
      std::printf("  %c %-60s %12s\n", fetched ? '*' : ' ', f.path.c_str(),
                  f.size < 0 ? "?" : core::human_bytes(static_cast<std::uint64_t>(f.size)).c_str());
    }
    if (selection.refusal.empty())
      std::cout << "* = what `hub download` fetches: " << selection.files.size() << " files, "
                << core::human_bytes(static_cast<std::uint64_t>(selected)) << "\n";
    else
      std::cout << "not downloadable: " << selection.refusal << "\nhint: " << selection.hint
                << "\n";
    if (layout) print_layout(*layout);
    if (layout_error)
      std::cout << "configs: none readable: " << layout_error->what()
                << (layout_error->hint().empty() ? "" : "\nhint: " + layout_error->hint()) << "\n";
    if (args.flag("--card"))
      std::cout << "\n" << (card ? *card : std::string("(the repository has no README.md card)\n"));
  }
  flush_stdout();
  return 0;
}

// A cell on one line, at most `width` characters (UTF-8 code points) with "…" when cut.
std::string table_cell(const std::string& text, std::size_t width) {
  std::string out;
  std::size_t chars = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) {  // a code point starts
      if (chars == width) {
        // Replace the last character by the ellipsis.
        std::size_t back = out.size();
        while (back > 0 && (static_cast<unsigned char>(out[back - 1]) & 0xC0) == 0x80) --back;
        out.resize(back > 0 ? back - 1 : 0);
        return out + "…";
      }
      ++chars;
    }
    out += c == '\n' || c == '\r' || c == '\t' ? ' ' : text[i];
  }
  return out;
}

std::size_t display_chars(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

int run_preview(std::vector<std::string> raw) {
  Args args(raw, {"--json"}, {"--config", "--split", "--rows", "--revision"});
  const std::string& repo = one_positional(args, "REPO");
  const std::string revision = args.option("--revision") ? *args.option("--revision") : "main";
  const std::string config = args.option("--config") ? *args.option("--config") : "";
  const std::string split = args.option("--split") ? *args.option("--split") : "";
  const int rows = static_cast<int>(args.integer("--rows", 10, 1, std::numeric_limits<int>::max()));
  hub::Client client(hub_settings());
  const hub::RowPreview preview = client.preview_rows(repo, revision, config, split, rows);
  if (args.flag("--json")) {
    std::cout << nlohmann::json{{"columns", preview.columns},
                                {"rows", preview.rows},
                                {"source", preview.source},
                                {"partial", preview.partial}}
                     .dump()
              << "\n";
    flush_stdout();
    return 0;
  }
  constexpr std::size_t kMaxWidth = 40;
  std::vector<std::size_t> widths;
  for (std::size_t c = 0; c < preview.columns.size(); ++c) {
    std::size_t w = display_chars(table_cell(preview.columns[c], kMaxWidth));
    for (const auto& row : preview.rows)
      w = std::max(w, display_chars(table_cell(row[c], kMaxWidth)));
    widths.push_back(w);
  }
  const auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::string cell = table_cell(cells[c], kMaxWidth);
      line += (c ? " | " : "") + cell + std::string(widths[c] - display_chars(cell), ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  };
  print_row(preview.columns);
  std::string rule;
  for (std::size_t c = 0; c < widths.size(); ++c)
    rule += (c ? "-+-" : "") + std::string(widths[c], '-');
  std::cout << rule << "\n";
  for (const auto& row : preview.rows) print_row(row);
  std::cout << preview.rows.size() << (preview.rows.size() == 1 ? " row" : " rows") << " from "
            << preview.source << (preview.partial ? "; the split has more" : "") << "\n";
  flush_stdout();
  return 0;
}

std::atomic<bool> g_cancel{false};
std::atomic<int> g_cancel_signal{0};  // the signal that cancelled: the exit code says which
extern "C" void on_interrupt(int signal) {
  g_cancel_signal = signal;
  g_cancel = true;
}

int run_download(std::vector<std::string> raw) {
  hub::DownloadParams params;
  params.include = take_repeated(raw, "--include");
  Args args(raw, {"--dataset"}, {"--revision", "--events"});
  const std::string& repo = one_positional(args, "REPO");
  params.type = args.flag("--dataset") ? hub::RepoType::Dataset : hub::RepoType::Model;
  if (const std::string* revision = args.option("--revision")) params.revision = *revision;

  job::EventSink events;
  const std::string* events_path = args.option("--events");
  if (events_path != nullptr) events.open(*events_path);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto last_line = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  std::int64_t last_done = -1;
  params.on_progress = [&](const hub::DownloadProgress& p) {
    if (events_path != nullptr) events.progress("download", p.done_bytes, p.total_bytes);
    const auto now = std::chrono::steady_clock::now();
    const bool finished = p.files_done == p.files_total;
    if (!finished && now - last_line < std::chrono::milliseconds(tty ? 200 : 1000)) return;
    if (p.done_bytes == last_done && !finished) return;
    last_line = now;
    last_done = p.done_bytes;
    const double pct = p.total_bytes > 0 ? 100.0 * static_cast<double>(p.done_bytes) /
                                               static_cast<double>(p.total_bytes)
                                         : 100.0;
    std::fprintf(
        stderr, "%sdownload: %d/%d files, %s of %s (%.0f%%)%s", tty ? "\r" : "", p.files_done,
        p.files_total,
        core::human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.done_bytes)))
            .c_str(),
        core::human_bytes(static_cast<std::uint64_t>(p.total_bytes)).c_str(), pct, tty ? "" : "\n");
  };
  g_cancel = false;
  params.cancel = &g_cancel;
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);

  hub::Client client(hub_settings());
  hub::DownloadResult result;
  try {
    result = client.download(repo, params);
  } catch (const Error& e) {
    if (tty) std::fputc('\n', stderr);
    if (events_path != nullptr) events.error(error_kind_name(e.kind()), e.what(), e.hint());
    if (g_cancel.load()) {
      // Stopped by Ctrl-C or SIGTERM: what was received stays in the cache's .incomplete files
      // and the next download resumes from it.
      std::fprintf(stderr, "error: %s\n", e.what());
      return core::exit_code_for_signal(g_cancel_signal.load());
    }
    throw;
  }
  if (tty) std::fputc('\n', stderr);
  if (events_path != nullptr)
    events.log("info",
               "downloaded " + repo + " at " + result.commit + " into " + result.snapshot.string());
  std::fprintf(stderr, "%zu file%s at commit %s; received %s, %s already in the cache\n",
               result.files.size(), result.files.size() == 1 ? "" : "s", result.commit.c_str(),
               core::human_bytes(static_cast<std::uint64_t>(result.downloaded_bytes)).c_str(),
               core::human_bytes(static_cast<std::uint64_t>(result.present_bytes)).c_str());
  // The snapshot folder is the last line on stdout (with --events -, the log event says it).
  if (events_path == nullptr || *events_path != "-") std::cout << result.snapshot.string() << "\n";
  flush_stdout();
  return 0;
}

int run_login(std::vector<std::string> raw) {
  Args args(raw, {}, {"--token"});
  args.expect_no_positionals();
  std::string token;
  if (const std::string* given = args.option("--token")) {
    token = *given;
  } else {
    if (::isatty(STDIN_FILENO) != 0) std::cerr << "token: " << std::flush;
    std::getline(std::cin, token);
  }
  token = hub::clean_token(token);
  const hub::Settings settings = hub::Settings::from_environment();
  hub::save_token(settings.token_path, token);
  std::cout << "token saved to " << settings.token_path.string() << " (mode 0600)\n";
  if (std::getenv("HF_TOKEN") != nullptr)
    std::cout << "note: HF_TOKEN is set in the environment and takes precedence over the file\n";
  flush_stdout();
  return 0;
}

int run_logout(std::vector<std::string> raw) {
  Args args(raw, {}, {});
  args.expect_no_positionals();
  const hub::Settings settings = hub::Settings::from_environment();
  if (hub::remove_token(settings.token_path))
    std::cout << "removed " << settings.token_path.string() << "\n";
  else
    std::cout << "no token file at " << settings.token_path.string() << "\n";
  if (std::getenv("HF_TOKEN") != nullptr)
    std::cout << "note: HF_TOKEN is still set in the environment\n";
  flush_stdout();
  return 0;
}

int run_hub(const std::vector<std::string>& raw) {
  if (raw.empty())
    throw UsageError{"give a subcommand: search, info, preview, download, login, logout"};
  std::vector<std::string> rest(raw.begin() + 1, raw.end());
  const std::string& sub = raw.front();
  if (sub == "search") return run_search(rest);
  if (sub == "info") return run_info(rest);
  if (sub == "preview") return run_preview(rest);
  if (sub == "download") return run_download(rest);
  if (sub == "login") return run_login(rest);
  if (sub == "logout") return run_logout(rest);
  throw UsageError{"unknown subcommand \"" + sub + "\""};
}

const RegisterCommand kHubCommand{{
    "hub",
    kUsage,
    "search the HuggingFace Hub, show a repository (a dataset's configs and splits), preview a "
    "dataset's rows, download into the shared HF cache, login",
    run_hub,
}};

}  // namespace
}  // namespace tessera::cli
