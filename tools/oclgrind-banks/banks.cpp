// Oclgrind plugin: shared-memory wavefronts of a kernel's local-memory accesses as a GPU with 32
// four-byte banks (NVIDIA's shared memory, AMD's LDS) would serve them, counted without a GPU.
// Built and run by tools/oclgrind-banks.sh, which documents it.
//
// Oclgrind runs a work-group's work-items one after another; a GPU runs them 32 at a time (a warp).
// So the n-th execution of one load or store instruction by the 32 work-items of a warp (local
// linear ids 32 w .. 32 w + 31) is taken as one warp-wide request, as it is in a kernel whose control
// flow is uniform across a warp.  A request touches a set of four-byte words (offsets in their local
// buffer); the same word read by several lanes is one (a broadcast).  It takes as many wavefronts as
// the most distinct words any one bank (word mod 32) holds, and at least ceil(distinct words / 32)
// (128 bytes a wavefront): conflict-free when the two are equal.  Printed per kernel at exit: warp
// requests, wavefronts, the conflict-free minimum, their ratio, and the instructions that lose the most.
// Oclgrind's plugin interface, declared here (Debian packages no Oclgrind headers): the classes and
// member functions this plugin uses, as Oclgrind 21.10 (Debian 12's package) defines and exports
// them.  Plugin's virtual functions are listed in Oclgrind's order, which fixes its vtable;
// tools/oclgrind-banks.sh refuses another Oclgrind version.  The library exports these symbols and
// libLLVM's C API (debug locations, LLVMPrintValueToString), which the plugin finds in the
// process that loads it; so it is built with a C++ compiler alone.
#include <cstddef>
#include <cstdint>
#include <string>

namespace llvm
{
class Instruction;
}

namespace oclgrind
{
typedef uint64_t cl_mem_flags, cl_map_flags; /* OpenCL's cl_bitfield */
struct Size3
{
  size_t x, y, z;
};
struct TypedValue;
enum MessageType
{
  DEBUG_,
  INFO_,
  WARNING_,
  ERROR_
};
enum AtomicOp
{
  AtomicAdd_
};
enum
{
  AddrSpaceLocal = 3
};
class Context;
class WorkGroup;
class Kernel
{
public:
  const std::string &getName() const;
};
class KernelInvocation
{
public:
  const Kernel *getKernel() const;
  Size3 getLocalSize() const;
};
class Memory
{
public:
  unsigned int getAddressSpace() const;
  size_t extractOffset(size_t address) const;
};
class WorkItem
{
public:
  const llvm::Instruction *getCurrentInstruction() const;
  Size3 getLocalID() const;
};
class Plugin
{
public:
  Plugin(const Context *context);
  virtual ~Plugin();
  virtual void hostMemoryLoad(const Memory *, size_t, size_t) {}
  virtual void hostMemoryStore(const Memory *, size_t, size_t, const uint8_t *) {}
  virtual void instructionExecuted(const WorkItem *, const llvm::Instruction *, const TypedValue &) {}
  virtual void kernelBegin(const KernelInvocation *) {}
  virtual void kernelEnd(const KernelInvocation *) {}
  virtual void log(MessageType, const char *) {}
  virtual void memoryAllocated(const Memory *, size_t, size_t, cl_mem_flags, const uint8_t *) {}
  virtual void memoryAtomicLoad(const Memory *, const WorkItem *, AtomicOp, size_t, size_t) {}
  virtual void memoryAtomicStore(const Memory *, const WorkItem *, AtomicOp, size_t, size_t) {}
  virtual void memoryDeallocated(const Memory *, size_t) {}
  virtual void memoryLoad(const Memory *, const WorkItem *, size_t, size_t) {}
  virtual void memoryLoad(const Memory *, const WorkGroup *, size_t, size_t) {}
  virtual void memoryMap(const Memory *, size_t, size_t, size_t, cl_map_flags) {}
  virtual void memoryStore(const Memory *, const WorkItem *, size_t, size_t, const uint8_t *) {}
  virtual void memoryStore(const Memory *, const WorkGroup *, size_t, size_t, const uint8_t *) {}
  virtual void memoryUnmap(const Memory *, size_t, const void *) {}
  virtual void workGroupBarrier(const WorkGroup *, uint32_t) {}
  virtual void workGroupBegin(const WorkGroup *) {}
  virtual void workGroupComplete(const WorkGroup *) {}
  virtual void workItemBegin(const WorkItem *) {}
  virtual void workItemComplete(const WorkItem *) {}
  virtual bool isThreadSafe() const;

protected:
  const Context *m_context;
};
class Context
{
public:
  void registerPlugin(Plugin *plugin);
  void unregisterPlugin(Plugin *plugin);
};
} // namespace oclgrind

// LLVM's C API (LLVMValueRef is an llvm::Value *, LLVMMetadataRef an llvm::Metadata *).
struct LLVMOpaqueMetadata;
typedef LLVMOpaqueMetadata *LLVMMetadataRef;
extern "C" LLVMMetadataRef LLVMInstructionGetDebugLoc(const llvm::Instruction *inst);
extern "C" unsigned LLVMDILocationGetLine(LLVMMetadataRef location);
extern "C" LLVMMetadataRef LLVMDILocationGetScope(LLVMMetadataRef location);
extern "C" LLVMMetadataRef LLVMDILocationGetInlinedAt(LLVMMetadataRef location);
extern "C" LLVMMetadataRef LLVMDIScopeGetFile(LLVMMetadataRef scope);
extern "C" const char *LLVMDIFileGetFilename(LLVMMetadataRef file, unsigned *length);
extern "C" char *LLVMPrintValueToString(const llvm::Instruction *value);
extern "C" void LLVMDisposeMessage(char *message);

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace
{
const unsigned kBanks = 32, kWarp = 32;

struct Totals
{
  unsigned long long requests = 0, wavefronts = 0, minimum = 0;
};

struct Key
{
  const llvm::Instruction *inst;
  unsigned warp, occurrence;
  bool operator==(const Key &o) const
  {
    return inst == o.inst && warp == o.warp && occurrence == o.occurrence;
  }
};
struct KeyHash
{
  size_t operator()(const Key &k) const
  {
    return std::hash<const void *>()(k.inst) ^ (size_t(k.warp) << 20) ^ (size_t(k.occurrence) * 0x9E3779B97F4A7C15ull);
  }
};

/* One warp-wide request: whether it stores, and each work-item's (offset, size). */
struct Request
{
  bool store = false;
  std::vector<std::pair<unsigned long long, size_t>> parts;
};

/* The totals of every context's plugin (a program may make several contexts), printed when the
   library is unloaded. */
struct Report
{
  std::map<std::string, Totals[2]> totals;
  std::map<std::string, std::map<std::string, Totals>> byInst; /* by the instruction's text */
  ~Report();
};
Report g_report;

class BankCounter : public oclgrind::Plugin
{
public:
  explicit BankCounter(const oclgrind::Context *c) : Plugin(c) {}
  bool isThreadSafe() const override { return false; } /* one worker: the work-groups one at a time */

  void kernelBegin(const oclgrind::KernelInvocation *inv) override
  {
    m_kernel = inv->getKernel()->getName();
    const oclgrind::Size3 ls = inv->getLocalSize();
    m_lx = ls.x;
    m_lxy = ls.x * ls.y;
    m_text.clear(); /* keyed by instructions, which a released program's may reuse */
  }
  void memoryLoad(const oclgrind::Memory *m, const oclgrind::WorkItem *wi, size_t address, size_t size) override
  {
    access(m, wi, address, size, false);
  }
  void memoryStore(const oclgrind::Memory *m, const oclgrind::WorkItem *wi, size_t address, size_t size,
                   const uint8_t *) override
  {
    access(m, wi, address, size, true);
  }
  void workGroupComplete(const oclgrind::WorkGroup *) override
  {
    std::vector<unsigned> words, per_bank(kBanks);
    for (auto &kv : m_accesses) {
      words.clear();
      for (const auto &a : kv.second.parts)
        for (unsigned long long w = a.first / 4; w * 4 < a.first + a.second; ++w)
          words.push_back(unsigned(w));
      std::sort(words.begin(), words.end());
      words.erase(std::unique(words.begin(), words.end()), words.end());
      std::fill(per_bank.begin(), per_bank.end(), 0u);
      unsigned most = 0;
      for (unsigned w : words)
        most = std::max(most, ++per_bank[w % kBanks]);
      const unsigned minimum = unsigned((words.size() + kBanks - 1) / kBanks);
      const bool store = kv.second.store;
      auto text = m_text.find(kv.first.inst);
      if (text == m_text.end())
        text = m_text.emplace(kv.first.inst, where(kv.first.inst)).first;
      for (Totals *t : {&g_report.totals[m_kernel][store], &g_report.byInst[m_kernel][text->second]}) {
        t->requests += 1;
        t->wavefronts += most;
        t->minimum += minimum;
      }
    }
    m_accesses.clear();
    m_count.clear();
  }

private:
  void access(const oclgrind::Memory *m, const oclgrind::WorkItem *wi, size_t address, size_t size, bool store)
  {
    if (m->getAddressSpace() != oclgrind::AddrSpaceLocal || !wi)
      return;
    const oclgrind::Size3 lid = wi->getLocalID();
    const size_t linear = lid.x + lid.y * m_lx + lid.z * m_lxy;
    const llvm::Instruction *inst = wi->getCurrentInstruction();
    const unsigned occurrence = m_count[std::make_pair(linear, inst)]++;
    Request &r = m_accesses[Key{inst, unsigned(linear / kWarp), occurrence}];
    r.store = store;
    r.parts.emplace_back(m->extractOffset(address), size);
  }

  /* Where the instruction comes from, as file:line, innermost first, then each place it was inlined
     at ("common.cl:335 < common.cl:358 < backward.cl:412"; Oclgrind builds programs with debug
     lines, and libcastle's carry #line directives), and the instruction's opening words of IR. */
  static std::string where(const llvm::Instruction *inst)
  {
    std::string s;
    for (LLVMMetadataRef loc = LLVMInstructionGetDebugLoc(inst); loc; loc = LLVMDILocationGetInlinedAt(loc)) {
      const LLVMMetadataRef scope = LLVMDILocationGetScope(loc);
      const LLVMMetadataRef file = scope ? LLVMDIScopeGetFile(scope) : nullptr;
      unsigned length = 0;
      const char *name = file ? LLVMDIFileGetFilename(file, &length) : nullptr;
      s += (s.empty() ? "" : " < ") + std::string(name ? name : "?", name ? length : 1) + ":" +
           std::to_string(LLVMDILocationGetLine(loc));
    }
    char *ir = LLVMPrintValueToString(inst);
    std::string text = ir;
    LLVMDisposeMessage(ir);
    text.erase(0, text.find_first_not_of(' '));
    if (text[0] == '%' && text.find(" = ") != std::string::npos)
      text.erase(0, text.find(" = ") + 3);
    text = text.substr(0, text.find_first_of(",("));
    return (s.empty() ? "" : s + ": ") + text;
  }

  std::string m_kernel;
  size_t m_lx = 1, m_lxy = 1;
  /* the requests of the current work-group, cleared when it completes */
  std::unordered_map<Key, Request, KeyHash> m_accesses;
  std::map<std::pair<size_t, const llvm::Instruction *>, unsigned> m_count;
  std::map<const llvm::Instruction *, std::string> m_text;
};

Report::~Report()
{
  for (const auto &k : totals) {
    for (int store = 0; store < 2; ++store) {
      const Totals &t = k.second[store];
      if (!t.requests)
        continue;
      std::fprintf(stderr, "banks: %-28s %-6s requests %llu wavefronts %llu conflict-free %llu ratio %.3f\n",
                   k.first.c_str(), store ? "stores" : "loads", t.requests, t.wavefronts, t.minimum,
                   double(t.wavefronts) / double(t.minimum));
    }
    /* BANKS_RANK=total (oclgrind-banks.sh --rank): the instructions with the most wavefronts, else
       those with the most above the conflict-free count; BANKS_TOP of them (--top, default 6) */
    const char *rank = std::getenv("BANKS_RANK"), *top = std::getenv("BANKS_TOP");
    const bool total = rank && !std::strcmp(rank, "total");
    const size_t ntop = top && std::atoi(top) > 0 ? size_t(std::atoi(top)) : 6;
    std::vector<std::pair<unsigned long long, std::string>> worst;
    for (const auto &i : byInst.at(k.first))
      if (total || i.second.wavefronts > i.second.minimum)
        worst.emplace_back(i.second.wavefronts - (total ? 0 : i.second.minimum), i.first);
    std::sort(worst.rbegin(), worst.rend());
    for (size_t n = 0; n < worst.size() && n < ntop; ++n) {
      const Totals &t = byInst.at(k.first).at(worst[n].second);
      std::fprintf(stderr, "banks:   %s %llu (%llu requests, %.2f wavefronts each) %s\n", total ? "total" : "excess",
                   worst[n].first, t.requests, double(t.wavefronts) / double(t.requests), worst[n].second.c_str());
    }
  }
}

std::map<oclgrind::Context *, BankCounter *> g_plugins;
} // namespace

extern "C" void initializePlugins(oclgrind::Context *context)
{
  BankCounter *p = new BankCounter(context);
  g_plugins[context] = p;
  context->registerPlugin(p);
}

extern "C" void releasePlugins(oclgrind::Context *context)
{
  auto it = g_plugins.find(context);
  if (it == g_plugins.end())
    return;
  context->unregisterPlugin(it->second);
  delete it->second;
  g_plugins.erase(it);
}
