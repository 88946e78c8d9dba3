// The emulated Gaudi's `hpu` device for stock (CPU) PyTorch.
//
// torch knows `hpu` as a device type and has HPU / AutogradHPU / AutocastHPU dispatch keys, but ships no
// device guard, no allocator and no kernels for it. This library supplies them, so that code written for a
// Gaudi (`x.to("hpu")`, `torch.zeros(..., device="hpu")`, `torch.autocast("hpu")`) runs unchanged on the CPU:
//
// * a device guard and hooks for HPU (one card per process, as on a Gaudi: always `hpu:0`);
// * a counting allocator: every hpu storage is counted when allocated and uncounted when freed, exact to the
//   byte, with Gaudi's ten memory counters and a Gaudi-style out-of-memory error over the limit;
// * kernels at the HPU key: allocation, copies between host and device, metadata ops, views; every other op
//   goes through one boxed fallback that runs the CPU kernel on CPU *aliases* of the same host memory (no copy)
//   and hands the results back as hpu tensors (fresh outputs adopt the CPU kernel's buffer, views keep
//   pointing at the hpu storage);
// * autocast at the AutocastHPU key with Habana's casting policies (lower precision, fp32, promote, lower the
//   first argument), for the op names the Python side registers from Habana's lists or the user's list files.
// * fp8_round_amax: the emulated transformer engine's fp8 rounding (x * scale on the fp8 grid) and the amax of
//   x, in one vectorised pass (see its comment).
//
// Behaviour modelled on Habana's bridge (autocast policies, the PT_DEVMEM out-of-memory text) and on torch's own
// open-registration example for out-of-tree devices; the code is ours.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/EmptyTensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/HIPHooksInterface.h>
#include <ATen/detail/HPUHooksInterface.h>
#include <ATen/detail/MPSHooksInterface.h>
#include <ATen/detail/XPUHooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/library.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace hpu_nb {
namespace {

constexpr c10::DeviceType kHPU = c10::DeviceType::HPU;
const c10::Device kDevice(kHPU, 0);

// ----------------------------------------------------------------------------------------------------------------
// Memory: Gaudi's counters, measured.
// ----------------------------------------------------------------------------------------------------------------
struct Memory {
  std::mutex mu;
  int64_t limit = int64_t(96) << 30;
  int64_t in_use = 0;
  int64_t max_in_use = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
  int64_t max_alloc_size = 0;
  int64_t card = 0;  // bumped when a forked process gets a fresh card: blocks of the parent's card are not ours
  std::string label = "emulated Gaudi";

  // Counts an allocation of n bytes on the card; returns the card it was counted on.
  int64_t charge(int64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (in_use + n > limit) {
      std::ostringstream msg;
      // The Gaudi runtime reports an out-of-memory card as "MODULE:PT_DEVMEM Allocation failed for size::<n> (<m>)MB".
      msg << "[" << label << "] MODULE:PT_DEVMEM Allocation failed for size::" << n << " ("
          << static_cast<double>(n) / (1024 * 1024.) << ")MB; InUse " << in_use << " of Limit " << limit
          << " bytes. HPU out of memory.";
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
    }
    in_use += n;
    num_allocs += 1;
    max_in_use = std::max(max_in_use, in_use);
    max_alloc_size = std::max(max_alloc_size, n);
    return card;
  }

  void release(int64_t n, int64_t on_card) {
    std::lock_guard<std::mutex> lock(mu);
    if (on_card != card) return;
    in_use -= n;
    num_frees += 1;
  }

  void fresh_card() {
    std::lock_guard<std::mutex> lock(mu);
    card += 1;
    in_use = max_in_use = num_allocs = num_frees = max_alloc_size = 0;
  }
};

Memory& memory() {
  static Memory* m = new Memory();  // never destroyed: tensors freed at interpreter exit still uncount
  return *m;
}

// Device memory is host memory behind a header that remembers its size and card, so the deleter can uncount it.
constexpr size_t kHeader = 64;  // keeps the payload 64-byte aligned

void free_device_block(void* ctx) {
  auto* header = static_cast<int64_t*>(ctx);
  memory().release(header[0], header[1]);
  c10::free_cpu(ctx);
}

struct HPUAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) {
      return {nullptr, kDevice};
    }
    const int64_t card = memory().charge(static_cast<int64_t>(n));
    void* block = nullptr;
    try {
      block = c10::alloc_cpu(n + kHeader);
    } catch (...) {
      memory().release(static_cast<int64_t>(n), card);
      throw;
    }
    static_cast<int64_t*>(block)[0] = static_cast<int64_t>(n);
    static_cast<int64_t*>(block)[1] = card;
    return {static_cast<char*>(block) + kHeader, block, &free_device_block, kDevice};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

HPUAllocator g_allocator;
REGISTER_ALLOCATOR(kHPU, &g_allocator);

// A buffer a CPU kernel allocated for its output, adopted as device memory (counted until it is freed).
struct AdoptedBlock {
  c10::DataPtr cpu;
  int64_t nbytes;
  int64_t card;
};

void free_adopted_block(void* ctx) {
  auto* block = static_cast<AdoptedBlock*>(ctx);
  memory().release(block->nbytes, block->card);
  delete block;
}

// ----------------------------------------------------------------------------------------------------------------
// Device guard and hooks: one card per process, as on a Gaudi.
// ----------------------------------------------------------------------------------------------------------------
// torch asks its HPU hooks once and keeps the answer object, so the library registers them as early as it can
// (when torch is imported); they report an HPU only once the emulated Gaudi is activated, so a process that never
// uses it sees no accelerator.
std::atomic<bool> g_active{false};
std::atomic<c10::DeviceIndex> g_guard_device_count{1};

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index <= 0,
      "hpu:", static_cast<int>(index),
      " is not this process's card: a process drives one HPU, hpu:0 (as on a Gaudi, where each rank acquires its own"
      " card). Use torch.device('hpu').");
}

struct HPUGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kHPU;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    check_index(d.index());
    return kDevice;
  }
  c10::Device getDevice() const override {
    return kDevice;
  }
  void setDevice(c10::Device d) const override {
    check_index(d.index());
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  // Every stream is the one in-order stream of an eager card.
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  // One card (torch.hpu.device_count() reports the machine's), except while activate() lets the autograd engine
  // size its device threads.
  c10::DeviceIndex deviceCount() const noexcept override {
    return g_guard_device_count.load();
  }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;  // the emulation computes eagerly on the CPU: everything recorded is already done
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(HPU, HPUGuardImpl);

// ----------------------------------------------------------------------------------------------------------------
// Which accelerator torch serves: the question every build of torch asks its compiled-in hooks.
// ----------------------------------------------------------------------------------------------------------------
// torch's getAccelerator() (aten/src/ATen/DeviceAccelerator.cpp, 2.6 to 2.15) asks the hooks of each compiled-in
// accelerator (CUDA, XPU, HIP, MPS, HPU) whether it isBuilt() and raises "Cannot have both HPU and cuda." when two
// say yes; autograd's engine, dynamo and init_process_group all ask it. And autograd serves one accelerator per
// process: in current torch (its source; measured on 2.14 with gdb) the engine and InputBuffer give a node on an
// accelerator device (isAccelerator: CUDA, XPU, HPU, ...) the current stream of *the* accelerator
// (at::accelerator::getCurrentStream), so backward through `hpu` tensors needs HPU to be the process's accelerator. PyPI's torch for Linux is a CUDA build, whose CUDA hooks say
// isBuilt() whether or not a GPU is there. So, when the emulated card is first used:
// * another compiled-in accelerator with no usable device (a CUDA build on a machine without a GPU, or with the GPUs
//   hidden) is told to answer isBuilt() = false, as a CPU build's hooks do: the process's accelerator becomes hpu, as
//   on a Gaudi. Its other answers (torch.cuda.is_available() is False, device_count() 0) are unchanged.
// * another accelerator with a usable device keeps the question (torch.accelerator stays cuda): HPU answers
//   isBuilt() = false, and the Python side finds out whether this torch's autograd can run hpu beside it.
// The hooks object is created by torch before any extension loads (torch._C's init asks getCUDAHooks()) and kept for
// the life of the process, on the heap. So its answer is changed on that one object: it gets its own copy of its
// class's virtual table, the isBuilt slot (found through the C++ ABI's member-pointer encoding) pointing at a function
// returning false, and its virtual-table pointer is set to the copy -- one pointer stored into the object's own heap
// memory. Nothing of torch's libraries is written (their read-only pages may be sealed: mseal since Linux 6.10,
// seccomp, PaX MPROTECT), and every other object of the class keeps the class's table. The copy is the whole table as
// the library's symbol table sizes it (the `_ZTV` symbol: offset-to-top and RTTI before the address point, so typeid
// and dynamic_cast still work, then every virtual slot); where that size is not known, nothing is changed.
std::atomic<bool> g_hpu_is_the_accelerator{false};  // claim_accelerator settled it so: what HPU's isBuilt() answers

bool answer_not_built(const void* /*hooks*/) {
  return false;
}

// The byte offset of isBuilt() in an accelerator hooks object's virtual table, or -1 if this ABI is not known.
std::ptrdiff_t is_built_slot_offset() {
  using IsBuilt = bool (at::AcceleratorHooksInterface::*)() const;
  IsBuilt member = &at::AcceleratorHooksInterface::isBuilt;
  struct {
    std::ptrdiff_t ptr;
    std::ptrdiff_t adj;
  } repr;
  static_assert(sizeof(repr) == sizeof(member), "not the Itanium C++ ABI's member pointers");
  std::memcpy(&repr, &member, sizeof(repr));
#if defined(__aarch64__) || defined(__arm__)
  return (repr.adj & 1) ? repr.ptr : -1;  // ARM's variant: the virtual flag is adj's low bit
#elif defined(__x86_64__) || defined(__i386__) || defined(__powerpc64__) || defined(__s390x__)
  return (repr.ptr & 1) ? repr.ptr - 1 : -1;  // a virtual member's ptr is 1 + its offset in the table
#else
  return -1;
#endif
}

#if defined(__has_feature)
#if __has_feature(ptrauth_calls)
#define HPU_NB_SIGNED_VTABLES 1
#endif
#endif
#if defined(__arm64e__)
#define HPU_NB_SIGNED_VTABLES 1
#endif

// The mapping holding `address`, from /proc/self/maps: its protection (-1: not mapped) and its file's inode (0: none).
struct Mapping {
  int protection = -1;
  unsigned long inode = 0;
};

Mapping mapping_of(uintptr_t address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  Mapping mapping;
  while (std::getline(maps, line)) {
    uintptr_t start = 0, end = 0;
    char perms[5] = {0};
    unsigned long inode = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s %*s %*s %lu", &start, &end, perms, &inode) != 4) {
      continue;
    }
    if (address < start || address >= end) continue;
    mapping.protection =
        (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) | (perms[2] == 'x' ? PROT_EXEC : 0);
    mapping.inode = inode;
    break;
  }
  return mapping;
}

// The virtual table holding `address_point` (an object's vptr): where its `_ZTV` symbol starts and how many bytes it
// has, from the symbol tables of the library defining it. `why` says why not when it is not found.
struct VirtualTable {
  const char* start = nullptr;
  std::size_t size = 0;
  std::string why;
};

bool is_virtual_table_spanning(const char* name, uintptr_t start, std::size_t size, uintptr_t address) {
  return name != nullptr && std::strncmp(name, "_ZTV", 4) == 0 && address >= start && address < start + size;
}

// The GNU build ID among an ELF object's notes (its raw bytes), or "" if there is none.
std::string build_id_in(const char* notes, std::size_t size) {
  const auto align4 = [](std::size_t n) { return (n + 3) & ~std::size_t(3); };
  std::size_t at = 0;
  while (at + sizeof(ElfW(Nhdr)) <= size) {
    ElfW(Nhdr) note;
    std::memcpy(&note, notes + at, sizeof(note));
    const std::size_t name_at = at + sizeof(note);
    const std::size_t desc_at = name_at + align4(note.n_namesz);
    if (desc_at > size || note.n_descsz > size - desc_at) break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(notes + name_at, "GNU", 4) == 0) {
      return std::string(notes + desc_at, note.n_descsz);
    }
    at = desc_at + align4(note.n_descsz);
  }
  return "";
}

// The build ID of the object loaded at `bias`, from its notes in memory (its own program headers), or "".
std::string loaded_build_id(uintptr_t bias) {
  struct Search {
    uintptr_t bias;
    std::string id;
  } search{bias, ""};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, std::size_t, void* data) -> int {
        auto* wanted = static_cast<Search*>(data);
        if (info->dlpi_addr != wanted->bias) return 0;
        for (int i = 0; i < info->dlpi_phnum && wanted->id.empty(); ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_NOTE) continue;
          wanted->id = build_id_in(reinterpret_cast<const char*>(info->dlpi_addr + segment.p_vaddr), segment.p_memsz);
        }
        return 1;
      },
      &search);
  return search.id;
}

// The `_ZTV` symbol spanning `address` in the full symbol table (.symtab) of the library file `path`, loaded at
// `bias`: a class's virtual table is often a local symbol, absent from the dynamic symbols dladdr reads (PyPI's
// libtorch_cuda.so keeps .symtab; a stripped library has none, and then nothing is changed). Only the file that was
// loaded is read -- the same build ID as the one in memory, or, for a library without one, the same inode as the
// mapping holding `address` -- not one that replaced it on disk since (a pip upgrade under a running kernel).
bool find_in_symtab(const char* path, uintptr_t bias, uintptr_t address, VirtualTable& table) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  void* file = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
    file = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  }
  close(fd);
  if (file == MAP_FAILED) return false;
  const auto* bytes = static_cast<const char*>(file);
  const auto size = static_cast<std::size_t>(st.st_size);
  const auto inside = [size](std::size_t offset, std::size_t length) {
    return offset <= size && length <= size - offset;
  };
  const auto* header = reinterpret_cast<const ElfW(Ehdr)*>(bytes);
  bool same_file = false;
  if (std::memcmp(header->e_ident, ELFMAG, SELFMAG) == 0 && header->e_phentsize == sizeof(ElfW(Phdr)) &&
      inside(header->e_phoff, std::size_t(header->e_phnum) * sizeof(ElfW(Phdr)))) {
    const std::string loaded = loaded_build_id(bias);
    if (loaded.empty()) {
      same_file = static_cast<unsigned long>(st.st_ino) == mapping_of(address).inode;
    } else {
      const auto* segments = reinterpret_cast<const ElfW(Phdr)*>(bytes + header->e_phoff);
      for (std::size_t i = 0; i < header->e_phnum && !same_file; ++i) {
        const ElfW(Phdr)& segment = segments[i];
        same_file = segment.p_type == PT_NOTE && inside(segment.p_offset, segment.p_filesz) &&
                    build_id_in(bytes + segment.p_offset, segment.p_filesz) == loaded;
      }
    }
  }
  if (!same_file) {
    munmap(file, size);
    return false;
  }
  bool found = false;
  if (header->e_shentsize == sizeof(ElfW(Shdr)) &&
      inside(header->e_shoff, std::size_t(header->e_shnum) * sizeof(ElfW(Shdr)))) {
    const auto* sections = reinterpret_cast<const ElfW(Shdr)*>(bytes + header->e_shoff);
    for (std::size_t i = 0; i < header->e_shnum && !found; ++i) {
      const ElfW(Shdr)& symtab = sections[i];
      if (symtab.sh_type != SHT_SYMTAB || symtab.sh_entsize != sizeof(ElfW(Sym)) || symtab.sh_link >= header->e_shnum)
        continue;
      const ElfW(Shdr)& strtab = sections[symtab.sh_link];
      if (!inside(symtab.sh_offset, symtab.sh_size) || !inside(strtab.sh_offset, strtab.sh_size)) continue;
      const auto* symbols = reinterpret_cast<const ElfW(Sym)*>(bytes + symtab.sh_offset);
      const char* names = bytes + strtab.sh_offset;
      for (std::size_t j = 0; j < symtab.sh_size / sizeof(ElfW(Sym)); ++j) {
        const ElfW(Sym)& symbol = symbols[j];
        if ((symbol.st_info & 0xf) != STT_OBJECT || symbol.st_name >= strtab.sh_size) continue;
        const char* name = names + symbol.st_name;
        if (std::memchr(name, 0, strtab.sh_size - symbol.st_name) == nullptr) continue;
        if (is_virtual_table_spanning(name, bias + symbol.st_value, symbol.st_size, address)) {
          table.start = reinterpret_cast<const char*>(bias + symbol.st_value);
          table.size = symbol.st_size;
          found = true;
          break;
        }
      }
    }
  }
  munmap(file, size);
  return found;
}

VirtualTable virtual_table_holding(const void* address_point) {
  VirtualTable table;
  const auto address = reinterpret_cast<uintptr_t>(address_point);
  Dl_info info{};
  void* entry = nullptr;
  if (dladdr1(address_point, &info, &entry, RTLD_DL_SYMENT) == 0 || info.dli_fname == nullptr) {
    table.why = "its virtual table is in no loaded library";
    return table;
  }
  // dladdr names the nearest dynamic symbol spanning the address, if any: the table itself when it is exported
  const auto* symbol = static_cast<const ElfW(Sym)*>(entry);
  if (symbol != nullptr &&
      is_virtual_table_spanning(info.dli_sname, reinterpret_cast<uintptr_t>(info.dli_saddr), symbol->st_size,
                                address)) {
    table.start = static_cast<const char*>(info.dli_saddr);
    table.size = symbol->st_size;
    return table;
  }
  Dl_info unused{};
  void* map = nullptr;
  if (dladdr1(address_point, &unused, &map, RTLD_DL_LINKMAP) != 0 && map != nullptr &&
      find_in_symtab(info.dli_fname, static_cast<struct link_map*>(map)->l_addr, address, table)) {
    return table;
  }
  table.why = std::string("the size of its virtual table is in no symbol table of ") + info.dli_fname +
              " (a stripped library, or one replaced on disk since it was loaded)";
  return table;
}

// Makes this one `hooks` object answer isBuilt() = false (see above); returns "" on success, else why not.
std::string answer_not_built_for(const at::AcceleratorHooksInterface& hooks) {
#ifdef HPU_NB_SIGNED_VTABLES
  (void)hooks;
  return "this platform signs virtual-table pointers (arm64e pointer authentication), so hpu_nb changes no answer";
#else
  const std::ptrdiff_t slot_offset = is_built_slot_offset();
  if (slot_offset < 0) return "this platform's C++ ABI is not one hpu_nb knows";
  auto* object = const_cast<at::AcceleratorHooksInterface*>(&hooks);
  auto** vptr_field = reinterpret_cast<const char**>(object);
  const int object_protection = mapping_of(reinterpret_cast<uintptr_t>(object)).protection;
  if (object_protection < 0 || !(object_protection & PROT_WRITE)) return "its hooks object is in read-only memory";
  const char* address_point = *vptr_field;
  const VirtualTable table = virtual_table_holding(address_point);
  if (!table.why.empty()) return table.why;
  const std::size_t point_offset = static_cast<std::size_t>(address_point - table.start);
  if (point_offset % sizeof(void*) != 0 || table.size % sizeof(void*) != 0 ||
      point_offset + static_cast<std::size_t>(slot_offset) + sizeof(void*) > table.size) {
    return "its isBuilt() is not inside its virtual table";
  }
  // never freed: the object keeps pointing at it until the process ends (its destructor is called through it)
  auto* copy = new void*[table.size / sizeof(void*)];
  std::memcpy(copy, table.start, table.size);
  const char* new_point = reinterpret_cast<const char*>(copy) + point_offset;
  *reinterpret_cast<void**>(const_cast<char*>(new_point) + slot_offset) = reinterpret_cast<void*>(&answer_not_built);
  const bool available = hooks.isAvailable();
  __atomic_store_n(vptr_field, new_point, __ATOMIC_SEQ_CST);  // the one store: the object's own heap memory
  // checked as torch's calls see it: through a pointer the compiler cannot see through, so the object's virtual-table
  // pointer is read back from memory rather than taken from the store above
  const at::AcceleratorHooksInterface* volatile through = object;
  if (!through->isBuilt() && through->isAvailable() == available) return "";
  __atomic_store_n(vptr_field, address_point, __ATOMIC_SEQ_CST);  // as it was; the copy is left unused
  return "its isBuilt() is not where the C++ ABI puts it";
#endif
}

struct OtherAccelerator {
  const char* name;
  const at::AcceleratorHooksInterface& (*hooks)();
};

const at::AcceleratorHooksInterface& cuda_hooks() { return at::detail::getCUDAHooks(); }
const at::AcceleratorHooksInterface& xpu_hooks() { return at::detail::getXPUHooks(); }
const at::AcceleratorHooksInterface& hip_hooks() { return at::detail::getHIPHooks(); }
const at::AcceleratorHooksInterface& mps_hooks() { return at::detail::getMPSHooks(); }

// The compiled-in accelerators torch's getAccelerator() asks before HPU, in its order.
const OtherAccelerator kOtherAccelerators[] = {
    {"cuda", &cuda_hooks}, {"xpu", &xpu_hooks}, {"hip", &hip_hooks}, {"mps", &mps_hooks}};

// Settles which accelerator torch serves now that the emulated card is used (see above), once per process: any
// number of threads may ask at once, and all get the first one's report. The report: "hpu" when HPU is the process's
// accelerator; "beside:<name>" when another accelerator with a usable device keeps it; "refused:<name>:<why>" when
// another accelerator has no usable device but its answer could not be changed.
std::string settle_accelerator() {
  for (const auto& other : kOtherAccelerators) {
    const at::AcceleratorHooksInterface& hooks = other.hooks();
    if (!hooks.isBuilt()) continue;
    if (hooks.isAvailable()) {
      return std::string("beside:") + other.name;
    }
    const std::string why = answer_not_built_for(hooks);
    if (!why.empty()) {
      return std::string("refused:") + other.name + ":" + why;
    }
  }
  g_hpu_is_the_accelerator = true;
  return "hpu";
}

std::string claim_accelerator() {
  static std::once_flag once;
  static std::string report;
  std::call_once(once, [] { report = settle_accelerator(); });
  return report;
}

struct HPUHooks final : at::HPUHooksInterface {
  HPUHooks(at::HPUHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override {
    return g_hpu_is_the_accelerator.load();
  }
  bool isAvailable() const override {
    return g_active.load();
  }
  bool hasHPU() const override {
    return g_active.load();
  }
  c10::DeviceIndex deviceCount() const override {
    return 1;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return 0;
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    check_index(device);
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    check_index(device);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return 0;
  }
  // Kernels run on the CPU, so they draw from the CPU generator: torch.manual_seed seeds the emulated card too.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::detail::createCPUGenerator();
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return kDevice;
  }
  bool isPinnedPtr(const void*) const override {
    return false;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();  // host memory is host memory: pinning is a no-op on the emulated card
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
};


// ----------------------------------------------------------------------------------------------------------------
// Tensors: hpu <-> cpu alias
// ----------------------------------------------------------------------------------------------------------------
const c10::DispatchKeySet kHPUKeys(c10::DispatchKey::HPU);
const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);

void check_strided(const at::Tensor& t) {
  TORCH_CHECK(
      t.layout() == c10::kStrided, "the emulated hpu device holds strided (dense) tensors only, got ", t.layout());
}

// Holds a reference to the hpu storage while a CPU alias of it lives.
void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// A CPU storage over the bytes of an hpu storage: no copy. Resizable through the device allocator, so a CPU
// kernel that resizes its `out=` tensor gets device memory (handed back to the hpu tensor afterwards).
//
// While torch.compile traces, hpu tensors are stood for by tensors with shapes and no memory: FakeTensors (meta
// storage) and, under AOTAutograd, FunctionalTensorWrappers around them. Those run meta kernels, but a few ops still
// reach the device's kernel during tracing: SDPA's _fused_sdp_choice_meta redispatches _fused_sdp_choice to the
// tensor's backend to learn which attention kernel eager mode would run. The CPU kernels of such ops read only sizes,
// strides and dtypes, so they get a CPU tensor of the same shape over a storage with no memory (shape_only_alias):
// reading its data fails as it does on the traced tensor itself.
bool is_shape_only(const at::Tensor& t) {
  return !t.has_storage() || t.storage().unsafeGetStorageImpl()->device_type() == c10::kMeta ||
         t.key_set().has(c10::DispatchKey::Functionalize);
}

c10::Storage shape_only_storage() {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), 0, c10::DataPtr(nullptr, c10::Device(c10::kCPU)), nullptr,
      /*resizable=*/false));
}

c10::Storage cpu_alias_storage(const c10::Storage& hpu) {
  c10::StorageImpl* impl = hpu.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  c10::DataPtr ptr(impl->mutable_data(), impl, &release_storage_ref, c10::Device(c10::kCPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->nbytes(), std::move(ptr), &g_allocator, /*resizable=*/true));
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  if (like.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {  // a FakeTensor of a dynamic-shape trace
    impl->set_sizes_and_strides(like.sym_sizes(), like.sym_strides(), like.sym_storage_offset());
  } else {
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  }
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

// A view on `hpu_storage` with the metadata of `like` (a CPU kernel's view of an alias).
at::Tensor hpu_view(const c10::Storage& hpu_storage, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(hpu_storage), kHPUKeys, like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

at::Tensor cpu_alias(const at::Tensor& hpu) {
  check_strided(hpu);
  return tensor_on(cpu_alias_storage(hpu.storage()), kCPUKeys, hpu);
}

// A fresh CPU buffer becomes device memory: the buffer is adopted (no copy) when nothing else holds it.
c10::Storage adopt_as_device_storage(const c10::Storage& cpu) {
  c10::StorageImpl* impl = cpu.unsafeGetStorageImpl();
  auto nbytes = static_cast<int64_t>(impl->nbytes());
  c10::DataPtr ptr;
  if (c10::raw::intrusive_ptr::use_count(impl) == 1 && impl->resizable()) {
    const int64_t card = memory().charge(nbytes);
    void* data = impl->mutable_data();
    auto* block = new AdoptedBlock{impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))), nbytes, card};
    ptr = c10::DataPtr(data, block, &free_adopted_block, kDevice);
  } else {
    ptr = g_allocator.allocate(static_cast<size_t>(nbytes));
    if (nbytes) std::memcpy(ptr.get(), impl->data(), static_cast<size_t>(nbytes));
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(ptr), &g_allocator, /*resizable=*/true));
}

// ----------------------------------------------------------------------------------------------------------------
// The boxed fallback: CPU kernels on aliases.
// ----------------------------------------------------------------------------------------------------------------
struct Aliased {
  at::Tensor hpu;
  at::Tensor cpu;
  c10::StorageImpl* cpu_storage;  // the alias's storage as created (a CPU kernel may swap or resize it)
  const void* data;               // the alias's data as created
};

struct CallState {
  c10::SmallVector<Aliased, 8> aliased;
  c10::SmallVector<c10::StorageImpl*, 4> host_storages;  // storages of CPU tensors passed in (stay on the CPU)
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> adopted;
  bool any_hpu = false;
  bool shape_only = false;                  // an hpu argument is a FakeTensor of a torch.compile trace
  const at::Tensor* host_tensor = nullptr;  // a CPU tensor with dims, for the device-mismatch error

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().type() == kHPU) {
      any_hpu = true;
      for (auto& a : aliased) {
        if (a.hpu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return a.cpu;
      }
      at::Tensor alias;
      if (!is_shape_only(t)) {
        try {
          alias = cpu_alias(t);
        } catch (const c10::Error&) {  // a storage that refuses access to its data: a traced tensor all the same
        }
      }
      if (!alias.defined()) {
        shape_only = true;
        check_strided(t);
        return tensor_on(shape_only_storage(), kCPUKeys, t);
      }
      aliased.push_back({t, alias, alias.storage().unsafeGetStorageImpl(), alias.storage().data()});
      return alias;
    }
    if (t.device().type() == c10::kCPU) {
      if (t.dim() > 0 && host_tensor == nullptr) host_tensor = &t;
      if (t.has_storage()) host_storages.push_back(t.storage().unsafeGetStorageImpl());
    }
    return t;
  }

  // After the CPU kernel: an alias whose metadata or storage the kernel changed passes it on to its hpu tensor.
  void sync_aliases() {
    for (auto& a : aliased) {
      c10::TensorImpl* hpu = a.hpu.unsafeGetTensorImpl();
      c10::StorageImpl* now = a.cpu.storage().unsafeGetStorageImpl();
      if (now != a.cpu_storage) {  // set_ to another storage: must be one of ours
        hpu->set_storage_keep_dtype(hpu_storage_for(now, a.cpu));
      } else if (now->data() != a.data) {  // resized through the device allocator
        c10::StorageImpl* target = a.hpu.storage().unsafeGetStorageImpl();
        auto nbytes = now->nbytes();
        target->set_data_ptr_noswap(now->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU))));
        target->set_nbytes(nbytes);
        a.data = nullptr;
      }
      if (!(a.cpu.sizes().equals(a.hpu.sizes()) && a.cpu.strides().equals(a.hpu.strides()) &&
            a.cpu.storage_offset() == a.hpu.storage_offset())) {
        hpu->set_sizes_and_strides(a.cpu.sizes(), a.cpu.strides(), a.cpu.storage_offset());
      }
    }
  }

  c10::Storage hpu_storage_for(c10::StorageImpl* cpu_storage, const at::Tensor& holder) {
    for (auto& a : aliased) {
      if (a.cpu_storage == cpu_storage) return a.hpu.storage();
    }
    for (auto& p : adopted) {
      if (p.first == cpu_storage) return p.second;
    }
    c10::Storage device = adopt_as_device_storage(holder.storage());
    adopted.emplace_back(cpu_storage, device);
    return device;
  }

  at::Tensor to_hpu(const at::Tensor& out) {
    if (!out.defined() || out.device().type() != c10::kCPU) return out;
    for (auto& a : aliased) {
      if (a.cpu.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) return a.hpu;  // in place / out=
    }
    check_strided(out);
    c10::StorageImpl* storage = out.storage().unsafeGetStorageImpl();
    for (auto* host : host_storages) {
      if (host == storage) return out;  // a host tensor handed back: it stays on the host
    }
    for (auto& a : aliased) {
      if (a.cpu_storage == storage) return hpu_view(a.hpu.storage(), out);
    }
    return tensor_on(hpu_storage_for(storage, out), kHPUKeys, out);
  }
};

c10::IValue map_ivalue(const c10::IValue& v, CallState& s, bool to_cpu) {
  auto map = [&](const at::Tensor& t) { return to_cpu ? s.to_cpu(t) : s.to_hpu(t); };
  if (v.isTensor()) {
    return map(v.toTensor());
  }
  if (v.isTensorList()) {
    auto list = v.toTensorList();
    c10::List<at::Tensor> mapped;
    mapped.reserve(list.size());
    for (const at::Tensor& t : list) mapped.push_back(map(t));
    return mapped;
  }
  if (v.isOptionalTensorList()) {
    auto list = v.toOptionalTensorList();
    c10::List<std::optional<at::Tensor>> mapped;
    mapped.reserve(list.size());
    for (const std::optional<at::Tensor>& t : list) {
      mapped.push_back(t.has_value() ? std::optional<at::Tensor>(map(*t)) : std::nullopt);
    }
    return mapped;
  }
  if (to_cpu && v.isDevice() && v.toDevice().type() == kHPU) {
    check_index(v.toDevice().index());
    return c10::Device(c10::kCPU);
  }
  return v;
}

// Lazy mode (PT_HPU_LAZY_MODE=1): Habana's lazy bridge takes a CPU tensor given to an hpu op as an input of the
// graph (habana_lazy GetOrCreateHbLazyTensor wraps it, copied to the card when the graph runs), so
// `hpu_out.eq(cpu_labels)` works there; eager mode refuses the mix as torch's devices do. Set at the device's load.
std::atomic<bool> g_lazy_host_inputs{false};

void set_lazy_host_inputs(bool on) {
  g_lazy_host_inputs = on;
}

// Ops that take host tensors beside device tensors on a real device (indices may stay on the host).
bool accepts_host_tensors(const c10::OperatorName& name) {
  const std::string& n = name.name;
  return n == "aten::index" || n == "aten::index_put_" || n == "aten::_index_put_impl_" || n == "aten::index_put";
}

// A CPU tensor that the op writes (self of an in-place op, an out= argument). Habana's lazy bridge copies CPU
// inputs to the card (LazyOp::set_inputs), but the tensor an op writes must be an hpu tensor: HandleLazy(self)
// and the tuple/list paths call GetHbLazyTensor on it, which asserts "Got a non-HPU tensor, expecting an HPU
// tensor" (habana_kernels/lazy_kernels.h, habana_lazy/aten_lazy_bridge.cpp). So `cpu.add_(hpu)` fails on a Gaudi.
bool writes_host_tensor(const c10::Argument& argument, const c10::IValue& value) {
  if (argument.alias_info() == nullptr || !argument.alias_info()->isWrite()) return false;
  auto on_host = [](const at::Tensor& t) { return t.defined() && t.device().type() == c10::kCPU; };
  if (value.isTensor()) return on_host(value.toTensor());
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) {
      if (on_host(t)) return true;
    }
  }
  return false;
}

// Habana's addmm computes in the common dtype of self, mat1 and mat2 (the bridge's AddMMMeta promotes to common,
// hpu_ops/backend/addmm_gen.cpp), where the CPU kernel refuses mixed dtypes: a bf16 activation left by an autocast
// region, fed to an fp32 nn.Linear (2-D input with bias: aten::addmm), runs in fp32 on a Gaudi and here. Habana's mm
// (MmMeta) refuses mixed dtypes as the CPU does: nothing to do there.
void promote_addmm_operands(const c10::OperatorName& name, torch::jit::Stack* stack, size_t first) {
  if (name.name != "aten::addmm" || !name.overload_name.empty()) return;
  at::ScalarType common = at::ScalarType::Undefined;
  for (size_t i = first; i < first + 3; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (!v.isTensor() || !at::isFloatingType(v.toTensor().scalar_type())) return;
    const at::ScalarType t = v.toTensor().scalar_type();
    common = common == at::ScalarType::Undefined ? t : c10::promoteTypes(common, t);  // not dispatched: no profiler op
  }
  for (size_t i = first; i < first + 3; ++i) {
    const at::Tensor t = (*stack)[i].toTensor();
    if (t.scalar_type() != common) (*stack)[i] = t.to(common);
  }
}

void hpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto first = stack->size() - num_args;
  CallState state;
  bool writes_host = false;
  for (size_t i = first; i < stack->size(); ++i) {
    writes_host = writes_host || writes_host_tensor(schema.arguments()[i - first], (*stack)[i]);
    (*stack)[i] = map_ivalue((*stack)[i], state, /*to_cpu=*/true);
  }
  if (state.any_hpu && state.host_tensor != nullptr && !g_lazy_host_inputs &&
      !accepts_host_tensors(schema.operator_name())) {
    TORCH_CHECK(
        false, "Expected all tensors to be on the same device, but found at least two devices, hpu:0 and cpu! (in ",
        schema.operator_name(), ")");
  }
  TORCH_CHECK(!(state.any_hpu && writes_host && g_lazy_host_inputs),
              "Got a non-HPU tensor, expecting an HPU tensor (in ", schema.operator_name(),
              "): in lazy mode an hpu op takes CPU tensors as inputs, but the tensor it writes (self of an in-place ",
              "op, or out=) must be on hpu, as in Habana's lazy bridge. Move that tensor to hpu first.");
  promote_addmm_operands(schema.operator_name(), stack, first);
  op.redispatchBoxed(kCPUKeys, stack);
  const auto num_returns = schema.returns().size();
  if (state.shape_only) {  // traced by torch.compile: only answers about shapes (see is_shape_only) come back
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      TORCH_CHECK(!(*stack)[i].isTensor() && !(*stack)[i].isTensorList(), "torch.compile traced ",
                  schema.operator_name(), " on hpu tensors without a meta kernel: the emulated hpu device cannot",
                  " run it on FakeTensors. Run that part eagerly (torch.compiler.disable) and report it to hpu_nb.");
    }
    return;
  }
  state.sync_aliases();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = map_ivalue((*stack)[i], state, /*to_cpu=*/false);
  }
}

// Structured ops have a CPU kernel and a composite kernel that other backends get by default (an `out=` call
// after an empty()); the composite costs a second dispatch and warns about resized outputs. Where torch has a CPU
// kernel, the hpu device takes it: the fallback is registered for those ops directly, so hpu runs what the CPU runs.
bool has_dedicated_kernel(const std::string& name);

// Composite ops that pick an implementation by device type and have none for other backends (convolution calls
// `convolution_overrideable` off CPU/CUDA): the hpu device runs them as the CPU does.
bool chooses_by_device(const std::string& name) {
  return name == "aten::convolution" || name == "aten::_convolution" || name == "aten::convolution_backward";
}

std::unique_ptr<torch::Library> register_cpu_kernel_ops() {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::HPU, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || has_dedicated_kernel(name.name)) continue;
    auto op = dispatcher.findOp(name);
    if (!op) continue;
    if (!chooses_by_device(name.name) && !op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    if (!chooses_by_device(name.name) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    const std::string qualified =
        name.overload_name.empty() ? name.name.substr(6) : name.name.substr(6) + "." + name.overload_name;
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&hpu_fallback>());
  }
  return lib;
}

// ----------------------------------------------------------------------------------------------------------------
// Kernels at the HPU key that cannot go through the fallback (allocation, copies, metadata) or are views.
// ----------------------------------------------------------------------------------------------------------------
at::Tensor hpu_empty(
    c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
    std::optional<at::Device> device, std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  if (device.has_value()) check_index(device->index());
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "the emulated hpu device holds strided tensors only");
  return at::detail::empty_generic(
      size, &g_allocator, kHPUKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor hpu_empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout, std::optional<at::Device> device, std::optional<bool>) {
  if (device.has_value()) check_index(device->index());
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "the emulated hpu device holds strided tensors only");
  return at::detail::empty_strided_generic(size, stride, &g_allocator, kHPUKeys, c10::dtype_or_default(dtype));
}

at::Tensor host_view(const at::Tensor& t) {
  return t.device().type() == kHPU ? cpu_alias(t) : t;
}

// copy_ between host and device (and device to device): a CPU copy between aliases of the same memory.
at::Tensor hpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor hpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return hpu_copy_from(self, dst, false);
}

// The card runs in order, eagerly: there is no other stream a tensor could still be in use on.
void hpu_record_stream(at::Tensor&, c10::Stream) {}

at::Tensor& hpu_set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

// ----------------------------------------------------------------------------------------------------------------
// Autocast at AutocastHPU: Habana's four policies, for the op names registered from Python.
// ----------------------------------------------------------------------------------------------------------------
enum class CastPolicy : int64_t { lower = 0, fp32 = 1, promote = 2, lower_first_arg = 3 };

std::mutex g_policy_mu;
std::unordered_map<std::string, CastPolicy> g_policies;  // "aten::linear" -> policy
std::vector<std::unique_ptr<torch::Library>> g_autocast_libraries;

bool autocast_eligible(const at::Tensor& t) {
  return t.defined() && t.is_floating_point() && t.device().type() == kHPU && t.scalar_type() != at::kDouble;
}

at::Tensor cast_to(const at::Tensor& t, at::ScalarType to) {
  // Habana never caches casts on HPU (cached casts are permanently disabled there).
  return autocast_eligible(t) && t.scalar_type() != to ? t.to(to) : t;
}

c10::IValue cast_ivalue(const c10::IValue& v, at::ScalarType to) {
  if (v.isTensor()) return cast_to(v.toTensor(), to);
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(cast_to(t, to));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(cast_to(*t, to)) : std::nullopt);
    }
    return out;
  }
  return v;
}

void widen(at::ScalarType& current, const at::Tensor& t) {
  if (autocast_eligible(t) && t.scalar_type() != current) current = at::kFloat;
}

at::ScalarType promoted(torch::jit::Stack* stack, size_t first, at::ScalarType lower) {
  at::ScalarType current = lower;
  for (size_t i = first; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor()) {
      widen(current, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) widen(current, t);
    }
  }
  return current;
}

void autocast_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  CastPolicy policy;
  {
    std::lock_guard<std::mutex> lock(g_policy_mu);
    policy = g_policies.at(op.operator_name().name);
  }
  const auto first = stack->size() - op.schema().arguments().size();
  const at::ScalarType lower = at::autocast::get_autocast_dtype(kHPU);
  switch (policy) {
    case CastPolicy::lower:
      for (size_t i = first; i < stack->size(); ++i) (*stack)[i] = cast_ivalue((*stack)[i], lower);
      break;
    case CastPolicy::fp32:
      for (size_t i = first; i < stack->size(); ++i) (*stack)[i] = cast_ivalue((*stack)[i], at::kFloat);
      break;
    case CastPolicy::promote: {
      const at::ScalarType to = promoted(stack, first, lower);
      for (size_t i = first; i < stack->size(); ++i) (*stack)[i] = cast_ivalue((*stack)[i], to);
      break;
    }
    case CastPolicy::lower_first_arg:
      if (stack->size() > first) (*stack)[first] = cast_ivalue((*stack)[first], lower);
      break;
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastHPU);
  op.callBoxed(stack);
}

// Registers the policy for every overload of `name` ("aten::linear"); `overloads` are the overload names.
void register_autocast(const std::string& name, const std::vector<std::string>& overloads, int64_t policy) {
  TORCH_CHECK(policy >= 0 && policy <= 3, "unknown autocast policy ", policy);
  TORCH_CHECK(name.rfind("aten::", 0) == 0, "autocast ops are aten ops, got ", name);
  {
    std::lock_guard<std::mutex> lock(g_policy_mu);
    auto found = g_policies.find(name);
    if (found != g_policies.end()) {
      found->second = static_cast<CastPolicy>(policy);  // the kernel is registered already
      return;
    }
    g_policies[name] = static_cast<CastPolicy>(policy);
  }
  auto lib = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutocastHPU, __FILE__, __LINE__);
  const std::string base = name.substr(6);
  for (const auto& overload : overloads) {
    const std::string qualified = overload.empty() ? base : base + "." + overload;
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&autocast_kernel>());
  }
  g_autocast_libraries.push_back(std::move(lib));
}

// Forgets every registered policy and deregisters its kernels (the lists are then registered anew).
void clear_autocast() {
  std::lock_guard<std::mutex> lock(g_policy_mu);
  g_policies.clear();
  g_autocast_libraries.clear();
}

// ----------------------------------------------------------------------------------------------------------------
// Python-facing ops (torch.ops.hpu_emu.*)
// ----------------------------------------------------------------------------------------------------------------
std::vector<int64_t> memory_stats() {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  const int64_t active = m.num_allocs - m.num_frees;
  // Gaudi's key order: Limit, InUse, MaxInUse, NumAllocs, NumFrees, ActiveAllocs, MaxAllocSize,
  // TotalSystemAllocs, TotalSystemFrees, TotalActiveAllocs (no pool: the system counters equal the others).
  return {m.limit, m.in_use, m.max_in_use, m.num_allocs, m.num_frees, active, m.max_alloc_size,
          m.num_allocs, m.num_frees, active};
}

void reset_peak_memory_stats() {
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.max_in_use = m.in_use;
  m.max_alloc_size = 0;
}

// The kernels: registered when the emulated Gaudi is first used (activate), not when the library is loaded. The
// library is loaded by `import torch` (the autoload) so that its HPU hooks come first; registering a fallback walks
// every operator's dispatch table (about 4 ms each, measured), and most processes that import torch never use hpu.
bool has_dedicated_kernel(const std::string& name) {
  static const std::vector<std::string> dedicated = {
      "aten::empty", "aten::empty_strided", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::copy_",
      "aten::resize_", "aten::set_", "aten::view", "aten::as_strided", "aten::_reshape_alias", "aten::unfold",
      "aten::_to_copy", "aten::to", "aten::record_stream"};
  return std::find(dedicated.begin(), dedicated.end(), name) != dedicated.end();
}

void register_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // kept for the life of the process: a torch::Library removes its registrations when destroyed
    static auto* libraries = new std::vector<std::unique_ptr<torch::Library>>();
    auto fallback = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::HPU, __FILE__,
                                                     __LINE__);
    fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&hpu_fallback>());
    libraries->push_back(std::move(fallback));
    libraries->push_back(register_cpu_kernel_ops());
    auto m = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::HPU, __FILE__, __LINE__);
    m->impl("empty.memory_format", &hpu_empty);
    m->impl("empty_strided", &hpu_empty_strided);
    m->impl("_copy_from", &hpu_copy_from);
    m->impl("_copy_from_and_resize", &hpu_copy_from_and_resize);
    m->impl("resize_", TORCH_FN(at::native::resize_));
    m->impl("set_.source_Storage", TORCH_FN(at::native::set_));
    m->impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_cpu_));
    m->impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
    m->impl("set_", &hpu_set_empty);
    m->impl("record_stream", &hpu_record_stream);
    m->impl("view", TORCH_FN(at::native::view));
    m->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
    m->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
    m->impl("unfold", TORCH_FN(at::native::unfold));
    libraries->push_back(std::move(m));
    auto autocast = std::make_unique<torch::Library>(torch::Library::IMPL, "_", c10::DispatchKey::AutocastHPU,
                                                     __FILE__, __LINE__);
    autocast->fallback(torch::CppFunction::makeFallthrough());
    libraries->push_back(std::move(autocast));
  });
}

// The emulated Gaudi is in use in this process; returns whether torch consults this library's HPU hooks (it does
// unless something asked torch about HPUs before the library was loaded).
//
// torch's autograd engine starts one worker thread per card, once per process, sized by the guards' deviceCount();
// once such threads exist, every forked child's backward fails ("bad fork"), and notebooks fork workers
// (ddp_notebook, DeepSpeed after training in the same kernel). The emulated card computes on the CPU, so its
// backward runs on the calling thread instead (hpu_device/backward.py): the engine sizes its threads here, while
// the guard reports no card, and starts none. A process that already ran a backward with this library loaded keeps
// the threads it has.
bool activate() {
  register_kernels();
  g_active = true;
  g_guard_device_count = 0;
  try {
    torch::autograd::Engine::get_default_engine().initialize_device_threads_pool();
  } catch (const c10::Error&) {
    // a child forked after another device started autograd threads: its backward passes fail with torch's message
  }
  g_guard_device_count = 1;
  return dynamic_cast<const HPUHooks*>(&at::detail::getHPUHooks()) != nullptr;
}

// A forked process drives its own card: it starts empty, and the parent's tensors it inherited are not counted.
void fresh_card() {
  memory().fresh_card();
}

void configure(int64_t limit, const std::string& label) {
  TORCH_CHECK(limit > 0, "the memory limit must be positive, got ", limit);
  Memory& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.limit = limit;
  m.label = label;
}

at::Tensor host_alias(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kHPU, "host_alias expects an hpu tensor, got one on ", t.device());
  return cpu_alias(t);
}

// ----------------------------------------------------------------------------------------------------------------
// fp8 rounding with amax in one pass (the emulated transformer engine's quantisation, hpu_nb/emulator/fp8/numerics.py)
// ----------------------------------------------------------------------------------------------------------------
// Delayed scaling quantises a tensor with the scale its amax history chose and records the tensor's own amax; both
// are read from the same pass here. Each element: y = clamp(x * scale, -fp8_max, fp8_max), then y is rounded to the
// fp8 grid by adding and subtracting M = 1.5 * 2**(e + 23 - mantissa bits), 2**e the power of two at or below |y|
// raised to the format's smallest normal: exactly numerics.round_to_fp8_grid's float32 operations, in the same order,
// so the results are bitwise those of the pure-torch path (and so of the float8 cast). amax is taken on the bits:
// for |x| (sign bit cleared) the uint32 order is the float order, and any NaN is above the bits of inf.
namespace fp8_kernel {

struct Grid {
  float scale, limit, min_normal, factor;
};

inline __attribute__((always_inline)) uint32_t round_element(uint32_t in_bits, const Grid& g, float* out) {
  float x;
  std::memcpy(&x, &in_bits, 4);
  float y = x * g.scale;
  y = y > g.limit ? g.limit : y;  // NaN compares false both times: it stays NaN, as torch.clamp keeps it
  y = y < -g.limit ? -g.limit : y;
  uint32_t y_bits;
  std::memcpy(&y_bits, &y, 4);
  uint32_t power_bits = y_bits & 0x7F800000u;
  float power;
  std::memcpy(&power, &power_bits, 4);
  power = power < g.min_normal ? g.min_normal : power;
  const float magic = power * g.factor;  // exact: a power of two times 1.5 * 2**k
  *out = (y + magic) - magic;
  return in_bits & 0x7FFFFFFFu;
}

// One block of float32 (or bfloat16, as its upper 16 bits) input; returns the block's max |x| as bits. The loops
// vectorise (selects, no branches): with GCC on x86-64 Linux they are compiled for AVX-512, AVX2 and the baseline,
// picked at load time for the CPU (ifunc); other GCC targets get -O3's vectoriser, clang vectorises them at -O2.
// Contracting y + power * factor into an FMA changes nothing: the product is exact.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define HPU_NB_FP8_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3")))
#elif defined(__GNUC__) && !defined(__clang__)
#define HPU_NB_FP8_CLONES __attribute__((optimize("O3")))
#else
#define HPU_NB_FP8_CLONES
#endif

HPU_NB_FP8_CLONES uint32_t round_block_f32(const float* __restrict in, float* __restrict out, int64_t n, Grid g) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, in + i, 4);
    uint32_t a = round_element(bits, g, out + i);
    amax = a > amax ? a : amax;
  }
  return amax;
}

HPU_NB_FP8_CLONES uint32_t round_block_bf16(const uint16_t* __restrict in, float* __restrict out, int64_t n, Grid g) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t a = round_element(static_cast<uint32_t>(in[i]) << 16, g, out + i);
    amax = a > amax ? a : amax;
  }
  return amax;
}

}  // namespace fp8_kernel

// round_to_fp8_grid(x * scale) into `out` (float32, x's shape, contiguous) and max |x| returned (NaN if x has one).
double fp8_round_amax(const at::Tensor& x, double scale, int64_t mantissa_bits, int64_t min_normal_exponent,
                      double fp8_max, at::Tensor& out) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "fp8_round_amax rounds float32 or bfloat16 tensors, got ", x.scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.sizes() == x.sizes(),
              "fp8_round_amax: out must be a contiguous float32 tensor of x's shape");
  TORCH_CHECK(x.device().type() == out.device().type(), "fp8_round_amax: x and out on different devices");
  TORCH_CHECK(x.device().type() == c10::DeviceType::CPU || x.device().type() == c10::DeviceType::HPU,
              "fp8_round_amax runs on cpu or (emulated) hpu tensors, got ", x.device());
  TORCH_CHECK(mantissa_bits >= 1 && mantissa_bits <= 22 && min_normal_exponent > -126 && min_normal_exponent < 0,
              "fp8_round_amax: mantissa bits ", mantissa_bits, " / smallest normal exponent ", min_normal_exponent,
              " are not those of a small float format");
  const at::Tensor input = x.contiguous();  // the data of a cpu or emulated hpu tensor is host memory
  const int64_t n = input.numel();
  if (n == 0) return 0.0;
  const fp8_kernel::Grid grid{static_cast<float>(scale), static_cast<float>(fp8_max),
                              std::ldexp(1.0f, static_cast<int>(min_normal_exponent)),
                              1.5f * std::ldexp(1.0f, static_cast<int>(23 - mantissa_bits))};
  float* dst = out.data_ptr<float>();
  const bool is_bf16 = input.scalar_type() == at::kBFloat16;
  const void* src = input.data_ptr();
  const uint32_t amax_bits = at::parallel_reduce(
      0, n, 1 << 16, uint32_t{0},
      [&](int64_t begin, int64_t end, uint32_t ident) {
        uint32_t block = is_bf16 ? fp8_kernel::round_block_bf16(static_cast<const uint16_t*>(src) + begin,
                                                                dst + begin, end - begin, grid)
                                 : fp8_kernel::round_block_f32(static_cast<const float*>(src) + begin, dst + begin,
                                                               end - begin, grid);
        return std::max(block, ident);
      },
      [](uint32_t a, uint32_t b) { return std::max(a, b); });
  float amax;
  std::memcpy(&amax, &amax_bits, 4);
  return static_cast<double>(amax);  // NaN bits (above inf's) are a NaN
}

}  // namespace
}  // namespace hpu_nb

namespace at {
C10_REGISTER_CLASS(HPUHooksRegistry, HPUHooks, hpu_nb::HPUHooks);
}  // namespace at

TORCH_LIBRARY(hpu_emu, m) {
  m.def("memory_stats() -> int[]", &hpu_nb::memory_stats);
  m.def("reset_peak_memory_stats() -> ()", &hpu_nb::reset_peak_memory_stats);
  m.def("configure(int limit, str label) -> ()", &hpu_nb::configure);
  m.def("fresh_card() -> ()", &hpu_nb::fresh_card);
  m.def("activate() -> bool", &hpu_nb::activate);
  m.def("set_lazy_host_inputs(bool on) -> ()", &hpu_nb::set_lazy_host_inputs);
  m.def("claim_accelerator() -> str", &hpu_nb::claim_accelerator);
  m.def("host_alias(Tensor(a) self) -> Tensor(a)", &hpu_nb::host_alias);
  m.def("register_autocast(str name, str[] overloads, int policy) -> ()", &hpu_nb::register_autocast);
  m.def("clear_autocast() -> ()", &hpu_nb::clear_autocast);
  m.def("fp8_round_amax(Tensor x, float scale, int mantissa_bits, int min_normal_exponent, float fp8_max,"
        " Tensor(a!) out) -> float",
        &hpu_nb::fp8_round_amax);
}
