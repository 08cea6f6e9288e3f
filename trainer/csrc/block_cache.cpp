// libtorch's CPU allocator with a cache of large blocks for the training
// step (`trainer/rl/src/memory.rs`, `reuse_freed_blocks`).
//
// libtorch allocates every CPU tensor with `posix_memalign` and frees it
// when the tensor dies. glibc hands blocks of 32 MiB and more (and, on a
// thread's own arena, any block its 64 MiB heaps cannot hold) pages of
// their own and unmaps them when freed, so each step's logits, activations
// and gradients fault in fresh zeroed pages again: ~9% of a CPU step. While
// a thread is inside a scope (`agl_block_cache_enter`/`_exit`), blocks of
// 1 MiB and more come from mapped blocks this allocator keeps when they are
// freed and hands out again (the smallest cached block that fits, up to
// twice the size asked for), up to a cap on the bytes kept; the rest goes to
// libtorch's own allocator. The cache is process-wide (a block freed on any
// thread returns to it); `agl_block_cache_trim` unmaps what it keeps.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kMinBlock = size_t(1) << 20;
// Mapped sizes are multiples of this: requests that differ a little (one
// more token in a row) share blocks.
constexpr size_t kGranule = size_t(64) << 10;

thread_local int t_depth = 0;

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* fallback, size_t cap)
      : fallback_(fallback), fallback_free_(fallback->raw_deleter()), cap_(cap) {}

  c10::DataPtr allocate(size_t n) override {
    void* p = nullptr;
    if (t_depth > 0 && n >= kMinBlock) {
      p = take((n + kGranule - 1) / kGranule * kGranule);
    }
    if (p == nullptr) {
      // A context that is the data pointer, as raw_allocate wants.
      p = fallback_->allocate(n).release_context();
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Every pointer this allocator handed out comes back here.
  static void release(void* p) {
    if (p != nullptr && !instance->give_back(p)) {
      instance->fallback_free_(p);
    }
  }

  size_t trim() {
    std::multimap<size_t, void*> free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free.swap(free_);
      cached_ = 0;
      for (auto& [size, p] : free) owned_.erase(p);
    }
    size_t bytes = 0;
    for (auto& [size, p] : free) {
      munmap(p, size);
      bytes += size;
    }
    return bytes;
  }

  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }

  static BlockCache* instance;

 private:
  // A cached block of `size` to `2 * size` bytes, or a new mapping.
  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= 2 * size) {
        void* p = it->second;
        cached_ -= it->first;
        free_.erase(it);
        return p;
      }
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return nullptr;  // libtorch's allocator tries, and reports failure
    }
    std::lock_guard<std::mutex> lock(mutex_);
    owned_.emplace(p, size);
    return p;
  }

  // Keeps `p` if it is one of ours (unmapping it past the cap); false if
  // it is the fallback's.
  bool give_back(void* p) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = owned_.find(p);
      if (it == owned_.end()) {
        return false;
      }
      size = it->second;
      if (cached_ + size <= cap_) {
        free_.emplace(size, p);
        cached_ += size;
        return true;
      }
      owned_.erase(it);
    }
    munmap(p, size);
    return true;
  }

  c10::Allocator* fallback_;
  c10::DeleterFnPtr fallback_free_;
  size_t cap_;
  std::mutex mutex_;
  // Every mapping this allocator made that is not unmapped: live or cached.
  std::unordered_map<void*, size_t> owned_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

BlockCache* BlockCache::instance = nullptr;
std::once_flag installed;

}  // namespace

extern "C" {

// Makes the cache libtorch's CPU allocator (once), keeping at most a
// quarter of the machine's memory. False if libtorch's allocator has no
// raw deleter to hand the blocks it allocates back with.
bool agl_block_cache_install() {
  std::call_once(installed, [] {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t cap = pages > 0 && page > 0 ? size_t(pages) * size_t(page) / 4 : size_t(1) << 30;
    c10::Allocator* fallback = c10::GetCPUAllocator();
    if (fallback == nullptr || fallback->raw_deleter() == nullptr) {
      return;
    }
    // Never freed: tensors may outlive every scope, up to process exit.
    BlockCache::instance = new BlockCache(fallback, cap);
    c10::SetCPUAllocator(BlockCache::instance, /*priority=*/1);
  });
  return BlockCache::instance != nullptr;
}

void agl_block_cache_enter() { ++t_depth; }

void agl_block_cache_exit() {
  if (t_depth > 0) --t_depth;
}

size_t agl_block_cache_trim() {
  return BlockCache::instance == nullptr ? 0 : BlockCache::instance->trim();
}

size_t agl_block_cache_cached() {
  return BlockCache::instance == nullptr ? 0 : BlockCache::instance->cached();
}

}  // extern "C"
