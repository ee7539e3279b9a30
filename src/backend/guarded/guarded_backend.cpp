#include "backend/guarded/guarded_backend.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>

#include "backend/cpu/scalar/reference_kernels.h"
#include "base/check.h"

namespace pagoda::guarded {
namespace {

// The arena: one reservation, handed out front to back (a buffer given back is not reused: tests
// are short), PROT_NONE but while an entry runs. Only the part handed out is ever opened.
class GuardedContext final : public ExecContext {
 public:
  static constexpr size_t kReserve = size_t{16} << 30;  // address space, not memory

  GuardedContext() {
    void* p = ::mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~GuardedContext() override {
    if (base_ != nullptr) ::munmap(base_, kReserve);
  }
  bool ok() const { return base_ != nullptr; }

  Buffer allocate(size_t bytes) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t at = (used_ + 63) / 64 * 64;
    if (bytes > kReserve - at) throw std::bad_alloc();
    used_ = at + bytes;
    if (depth_ > 0) protect(PROT_READ | PROT_WRITE);  // allocated inside an entry: open it too
    // Fresh pages of the mapping are zero, and nothing is handed out twice.
    return Buffer(base_ + at, bytes, [](const void*, void*, size_t) {}, this);
  }

  // Opens the handed-out part for the entry that runs now (nested entries share one opening).
  void open() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (depth_++ == 0) protect(PROT_READ | PROT_WRITE);
  }
  void close() const {
    std::lock_guard<std::mutex> lock(mu_);
    PAGODA_CHECK(depth_ > 0);
    if (--depth_ == 0) protect(PROT_NONE);
  }

 private:
  // Opening covers every page handed out so far; closing, every page last opened.
  void protect(int prot) const {
    if (prot != PROT_NONE) opened_ = (used_ + kPage - 1) / kPage * kPage;
    if (opened_ == 0) return;
    PAGODA_CHECK(::mprotect(base_, opened_, prot) == 0 && "mprotect of the guarded arena");
  }

  static constexpr size_t kPage = 4096;
  uint8_t* base_ = nullptr;
  mutable std::mutex mu_;
  mutable size_t used_ = 0;    // bytes handed out
  mutable size_t opened_ = 0;  // bytes last made readable (closed again in full)
  mutable int depth_ = 0;
};

const GuardedContext& guarded(const ExecContext& ctx) { return static_cast<const GuardedContext&>(ctx); }

// Holds the arena open for one entry.
class Open {
 public:
  explicit Open(const ExecContext& ctx) : ctx_(guarded(ctx)) { ctx_.open(); }
  ~Open() { ctx_.close(); }
  Open(const Open&) = delete;
  Open& operator=(const Open&) = delete;

 private:
  const GuardedContext& ctx_;
};

// Entry M of the reference table, run with the arena open.
template <auto M>
struct Guarded;
template <class R, class... A, R (*KernelTable::*M)(const ExecContext&, A...)>
struct Guarded<M> {
  static R call(const ExecContext& ctx, A... args) {
    const Open open(ctx);
    return (cpu::reference_kernels().*M)(ctx, args...);
  }
};

// The reference upload reads a weight where it lies (host memory is the CPU's); here it is copied
// into the arena.
Tensor upload(const ExecContext& ctx, const Tensor& w, Buffer* storage) {
  Tensor out = w;
  *storage = ctx.allocate(static_cast<size_t>(w.nbytes()));
  out.data = storage->data();
  const Open open(ctx);
  if (w.nbytes() > 0) std::memcpy(out.data, w.data, static_cast<size_t>(w.nbytes()));
  return out;
}

KernelTable guarded_table() {
  KernelTable t{};
  t.matmul = Guarded<&KernelTable::matmul>::call;
  t.pack_matmul_weight = nullptr;  // weights are uploaded as they are, row-major
  t.matmul_many = nullptr;
  t.matmul_grouped = nullptr;
  t.matmul_int = Guarded<&KernelTable::matmul_int>::call;
  t.pack_int_weight = Guarded<&KernelTable::pack_int_weight>::call;
  t.embedding = Guarded<&KernelTable::embedding>::call;
  t.rms_norm = Guarded<&KernelTable::rms_norm>::call;
  t.rope = Guarded<&KernelTable::rope>::call;
  t.silu_mul = Guarded<&KernelTable::silu_mul>::call;
  t.add = Guarded<&KernelTable::add>::call;
  t.store_kv = Guarded<&KernelTable::store_kv>::call;
  t.paged_attention = Guarded<&KernelTable::paged_attention>::call;
  t.merge_attention = Guarded<&KernelTable::merge_attention>::call;
  t.copy_to_device = Guarded<&KernelTable::copy_to_device>::call;
  t.copy_to_host = Guarded<&KernelTable::copy_to_host>::call;
  t.zero = Guarded<&KernelTable::zero>::call;
  t.upload = upload;
  t.copy_rows = Guarded<&KernelTable::copy_rows>::call;
  t.gather_rows = Guarded<&KernelTable::gather_rows>::call;
  t.gather_columns = Guarded<&KernelTable::gather_columns>::call;
  t.moe_route = Guarded<&KernelTable::moe_route>::call;
  t.moe_combine = Guarded<&KernelTable::moe_combine>::call;
  t.all_reduce = Guarded<&KernelTable::all_reduce>::call;
  t.all_gather = Guarded<&KernelTable::all_gather>::call;
  return t;
}

}  // namespace

Result<std::unique_ptr<GuardedBackend>> GuardedBackend::create() {
  auto context = std::make_shared<const GuardedContext>();
  if (!context->ok()) {
    return resource_exhausted(std::string("the guarded backend could not reserve its arena: ") + std::strerror(errno));
  }
  return std::unique_ptr<GuardedBackend>(new GuardedBackend(Kernels(guarded_table(), std::move(context))));
}

std::string GuardedBackend::description() const {
  return "guarded: the scalar reference kernels over memory the host cannot touch outside them (a test backend)";
}

bool GuardedBackend::supports_weight_type(DType t) const { return dtype_traits(t).dense_matmul; }

void register_guarded_backend() {
  register_backend("guarded", [](const BackendOptions&) -> Result<std::unique_ptr<Backend>> {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<GuardedBackend> b, GuardedBackend::create());
    return std::unique_ptr<Backend>(std::move(b));
  });
}

}  // namespace pagoda::guarded
