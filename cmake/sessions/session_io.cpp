// train::session_io (include/loom/train/session.hpp): the checkpoint and trace calls of every
// session instance, compiled once into loom::sessions instead of once per instance.
#include <loom/io/checkpoint.hpp>
#include <loom/io/trace.hpp>
#include <loom/parallel/any_comm.hpp>
#include <loom/train/session.hpp>

namespace loom::train {

struct session_io::impl {
  io::async_saver saver;
};

session_io::session_io() : impl_(std::make_unique<impl>()) {}
session_io::~session_io() = default;

void session_io::save(const io::state_view& v, const std::filesystem::path& root, const io::run_state& state,
                      io::checkpoint_options opt, parallel::any_communicator* world) {
  if (world) impl_->saver.save(v, root, state, io::collective_of(*world), std::move(opt));
  else impl_->saver.save(v, root, state, std::move(opt));
}

std::optional<std::filesystem::path> session_io::wait(parallel::any_communicator* world) {
  return world ? impl_->saver.wait(io::collective_of(*world)) : impl_->saver.wait();
}

double session_io::last_write_seconds() const noexcept { return impl_->saver.last_write_seconds(); }

io::checkpoint_info session_io::load(const std::filesystem::path& dir, const io::state_view& v,
                                     const std::function<void(const std::string&)>& warn) {
  return io::load_checkpoint(io::find_checkpoint(dir, warn), v);
}

void session_io::gather_trace(const io::trace_recorder& rec, parallel::any_communicator* world,
                              const std::filesystem::path& file) {
  if (world) io::gather_trace(rec, *world, file);
  else rec.write(file);
}

}  // namespace loom::train
