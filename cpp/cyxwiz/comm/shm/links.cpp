#include "cyxwiz/comm/shm/links.h"

#include <algorithm>
#include <cstring>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm::shm {

namespace {
// The call header's check raises first on any mismatch a user can cause: reaching these errors means
// the ranks disagree on a step's sizes anyway.
constexpr const char* kOutOfStep =
    ": the ranks are out of step; every rank must call the same collectives in the same order with arrays of the "
    "same size (if they do, run with CYXWIZ_SHM_ALGORITHM=direct and report this)";

// What a member writes at the start of its half in each round of a step.
struct alignas(64) Record {
  uint64_t bytes;     // payload after this record, sent to its `to`
  uint64_t sendLeft;  // still to send after this round
  uint64_t recvLeft;  // still to receive before this round
  int32_t from;       // the member it receives from in this step
};
constexpr size_t kRecordBytes = sizeof(Record);

// Copies between a list of buffers, at a byte offset into the whole list, and flat memory.
size_t total(const std::vector<platform::IoVec>& v) {
  size_t n = 0;
  for (const auto& e : v) n += e.iov_len;
  return n;
}

template <bool kIn>
void copy(const std::vector<platform::IoVec>& v, size_t at, uint8_t* flat, size_t n) {
  for (const auto& e : v) {
    if (n == 0) return;
    if (at >= e.iov_len) {
      at -= e.iov_len;
      continue;
    }
    const size_t k = std::min(n, e.iov_len - at);
    auto* base = static_cast<uint8_t*>(e.iov_base) + at;
    if (kIn) {
      std::memcpy(base, flat, k);
    } else {
      std::memcpy(flat, base, k);
    }
    flat += k;
    n -= k;
    at = 0;
  }
}

// The address a send continues at (for placing our half's data like it).
const void* addressAt(const std::vector<platform::IoVec>& v, size_t at) {
  for (const auto& e : v) {
    if (at < e.iov_len) return static_cast<const uint8_t*>(e.iov_base) + at;
    at -= e.iov_len;
  }
  return nullptr;
}

}  // namespace

void Links::run(Step& step, int from, int to) {
  if (!linked(from) || !linked(to)) {
    throw BackendError(makeString(what(), ": no shared-memory link from member ", from, " or to member ", to, " of ",
                                  size(), " (this is member ", me(), ")"));
  }
  const size_t sendTotal = total(step.send), recvTotal = total(step.recv), header = step.recvHeaderBytes;
  const size_t capacity = w_.halfBytes() - kRecordBytes;
  size_t sent = 0, got = 0, handedOn = 0;
  std::vector<Record> records;
  bool headerSeen = header == 0;
  auto payloadIn = [&] { return got > header ? got - header : 0; };
  auto sendLimit = [&] {
    if (step.relay) return std::min(sendTotal, step.sendHeaderBytes + payloadIn());
    if (step.sendAvailable) return std::min(sendTotal, step.sendHeaderBytes + step.sendAvailable(handedOn));
    return sendTotal;
  };
  for (;;) {
    const size_t n = std::min(capacity, sendLimit() - sent);
    const int h = w_.nextHalf();
    const void* like = addressAt(step.send, sent);
    uint8_t* out = w_.writable(h, like != nullptr ? static_cast<const uint8_t*>(like) - kRecordBytes : nullptr);
    copy<false>(step.send, sent, out + kRecordBytes, n);
    sent += n;
    Record mine{n, sendTotal - sent, recvTotal - got, from};
    std::memcpy(out, &mine, sizeof mine);
    w_.arrive();

    // Every member's record: the same verdict everywhere on whether another round follows.
    records.resize(static_cast<size_t>(size()));
    for (int m = 0; m < size(); ++m) std::memcpy(&records[static_cast<size_t>(m)], w_.half(m, h), sizeof(Record));
    const Record& theirs = records[static_cast<size_t>(from)];
    if (theirs.bytes > recvTotal - got) {
      throw BackendError(makeString(what(), ": rank ", rank(from), " sent ", got + theirs.bytes, " bytes where this rank "
                                    "expected ", recvTotal, kOutOfStep));
    }
    copy<true>(step.recv, got, const_cast<uint8_t*>(w_.half(from, h)) + kRecordBytes, theirs.bytes);
    got += theirs.bytes;
    bool more = false, moved = false;
    for (const Record& r : records) {
      const bool known = r.from >= 0 && r.from < size();
      more = more || r.sendLeft > 0 || r.recvLeft > (known ? records[static_cast<size_t>(r.from)].bytes : 0);
      moved = moved || r.bytes > 0;
    }
    w_.doneReading(h);

    if (!headerSeen && got >= header) {
      headerSeen = true;
      if (step.onHeader) step.onHeader();
    }
    if (headerSeen && step.onReceived) {
      const size_t ready = got == recvTotal ? payloadIn() : payloadIn() / step.unit * step.unit;
      if (ready > handedOn) {
        step.onReceived(handedOn, ready);
        handedOn = ready;
      }
    }
    if (!more) break;
    if (!moved) {
      // Nobody wrote, so nothing arrived and the next round would be this one again: every member
      // waits on another (every member sees the same records and raises the same).
      throw BackendError(makeString(what(), ": a step through shared memory stalled with ", recvTotal - got, " of ",
                                    recvTotal, " bytes still to come from rank ", rank(from), " and ", sendTotal - sent,
                                    " of ", sendTotal, " to send", kOutOfStep));
    }
  }
  if (got != recvTotal) {
    throw BackendError(makeString(what(), ": rank ", rank(from), " sent ", got, " bytes where this rank expected ",
                                  recvTotal, kOutOfStep));
  }
}

}  // namespace cyxwiz::comm::shm
