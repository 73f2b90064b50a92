// In-kernel timestamps at phase boundaries, for attributing a call's time (scripts/latency_trace.py).
//
// Only in the trace build (nvcc -DHC_TRACE: build.py's "trace" variant, a library of its own);
// in the normal build every hook below is empty, so the kernels are unchanged.
//
// What is recorded: per kernel call, block 0's thread 0 stamps each phase boundary it passes
// (both %globaltimer, ns and comparable across GPUs up to an offset, and clock64, its SM's
// cycles: fine-grained where the global timer ticks coarsely) into shared memory, and writes
// them out once at its end; the block that finishes last stamps the kernel's end. Every
// translation unit has its own ring of records (a __device__ variable per module: the library
// is built without relocatable device code), registered with the host side (trace.cu), which
// copies the rings out. A call's record is the one at its call flag modulo the ring's size, so
// no thread waits for a load to find it (calls of different groups may share one: trace one
// group at a time); the last block counts the calls, so the host knows whether the ring wrapped.
//
// Cost in the trace build: ~10 timer reads and one record store by one thread per call; the
// other threads are untouched.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace hc {

// Phase boundaries, in the order a call passes them. A kernel that does not pass one leaves it 0.
enum TraceEvent : int {
  kTraceEntry = 0,     // first instruction (before the PDL wait: may overlap the previous kernel)
  kTraceReady = 1,     // the PDL wait returned: the previous kernel is complete
  kTraceArrived = 2,   // arrive() done: call flag read, fingerprint sent (the prologue)
  kTraceSent = 3,      // this thread's data stores issued (kernels that mark it)
  kTraceRefilled = 4,  // Lamport: the previous slot's re-fill issued
  kTraceWaitBegin = 5, // first poll for a peer's data
  kTraceWaitEnd = 6,   // last poll for a peer's data satisfied
  kTraceEndBegin = 7,  // end_call entered: this block's data work done
  kTraceArrivals = 8,  // every peer's arrival packet seen (end_call)
  kTraceCounted = 9,   // the last-block decision made (end_call)
  kTraceExit = 10,     // block 0's thread 0 leaves
  kTraceEvents = 11
};

constexpr int kTraceRecords = 2048;  // per translation unit: calls traced between two reads

struct TraceRecord {
  uint32_t op, flag;        // Op code, call flag
  uint32_t blocks, rank;    // grid size, my index in the group
  uint64_t ns[kTraceEvents];      // %globaltimer of block 0 thread 0 per event (0: not passed)
  uint64_t cycles[kTraceEvents];  // clock64 of the same
  uint64_t last_ns, last_cycles;  // the last block's thread 0 when the call is complete
};

struct TraceRing {
  uint32_t calls, pad;  // calls recorded since the last clear
  TraceRecord records[kTraceRecords];
};

}  // namespace hc

// Host side (trace.cu): every translation unit's ring registers its copy / clear functions.
using hc_trace_copy_fn = int (*)(void* dst, cudaStream_t stream);
using hc_trace_clear_fn = int (*)(cudaStream_t stream);
bool hc_trace_register(hc_trace_copy_fn copy, hc_trace_clear_fn clear);

#if defined(HC_TRACE) && !defined(HC_TRACE_REGISTRY)

namespace hc {
namespace {

__device__ TraceRing trace_ring;  // this translation unit's

int trace_copy(void* dst, cudaStream_t stream) {
  return (int)cudaMemcpyFromSymbolAsync(dst, trace_ring, sizeof(TraceRing), 0, cudaMemcpyDeviceToHost, stream);
}

int trace_clear(cudaStream_t stream) {
  void* p = nullptr;
  int status = (int)cudaGetSymbolAddress(&p, trace_ring);
  return status ? status : (int)cudaMemsetAsync(p, 0, sizeof(TraceRing), stream);
}

const bool trace_registered = hc_trace_register(trace_copy, trace_clear);

__device__ __forceinline__ uint64_t trace_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Block 0 thread 0's stamps of the current call, staged in shared memory.
struct TraceStage {
  uint64_t ns[kTraceEvents], cycles[kTraceEvents];
};

__device__ __forceinline__ TraceStage& trace_stage() {
  __shared__ TraceStage s;
  return s;
}

__device__ __forceinline__ bool trace_thread() { return blockIdx.x == 0 && threadIdx.x == 0; }

__device__ __forceinline__ void trace_stamp(int event) {
  if (!trace_thread()) return;
  TraceStage& s = trace_stage();
  s.cycles[event] = clock64();
  s.ns[event] = trace_ns();
}

// Stamps `event` only the first time in this call (kTraceWaitBegin).
__device__ __forceinline__ void trace_stamp_once(int event) {
  if (trace_thread() && trace_stage().ns[event] == 0) trace_stamp(event);
}

// Kernel entry: clears the stage and stamps kTraceEntry (shared memory only: allowed before the PDL wait).
__device__ __forceinline__ void trace_entry() {
  if (!trace_thread()) return;
  TraceStage& s = trace_stage();
  for (int e = 0; e < kTraceEvents; ++e) s.ns[e] = s.cycles[e] = 0;
  trace_stamp(kTraceEntry);
}

__device__ __forceinline__ TraceRecord& trace_record(uint32_t flag) { return trace_ring.records[flag % kTraceRecords]; }

// Block 0 thread 0 writes its stamps out (at its end).
__device__ __forceinline__ void trace_flush(int op, uint32_t flag, int rank) {
  if (!trace_thread()) return;
  trace_stamp(kTraceExit);
  const TraceStage& s = trace_stage();
  TraceRecord& r = trace_record(flag);
  r.op = (uint32_t)op;
  r.flag = flag;
  r.blocks = gridDim.x;
  r.rank = (uint32_t)rank;
  for (int e = 0; e < kTraceEvents; ++e) {
    r.ns[e] = s.ns[e];
    r.cycles[e] = s.cycles[e];
  }
}

// The last block's thread 0, when the call is complete: the call's end, and one more call
// counted (the previous call's kernel is complete: no other thread writes the count meanwhile).
__device__ __forceinline__ void trace_last(uint32_t flag) {
  if (threadIdx.x != 0) return;
  TraceRecord& r = trace_record(flag);
  r.last_cycles = clock64();
  r.last_ns = trace_ns();
  trace_ring.calls += 1;
}

}  // namespace
}  // namespace hc

#define HC_TRACE_ENTRY() ::hc::trace_entry()
#define HC_TRACE_READY() ::hc::trace_stamp(::hc::kTraceReady)
#define HC_TRACE_EVENT(e) ::hc::trace_stamp(::hc::e)
#define HC_TRACE_EVENT_ONCE(e) ::hc::trace_stamp_once(::hc::e)
#define HC_TRACE_FLUSH(op, flag, rank) ::hc::trace_flush(op, flag, rank)
#define HC_TRACE_LAST(flag) ::hc::trace_last(flag)

#else

#define HC_TRACE_ENTRY() ((void)0)
#define HC_TRACE_READY() ((void)0)
#define HC_TRACE_EVENT(e) ((void)0)
#define HC_TRACE_EVENT_ONCE(e) ((void)0)
#define HC_TRACE_FLUSH(op, flag, rank) ((void)0)
#define HC_TRACE_LAST(flag) ((void)0)

#endif
