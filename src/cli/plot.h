#pragma once
// `pentad plot RUN_DIR [RUN_DIR ...] -o curves.png`: training curves of one or more runs
// (loss with eval loss, learning rate, tokens/s, gradient norm against the step; a 2x2
// figure) drawn by scripts/plot_curves.py with matplotlib. The command only checks its
// arguments and finds and runs the script; no MPI, no trainer.
#include <string>
#include <vector>

namespace pentad {

// Where the script is: <the executable's directory>/../share/pentad/plot_curves.py when
// pentad is installed (CMake's install rule puts it there), else the source tree's
// scripts/plot_curves.py, whose path CMake compiles in (PENTAD_PLOT_SCRIPT).
std::string plot_script_path();

// The interpreter: $PENTAD_PYTHON if set, else Debian's /usr/bin/python3 (python3-matplotlib
// is installed for it, and a virtual environment or pyenv first on PATH may lack it), else
// python3 on PATH.
std::string plot_python();

// Refuses (pentad::Error) a run directory without metrics.jsonl, a missing script or a
// python that cannot start; otherwise runs `PYTHON SCRIPT -o OUT RUN_DIR...` and returns its
// exit status (the script refuses with status 2 and a message when matplotlib is missing).
int plot_curves(const std::vector<std::string>& run_dirs, const std::string& out_png);

}  // namespace pentad
