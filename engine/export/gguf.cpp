#include "export/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>

#include "core/error.h"
#include "core/files.h"
#include "core/temporaries.h"
#include "export/gguf_file.h"
#include "export/gguf_quant.h"
#include "export/gguf_vocab.h"
#include "hf/families.h"
#include "model/model.h"

namespace tessera::exporter {
namespace fs = std::filesystem;

// GGUF is little-endian; tensor bytes are copied from memory as they are.
static_assert(std::endian::native == std::endian::little, "GGUF export needs a little-endian host");

namespace {

const char* kFamiliesHint = "GGUF export covers llama, mistral, qwen2 and gpt2 causal LMs";

void report(const GgufOptions& o, const std::string& message) {
  if (o.progress) o.progress(message);
}

std::uint32_t u32(std::int64_t value, const std::string& what) {
  if (value < 0 || value > std::numeric_limits<std::uint32_t>::max())
    throw_unsupported(what + " = " + std::to_string(value) + " does not fit GGUF's uint32");
  return static_cast<std::uint32_t>(value);
}

// llama.cpp's general.file_type (its llama_ftype) for each file type.
std::uint32_t file_type_code(GgufFileType t) {
  switch (t) {
    case GgufFileType::F32:
      return 0;
    case GgufFileType::F16:
      return 1;
    case GgufFileType::Q8_0:
      return 7;
    case GgufFileType::BF16:
      return 32;
  }
  return 0;
}

gguf::TensorType tensor_type(GgufFileType t) {
  switch (t) {
    case GgufFileType::F32:
      return gguf::TensorType::F32;
    case GgufFileType::F16:
      return gguf::TensorType::F16;
    case GgufFileType::BF16:
      return gguf::TensorType::BF16;
    case GgufFileType::Q8_0:
      return gguf::TensorType::Q8_0;
  }
  return gguf::TensorType::F32;
}

// One tensor to write: where its values come from and how they are arranged.
struct Planned {
  gguf::TensorInfo info;
  torch::Tensor source;  // the parameter (any dtype/device), or the generated values
  hf::GgufLayout layout = hf::GgufLayout::AsIs;
};

// llama3 rope scaling as llama.cpp's llama reads it: one divisor per rotary frequency.
torch::Tensor llama3_rope_freqs(const hf::ModelConfig& c) {
  const hf::RopeScaling& s = c.rope_scaling;
  const std::int64_t half = c.head_dim / 2;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  std::vector<float> factors;
  for (std::int64_t i = 0; i < half; ++i) {
    const double freq =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    double divisor = 1.0;
    if (wavelen > low_freq_wavelen) {
      divisor = s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth =
          (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      divisor = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    factors.push_back(static_cast<float>(divisor));
  }
  return torch::tensor(factors, torch::kFloat32);
}

// The values of a planned tensor as float32 in the layout GGUF wants, contiguous on the CPU.
torch::Tensor arranged(const Planned& p, const hf::ModelConfig& c) {
  torch::Tensor t = p.source.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  switch (p.layout) {
    case hf::GgufLayout::AsIs:
      return t;
    case hf::GgufLayout::Transposed:
      return t.t().contiguous();
    case hf::GgufLayout::RotaryQ:
    case hf::GgufLayout::RotaryK: {
      const std::int64_t heads =
          p.layout == hf::GgufLayout::RotaryQ ? c.num_attention_heads : c.num_key_value_heads;
      std::vector<std::int64_t> shape = t.sizes().vec();
      if (shape[0] % (2 * heads) != 0)
        throw Error(ErrorKind::Internal, p.info.name + ": " + std::to_string(shape[0]) +
                                             " rows do not split into " + std::to_string(heads) +
                                             " rotary heads");
      std::vector<std::int64_t> grouped = {heads, 2, shape[0] / heads / 2};
      grouped.insert(grouped.end(), shape.begin() + 1, shape.end());
      return t.reshape(grouped).transpose(1, 2).reshape(shape).contiguous();
    }
  }
  return t;
}

std::vector<std::uint8_t> encode(const torch::Tensor& values, gguf::TensorType type) {
  const std::span<const float> in(values.data_ptr<float>(),
                                  static_cast<std::size_t>(values.numel()));
  std::vector<std::uint8_t> out;
  switch (type) {
    case gguf::TensorType::F32:
      out.resize(in.size() * 4);
      std::memcpy(out.data(), in.data(), out.size());
      break;
    case gguf::TensorType::F16:
      out.resize(in.size() * 2);
      gguf::encode_f16(in, out.data());
      break;
    case gguf::TensorType::BF16:
      out.resize(in.size() * 2);
      gguf::encode_bf16(in, out.data());
      break;
    case gguf::TensorType::Q8_0:
      out.resize(in.size() / gguf::kQ8BlockSize * gguf::kQ8BlockBytes);
      gguf::quantize_q8_0(in, out.data());
      break;
  }
  return out;
}

// FNV-1a: notices bytes that changed between writing and reading back.
std::uint64_t fnv1a(const std::uint8_t* data, std::size_t size) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

void write_all(int fd, const void* data, std::size_t size, const fs::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io(path.string() + ": write failed: " + std::strerror(errno),
               errno == ENOSPC ? "free some space or export to another disk" : "");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Removes the temporary file unless released.
class TempFile {
 public:
  explicit TempFile(fs::path path) : path_(std::move(path)) {}
  ~TempFile() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const fs::path& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

gguf::Metadata metadata_for(const hf::ModelConfig& c, const hf::FamilyTraits& family,
                            const GgufVocab& vocab, const GgufOptions& options,
                            const std::string& name) {
  const hf::GgufNaming& naming = *family.gguf;
  const std::string& arch = naming.architecture;
  gguf::Metadata m;
  m.add_string("general.architecture", arch);
  m.add_string("general.type", "model");
  m.add_string("general.name", name);
  m.add_u32("general.file_type", file_type_code(options.type));
  m.add_u32("general.quantization_version", 2);
  m.add_u32("general.alignment", options.alignment);
  m.add_u32(arch + ".context_length", u32(c.max_position_embeddings, "max_position_embeddings"));
  m.add_u32(arch + ".embedding_length", u32(c.hidden_size, "hidden_size"));
  m.add_u32(arch + ".block_count", u32(c.num_hidden_layers, "num_hidden_layers"));
  m.add_u32(arch + ".feed_forward_length", u32(c.intermediate_size, "intermediate_size"));
  m.add_u32(arch + ".attention.head_count", u32(c.num_attention_heads, "num_attention_heads"));
  m.add_u32(arch + ".attention.head_count_kv", u32(c.num_key_value_heads, "num_key_value_heads"));
  if (naming.rms_norm)
    m.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps));
  else
    m.add_f32(arch + ".attention.layer_norm_epsilon", static_cast<float>(c.norm_eps));
  if (family.rotary) {
    m.add_f32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
    m.add_u32(arch + ".rope.dimension_count", u32(c.head_dim, "head_dim"));
    if (c.rope_scaling.rope_type == "linear") {
      m.add_string(arch + ".rope.scaling.type", "linear");
      m.add_f32(arch + ".rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
    }
  }
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    m.add_u32(arch + ".attention.key_length", u32(c.head_dim, "head_dim"));
    m.add_u32(arch + ".attention.value_length", u32(c.head_dim, "head_dim"));
  }
  m.add_u32(arch + ".vocab_size", u32(c.vocab_size, "vocab_size"));

  m.add_string("tokenizer.ggml.model", vocab.model);
  if (!vocab.pre.empty()) m.add_string("tokenizer.ggml.pre", vocab.pre);
  m.add_strings("tokenizer.ggml.tokens", vocab.tokens);
  if (!vocab.scores.empty()) m.add_f32s("tokenizer.ggml.scores", vocab.scores);
  m.add_i32s("tokenizer.ggml.token_type", vocab.token_types);
  if (vocab.model == "gpt2") m.add_strings("tokenizer.ggml.merges", vocab.merges);
  if (vocab.bos_id) m.add_u32("tokenizer.ggml.bos_token_id", *vocab.bos_id);
  if (vocab.eos_id) m.add_u32("tokenizer.ggml.eos_token_id", *vocab.eos_id);
  if (vocab.unk_id) m.add_u32("tokenizer.ggml.unknown_token_id", *vocab.unk_id);
  if (vocab.pad_id) m.add_u32("tokenizer.ggml.padding_token_id", *vocab.pad_id);
  m.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  m.add_bool("tokenizer.ggml.add_eos_token", vocab.add_eos);
  if (vocab.add_space_prefix)
    m.add_bool("tokenizer.ggml.add_space_prefix", *vocab.add_space_prefix);
  if (vocab.chat_template) m.add_string("tokenizer.chat_template", *vocab.chat_template);
  return m;
}

// Refuses what llama.cpp's graph for the architecture would compute differently.
void check_expressible(const hf::ModelConfig& c, model::TaskHead head) {
  const hf::FamilyTraits& family = hf::family_of(c);
  if (!family.gguf) throw_unsupported(c.model_type + " models have no GGUF export", kFamiliesHint);
  if (head != model::TaskHead::CausalLM)
    throw_unsupported(std::string("GGUF export needs a causal LM; this ") + c.model_type +
                          " model has a " + model::task_head_name(head) + " head",
                      "export a *ForCausalLM model (config.json's architectures)");
  const hf::GgufNaming& naming = *family.gguf;
  if (std::find(naming.activations.begin(), naming.activations.end(), c.hidden_act) ==
      naming.activations.end())
    throw_unsupported("config.json: activation \"" + c.hidden_act + "\" is not what llama.cpp's " +
                          naming.architecture + " architecture computes",
                      "GGUF export of " + c.model_type + " needs one of its activations");
  if (family.rotary) {
    const std::string& rope = c.rope_scaling.rope_type;
    if (rope == "llama3" && !naming.llama3_rope_freqs)
      throw_unsupported("config.json: llama3 rope scaling is not read by llama.cpp's " +
                        naming.architecture + " architecture");
    if (rope != "default" && rope != "linear" && rope != "llama3")
      throw_unsupported("config.json: rope scaling \"" + rope + "\" has no GGUF form here");
  }
}

}  // namespace

GgufFileType parse_gguf_file_type(std::string_view name) {
  if (name == "f32") return GgufFileType::F32;
  if (name == "f16") return GgufFileType::F16;
  if (name == "bf16") return GgufFileType::BF16;
  if (name == "q8_0") return GgufFileType::Q8_0;
  throw_invalid("GGUF type \"" + std::string(name) + "\" is not one we write",
                "choose f32, f16, bf16 or q8_0");
}

const char* gguf_file_type_name(GgufFileType type) {
  switch (type) {
    case GgufFileType::F32:
      return "f32";
    case GgufFileType::F16:
      return "f16";
    case GgufFileType::BF16:
      return "bf16";
    case GgufFileType::Q8_0:
      return "q8_0";
  }
  return "unknown";
}

void check_gguf_exportable(const hf::ModelConfig& config, const fs::path& tokenizer_dir) {
  check_expressible(config, model::head_from_config(config));
  read_gguf_vocab(tokenizer_dir, config);
}

GgufReport export_gguf(model::PretrainedModel& model, const fs::path& out,
                       const GgufOptions& options) {
  const hf::ModelConfig& c = model.config();
  check_expressible(c, model.head());
  const hf::FamilyTraits& family = hf::family_of(c);
  const hf::GgufNaming& naming = *family.gguf;
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0)
    throw_invalid("GGUF alignment " + std::to_string(options.alignment) + " is not a power of two");
  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw_invalid(out.string() + " is a folder; a GGUF export is one file",
                  "give a file name such as " + (out / "model.gguf").string());
  if (fs::exists(out, ec) && !options.force)
    throw_invalid(out.string() + ": the file exists",
                  "choose another --out, or pass --force to replace it (the new file is written "
                  "and checked first, then renamed over it)");
  const fs::path dir = out.has_parent_path() ? out.parent_path() : fs::path(".");
  core::create_output_folder(dir, "--out");
  core::remove_dead_temporaries(dir, [&](const std::string& line) { report(options, line); });

  report(options, "reading the tokenizer from " + options.tokenizer_dir.string());
  const GgufVocab vocab = read_gguf_vocab(options.tokenizer_dir, c);
  GgufReport result;
  if (vocab.padding_tokens > 0)
    result.notes.push_back(std::to_string(vocab.padding_tokens) +
                           " ids the tokenizer does not use are written as [PAD<id>] tokens");
  if (c.sliding_window && *c.sliding_window < c.max_position_embeddings)
    result.notes.push_back("llama.cpp's " + naming.architecture +
                           " attends over the whole context: outputs equal the model's up to " +
                           std::to_string(*c.sliding_window) +
                           " tokens (its sliding_window), not beyond");

  // The tensor table, in parameter order, then generated tensors.
  const gguf::TensorType wanted = tensor_type(options.type);
  std::vector<Planned> planned;
  for (const auto& item : model.named_parameters()) {
    const std::string& hf_name = item.key();
    const torch::Tensor& param = item.value();
    const std::optional<hf::GgufTensor> name = hf::gguf_tensor(naming, hf_name);
    if (!name)
      throw Error(ErrorKind::Internal,
                  "weight " + hf_name + " of " + c.model_type + " has no GGUF name",
                  "add it to the family's GgufNaming in engine/hf/families.cpp");
    Planned p;
    p.info.name = name->name;
    p.layout = name->layout;
    p.source = param;
    std::vector<std::int64_t> shape = param.sizes().vec();
    if (p.layout == hf::GgufLayout::Transposed) std::swap(shape[0], shape[1]);
    for (auto it = shape.rbegin(); it != shape.rend(); ++it)
      p.info.dims.push_back(static_cast<std::uint64_t>(*it));
    const bool stays_f32 =
        shape.size() <= 1 || name->keep_f32 || p.info.name.ends_with("_norm.weight");
    p.info.type = stays_f32 ? gguf::TensorType::F32 : wanted;
    if (p.info.type == gguf::TensorType::Q8_0 && p.info.dims[0] % gguf::kQ8BlockSize != 0)
      p.info.type = gguf::TensorType::F16;  // llama.cpp's converter falls back the same way
    planned.push_back(std::move(p));
  }
  if (family.rotary && c.rope_scaling.rope_type == "llama3") {
    Planned p;
    p.source = llama3_rope_freqs(c);
    p.info = {"rope_freqs.weight",
              {static_cast<std::uint64_t>(p.source.numel())},
              gguf::TensorType::F32,
              0};
    planned.push_back(std::move(p));
  }

  const std::string name = options.name.empty() ? out.stem().string() : options.name;
  const gguf::Metadata metadata = metadata_for(c, family, vocab, options, name);
  std::vector<gguf::TensorInfo> infos;
  for (const Planned& p : planned) infos.push_back(p.info);
  const gguf::Layout layout = gguf::lay_out(metadata, std::move(infos));

  std::random_device rd;
  TempFile temp(dir / ("." + out.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                       std::to_string(rd())));
  std::vector<std::uint64_t> hashes;
  {
    core::FileDescriptor fd(
        ::open(temp.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0)
      throw_io(temp.path().string() + ": cannot create: " + std::strerror(errno),
               "check that " + dir.string() + " is writable");
    write_all(fd.get(), layout.header.data(), layout.header.size(), temp.path());
    std::uint64_t written = 0;
    const std::string zeros(layout.alignment, '\0');
    for (std::size_t i = 0; i < planned.size(); ++i) {
      const gguf::TensorInfo& info = layout.tensors[i];
      report(options, "tensor " + std::to_string(i + 1) + "/" + std::to_string(planned.size()) +
                          " " + info.name + " (" + gguf::tensor_type_name(info.type) + ")");
      const torch::Tensor values = arranged(planned[i], c);
      if (!torch::isfinite(values).all().item<bool>())
        throw_invalid("weight " + info.name + " holds NaN or infinite values",
                      "the model is broken (a diverged run?); export a checkpoint from before");
      const std::vector<std::uint8_t> bytes = encode(values, info.type);
      if (bytes.size() != info.bytes() || written != info.offset)
        throw Error(ErrorKind::Internal, info.name + ": encoded size or offset is off");
      write_all(fd.get(), bytes.data(), bytes.size(), temp.path());
      hashes.push_back(fnv1a(bytes.data(), bytes.size()));
      written += bytes.size();
      const std::uint64_t padding =
          (layout.alignment - written % layout.alignment) % layout.alignment;
      write_all(fd.get(), zeros.data(), padding, temp.path());
      written += padding;
      result.parameters += static_cast<std::uint64_t>(values.numel());
      result.tensors_by_type[gguf::tensor_type_name(info.type)] += 1;
    }
    if (::fsync(fd.get()) != 0)
      throw_io(temp.path().string() + ": fsync failed: " + std::strerror(errno));
  }

  // Read back what is on disk and compare it with what was meant.
  report(options, "checking the written file");
  {
    core::MappedFile file(temp.path());
    const gguf::FileContents back = gguf::read_contents(file.bytes(), temp.path().string());
    auto mismatch = [&](const std::string& what) {
      throw Error(ErrorKind::Internal,
                  temp.path().string() + ": read back, " + what + " differs from what was written",
                  "check the disk (" + dir.string() + "); nothing was put at " + out.string());
    };
    if (back.metadata != metadata.entries()) mismatch("the metadata");
    if (back.tensors != layout.tensors) mismatch("the tensor table");
    if (back.alignment != layout.alignment || back.data_offset != layout.header.size())
      mismatch("the alignment");
    if (back.file_bytes != layout.header.size() + layout.data_bytes) mismatch("the file size");
    for (std::size_t i = 0; i < back.tensors.size(); ++i) {
      const gguf::TensorInfo& t = back.tensors[i];
      if (fnv1a(file.data() + back.data_offset + t.offset, t.bytes()) != hashes[i])
        mismatch("the data of " + t.name);
    }
    result.file_bytes = back.file_bytes;
    result.metadata_keys = back.metadata.size();
  }

  if (::rename(temp.path().c_str(), out.c_str()) != 0)
    throw_io(out.string() + ": cannot move the export into place: " + std::strerror(errno));
  temp.release();
  core::fsync_directory(dir);
  report(options, "wrote " + out.string());

  result.file = out;
  result.architecture = naming.architecture;
  result.file_type = gguf_file_type_name(options.type);
  result.tokenizer_model = vocab.model;
  result.tokenizer_pre = vocab.pre;
  result.tokens = vocab.tokens.size();
  result.merges = vocab.merges.size();
  return result;
}

}  // namespace tessera::exporter
