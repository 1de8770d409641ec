// A dataset file read as fine-tune and `data preview` read it: opened and indexed, then every row
// read and its format detected, both failing on a bad row and skipping bad rows. Compiled once
// per reader with TESSERA_FUZZ_FILE_TYPES naming the file names it is read under (CSV and TSV
// share a target: the input's size picks one).
#include <array>

#include "data/dataset.h"
#include "data/format.h"
#include "fuzz_support.h"

namespace {

constexpr std::array kFileNames{TESSERA_FUZZ_FILE_NAMES};

void read_everything(const std::filesystem::path& path, bool skip_bad_rows) {
  tessera::data::ReadOptions options;
  options.skip_bad_rows = skip_bad_rows;
  const auto reader = tessera::data::open_dataset(path, options);
  tessera::fuzz::require(reader->num_rows() > 0, "an opened dataset has rows");
  for (std::size_t i = 0; i < reader->num_rows(); ++i) {
    const tessera::data::Row row = reader->row(i);
    for (const auto& [column, value] : row.items()) (void)tessera::data::value_to_text(value);
    (void)reader->row_location(i);
  }
  (void)reader->skipped().summary();
  (void)tessera::data::detect_format(reader->columns(), path.string());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = tessera::fuzz::write_input(kFileNames[size % kFileNames.size()], data, size);
  tessera::fuzz::refusal_is_fine([&] { read_everything(path, false); });
  tessera::fuzz::refusal_is_fine([&] { read_everything(path, true); });
  return 0;
}
