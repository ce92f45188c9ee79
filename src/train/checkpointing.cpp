#include "cubelm/train/checkpointing.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/train/data_parallel.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

namespace cubelm::train {

namespace fs = std::filesystem;

namespace {

// The stored shape: without the rows that pad the tensor (wte's padded vocabulary).
std::vector<std::uint64_t> shape_of(const tp::ParamBlock<real>& p) {
  std::vector<std::uint64_t> shape(p.shape.begin(), p.shape.end());
  shape[0] -= static_cast<std::uint64_t>(p.padding_rows);
  return shape;
}

// This rank's block of the parameter's stored tensor: its rows up to the padding, the
// first rows of the block in memory (blocks are row-major).
io::Block block_of(const tp::ParamBlock<real>& p) {
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

// Every rank reads its own block, whatever layout wrote the file.
void read_tensor(const io::CheckpointReader& r, const std::string& path,
                 const tp::ParamBlock<real>& p, const kernels::Vec<real>& dst) {
  r.expect_shape(path, shape_of(p));
  auto host = Kokkos::create_mirror_view(dst);
  const io::Block block = block_of(p);
  r.read(path, block, host.data());
  for (std::size_t i = block.size(); i < host.extent(0); ++i)
    host(i) = 0; // padding rows
  Kokkos::deep_copy(dst, host);
}

// A double as the shortest text that reads back to it ("0.01", not 0.01000000000000000021).
std::string number_text(double x) {
  char text[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, x);
    if (std::strtod(text, nullptr) == x)
      break;
  }
  return text;
}

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

// The identity as stored in the root attribute "run": one "key = value" line per key.
std::string identity_text(const std::vector<IdentityKey>& keys) {
  std::string text;
  for (const IdentityKey& k : keys)
    text += k.key + " = " + k.value + "\n";
  return text;
}

std::vector<IdentityKey> parse_identity_text(const std::string& text) {
  std::vector<IdentityKey> keys;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos)
      end = text.size();
    const std::string line = text.substr(start, end - start);
    const std::size_t eq = line.find(" = ");
    if (eq != std::string::npos)
      keys.push_back({line.substr(0, eq), line.substr(eq + 3)});
    start = end + 1;
  }
  return keys;
}

// The identity a checkpoint holds: its "run" attribute, or for a checkpoint written before
// there was one, the identity of the deck it holds.
std::vector<IdentityKey> stored_identity(const io::CheckpointReader& r, const std::string& path) {
  if (r.has_attribute("/", "run"))
    return parse_identity_text(r.string_attribute("/", "run"));
  const std::string text = r.string_attribute("/", "deck");
  try {
    return run_identity(cost::parse_deck(text, path + " (its deck)"));
  } catch (const Error& e) {
    throw Error("checkpoint " + path +
                    ": cannot tell which run wrote it: it holds no run identity, and this cubelm "
                    "cannot read the deck it holds (" +
                    e.what() + ")",
                true);
  }
}

} // namespace

std::vector<IdentityKey> run_identity(const Deck& deck) {
  const ModelConfig& m = deck.model;
  const auto integer = [](long long v) { return std::to_string(v); };
  return {
      {"model.vocab_size", integer(m.vocab_size)},
      {"model.seq_len", integer(m.seq_len)},
      {"model.hidden", integer(m.hidden)},
      {"model.heads", integer(m.heads)},
      {"model.layers", integer(m.layers)},
      {"model.experts", integer(m.experts)},
      {"model.top_k", integer(m.top_k)},
      {"model.moe_every", integer(m.moe_every)},
      {"model.capacity_factor", number_text(m.capacity_factor)},
      {"model.aux_loss", number_text(m.aux_loss)},
      {"train.seed", integer(deck.train.seed)},
      {"train.global_batch", integer(deck.train.global_batch)},
      {"train.precision", quoted(precision_name(deck.train.precision))},
      {"data.format", quoted(deck.data.format)},
      {"data.path", quoted(deck.data.path)},
      {"data.sampler", quoted(deck.data.sampler)},
      {"data.synthetic_tokens", integer(deck.data.synthetic_tokens)},
      {"data.synthetic_branching", integer(deck.data.synthetic_branching)},
      // the training tokens end where the held-out validation tokens begin
      {"data.val_fraction", number_text(deck.data.val_fraction)},
  };
}

std::vector<IdentityDifference> run_differences(const std::string& path, const Deck& deck,
                                                const comm::Communicator& comm) {
  const io::CheckpointReader r(path, comm);
  const std::vector<IdentityKey> stored = stored_identity(r, path);
  std::vector<IdentityDifference> differences;
  for (const IdentityKey& k : run_identity(deck)) {
    // A key the checkpoint does not name (a newer cubelm's key) is not compared.
    const auto it = std::find_if(stored.begin(), stored.end(),
                                 [&](const IdentityKey& s) { return s.key == k.key; });
    if (it != stored.end() && it->value != k.value)
      differences.push_back({k.key, it->value, k.value});
  }
  return differences;
}

std::string describe_differences(const std::vector<IdentityDifference>& differences) {
  std::string text;
  for (const IdentityDifference& d : differences)
    text += (text.empty() ? "" : "; ") + d.key + " = " + d.stored + " there, " + d.deck +
            " in the deck";
  return text;
}

int check_checkpoint_dir(const Deck& deck, const comm::Communicator& comm) {
  const std::string& dir = deck.checkpoint.dir;
  int same = 0;
  for (const std::string& file : checkpoints_newest_first(dir)) {
    std::string why;
    try {
      const auto differences = run_differences(file, deck, comm);
      if (differences.empty()) {
        ++same;
        continue;
      }
      why = "it is another run's (" + describe_differences(differences) + ")";
    } catch (const Error& e) {
      if (!e.collective())
        throw;
      why = std::string("cannot tell whose it is: ") + e.what();
    }
    throw OtherRunCheckpoint(
        "checkpoint.dir = \"" + dir + "\" holds " + file + ": " + why +
            ". This run starts from step 0 (checkpoint.resume = \"none\") and would write its "
            "checkpoints beside it, over it, or for a later resume = \"auto\" to mix up with "
            "it. Give this run a directory of its own (checkpoint.dir), continue that run with "
            "its own deck, or move the file away (docs/reliability.md#whose-checkpoint)",
        true);
  }
  return same;
}

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
  for (const auto& [name, shape] : cost::parameter_shapes(config))
    out.emplace_back(name, std::vector<std::uint64_t>(shape.begin(), shape.end()));
  return out;
}

// Index of each of this rank's parameters by name.
template <class T>
std::map<std::string, std::size_t> local_indices(const model::ShardedGPT<T>& model) {
  std::map<std::string, std::size_t> index;
  const auto& params = model.params();
  for (std::size_t i = 0; i < params.size(); ++i)
    index[params[i].name] = i;
  return index;
}

} // namespace

namespace {

// What one checkpoint writes, in the order every rank writes it: each tensor with its
// stored shape, this rank's block of it and where its values are (none: zeros).
// Of the block, the rank writes elements [first, first + count) (a run of moments), all of
// them unless it says otherwise.
struct Item {
  std::string path;
  std::vector<std::uint64_t> shape;
  io::Block block;
  const kernels::Vec<real>* source = nullptr;
  std::uint64_t first = 0, count = 0;
};

// The moments as runs (ZeRO's shards: every rank with writes_moments writes its own).
struct Runs {
  const std::vector<MomentRun>* m;
  const std::vector<MomentRun>* v;
};

template <class T>
std::vector<Item>
checkpoint_items(const model::ShardedGPT<T>& model, const std::vector<kernels::Vec<real>>* m,
                 const std::vector<kernels::Vec<real>>* v, const Runs& runs = {nullptr, nullptr}) {
  std::vector<Item> items;
  const auto& params = model.params();
  const auto tensors = all_tensors(model.config());
  const auto index = local_indices(model);
  // The values, then AdamW's moments (zeros when there are none).
  const std::pair<const char*, const std::vector<kernels::Vec<real>>*> parts[] = {
      {"/model/", nullptr}, {"/optimizer/m/", m}, {"/optimizer/v/", v}};
  for (std::size_t k = 0; k < 3; ++k)
    for (const auto& [name, shape] : tensors) {
      Item item{parts[k].first + name, shape, io::Block::none(), nullptr};
      const auto it = index.find(name);
      if (it != index.end()) {
        const auto& p = params[it->second];
        // Replicas write nothing: each element of the global tensor is written once.
        item.shape = shape_of(p);
        item.block = p.writer ? block_of(p) : io::Block::none();
        const auto* moments = parts[k].second;
        item.source = k == 0 ? &p.value : moments ? &(*moments)[it->second] : nullptr;
        item.count = item.block.size();
        if (const auto* run = k == 0 ? nullptr : k == 1 ? runs.m : runs.v; run) {
          // The run, past the block's padding rows (its last) left out.
          const MomentRun& r = (*run)[it->second];
          item.block = p.writes_moments ? block_of(p) : io::Block::none();
          item.first = static_cast<std::uint64_t>(r.first);
          const std::uint64_t end =
              std::min<std::uint64_t>(item.first + r.values.extent(0), item.block.size());
          item.count = end > item.first ? end - item.first : 0;
          item.source = &r.values;
        }
      }
      items.push_back(std::move(item));
    }
  return items;
}

} // namespace

CheckpointAttributes CheckpointAttributes::of(const Deck& deck, int step, int optimizer_step) {
  CheckpointAttributes a;
  a.step = step;
  a.tokens_seen = static_cast<std::int64_t>(step) * deck.train.global_batch * deck.model.seq_len;
  a.deck = deck.text;
  a.layout = comm::layout_of(deck.parallel).describe();
  a.padded_vocab_size = tp::padded_vocab(deck.model, comm::layout_of(deck.parallel));
  a.seed = static_cast<std::int64_t>(deck.train.seed);
  a.run = identity_text(run_identity(deck));
  a.optimizer_step = optimizer_step < 0 ? step : optimizer_step;
  return a;
}

namespace {

void make_parent(const std::string& path, const comm::Communicator& comm) {
  const fs::path parent = fs::path(path).parent_path();
  if (comm.rank() == 0 && !parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec); // a failure surfaces as the writer's clear error
  }
}

void write_attributes(io::CheckpointWriter& w, const CheckpointAttributes& a) {
  w.set_attribute("/", "version", kCheckpointVersion);
  w.set_attribute("/", "step", a.step);
  w.set_attribute("/", "tokens_seen", a.tokens_seen);
  w.set_attribute("/", "deck", a.deck);
  w.set_attribute("/", "layout", a.layout);
  // /model/wte holds the vocabulary's rows only; the run that wrote it computed with
  // this many (the rest zero padding), which any layout may choose differently.
  w.set_attribute("/", "padded_vocab_size", a.padded_vocab_size);
  w.set_attribute("/", "seed", a.seed);
  w.set_attribute("/", "data_cursor", a.step);
  w.set_attribute("/", "run", a.run);
  w.set_attribute("/optimizer", "step", a.optimizer_step);
  w.close();
}

} // namespace

namespace {
void write_items(const std::string& path, const Deck& deck, const std::vector<Item>& items,
                 int step, const comm::Communicator& comm, int optimizer_step) {
  make_parent(path, comm);
  io::CheckpointWriter w(path, comm, io::writers_named(deck.checkpoint.writers));
  const float nothing = 0.0f;
  for (const Item& item : items) {
    if (item.count == 0) {
      w.write(item.path, item.shape, io::Block::none(), &nothing);
    } else if (item.source) { // one tensor at a time in host memory (a GPU's copy)
      const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), *item.source);
      w.write(item.path, item.shape, item.block, item.first, item.count, host.data());
    } else {
      const std::vector<float> zeros(static_cast<std::size_t>(item.block.size()), 0.0f);
      w.write(item.path, item.shape, item.block, zeros.data());
    }
  }
  write_attributes(w, CheckpointAttributes::of(deck, step, optimizer_step));
}
} // namespace

template <class T>
void save_checkpoint(const std::string& path, const Deck& deck, const model::ShardedGPT<T>& model,
                     const std::vector<kernels::Vec<real>>* m,
                     const std::vector<kernels::Vec<real>>* v, int step,
                     const comm::Communicator& comm, int optimizer_step) {
  write_items(path, deck, checkpoint_items(model, m, v), step, comm, optimizer_step);
}

template <class T>
void save_checkpoint(const std::string& path, const Deck& deck, const model::ShardedGPT<T>& model,
                     const std::vector<MomentRun>* m, const std::vector<MomentRun>* v, int step,
                     const comm::Communicator& comm, int optimizer_step) {
  write_items(path, deck, checkpoint_items(model, nullptr, nullptr, Runs{m, v}), step, comm,
              optimizer_step);
}

void save_model_tensors(const std::string& path, const Deck& deck,
                        const std::map<std::string, std::vector<float>>& values,
                        const comm::Communicator& comm) {
  const auto tensors = all_tensors(deck.model);
  const bool writer = comm.rank() == 0;
  std::size_t largest = 0;
  for (const auto& [name, shape] : tensors) {
    std::size_t n = 1;
    for (const std::uint64_t d : shape)
      n *= static_cast<std::size_t>(d);
    largest = std::max(largest, n);
    if (!writer)
      continue;
    const auto it = values.find(name);
    CUBELM_ASSERT(it != values.end() && it->second.size() == n,
                  "save_model_tensors: no values of the right size for " + name);
  }
  make_parent(path, comm);
  io::CheckpointWriter w(path, comm, io::writers_named(deck.checkpoint.writers));
  const std::vector<float> zeros(writer ? largest : 0, 0.0f);
  const float nothing = 0.0f;
  for (const char* group : {"/model/", "/optimizer/m/", "/optimizer/v/"})
    for (const auto& [name, shape] : tensors) {
      const io::Block block = writer ? io::Block::whole(shape) : io::Block::none();
      const float* data = !writer                           ? &nothing
                          : std::string(group) == "/model/" ? values.at(name).data()
                                                            : zeros.data();
      w.write(group + name, shape, block, data);
    }
  write_attributes(w, CheckpointAttributes::of(deck, 0, 0));
}

namespace {
// The tensors of a snapshot of `items`, at their offsets in its buffer, and their sources.
std::pair<std::vector<CheckpointSnapshot::Tensor>, std::vector<const kernels::Vec<real>*>>
snapshot_of(const std::vector<Item>& items) {
  std::pair<std::vector<CheckpointSnapshot::Tensor>, std::vector<const kernels::Vec<real>*>> out;
  std::int64_t at = 0;
  for (const Item& item : items) {
    out.first.push_back({item.path, item.shape, item.block, item.first, item.count, at});
    out.second.push_back(item.source);
    at += static_cast<std::int64_t>(item.count);
  }
  return out;
}
} // namespace

template <class T>
void CheckpointSnapshot::take(const Deck& deck, const model::ShardedGPT<T>& model,
                              const std::vector<kernels::Vec<real>>& m,
                              const std::vector<kernels::Vec<real>>& v, int step,
                              int optimizer_step) {
  auto [tensors, sources] = snapshot_of(checkpoint_items(model, &m, &v));
  copy(deck, std::move(tensors), sources, step, optimizer_step);
}

template <class T>
void CheckpointSnapshot::take(const Deck& deck, const model::ShardedGPT<T>& model,
                              const std::vector<MomentRun>& m, const std::vector<MomentRun>& v,
                              int step, int optimizer_step) {
  auto [tensors, sources] = snapshot_of(checkpoint_items(model, nullptr, nullptr, Runs{&m, &v}));
  copy(deck, std::move(tensors), sources, step, optimizer_step);
}

void CheckpointSnapshot::copy(const Deck& deck, std::vector<Tensor> tensors,
                              const std::vector<const kernels::Vec<real>*>& sources, int step,
                              int optimizer_step) {
  const std::int64_t total =
      tensors.empty() ? 0 : tensors.back().offset + static_cast<std::int64_t>(tensors.back().count);
  if (static_cast<std::int64_t>(buffer_.extent(0)) != total)
    buffer_ = Kokkos::View<float*, Kokkos::HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::checkpoint_snapshot"),
        static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::int64_t n = static_cast<std::int64_t>(t.count);
    if (n == 0)
      continue;
    // The values are the first n of the source (blocks are row-major).
    Kokkos::deep_copy(Kokkos::subview(buffer_, std::make_pair(t.offset, t.offset + n)),
                      Kokkos::subview(*sources[i], std::make_pair(std::int64_t(0), n)));
  }
  tensors_ = std::move(tensors);
  attributes_ = CheckpointAttributes::of(deck, step, optimizer_step);
  writers_ = io::writers_named(deck.checkpoint.writers);
}

void CheckpointSnapshot::write(const std::string& path, const comm::Communicator& comm) const {
  make_parent(path, comm);
  io::CheckpointWriter w(path, comm, writers_);
  const float nothing = 0.0f;
  for (const Tensor& t : tensors_) {
    if (t.count == 0)
      w.write(t.path, t.shape, io::Block::none(), &nothing);
    else
      w.write(t.path, t.shape, t.block, t.first, t.count, buffer_.data() + t.offset);
  }
  write_attributes(w, attributes_);
}

template <class T>
std::int64_t CheckpointSnapshot::bytes_for(const model::ShardedGPT<T>& model,
                                           const std::vector<MomentRun>* runs) {
  const auto items = runs ? checkpoint_items(model, nullptr, nullptr, Runs{runs, runs})
                          : checkpoint_items(model, nullptr, nullptr);
  std::int64_t total = 0;
  for (const Item& item : items)
    total += static_cast<std::int64_t>(item.count);
  return total * static_cast<std::int64_t>(sizeof(float));
}

void CheckpointSnapshot::reserve(std::int64_t bytes) {
  // Zero-filled: every page is touched here rather than during the first take().
  buffer_ = Kokkos::View<float*, Kokkos::HostSpace>(
      "cubelm::checkpoint_snapshot", static_cast<std::size_t>(bytes) / sizeof(float));
}

std::int64_t CheckpointSnapshot::bytes() const {
  return static_cast<std::int64_t>(buffer_.extent(0) * sizeof(float));
}

namespace {
// Reads the checkpoint of `r` into the model's master weights and, when `m` and `v` are
// given, the moments.
template <class T>
void read_checkpoint(const io::CheckpointReader& r, model::ShardedGPT<T>& model,
                     std::vector<kernels::Vec<real>>* m, std::vector<kernels::Vec<real>>* v) {
  const std::string& path = r.path();
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
  const bool moments = m != nullptr && v != nullptr;
  const std::vector<const char*> groups =
      moments ? std::vector<const char*>{"/model/", "/optimizer/m/", "/optimizer/v/"}
              : std::vector<const char*>{"/model/"};
  auto& params = model.params();
  float nothing = 0.0f;
  const auto index = local_indices(model);
  for (const auto& [name, shape] : all_tensors(model.config())) {
    const auto it = index.find(name);
    if (it == index.end()) {
      for (const char* group : groups) {
        r.expect_shape(group + name, shape);
        r.read(group + name, io::Block::none(), &nothing);
      }
      continue;
    }
    const std::size_t k = it->second;
    read_tensor(r, "/model/" + name, params[k], params[k].value);
    if (moments) {
      read_tensor(r, "/optimizer/m/" + name, params[k], (*m)[k]);
      read_tensor(r, "/optimizer/v/" + name, params[k], (*v)[k]);
    }
  }
  model.refresh_weights(ExecSpace()); // a bf16 model's weights follow what was read
}
} // namespace

template <class T>
int load_checkpoint(const std::string& path, model::ShardedGPT<T>& model,
                    std::vector<kernels::Vec<real>>& m, std::vector<kernels::Vec<real>>& v,
                    const comm::Communicator& comm, int* optimizer_step) {
  const io::CheckpointReader r(path, comm);
  read_checkpoint(r, model, &m, &v);
  if (optimizer_step)
    *optimizer_step = static_cast<int>(r.int_attribute("/optimizer", "step"));
  return static_cast<int>(r.int_attribute("/", "step"));
}

template <class T>
void load_weights(const std::string& path, model::ShardedGPT<T>& model,
                  const comm::Communicator& comm) {
  const io::CheckpointReader r(path, comm);
  read_checkpoint<T>(r, model, nullptr, nullptr);
}

#define CUBELM_INSTANTIATE_CHECKPOINTS(T)                                                          \
  template std::int64_t CheckpointSnapshot::bytes_for<T>(const model::ShardedGPT<T>&,              \
                                                         const std::vector<MomentRun>*);           \
  template void CheckpointSnapshot::take<T>(const Deck&, const model::ShardedGPT<T>&,              \
                                            const std::vector<kernels::Vec<real>>&,                \
                                            const std::vector<kernels::Vec<real>>&, int, int);     \
  template void CheckpointSnapshot::take<T>(const Deck&, const model::ShardedGPT<T>&,              \
                                            const std::vector<MomentRun>&,                         \
                                            const std::vector<MomentRun>&, int, int);              \
  template void save_checkpoint<T>(const std::string&, const Deck&, const model::ShardedGPT<T>&,   \
                                   const std::vector<kernels::Vec<real>>*,                         \
                                   const std::vector<kernels::Vec<real>>*, int,                    \
                                   const comm::Communicator&, int);                                \
  template void save_checkpoint<T>(const std::string&, const Deck&, const model::ShardedGPT<T>&,   \
                                   const std::vector<MomentRun>*, const std::vector<MomentRun>*,   \
                                   int, const comm::Communicator&, int);                           \
  template int load_checkpoint<T>(                                                                 \
      const std::string&, model::ShardedGPT<T>&, std::vector<kernels::Vec<real>>&,                 \
      std::vector<kernels::Vec<real>>&, const comm::Communicator&, int*);                          \
  template void load_weights<T>(const std::string&, model::ShardedGPT<T>&,                         \
                                const comm::Communicator&);
CUBELM_INSTANTIATE_CHECKPOINTS(real)
CUBELM_INSTANTIATE_CHECKPOINTS(bf16)

} // namespace cubelm::train
