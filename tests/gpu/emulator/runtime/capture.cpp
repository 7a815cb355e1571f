// TEST DOUBLE, NOT GPU SUPPORT. Stream capture and graphs. Work on a capturing stream becomes a node
// of the capture's graph, depending on the stream's current tail. cudaEventRecord in a capture
// snapshots the tail; cudaStreamWaitEvent with such an event pulls the waiting stream into the
// capture (or merges the tail). cudaStreamEndCapture on the origin stream fails with
// cudaErrorStreamCaptureUnjoined when another stream's tail is not an ancestor of the origin's, and
// with cudaErrorStreamCaptureInvalidated when a call CUDA refuses in a capture invalidated it.
// cudaMallocAsync in a capture is an alloc node: graph memory, reserved at the capture, live in each
// replay from its alloc node to its free node (poisoned with 0xFF at each alloc). A replay runs the
// nodes in recorded order (a topological order) as one piece of work on the launch stream, checking
// each node's accesses when it runs. CYXWIZ_EMULATED_CAPTURE_FAIL=1 makes cudaGraphInstantiate fail.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "internal.h"

namespace cxemu {

namespace {

struct Node {
  enum Kind { Work, Alloc, Free } kind = Work;
  Item item;
  void* ptr = nullptr;
  std::vector<int> deps;
};

struct GraphData {
  int dev = 0;
  std::vector<Node> nodes;
  std::vector<void*> allocs;   // its graph memory
  std::vector<void*> unfreed;  // allocated, not freed in the graph: live after a launch until freed
  GraphData() = default;
  GraphData(const GraphData&) = delete;
  GraphData& operator=(const GraphData&) = delete;
  ~GraphData() {
    for (void* p : allocs) {
      BlockInfo i;
      if (!blockAt(p, &i)) continue;
      if (i.state == BlockState::Live) {
        blockSetKind(p, BlockKind::Device);  // left live by a launch: an ordinary allocation now
      } else if (i.state != BlockState::Freed) {
        blockSetState(p, BlockState::Freed, "released with its graph");
      }
    }
  }
};

struct Capture {
  uint64_t id = 0;
  int dev = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  Stream* origin = nullptr;
  std::thread::id thread;
  std::shared_ptr<GraphData> graph;
  bool invalidated = false;
  std::string why;
  std::vector<Stream*> streams;
  std::set<void*> liveAllocs;
  std::vector<void*> holds;
};

}  // namespace

}  // namespace cxemu

// The handles' types (declared, never defined, by cuda_runtime_api.h).
struct CUgraph_st {
  std::shared_ptr<cxemu::GraphData> data;
  std::vector<void*> holds;
};
struct CUgraphExec_st {
  std::shared_ptr<cxemu::GraphData> data;
  std::vector<void*> holds;
};

namespace cxemu {

namespace {

struct Captures {
  std::map<uint64_t, Capture*> active;
  std::set<CUgraph_st*> graphs;
  std::set<CUgraphExec_st*> execs;
  std::map<void*, int> holds;
  uint64_t nextId = 0;
};

Captures& caps() {
  static Captures* c = new Captures;  // never destroyed (workers may outlive main)
  return *c;
}

thread_local bool tInReplay = false;
thread_local cudaStreamCaptureMode tInteraction = cudaStreamCaptureModeGlobal;

void addHoldsLocked(const std::vector<void*>& owners, int delta) {
  auto& h = caps().holds;
  for (void* o : owners) {
    if ((h[o] += delta) <= 0) h.erase(o);
  }
}

// The capture's graph memory goes back (a failed capture never runs).
void discardLocked(Capture* c) {
  for (void* p : c->graph->allocs) blockSetState(p, BlockState::Freed, "freed with a failed capture");
  c->graph->allocs.clear();
  addHoldsLocked(c->holds, -1);
}

void endLocked(Capture* c) {
  for (Stream* s : c->streams) {
    s->captureId = 0;
    s->tail.clear();
  }
  caps().active.erase(c->id);
}

// Whether every other stream's tail is an ancestor of (or in) the origin's.
std::string unjoinedLocked(Capture* c) {
  const auto& nodes = c->graph->nodes;
  std::vector<char> reach(nodes.size(), 0);
  std::vector<int> todo = c->origin->tail;
  while (!todo.empty()) {
    const int n = todo.back();
    todo.pop_back();
    if (reach[n]) continue;
    reach[n] = 1;
    for (int d : nodes[n].deps) todo.push_back(d);
  }
  for (Stream* s : c->streams) {
    if (s == c->origin) continue;
    for (int n : s->tail) {
      if (!reach[n]) return s->name() + " did not join back (its last node: " + nodes[n].item.what + ")";
    }
  }
  return {};
}

void replay(const GraphData& g) {
  tInReplay = true;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const std::string where = " (node " + std::to_string(i) + " of a graph replay)";
    if (n.kind == Node::Alloc) {
      blockSetState(n.ptr, BlockState::Live, "allocated by node " + std::to_string(i) + " of a graph replay");
    } else if (n.kind == Node::Free) {
      blockSetState(n.ptr, BlockState::Reserved, "freed by node " + std::to_string(i) + " of a graph replay");
    } else {
      Item item = n.item;  // execute() may be given a copy: the node runs again at the next replay
      execute(g.dev, item, where.c_str());
      if (stickyError(g.dev) != cudaSuccess) break;
    }
  }
  tInReplay = false;
}

Capture* captureOfLocked(Stream* s) {
  auto it = caps().active.find(s->captureId);
  return it == caps().active.end() ? nullptr : it->second;
}

bool envFlag(const char* name) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace

bool inReplay() { return tInReplay; }

cudaError_t captureRecordLocked(Stream* s, Item& item) {
  Capture* c = captureOfLocked(s);
  if (!c) return setLastError(cudaErrorIllegalState);
  if (c->invalidated) return setLastError(cudaErrorStreamCaptureInvalidated);
  Node n;
  n.kind = Node::Work;
  n.item = std::move(item);
  n.item.deps.clear();
  n.deps = s->tail;
  c->graph->nodes.push_back(std::move(n));
  s->tail = {static_cast<int>(c->graph->nodes.size() - 1)};
  return cudaSuccess;
}

void invalidateLocked(uint64_t captureId, const std::string& why) {
  auto it = caps().active.find(captureId);
  if (it == caps().active.end() || it->second->invalidated) return;
  it->second->invalidated = true;
  it->second->why = why;
  say("the capture on cuda:" + std::to_string(it->second->dev) + " is invalidated by " + why);
}

bool captureActiveLocked(uint64_t id) { return caps().active.count(id) != 0; }

bool captureInvalidatedLocked(uint64_t id) {
  auto it = caps().active.find(id);
  return it != caps().active.end() && it->second->invalidated;
}

uint64_t unsafeCallCaptureLocked() {
  if (tInteraction == cudaStreamCaptureModeRelaxed) return 0;
  const auto self = std::this_thread::get_id();
  for (const auto& kv : caps().active) {
    const Capture* c = kv.second;
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->thread == self) return c->id;
    if (c->mode == cudaStreamCaptureModeGlobal && tInteraction == cudaStreamCaptureModeGlobal) return c->id;
  }
  return 0;
}

cudaError_t captureAllocLocked(Stream* s, size_t bytes, void** out) {
  Capture* c = captureOfLocked(s);
  if (!c) return setLastError(cudaErrorIllegalState);
  if (c->invalidated) return setLastError(cudaErrorStreamCaptureInvalidated);
  void* p = blockCreate(bytes, s->dev, BlockKind::Graph, BlockState::Live, PoolKind::None, nullptr,
                        "cudaMallocAsync in a capture on " + s->name());
  if (!p) return setLastError(cudaErrorMemoryAllocation);
  Node n;
  n.kind = Node::Alloc;
  n.ptr = p;
  n.item.what = "cudaMallocAsync";
  n.deps = s->tail;
  c->graph->nodes.push_back(std::move(n));
  s->tail = {static_cast<int>(c->graph->nodes.size() - 1)};
  c->graph->allocs.push_back(p);
  c->liveAllocs.insert(p);
  *out = p;
  return cudaSuccess;
}

cudaError_t captureFreeLocked(Stream* s, void* ptr) {
  Capture* c = captureOfLocked(s);
  if (!c) return setLastError(cudaErrorIllegalState);
  if (c->invalidated) return setLastError(cudaErrorStreamCaptureInvalidated);
  if (!c->liveAllocs.count(ptr)) {
    const std::string why = "cudaFreeAsync of " + hexPtr(ptr) + " on " + s->name() +
                            ", memory not allocated in this capture (or already freed in it)";
    invalidateLocked(c->id, why);
    return setLastError(cudaErrorInvalidValue);
  }
  c->liveAllocs.erase(ptr);
  Node n;
  n.kind = Node::Free;
  n.ptr = ptr;
  n.item.what = "cudaFreeAsync";
  n.deps = s->tail;
  c->graph->nodes.push_back(std::move(n));
  s->tail = {static_cast<int>(c->graph->nodes.size() - 1)};
  blockSetState(ptr, BlockState::Reserved, "freed in the capture by " + s->name());
  return cudaSuccess;
}

std::vector<int> captureTailLocked(Stream* s) { return s->tail; }

cudaError_t captureJoinLocked(Stream* s, uint64_t captureId, const std::vector<int>& tail) {
  auto it = caps().active.find(captureId);
  if (it == caps().active.end()) return setLastError(cudaErrorIllegalState);
  Capture* c = it->second;
  if (s->captureId == 0) {
    if (s->legacy) {
      invalidateLocked(captureId, "a wait of the legacy stream on an event of the capture");
      return setLastError(cudaErrorStreamCaptureImplicit);
    }
    s->captureId = captureId;
    s->tail = tail;
    c->streams.push_back(s);
    return cudaSuccess;
  }
  if (s->captureId != captureId) {
    invalidateLocked(captureId, "a wait joining two captures");
    invalidateLocked(s->captureId, "a wait joining two captures");
    return setLastError(cudaErrorStreamCaptureMerge);
  }
  for (int n : tail) {
    if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end()) s->tail.push_back(n);
  }
  return cudaSuccess;
}

bool isCapturing(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  return s && s->captureId != 0;
}

void captureAddHold(cudaStream_t stream, void* owner) {
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  Capture* c = s ? captureOfLocked(s) : nullptr;
  if (!c || std::find(c->holds.begin(), c->holds.end(), owner) != c->holds.end()) return;
  c->holds.push_back(owner);
  addHoldsLocked({owner}, +1);
}

int holds(void* owner) {
  std::lock_guard<std::mutex> lock(stateMutex());
  auto it = caps().holds.find(owner);
  return it == caps().holds.end() ? 0 : it->second;
}

int liveGraphs() {
  std::lock_guard<std::mutex> lock(stateMutex());
  return static_cast<int>(caps().graphs.size() + caps().execs.size());
}

}  // namespace cxemu

using namespace cxemu;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return setLastError(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (cudaError_t e = checkSticky(s->dev)) return e;
  if (s->legacy) return failWhy(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture of the legacy stream");
  if (s->captureId) return setLastError(cudaErrorIllegalState);
  auto* c = new Capture;
  c->id = ++caps().nextId;
  c->dev = s->dev;
  c->mode = mode;
  c->origin = s;
  c->thread = std::this_thread::get_id();
  c->graph = std::make_shared<GraphData>();
  c->graph->dev = s->dev;
  c->streams.push_back(s);
  caps().active[c->id] = c;
  s->captureId = c->id;
  s->tail.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (!pGraph) return setLastError(cudaErrorInvalidValue);
  *pGraph = nullptr;
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  Capture* c = captureOfLocked(s);
  if (!c) return setLastError(cudaErrorIllegalState);
  if (c->origin != s) {
    invalidateLocked(c->id, "cudaStreamEndCapture on " + s->name() + ", not the stream that began the capture");
    return setLastError(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return setLastError(cudaErrorStreamCaptureWrongThread);
  }
  cudaError_t result = cudaSuccess;
  if (c->invalidated) {
    say("cudaStreamEndCapture on cuda:" + std::to_string(c->dev) + ": the capture was invalidated by " + c->why);
    result = cudaErrorStreamCaptureInvalidated;
  } else {
    const std::string unjoined = unjoinedLocked(c);
    if (!unjoined.empty()) {
      say("cudaStreamEndCapture on cuda:" + std::to_string(c->dev) + ": " + unjoined);
      result = cudaErrorStreamCaptureUnjoined;
    }
  }
  endLocked(c);
  if (result != cudaSuccess) {
    discardLocked(c);
    delete c;
    return setLastError(result);
  }
  c->graph->unfreed.assign(c->liveAllocs.begin(), c->liveAllocs.end());
  for (void* p : c->graph->allocs) blockSetState(p, BlockState::Reserved, "not allocated before its graph's launch");
  auto* g = new CUgraph_st;
  g->data = c->graph;
  g->holds = c->holds;  // the capture's holds pass to the graph
  caps().graphs.insert(g);
  *pGraph = g;
  delete c;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  return cudaStreamGetCaptureInfo(stream, pCaptureStatus);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus* captureStatus_out,
                                     unsigned long long* id_out, cudaGraph_t* graph_out,
                                     const cudaGraphNode_t** dependencies_out, const cudaGraphEdgeData** edgeData_out,
                                     size_t* numDependencies_out) {
  if (!captureStatus_out) return setLastError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(stateMutex());
  cudaError_t err = cudaSuccess;
  Stream* s = resolveStreamLocked(stream, &err);
  if (!s) return setLastError(err);
  if (s->legacy) {
    for (Stream* b : streamsOfLocked(s->dev)) {
      if (b->blocking() && b->captureId) return setLastError(cudaErrorStreamCaptureImplicit);
    }
  }
  Capture* c = captureOfLocked(s);
  *captureStatus_out = !c ? cudaStreamCaptureStatusNone
                          : (c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive);
  if (id_out) *id_out = c ? c->id : 0;
  if (graph_out) *graph_out = nullptr;  // the graph under construction is not exposed
  if (dependencies_out) *dependencies_out = nullptr;
  if (edgeData_out) *edgeData_out = nullptr;
  if (numDependencies_out) *numDependencies_out = 0;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (!mode) return setLastError(cudaErrorInvalidValue);
  std::swap(*mode, tInteraction);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long /*flags*/) {
  if (!pGraphExec) return setLastError(cudaErrorInvalidValue);
  *pGraphExec = nullptr;
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!caps().graphs.count(graph)) return setLastError(cudaErrorInvalidValue);
  if (cudaError_t e = checkSticky(graph->data->dev)) return e;
  if (envFlag("CYXWIZ_EMULATED_CAPTURE_FAIL")) {
    return failWhy(cudaErrorInvalidValue, "cudaGraphInstantiate refused (CYXWIZ_EMULATED_CAPTURE_FAIL=1)");
  }
  auto* x = new CUgraphExec_st;
  x->data = graph->data;
  x->holds = graph->holds;
  addHoldsLocked(x->holds, +1);
  caps().execs.insert(x);
  *pGraphExec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiate(pGraphExec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  std::shared_ptr<GraphData> data;
  Stream* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(stateMutex());
    if (!caps().execs.count(graphExec)) return setLastError(cudaErrorInvalidValue);
    cudaError_t err = cudaSuccess;
    s = resolveStreamLocked(stream, &err);
    if (!s) return setLastError(err);
    data = graphExec->data;
  }
  if (data->dev != s->dev) {
    return failWhy(cudaErrorInvalidValue, "cudaGraphLaunch of a graph of cuda:" + std::to_string(data->dev) +
                                              " on " + s->name());
  }
  for (void* p : data->unfreed) {
    BlockInfo i;
    if (blockAt(p, &i) && i.state == BlockState::Live && !i.freeQueued) {
      return failWhy(cudaErrorInvalidValue, "cudaGraphLaunch: the graph's allocation " + hexPtr(p) +
                                                " from its previous launch was not freed");
    }
  }
  Item item;
  item.what = "cudaGraphLaunch";
  item.fn = [data] { replay(*data); };
  return launchItem(s, std::move(item), false);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!caps().execs.erase(graphExec)) return setLastError(cudaErrorInvalidValue);
  addHoldsLocked(graphExec->holds, -1);
  delete graphExec;  // a replay in flight keeps the graph's data
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  std::lock_guard<std::mutex> lock(stateMutex());
  if (!caps().graphs.erase(graph)) return setLastError(cudaErrorInvalidValue);
  addHoldsLocked(graph->holds, -1);
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
