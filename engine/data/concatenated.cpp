// open_datasets: several files read as one dataset (a Hub dataset's shards, or a user's list),
// in the order given.
#include <algorithm>

#include "core/error.h"
#include "data/dataset.h"

namespace tessera::data {
namespace {

class ConcatenatedReader : public DatasetReader {
 public:
  explicit ConcatenatedReader(std::vector<std::unique_ptr<DatasetReader>> parts)
      : parts_(std::move(parts)) {
    path_ = parts_.front()->path();
    file_type_ = parts_.front()->file_type();
    std::size_t rows = 0;
    for (const auto& part : parts_) {
      starts_.push_back(rows);
      rows += part->num_rows();
      for (const std::string& c : part->columns())
        if (std::find(columns_.begin(), columns_.end(), c) == columns_.end()) columns_.push_back(c);
      skipped_.merge(part->skipped());
    }
    rows_ = rows;
  }

  std::size_t num_rows() const override { return rows_; }
  Row row(std::size_t index) const override {
    const auto [part, local] = locate(index);
    return parts_[part]->row(local);
  }
  std::string row_location(std::size_t index) const override {
    const auto [part, local] = locate(index);
    return parts_[part]->row_location(local);
  }

 private:
  std::pair<std::size_t, std::size_t> locate(std::size_t index) const {
    if (index >= rows_)
      throw Error(ErrorKind::Internal, "row " + std::to_string(index) + " of " +
                                           std::to_string(rows_) + " in " + path_.string());
    const auto after = std::upper_bound(starts_.begin(), starts_.end(), index);
    const auto part = static_cast<std::size_t>(after - starts_.begin()) - 1;
    return {part, index - starts_[part]};
  }

  std::vector<std::unique_ptr<DatasetReader>> parts_;
  std::vector<std::size_t> starts_;  // the first row of each part
  std::size_t rows_ = 0;
};

}  // namespace

std::unique_ptr<DatasetReader> open_datasets(const std::vector<std::filesystem::path>& paths,
                                             const ReadOptions& options) {
  if (paths.empty()) throw_invalid("no dataset files given");
  if (paths.size() == 1) return open_dataset(paths.front(), options);
  std::vector<std::unique_ptr<DatasetReader>> parts;
  for (const auto& path : paths) {
    parts.push_back(open_dataset(path, options));
    if (parts.back()->file_type() != parts.front()->file_type())
      throw_invalid(path.string() + " is " + parts.back()->file_type() + " but " +
                        paths.front().string() + " is " + parts.front()->file_type() +
                        ": the files of one dataset must be of one type",
                    "list files of one type (convert the others first)");
  }
  return std::make_unique<ConcatenatedReader>(std::move(parts));
}

}  // namespace tessera::data
