// `pentad launch`'s command line: its options, and the start of the Supervisor
// (supervisor_restart.cpp, supervisor_watch.cpp) with the signals that stop it.
#include "launch/supervisor.h"

#include <signal.h>
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <optional>

#include "core/check.h"
#include "launch/supervisor_internal.h"

namespace pentad::launch {

volatile std::sig_atomic_t g_stop_signal = 0;
volatile std::sig_atomic_t g_grow_signal = 0;

namespace {

constexpr const char* kUsage =
    R"(Usage: pentad launch [options] -- LAUNCHER... pentad train RECIPE [args]

Runs the job under supervision: detects a dead, hung or slow rank from the ranks' reports
of their own communication, has the ranks dump their communication traces, ends the job
and restarts it with --resume latest.

Options:
  --max-restarts N     restarts in a row before giving up (default 3): a restarted job that
                       trains 3 steps past the furthest step of the failed attempts clears
                       them, and the count starts again
  --backoff-s S        restarts in a row for the same cause wait 0, S, 2S, 4S, ... seconds,
                       each x a factor from 0.75 to 1.25 (default 2)
  --backoff-max-s S    ... at most S seconds (x that factor) (default 60)
  --storage-wait-s S   before a restart, wait up to S seconds for a checkpoint directory
                       to clear: one gone (an unmounted share), or one whose saves failed
                       without room there for a save; then give up saying which (default 30)
  --link-wait-s S      a host whose ranks all fell silent at once (its link down) is waited
                       for up to S seconds: heard again and the job moving on, it goes on
                       without a restart (default 10; 0: end the job at once)
  --host-wait-s S      after a host fault, wait up to S seconds before the restart for that
                       host to answer on the network; then give up naming it (default 60)
  --restart-on-slow    also restart on a slow rank or link (default: report only)
  --link-slow-s S      a link slower than its like for S seconds (and 10 steps) is reported
                       (default 1)
  --port P             monitor port, 0 = any free one (default 0)
  --hang-factor K      a wait longer than K x the median step time is a hang (default 5)
  --hang-floor-s S     ... and never shorter than S seconds (default 2.0)
  --beat-timeout-s S   a rank silent this long while others wait is unresponsive (default 1.0)
  --events PATH        event log (default: <out_dir>/events.jsonl, out_dir from the ranks)
  --exclude-culprit    restart with one data-parallel replica fewer after a fault with a
                       culprit (launch/exclude.h; on one machine: fewer ranks)
  --replan             restart on the best layout for the ranks that remain after a fault
                       with a culprit: the planner's search over every layout of n ranks, n
                       from what remains down to 1, at the job's global batch (launch/replan.h)
                       SIGUSR2 to the supervisor: the ranks left out are back; at the next
                       checkpoint the job restarts on the best layout of its full count
                       A slow link: the layouts of the same ranks re-planned with that link
                       slowed as it was measured; the job restarts on the best if the time it
                       saves over the steps left beats --replan-gain x the restart's cost
                       (start-up and the steps since the checkpoint), else it goes on and the
                       event log says why
  --replan-gain X      the margin above (default 2)
  --cluster NAME       the machine --replan plans for (a `pentad plan --cluster` preset);
                       default: this machine, by its calibration (made first if missing)

Every wait is in the event log ("wait" when it starts, "waited" when it ends).
)";

void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

void on_grow_signal(int) {
  g_grow_signal = 1;
}

double number(const std::string& option, const std::string& text, double low, double high) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < low || v > high)
    fail("pentad launch: {} takes a number from {} to {}, not '{}'", option, low, high, text);
  return v;
}

}  // namespace

LaunchOptions parse_launch_options(int argc, char** argv) {
  LaunchOptions o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc || std::string(argv[i + 1]) == "--")
        fail("pentad launch: {} needs a value", arg);
      return argv[++i];
    };
    if (arg == "--max-restarts")
      o.max_restarts = int(number(arg, value(), 0, 1000));
    else if (arg == "--backoff-s")
      o.backoff_s = number(arg, value(), 0, 3600);
    else if (arg == "--backoff-max-s")
      o.backoff_max_s = number(arg, value(), 0, 86400);
    else if (arg == "--storage-wait-s")
      o.storage_wait_s = number(arg, value(), 0, 86400);
    else if (arg == "--link-wait-s")
      o.link_wait_s = number(arg, value(), 0, 86400);
    else if (arg == "--host-wait-s")
      o.host_wait_s = number(arg, value(), 0, 86400);
    else if (arg == "--port")
      o.port = int(number(arg, value(), 0, 65535));
    else if (arg == "--hang-factor")
      o.hang_factor = number(arg, value(), 1, 1e6);
    else if (arg == "--hang-floor-s")
      o.hang_floor_s = number(arg, value(), 0.1, 1e6);
    else if (arg == "--beat-timeout-s")
      o.beat_timeout_s = number(arg, value(), 0.2, 1e6);
    else if (arg == "--events")
      o.events_path = value();
    else if (arg == "--link-slow-s")
      o.link_slow_s = number(arg, value(), 0.1, 1e6);
    else if (arg == "--replan-gain")
      o.replan_gain = number(arg, value(), 0, 1e6);
    else if (arg == "--restart-on-slow")
      o.restart_on_slow = true;
    else if (arg == "--exclude-culprit")
      o.exclude_culprit = true;
    else if (arg == "--replan")
      o.replan = true;
    else if (arg == "--cluster")
      o.replan_cluster = value();
    else
      fail(
          "pentad launch: unknown option '{}' (pentad launch --help lists them; the job's "
          "command goes after --)",
          argv[i]);
  }
  for (++i; i < argc; ++i) o.command.push_back(argv[i]);
  if (o.replan && o.exclude_culprit)
    fail(
        "pentad launch: --replan and --exclude-culprit both choose the restart's layout; give one");
  if (!o.replan_cluster.empty() && !o.replan)
    fail("pentad launch: --cluster {} is the machine --replan plans for; add --replan",
         o.replan_cluster);
  if (o.command.empty())
    fail(
        "pentad launch: no job to run: put its command after --, e.g. pentad launch -- mpirun "
        "-np 4 pentad train recipes/gpt-tiny.toml");
  return o;
}

int supervise_main(int argc, char** argv) {
  for (int i = 1; i < argc && std::string(argv[i]) != "--"; ++i)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    LaunchOptions options = parse_launch_options(argc, argv);
    // Ranks orphaned by a dead launcher come to us to be reaped (a zombie looks alive).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    struct sigaction stop {};
    stop.sa_handler = on_stop_signal;  // no SA_RESTART: poll() wakes up to see it
    ::sigaction(SIGINT, &stop, nullptr);
    ::sigaction(SIGTERM, &stop, nullptr);
    struct sigaction grow {};
    grow.sa_handler = on_grow_signal;
    ::sigaction(SIGUSR2, &grow, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    Supervisor supervisor(std::move(options));
    return supervisor.run();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

}  // namespace pentad::launch
