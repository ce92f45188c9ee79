#include "cubelm/train/checkpointing.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/model/shape.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

namespace cubelm::train {

namespace fs = std::filesystem;

namespace {

// The stored shape: without the rows that pad the tensor (wte's padded vocabulary).
std::vector<std::uint64_t> shape_of(const tp::Param<real>& p) {
  std::vector<std::uint64_t> shape(p.shape.begin(), p.shape.end());
  shape[0] -= static_cast<std::uint64_t>(p.padding_rows);
  return shape;
}

// This rank's block of the parameter's stored tensor: its rows up to the padding, the
// first rows of the block in memory (blocks are row-major).
io::Block block_of(const tp::Param<real>& p) {
  io::Block b{std::vector<std::uint64_t>(p.offset.begin(), p.offset.end()),
              std::vector<std::uint64_t>(p.local.begin(), p.local.end())};
  const std::int64_t stored = p.shape[0] - p.padding_rows;
  b.count[0] =
      static_cast<std::uint64_t>(std::clamp<std::int64_t>(stored - p.offset[0], 0, p.local[0]));
  return b;
}

// Step number of "step_XXXXXXXX.h5", or -1 for any other name.
int step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  int step = -1;
  char tail[4] = {0};
  if (std::sscanf(name.c_str(), "step_%d.%3s", &step, tail) == 2 && std::string(tail) == "h5" &&
      name.size() == std::string("step_00000000.h5").size())
    return step;
  return -1;
}

std::vector<std::pair<int, std::string>> checkpoints_in(const std::string& dir) {
  std::vector<std::pair<int, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return found;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && step_of(entry.path()) >= 0)
      found.emplace_back(step_of(entry.path()), entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

// Replicas write nothing: each element of the global tensor is written once.
void write_tensor(io::CheckpointWriter& w, const std::string& path, const tp::Param<real>& p,
                  const kernels::Vec<real>* data) {
  const io::Block block = p.writer ? block_of(p) : io::Block::none();
  if (data) {
    auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), *data);
    w.write(path, shape_of(p), block, host.data());
  } else {
    const std::vector<float> zeros(static_cast<std::size_t>(p.size()), 0.0f);
    w.write(path, shape_of(p), block, zeros.data());
  }
}

// Every rank reads its own block, whatever layout wrote the file.
void read_tensor(const io::CheckpointReader& r, const std::string& path, const tp::Param<real>& p,
                 const kernels::Vec<real>& dst) {
  r.expect_shape(path, shape_of(p));
  auto host = Kokkos::create_mirror_view(dst);
  const io::Block block = block_of(p);
  r.read(path, block, host.data());
  for (std::size_t i = block.size(); i < host.extent(0); ++i)
    host(i) = 0; // padding rows
  Kokkos::deep_copy(dst, host);
}

} // namespace

std::string checkpoint_path(const std::string& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08d.h5", step);
  return (fs::path(dir) / name).string();
}

std::string latest_checkpoint(const std::string& dir) {
  const auto found = checkpoints_in(dir);
  return found.empty() ? std::string() : found.back().second;
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  std::vector<std::string> out;
  const auto found = checkpoints_in(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it)
    out.push_back(it->second);
  return out;
}

void prune_checkpoints(const std::string& dir, int keep, int committed) {
  if (keep <= 0)
    return;
  auto found = checkpoints_in(dir);
  if (committed >= 0)
    found.erase(std::remove_if(found.begin(), found.end(),
                               [&](const auto& f) { return f.first > committed; }),
                found.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < found.size(); ++i) {
    std::error_code ec;
    fs::remove(found[i].second, ec);
  }
}

namespace {

// Every tensor of the model with its global shape. Every rank walks the whole model: creating and
// transferring datasets is collective.
std::vector<std::pair<std::string, std::vector<std::uint64_t>>>
all_tensors(const ModelConfig& config) {
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> out;
  for (const auto& [name, shape] : model::parameter_shapes(config))
    out.emplace_back(name, std::vector<std::uint64_t>(shape.begin(), shape.end()));
  return out;
}

// Index of each of this rank's parameters by name.
std::map<std::string, std::size_t> local_indices(const model::ShardedGPT<real>& model) {
  std::map<std::string, std::size_t> index;
  const auto& params = model.params();
  for (std::size_t i = 0; i < params.size(); ++i)
    index[params[i].name] = i;
  return index;
}

} // namespace

void save_checkpoint(const std::string& path, const Deck& deck,
                     const model::ShardedGPT<real>& model, const std::vector<kernels::Vec<real>>* m,
                     const std::vector<kernels::Vec<real>>* v, int step,
                     const comm::Communicator& comm, int optimizer_step) {
  const fs::path parent = fs::path(path).parent_path();
  if (comm.rank() == 0 && !parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec); // a failure surfaces as the writer's clear error
  }
  io::CheckpointWriter w(path, comm);
  const auto& params = model.params();
  const auto tensors = all_tensors(model.config());
  const auto index = local_indices(model);
  const float nothing = 0.0f;
  // The values, then AdamW's moments (zeros when there are none).
  const std::pair<const char*, const std::vector<kernels::Vec<real>>*> parts[] = {
      {"/model/", nullptr}, {"/optimizer/m/", m}, {"/optimizer/v/", v}};
  for (std::size_t k = 0; k < 3; ++k)
    for (const auto& [name, shape] : tensors) {
      const auto it = index.find(name);
      const std::string path = parts[k].first + name;
      if (it == index.end()) {
        w.write(path, shape, io::Block::none(), &nothing);
        continue;
      }
      const auto& p = params[it->second];
      const auto* moments = parts[k].second;
      write_tensor(w, path, p, k == 0 ? &p.value : moments ? &(*moments)[it->second] : nullptr);
    }
  const std::int64_t tokens =
      static_cast<std::int64_t>(step) * deck.train.global_batch * deck.model.seq_len;
  w.set_attribute("/", "version", kCheckpointVersion);
  w.set_attribute("/", "step", static_cast<std::int64_t>(step));
  w.set_attribute("/", "tokens_seen", tokens);
  w.set_attribute("/", "deck", deck.text);
  w.set_attribute("/", "layout", comm::layout_of(deck.parallel).describe());
  // /model/wte holds the vocabulary's rows only; the run that wrote it computed with
  // this many (the rest zero padding), which any layout may choose differently.
  w.set_attribute("/", "padded_vocab_size",
                  tp::padded_vocab(deck.model, comm::layout_of(deck.parallel)));
  w.set_attribute("/", "seed", static_cast<std::int64_t>(deck.train.seed));
  w.set_attribute("/", "data_cursor", static_cast<std::int64_t>(step));
  w.set_attribute("/optimizer", "step",
                  static_cast<std::int64_t>(optimizer_step < 0 ? step : optimizer_step));
  w.close();
}

int load_checkpoint(const std::string& path, model::ShardedGPT<real>& model,
                    std::vector<kernels::Vec<real>>& m, std::vector<kernels::Vec<real>>& v,
                    const comm::Communicator& comm, int* optimizer_step) {
  const io::CheckpointReader r(path, comm);
  const std::int64_t version = r.int_attribute("/", "version");
  if (version != kCheckpointVersion)
    throw Error("checkpoint " + path + ": schema version " + std::to_string(version) +
                    " is not supported (this cubelm reads version " +
                    std::to_string(kCheckpointVersion) + ")",
                true);
  const std::string extra = "/model/layers/" + std::to_string(model.config().layers) + "/ln1/gamma";
  if (r.has(extra))
    throw Error("checkpoint " + path + ": holds more than the deck's model.layers = " +
                    std::to_string(model.config().layers) + " layers (" + extra + " exists)",
                true);
  auto& params = model.params();
  float nothing = 0.0f;
  const auto index = local_indices(model);
  for (const auto& [name, shape] : all_tensors(model.config())) {
    const auto it = index.find(name);
    if (it == index.end()) {
      for (const char* group : {"/model/", "/optimizer/m/", "/optimizer/v/"}) {
        r.expect_shape(group + name, shape);
        r.read(group + name, io::Block::none(), &nothing);
      }
      continue;
    }
    const std::size_t k = it->second;
    read_tensor(r, "/model/" + name, params[k], params[k].value);
    read_tensor(r, "/optimizer/m/" + name, params[k], m[k]);
    read_tensor(r, "/optimizer/v/" + name, params[k], v[k]);
  }
  if (optimizer_step)
    *optimizer_step = static_cast<int>(r.int_attribute("/optimizer", "step"));
  return static_cast<int>(r.int_attribute("/", "step"));
}

} // namespace cubelm::train
