#include "cyxwiz/comm/cpu/handshake.h"

#include <cctype>
#include <cstdio>
#include <vector>

#include "cyxwiz/common/error.h"

namespace cyxwiz::comm {

bool sendHello(const Socket& s, const wire::Hello& hello, Deadline deadline) {
  uint8_t buf[wire::kHelloBytes];
  wire::encodeHello(hello, buf);
  return s.sendAll(buf, sizeof buf, deadline).ok();
}

std::string awaitHelloReply(const Socket& s, Deadline deadline) {
  uint8_t head[8];
  IoStatus st = s.recvAll(head, sizeof head, deadline);
  if (!st.ok()) return "no answer to the hello: " + st.describe();
  uint32_t status, length;
  std::memcpy(&status, head, 4);
  std::memcpy(&length, head + 4, 4);
  if (status == 0) return "";
  if (length > wire::kMaxReasonBytes) return "refused, with a malformed reason";
  std::string reason(length, '\0');
  st = s.recvAll(reason.data(), length, deadline);
  if (!st.ok()) return "refused (reason lost: " + st.describe() + ")";
  return reason.empty() ? "refused" : reason;
}

std::string sayHello(const Socket& s, const wire::Hello& hello, Deadline deadline) {
  if (!sendHello(s, hello, deadline)) return "no answer: sending the hello failed";
  return awaitHelloReply(s, deadline);
}

std::string checkHello(const wire::Hello& got, wire::Channel expected, const JobIdentity& job) {
  if (got.version != wire::kProtocolVersion) {
    return makeString("it speaks pycyxwiz protocol version ", got.version, ", this rank speaks version ",
                      wire::kProtocolVersion, ": run the same pycyxwiz version on every rank");
  }
  if (got.jobHash != job.jobHash) {
    return "it belongs to another job (its job id differs: CYXWIZ_JOB_ID / TORCHELASTIC_RUN_ID / SLURM_JOB_ID "
           "must be the same on every rank, or two jobs share MASTER_PORT)";
  }
  if (static_cast<int>(got.worldSize) != job.worldSize) {
    return makeString("it was started with world size ", got.worldSize, " but this job has world size ", job.worldSize,
                      ": set the same WORLD_SIZE on every rank");
  }
  if (got.rank >= got.worldSize) return makeString("it claims rank ", got.rank, ", outside 0..", job.worldSize - 1);
  if (got.channel != expected) {
    return makeString("it opened a ", wire::channelName(got.channel), " where a ", wire::channelName(expected), " was expected");
  }
  return "";
}

void replyHello(const Socket& s, const std::string& refusal, Deadline deadline) {
  std::string reason = refusal.substr(0, wire::kMaxReasonBytes);
  std::vector<uint8_t> out(8 + reason.size());
  uint32_t status = reason.empty() ? 0 : 1;
  uint32_t length = static_cast<uint32_t>(reason.size());
  std::memcpy(out.data(), &status, 4);
  std::memcpy(out.data() + 4, &length, 4);
  std::memcpy(out.data() + 8, reason.data(), reason.size());
  s.sendAll(out.data(), out.size(), deadline);
}

std::string describeStrangerBytes(const uint8_t* data, size_t n) {
  if (n == 0) return "nothing";
  size_t shown = n < 24 ? n : 24;
  bool printable = true;
  for (size_t i = 0; i < shown; ++i) {
    printable = printable && (std::isprint(data[i]) || data[i] == '\r' || data[i] == '\n');
  }
  std::string out;
  if (printable) {
    out = "'";
    for (size_t i = 0; i < shown; ++i) {
      if (data[i] == '\r') out += "\\r";
      else if (data[i] == '\n') out += "\\n";
      else out += static_cast<char>(data[i]);
    }
    out += n > shown ? "...'" : "'";
    return out;
  }
  out = makeString(n, " bytes");
  for (size_t i = 0; i < shown; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, " %02x", data[i]);
    out += hex;
  }
  return n > shown ? out + " ..." : out;
}

}  // namespace cyxwiz::comm
