#pragma once
// Whether a host answers on the network, for `pentad launch` before it restarts a job after a
// host fault (launch/detector.h: host unreachable, host down): a restart launched while the
// host's link is still down would fail to start its ranks there, and count as one more
// failure. A TCP connection attempt to the host answers either way when its network stack is
// reachable: accepted, or refused at once (nothing listens on the port). No answer within the
// timeout (packets dropped: a cut link, a host that is off, or a firewall that drops
// silently) reads as not answering.
#include <string>

namespace pentad::launch {

// The port tried: the discard service's, which nothing on a training host is expected to
// serve (a refusal is the usual answer).
constexpr int kHostProbePort = 9;

// Resolves `host` and tries one connection, waiting at most `timeout_s`.
bool host_answers(const std::string& host, double timeout_s, int port = kHostProbePort);

}  // namespace pentad::launch
